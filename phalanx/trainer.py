"""The training loop: fit, evaluate, checkpoint, for any task. No argv, no environment reads, no
printing of its own: what to print goes through ``say``, what to record (metrics, snapshots,
uploads) through ``RunOutputs``.

The trainer owns progress, accumulation, precision, checkpoints and resume; the task (``tasks/``)
owns its networks, losses, metrics and pictures; the strategy (``parallel``) owns devices,
wrapping and collectives. The trainer never asks which task it runs.

Progress is a position in the epoch's global sample order (``sampling``): the learning rate, the
random streams and a checkpoint's resume point are functions of it, never of a step count, so a
run resumed at another world size continues the same training.
"""

from __future__ import annotations

import contextlib
import math
import random
import signal
import sys
import time
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.data import DataLoader

from . import checkpoint
from .config import RunConfig
from .context import RunContext, StepContext
from .data import by_epoch, loader_workers
from .divergence import diverged, first_non_finite, loss_name, non_finite_metric
from .errors import PhalanxError
from .optim import build_optimizer, lr_factor, set_lr
from .outputs import RunOutputs
from .parallel import Strategy
from .preempt import Preempted, StopRequest
from .progress import ProgressLog
from .recipe import ModelEma, prepare
from .sampling import EpochBatches, MicroBatch, ShardSampler, derive_seed, epoch_order, plan_epoch
from .tasks.base import Evaluation, Task, TaskData


def seed_streams(seed: int, device: torch.device | None = None) -> None:
    """Seed every random stream a model or user code may draw from (dropout, Python's random).

    The CPU generator and the training device's own, not ``torch.manual_seed``: that also queues a
    seed for every lazily initialised backend (CUDA, XPU, MTIA), each capturing a stack trace, 70 us
    a call measured here, at every step."""
    torch.default_generator.manual_seed(seed)
    if device is not None and device.type == "cuda":
        torch.cuda.manual_seed(seed)
    random.seed(seed)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(seed % 2**32)


class Best:
    """The validation metric that picks ``best.pt``, its direction, and the best value so far."""

    def __init__(self, task: Task, asked: str | None):
        name, mode = task.best_metric
        if asked:
            name, _, given_mode = asked.partition(":")
            known = task.metric_names()
            known += [f"ema_{k}" for k in known]
            if name not in known:
                raise PhalanxError(f"this task's validation metrics are {', '.join(known)} (got {name!r})",
                                   "--best-metric")
            mode = given_mode or (task.best_metric[1] if name.removeprefix("ema_") == task.best_metric[0]
                                  else "min" if any(w in name.lower() for w in ("loss", "l1", "l2", "error"))
                                  else "max")
            if mode not in ("max", "min"):
                raise PhalanxError(f"the direction after ':' is max or min (got {mode!r})", "--best-metric")
        self.name, self.mode = name, mode
        self.value: float | None = None

    def improves(self, metrics: dict[str, float]) -> bool:
        value = metrics[self.name]
        if not math.isfinite(value):
            return False
        if self.value is None or (value > self.value if self.mode == "max" else value < self.value):
            self.value = value
            return True
        return False

    def state(self) -> dict[str, Any]:
        return {"metric": self.name, "mode": self.mode, "value": self.value}

    def spec(self, task: Task) -> dict[str, Any]:
        """How the dashboard names and shows it (the ``panes`` record's ``best``)."""
        bare = self.name.removeprefix("ema_")
        percent = any(pane.get("percent") for pane in task.panes()
                      if pane["record"] == "val" and any(key == bare for key, _ in pane["traces"]))
        label = task.metric_labels.get(bare, bare)
        return {"metric": self.name, "mode": self.mode, "percent": percent,
                "label": f"EMA {label}" if self.name.startswith("ema_") else label}

    def restore(self, state: dict[str, Any]) -> None:
        if state.get("metric") == self.name:  # another --best-metric starts its own record
            self.value = state.get("value")


class Trainer:
    def __init__(self, cfg: RunConfig, strategy: Strategy, task: Task, data: TaskData, models: dict[str, nn.Module],
                 outputs: RunOutputs, run_id: str, say: Callable[[str], None], stop: StopRequest | None = None):
        self.cfg, self.strategy, self.task, self.outputs, self.say = cfg, strategy, task, outputs, say
        self.run_id = run_id
        self.stop = stop or StopRequest()
        self.device = strategy.device
        self.world_size, self.rank = strategy.world_size, strategy.rank
        if cfg.precision == "fp64":
            models = {name: model.double() for name, model in models.items()}
        groups = task.param_groups(models)  # before compilation renames the parameters' owner
        averaged = task.ema_models if task.ema_models is not None else (task.primary_model,)
        self.ema = {name: ModelEma(models[name], cfg.ema_decay) for name in averaged if name in models} \
            if cfg.ema_decay else {}
        self.bare = models
        self.models = {name: strategy.wrap(prepare(model, cfg.channels_last, cfg.compile), task.find_unused_parameters)
                       for name, model in models.items()}
        for ema in self.ema.values():
            ema.module.to(self.device)
        pin = self.device.type == "cuda"
        self.num_workers = loader_workers(cfg.num_workers, strategy.local_world_size, strategy.training_threads)
        workers = {"num_workers": self.num_workers, "pin_memory": pin, "persistent_workers": self.num_workers > 0,
                   "collate_fn": data.collate}
        self.num_train = len(data.train)
        self.data_info = data.info
        self.batches = EpochBatches()
        self.train_loader = DataLoader(by_epoch(data.train), batch_sampler=self.batches, **workers)
        self.val_loader = DataLoader(data.val, batch_size=cfg.batch_size, **workers,
                                     sampler=ShardSampler(len(data.val), self.rank, self.world_size))
        self.base_lr = strategy.plan.lr
        self.optimizers = {name: build_optimizer(cfg, param_groups, self.base_lr) for name, param_groups in groups.items()}
        self.scalers = {name: torch.amp.GradScaler(self.device.type, enabled=cfg.precision == "fp16" and pin)
                        for name in self.optimizers}
        self.ctx = StepContext(strategy, cfg.precision, cfg.channels_last, self.models, self.optimizers, self.scalers)
        self.eval_ctx = RunContext(strategy, cfg.precision, cfg.channels_last)
        # Rank 0 shows what the task draws of each epoch (validation images with predictions, ...).
        self.visuals = task.visuals(data) if strategy.is_main else None
        self.loss_names = tuple(task.loss_names)
        self.best = Best(task, cfg.best_metric)
        self.epoch = 0  # completed epochs
        self.position = 0  # samples of epoch + 1 consumed, over all ranks (mid-epoch checkpoints)
        self.step = 0  # optimizer steps taken (a count for logs; progress is epoch + position)
        self.epoch_sums = [0.0] * (len(self.loss_names) + 1)  # the epoch's loss sums and samples, all ranks
        self.val_samples = 0
        self.first_step_pending = True
        self.window_from = 1  # the first step whose losses the next log covers

    @property
    def effective_batch(self) -> int:
        return self.cfg.batch_size * self.cfg.grad_accum * self.world_size

    def bare_models(self) -> dict[str, nn.Module]:
        return {name: self.strategy.unwrap(model) for name, model in self.models.items()}

    # --- checkpoints
    def state_dict(self) -> dict[str, Any]:
        models = {name: model.state_dict() for name, model in self.bare_models().items()}
        return {"task": self.cfg.task, "epoch": self.epoch, "position": self.position, "step": self.step,
                "epoch_sums": {"losses": dict(zip(self.loss_names, self.epoch_sums)), "samples": self.epoch_sums[-1]},
                "world_size": self.world_size, "effective_batch": self.effective_batch, "best": self.best.state(),
                "run_id": self.run_id, "models": models, "model": models[self.task.primary_model],
                "optimizers": {name: opt.state_dict() for name, opt in self.optimizers.items()},
                "scalers": {name: scaler.state_dict() for name, scaler in self.scalers.items()},
                "ema": {name: ema.module.state_dict() for name, ema in self.ema.items()} or None,
                "task_state": self.task.state_dict(), "config": self.cfg.to_dict(), "data": self.data_info}

    def restore(self, state: dict[str, Any]) -> None:
        bare = self.bare_models()
        for name, model in bare.items():
            model.load_state_dict(state["models"][name])
        for name, optimizer in self.optimizers.items():
            optimizer.load_state_dict(state["optimizers"][name])
        for name, scaler in self.scalers.items():
            if state.get("scalers", {}).get(name):
                scaler.load_state_dict(state["scalers"][name])
        saved_ema = state.get("ema") or {}
        for name, ema in self.ema.items():  # a checkpoint from before --ema-decay starts the average at its weights
            ema.module.load_state_dict(saved_ema.get(name) or state["models"][name])
        self.task.load_state_dict(state.get("task_state") or {})
        self.epoch, self.step, self.position = state["epoch"], state["step"], state["position"]
        self.best.restore(state.get("best") or {})
        sums = state["epoch_sums"]
        self.epoch_sums = [float(sums["losses"].get(name, 0.0)) for name in self.loss_names] + [float(sums["samples"])]

    def _save(self, metrics: dict[str, float]) -> None:
        run_dir = self.cfg.run_dir
        paths = [run_dir / checkpoint.LATEST]
        if self.best.improves(metrics):
            paths.append(run_dir / checkpoint.BEST)
        if self.cfg.save_epoch_freq and self.epoch % self.cfg.save_epoch_freq == 0:
            paths.append(run_dir / checkpoint.epoch_name(self.epoch))
        if self.strategy.is_main:
            checkpoint.save(paths, self.state_dict())
            self.outputs.files_written(paths)

    # --- the loop
    def fit(self) -> dict[str, Any]:
        summary: dict[str, Any] = {"epochs": self.epoch}
        for epoch in range(self.epoch + 1, self.cfg.epochs + 1):
            started = time.perf_counter()
            train_losses, rate = self._train_epoch(epoch)
            self._stop_if_diverged(epoch)  # before the weights are evaluated or saved
            evaluation = self.evaluate()
            metrics = dict(evaluation.metrics)
            if self.ema:
                averaged = self.evaluate({**self.eval_models(), **{n: e.module for n, e in self.ema.items()}})
                metrics.update({f"ema_{k}": v for k, v in averaged.metrics.items()})
            self._stop_if_not_finite(epoch, metrics)
            self.epoch = epoch
            self._record_epoch(epoch, evaluation)
            train = {f"train_{name}": value for name, value in train_losses.items()}
            self.outputs.record({"kind": "val", "epoch": epoch, "step": self.step, **metrics,
                                 "samples": self.val_samples, "world_size": self.world_size, **train,
                                 **self._peak_memory()}, flush=True)
            self._save(metrics)
            shown = "  ".join(f"{k} {v:.4f}" for k, v in train.items())
            speed = f"{rate:,.0f}" if rate >= 100 else f"{rate:.3g}"
            self.say(f"epoch {epoch}/{self.cfg.epochs}  {shown}  {self.task.summary(metrics)}  lr {self._lr():.4g}  "
                     f"{speed} samples/s  {time.perf_counter() - started:.1f}s")
            summary = {"epochs": epoch, **train, "metrics": metrics}
            if epoch < self.cfg.epochs and self._agreed_stop(self.stop.signum):
                raise Preempted(self.stop.signum or signal.SIGTERM, f"after epoch {epoch}")
        summary["best"] = self.best.state()
        summary["max_rank_divergence"] = max(
            (self.strategy.max_divergence(model) for model in self.bare_models().values()), default=0.0)
        if summary["max_rank_divergence"] > 0:
            self.say(f"phalanx: warning: the ranks' parameters differ by up to {summary['max_rank_divergence']:.3g} "
                     "(DDP keeps them identical; something changed parameters outside backward and the optimizer)")
        end = {k: v for k, v in summary.items() if k != "metrics"}
        self.outputs.record({"kind": "end", "epoch": self.epoch, "step": self.step, **end,
                             **{f"val_{k}": v for k, v in summary.get("metrics", {}).items()}}, flush=True)
        self.strategy.barrier()  # no rank tears down its process group while another still writes
        return summary

    def _record_epoch(self, epoch: int, evaluation: Evaluation) -> None:
        for record in self.task.epoch_records(evaluation, epoch):
            self.outputs.record(record)
        if self.visuals is not None:  # image bytes: the snapshots keep them, the metrics log does not
            models = self.bare_models()
            for model in models.values():  # as in validation; the next epoch's train_mode restores them
                model.eval()
            self.outputs.snapshot_only(self.visuals.record(models, epoch, self.eval_ctx))

    def _peak_memory(self) -> dict[str, Any]:
        """On CUDA: each rank's peak allocated memory (GiB), gathered with one small all-reduce."""
        if self.device.type != "cuda":
            return {}
        peaks = torch.zeros(self.world_size, device=self.device, dtype=torch.float64)
        peaks[self.rank] = torch.cuda.max_memory_allocated(self.device) / 2**30
        return {"memory_gib": self.strategy.all_reduce_sum(peaks).tolist()}

    def _lr(self) -> float:
        return next(iter(self.optimizers.values())).param_groups[0]["lr"]

    def _set_lr(self, epoch: int, micro: MicroBatch) -> None:
        """Every optimizer gets the learning rate of the optimizer step this micro-batch belongs to."""
        start = epoch - 1 + micro.step_start / self.num_train
        end = epoch - 1 + (micro.step_start + micro.step_samples) / self.num_train
        factor = lr_factor(self.cfg, start, end)
        for optimizer in self.optimizers.values():
            set_lr(optimizer, self.base_lr, factor)

    def _no_sync(self, micro: MicroBatch) -> contextlib.AbstractContextManager:
        """Skip every network's gradient all-reduce on micro-batches that do not end a step."""
        if micro.ends_step:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        for model in self.models.values():
            stack.enter_context(self.strategy.no_sync(model))
        return stack

    def _train_epoch(self, epoch: int) -> tuple[dict[str, float], float]:
        """The rest of one epoch from ``self.position``; returns the epoch's named train losses
        (all ranks, the whole epoch) and the samples/s of all ranks together."""
        self.task.train_mode(self.models)
        total = self.num_train
        plan = plan_epoch(epoch_order(total, self.cfg.seed, epoch), self.position, self.cfg.batch_size,
                          self.world_size, self.rank, self.cfg.grad_accum)
        self.batches.set(epoch, plan)
        # Sums stay on the device: no .item() (a host sync) per step, only when logging.
        window = torch.zeros(len(self.loss_names) + 1, device=self.device, dtype=torch.float64)
        trained = 0
        progress = ProgressLog(len(plan), f"epoch {epoch}/{self.cfg.epochs}",
                               self.cfg.progress and self.strategy.is_main, self.cfg.log_interval)
        started = window_start = time.perf_counter()
        self.window_from = self.step + 1  # the first step of the window of losses not yet logged
        manual = self.task.manual_optimization
        steps_left = sum(micro.ends_step for micro in plan)
        for micro, batch in zip(plan, self.train_loader):
            batch = self.ctx.to_device(batch)
            # Dropout, batch mixing and the like draw from a stream that is a function of the
            # position alone.
            seed_streams(derive_seed(self.cfg.seed, "train", self.rank, epoch, micro.start), self.device)
            self.ctx.begin(micro, epoch, epoch - 1 + micro.end / total, self.cfg.epochs)
            self._set_lr(epoch, micro)
            with self._no_sync(micro):
                with self.ctx.autocast():
                    losses = self.task.training_step(batch, self.ctx)
                if self.first_step_pending:
                    self._check_loss_names(losses, manual)
                if not manual:
                    self.ctx.backward(losses["loss"])
            if micro.real:
                window[:-1] += torch.stack([_summed(losses[name], micro.real) for name in self.loss_names])
                window[-1] += micro.real
            trained += micro.end - micro.start
            progress.update(micro.end - micro.start, lambda: (window[0] / window[-1].clamp(min=1)).item())
            if not micro.ends_step:
                continue
            first_step = self.first_step_pending
            self._optimizer_step(epoch, micro, manual)
            if first_step:  # a far too high --lr shows at once; later steps are checked when logged
                self._stop_if_diverged(epoch, {name: losses[name] for name in self.loss_names})
            steps_left -= 1
            # A lone process stops at the very next step; DDP ranks agree at the next log step,
            # where the stop flag rides along with the loss all-reduce (no extra collective).
            stop_now = self.stop.signum != 0 and self.world_size == 1
            # No window of less than half --log-every steps at an epoch's end (a spike of a few
            # samples on the dashboard): the last log step before it waits for the epoch's end.
            log_step = self.step % self.cfg.log_every == 0 and steps_left >= self.cfg.log_every / 2
            if log_step or micro.end == total or stop_now:
                window_start, stop = self._log_train(epoch, window, window_start)
                if stop and micro.end < total:
                    progress.close()
                    self._preempt(epoch)
        progress.close()
        sums, self.epoch_sums, self.position = self.epoch_sums, [0.0] * (len(self.loss_names) + 1), 0
        count = max(sums[-1], 1)
        return {name: value / count for name, value in zip(self.loss_names, sums)}, \
            trained / (time.perf_counter() - started)

    def _optimizer_step(self, epoch: int, micro: MicroBatch, manual: bool) -> None:
        """Step the optimizers this micro-batch ends a step for, then count the step."""
        if not manual:
            for name in self.optimizers:
                self.ctx.step(name)
        bare = self.bare_models()
        for name, ema in self.ema.items():
            ema.update(bare[name])
        self.task.after_step(bare)
        self.step += 1
        self.position = micro.end
        if self.first_step_pending:  # startup latency, for users and benchmarks: once a process
            self.first_step_pending = False
            self.outputs.record({"kind": "first_step", "epoch": epoch, "step": self.step, "time": time.time()})

    def _preempt(self, epoch: int) -> None:
        """Save a mid-epoch checkpoint (the step just finished) and stop with the signal's code."""
        self._stop_if_diverged(epoch)
        if self.strategy.is_main:
            path = self.cfg.run_dir / checkpoint.LATEST
            checkpoint.save([path], self.state_dict())
            self.outputs.files_written([path])
        raise Preempted(self.stop.signum or signal.SIGTERM,
                        f"at step {self.step} (epoch {epoch}, {self.position}/{self.num_train} samples)")

    def _agreed_stop(self, signum: int) -> bool:
        """Whether any rank was asked to stop (one tiny all-reduce, once an epoch)."""
        flag = torch.tensor([float(signum != 0)], device=self.device)
        return self.strategy.all_reduce_sum(flag).item() > 0

    def _log_train(self, epoch: int, window: torch.Tensor, since: float) -> tuple[float, bool]:
        """Log the losses of the window (averaged over ranks); returns the time and whether any
        rank must stop."""
        now = time.perf_counter()
        stop = window.new_tensor([float(self.stop.signum != 0)])
        *loss_sums, count, stops = self.strategy.all_reduce_sum(torch.cat([window, stop])).tolist()
        self.epoch_sums = [a + b for a, b in zip(self.epoch_sums, [*loss_sums, count])]
        losses = {name: value / max(count, 1) for name, value in zip(self.loss_names, loss_sums)}
        lrs = {name: opt.param_groups[0]["lr"] for name, opt in self.optimizers.items()}
        self.outputs.record({"kind": "train", "epoch": epoch, "step": self.step,
                             "epoch_progress": epoch - 1 + self.position / self.num_train, **losses,
                             "lr": self._lr(), **({"lrs": lrs} if len(lrs) > 1 else {}),
                             "samples_per_s": count / max(now - since, 1e-9), "samples": int(count),
                             "seconds": now - since, "time": time.time(), "world_size": self.world_size})
        window.zero_()
        bad = {name: value for name, value in losses.items() if not math.isfinite(value)}
        if bad:  # every rank sees the same sums, so every rank stops here
            name, value = next(iter(bad.items()))
            steps = f"step {self.step}" if self.window_from == self.step else f"steps {self.window_from}-{self.step}"
            raise diverged(f"the train {loss_name(name)} became {value} in {steps}", epoch, self.epoch, self.base_lr)
        self.window_from = self.step + 1
        return now, stops > 0

    def _check_loss_names(self, losses: Any, manual: bool) -> None:
        """The losses a step returns are those its task declares (``loss_names``): said at the first
        step in one line, not as a KeyError in a log."""
        wanted = set(self.loss_names) | ({"loss"} if not manual else set())
        got = set(losses) if isinstance(losses, dict) else set()
        if not isinstance(losses, dict) or not wanted <= got:
            task = type(self.task).__name__
            missing = ", ".join(sorted(wanted - got)) or "a dict"
            raise PhalanxError(f"{task}.training_step returned {sorted(got) if isinstance(losses, dict) else type(losses).__name__}"
                               f" without {missing}: it returns a dict with every name of {task}.loss_names "
                               f"({', '.join(self.loss_names)})" + ("" if manual else " and 'loss' (the one backward takes)"),
                               exit_code=1)

    def _stop_if_diverged(self, epoch: int, losses: dict[str, torch.Tensor] | None = None) -> None:
        """Stop before a non-finite loss or weight is trained on, evaluated or saved. One host sync
        and one tiny all-reduce (so every rank stops together): at a process's first step and once
        an epoch, not at every step."""
        bad = first_non_finite(losses or {}, self.bare_models(), self.device)
        flag = torch.tensor([float(bad is not None)], device=self.device)
        if self.strategy.all_reduce_sum(flag).item() > 0:
            what = bad or "weights of another rank"
            raise diverged(f"the {what} became non-finite (inf or nan) at step {self.step}", epoch, self.epoch,
                           self.base_lr)

    def _stop_if_not_finite(self, epoch: int, metrics: dict[str, Any]) -> None:
        """A model whose outputs are nan still has an accuracy (argmax of nan is 0: "best 33.33%"):
        a non-finite validation metric stops the run before it is saved, as latest or best. The
        metrics are reduced over ranks, so every rank stops here."""
        bad = non_finite_metric(metrics)
        if bad:
            raise diverged(f"the validation {bad} after step {self.step}", epoch, self.epoch, self.base_lr)

    def eval_models(self) -> dict[str, nn.Module]:
        return {name: self.strategy.eval_model(model) for name, model in self.models.items()}

    def evaluate(self, models: dict[str, nn.Module] | None = None) -> Evaluation:
        """The task's validation over the whole validation set, every sample once."""
        models = self.eval_models() if models is None else models
        for model in models.values():
            model.eval()
        evaluation = self.task.evaluate(models, self.val_loader, self.eval_ctx)
        self.val_samples = int(evaluation.extra.get("samples", self.val_samples))
        return evaluation


def _summed(loss: torch.Tensor, samples: int) -> torch.Tensor:
    """A named loss's sum over this micro-batch's samples (per-sample values, or a mean)."""
    loss = loss.detach().double()
    return loss.sum() if loss.dim() else loss * samples

"""The training loop: fit, evaluate, checkpoint, for any task. No argv, no environment reads, no
printing of its own: what to print goes through ``say``, what to record (metrics, snapshots,
uploads) through ``RunOutputs``.

The trainer owns progress, accumulation, precision, checkpoints and resume (its ``Checkpointer``);
the task (``tasks/``) owns its networks, losses, metrics and pictures; the strategy
(``phalanx.distributed``) owns devices, wrapping and collectives. The trainer never asks which task
it runs.

Progress is a position in the epoch's global sample order (``phalanx.data.sampling``): the learning
rate, the random streams and a checkpoint's resume point are functions of it, never of a step count,
so a run resumed at another world size continues the same training."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..checkpoint.writer import CheckpointWriter
from ..config import RunConfig
from ..data import loader_workers, run_loaders
from ..data.sampling import EpochBatches, MicroBatch, derive_seed, epoch_order, plan_epoch, seed_streams
from ..distributed.strategy import Strategy
from ..models.recipe import ModelEma, prepare
from ..tasks.base import Batch, Declaration, Task, TaskData, check_step_losses, dataset_size
from .best import Best
from .checkpointing import Checkpointer, Progress
from .context import DeviceContext, TrainingStepContext
from .divergence import diverged, first_non_finite, non_finite_at_start, rank_divergence
from .losses import TrainLosses
from .optim import build_optimizer, first_lr, lr_factor, set_lr
from .outputs import RunOutputs
from .preempt import Preempted, StopRequest
from .progress import ProgressLog
from .state import RunState
from .step_times import StepTimes
from .validation import Validator


class StepLimit(Exception):
    """--max-steps reached mid-epoch."""


class Trainer:
    def __init__(
        self,
        cfg: RunConfig,
        strategy: Strategy,
        task: Task,
        declared: Declaration,
        data: TaskData,
        models: dict[str, nn.Module],
        outputs: RunOutputs,
        run_id: str,
        say: Callable[[str], None],
        stop: StopRequest | None = None,
    ):
        self.cfg, self.strategy, self.task, self.declared, self.outputs, self.say = (
            cfg,
            strategy,
            task,
            declared,
            outputs,
            say,
        )
        self.run_id, self.stop = run_id, stop or StopRequest()
        self.device = strategy.device
        self.world_size, self.rank = strategy.world_size, strategy.rank
        if cfg.optim.precision == "fp64":
            models = {name: model.double() for name, model in models.items()}
        self.ema = (
            {name: ModelEma(models[name], cfg.optim.ema_decay) for name in declared.ema_models if name in models}
            if cfg.optim.ema_decay
            else {}
        )
        self.models = {
            name: strategy.wrap(
                prepare(model, cfg.network.channels_last, cfg.network.compile, cfg.network.activation_checkpointing),
                declared.find_unused_parameters,
            )
            for name, model in models.items()
        }
        # The parameters the optimizers step are the wrapped networks' (FSDP replaces each with its
        # shard), named as in the bare networks (compilation and DDP only add prefixes).
        groups = task.param_groups(self.bare_models())
        for ema in self.ema.values():
            ema.module.to(self.device)
        pin = self.device.type == "cuda"
        self.num_workers = loader_workers(cfg.data.num_workers, strategy.local_world_size, strategy.training_threads)
        self.num_train, self.batches = dataset_size(data.train), EpochBatches()
        self.train_loader, self.val_loader = run_loaders(
            data.train,
            data.val,
            data.collate,
            self.batches,
            cfg.optim.batch_size,
            self.num_workers,
            pin,
            self.rank,
            self.world_size,
        )
        self.base_lr = strategy.plan.lr
        self.optimizers = {
            name: build_optimizer(cfg.optim, param_groups, self.base_lr) for name, param_groups in groups.items()
        }
        self.scalers = {
            name: torch.amp.GradScaler(self.device.type, enabled=cfg.optim.precision == "fp16" and pin)
            for name in self.optimizers
        }
        self.ctx = TrainingStepContext(
            strategy,
            cfg.optim,
            cfg.network.channels_last,
            self.models,
            self.optimizers,
            self.scalers,
            declared.manual_optimization,
            type(task).__name__,
        )
        self.eval_ctx = DeviceContext(strategy, cfg.optim.precision, cfg.network.channels_last)
        self.loss_names = declared.loss_names
        self.best = Best(declared, cfg.output.best_metric)
        self.epoch = 0  # completed epochs
        self.position = 0  # samples of epoch + 1 consumed, over all ranks (mid-epoch checkpoints)
        self.step = 0  # optimizer steps taken (a count for logs; progress is epoch + position)
        self.losses, self.times = TrainLosses(self.loss_names, self.device), StepTimes()
        self.parts = RunState(
            self.bare_models, self.optimizers, self.scalers, self.ema, task, self.best, self.losses, strategy
        )
        self.first_step_pending = True  # the first step's checks and latency
        self.checkpointer = Checkpointer(
            cfg,
            strategy,
            self.parts,
            self.best,
            CheckpointWriter(outputs.files_written),
            declared.primary_model,
            run_id,
            data.info,
        )
        self.validator = Validator(task, strategy, self.val_loader, self.eval_ctx, outputs, data)

    def bare_models(self) -> dict[str, nn.Module]:
        return {name: self.strategy.unwrap(model) for name, model in self.models.items()}

    def progress(self) -> Progress:
        return Progress(self.epoch, self.position, self.step)

    def restore(self, state: dict[str, Any]) -> None:
        """A checkpoint's parts and position (a resume)."""
        progress = self.checkpointer.restore(state)
        self.epoch, self.position, self.step = progress.epoch, progress.position, progress.step

    def _validate(self, epoch: int) -> dict[str, float]:
        def stop(what: str) -> Exception:
            return diverged(f"{what} after step {self.step}", epoch, self.epoch, self.base_lr, self.cfg.optim.precision)

        averaged = {name: ema.module for name, ema in self.ema.items()}
        return self.validator.validate(epoch, self.models, averaged, self.bare_models, stop)

    # --- the loop
    def fit(self) -> dict[str, Any]:
        """Train to the last epoch; however it ends, the last checkpoint is on disk first."""
        try:
            summary = self._fit()
        except Preempted:
            self.checkpointer.writer.wait()  # a checkpoint that could not be written is the stop's news
            raise
        except BaseException:
            self.checkpointer.writer.wait(quiet=True)  # the failure's own error is the news; the previous file is whole
            raise
        self.checkpointer.writer.wait()
        self.checkpointer.collect_shards()
        return summary

    def _fit(self) -> dict[str, Any]:
        summary: dict[str, Any] = {"epochs": self.epoch}
        limit = self.cfg.schedule.max_steps
        for epoch in range(self.epoch + 1, self.cfg.schedule.epochs + 1):
            if limit and self.step >= limit:
                break
            started = time.perf_counter()
            try:
                train_losses, rate = self._train_epoch(epoch)
            except StepLimit:  # mid-epoch: saved as a preempted run saves, without validation
                self._stop_if_diverged(epoch)
                self.checkpointer.save_latest(self.progress())
                break
            self._stop_if_diverged(epoch)  # before the weights are evaluated or saved
            train = {f"train_{name}": value for name, value in train_losses.items()}
            summary = {"epochs": epoch, **train}
            # --val-every: an epoch without validation saves latest.pt (and its numbered checkpoint),
            # never best.pt, and writes no val record (a val pane's points are validated epochs).
            validate = epoch % self.cfg.output.val_every == 0 or epoch == self.cfg.schedule.epochs
            metrics = self._validate(epoch) if validate else None
            self.epoch = epoch
            if metrics is not None:
                self.outputs.record(
                    {
                        "kind": "val",
                        "epoch": epoch,
                        "step": self.step,
                        **metrics,
                        "samples": self.validator.samples,
                        "world_size": self.world_size,
                        **train,
                        **self.strategy.peak_memory(),
                    },
                    flush=True,
                )
                summary["metrics"] = metrics
            self.checkpointer.save_epoch(self.progress(), metrics)
            shown = "  ".join(f"{k} {v:.4f}" for k, v in train.items())
            speed = f"{rate:,.0f}" if rate >= 100 else f"{rate:.3g}"
            checked = self.task.summary(metrics) if metrics is not None else "(not validated: --val-every)"
            self.say(
                f"epoch {epoch}/{self.cfg.schedule.epochs}  {shown}  {checked}  lr {first_lr(self.optimizers):.4g}  "
                f"{speed} samples/s  {time.perf_counter() - started:.1f}s"
            )
            for warning in self.task.epoch_warnings(train_losses, epoch):
                self.say(f"phalanx: warning: {warning}")
            if epoch < self.cfg.schedule.epochs and self._any_rank(self.stop.signum != 0):  # once an epoch
                raise Preempted(self.stop.signum or signal.SIGTERM, f"after epoch {epoch}")
        if limit and self.step >= limit and (self.epoch < self.cfg.schedule.epochs or self.position):  # not the end
            summary["stopped_at_step"], summary["epochs"], summary["position"] = self.step, self.epoch, self.position
        summary["best"], summary["step_times"] = self.best.state(), self.times.shares()
        summary["max_rank_divergence"], drifted = rank_divergence(self.strategy, self.bare_models().values())
        if drifted:
            self.say(drifted)
        end = {k: v for k, v in summary.items() if k != "metrics"}
        self.outputs.record(
            {
                "kind": "end",
                "epoch": self.epoch,
                "step": self.step,
                **end,
                **{f"val_{k}": v for k, v in summary.get("metrics", {}).items()},
            },
            flush=True,
        )
        self.strategy.barrier()  # no rank tears down its process group while another still writes
        return summary

    def _micro_batch_scope(self, micro: MicroBatch) -> contextlib.AbstractContextManager:
        """Skip every network's gradient all-reduce on micro-batches that do not end a step; a
        padding sample counts in no synchronised statistics."""
        stack = contextlib.ExitStack()
        stack.enter_context(self.strategy.padding(not micro.real))
        if not micro.ends_step:
            for model in self.models.values():
                stack.enter_context(self.strategy.no_sync(model))
        return stack

    def _train_epoch(self, epoch: int) -> tuple[dict[str, float], float]:
        """The rest of one epoch from ``self.position``; returns the epoch's named train losses
        (all ranks, the whole epoch) and the samples/s of all ranks together."""
        self.task.train_mode(self.models)
        total = self.num_train
        plan = plan_epoch(
            epoch_order(total, self.cfg.seed, epoch),
            self.position,
            self.cfg.optim.batch_size,
            self.world_size,
            self.rank,
            self.cfg.optim.grad_accum,
        )
        self.batches.set(epoch, plan)
        trained = 0
        progress = ProgressLog(
            len(plan),
            f"epoch {epoch}/{self.cfg.schedule.epochs}",
            self.cfg.output.progress and self.strategy.is_main,
            self.cfg.output.log_interval,
        )
        started = time.perf_counter()
        self.losses.start_epoch(self.step)
        self.times.start()
        manual = self.declared.manual_optimization
        steps_left = sum(micro.ends_step for micro in plan)
        clock = self.strategy.clock
        for micro, batch in self.batches.delivered(self.train_loader):
            self.times.lap("data")
            clock.take()  # what waited outside the step (validation, logging) is not this step's
            losses = self._forward_backward(epoch, micro, batch, manual)
            if micro.real:
                self.losses.add(losses, micro.real)
            trained += micro.end - micro.start
            progress.update(micro.end - micro.start, self.losses.window_mean)
            self.times.lap("compute", waited=clock.take())
            if not micro.ends_step:
                continue
            first_step = self.first_step_pending
            self._optimizer_step(epoch, micro, manual)
            if first_step:  # a far too high --lr shows at once; later steps are checked when logged
                self._stop_if_diverged(epoch, {name: losses[name] for name in self.loss_names})
            self.times.lap("optimizer", waited=clock.take())
            steps_left -= 1
            self._after_step(epoch, micro.end, steps_left, progress)
        progress.close()
        self.position = 0
        return self.losses.end_epoch(), trained / (time.perf_counter() - started)

    def _after_step(self, epoch: int, end: int, steps_left: int, progress: ProgressLog) -> None:
        """What an optimizer step that ends at sample ``end`` leads to: a log window, a stop."""
        total = self.num_train
        # A lone process stops at the very next step; DDP ranks agree at the next log step,
        # where the stop flag rides along with the loss all-reduce (no extra collective).
        stop_now = self.stop.signum != 0 and self.world_size == 1
        # No window of less than half --log-every steps at an epoch's end (a spike of a few
        # samples on the dashboard): the last log step before it waits for the epoch's end.
        log_step = self.step % self.cfg.output.log_every == 0 and steps_left >= self.cfg.output.log_every / 2
        # --max-steps mid-epoch (at an epoch's end the epoch ends as any other, then training does)
        at_limit = self.step == self.cfg.schedule.max_steps and end < total
        if log_step or end == total or stop_now or at_limit:
            if self._log_train(epoch) and end < total:
                progress.close()
                self._preempt(epoch)
            self.times.lap("logging")
        if at_limit:
            progress.close()
            raise StepLimit

    def _forward_backward(self, epoch: int, micro: MicroBatch, batch: Batch, manual: bool) -> dict[str, torch.Tensor]:
        """One micro-batch through the task's step (and backward, unless the step does its own)."""
        total = self.num_train
        # Dropout, batch mixing and the like draw from a stream that is a function of the position alone.
        seed_streams(derive_seed(self.cfg.seed, "train", self.rank, epoch, micro.start), self.device)
        self.ctx.begin(micro, epoch, epoch - 1 + micro.end / total, self.cfg.schedule.epochs)
        # Every optimizer gets the learning rate of the optimizer step this micro-batch belongs to.
        factor = lr_factor(
            self.cfg.schedule,
            epoch - 1 + micro.step_start / total,
            epoch - 1 + (micro.step_start + micro.step_samples) / total,
            self.base_lr,
        )
        for optimizer in self.optimizers.values():
            set_lr(optimizer, self.base_lr, factor)
        with self._micro_batch_scope(micro):
            with self.ctx.autocast():
                losses = self.task.training_step(self.ctx.to_device(batch), self.ctx)
            if self.first_step_pending:
                check_step_losses(self.task, losses, self.declared)
            if not manual:
                loss = losses["loss"]
                assert isinstance(loss, torch.Tensor), "the loss backward takes is a tensor, not sums still pending"
                self.ctx.backward_loss(loss)
        # Sums the step all-reduced beside its backward (monitors of the global batch), done now.
        return {name: value if isinstance(value, torch.Tensor) else value.result() for name, value in losses.items()}

    def _optimizer_step(self, epoch: int, micro: MicroBatch, manual: bool) -> None:
        """Step the optimizers this micro-batch ends a step for, then count the step."""
        if not manual:
            for name in self.optimizers:
                self.ctx.step_optimizer(name)
        self.strategy.after_step(self.models.values())
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
        self.checkpointer.save_latest(self.progress())
        self.checkpointer.writer.wait()  # on disk before the process stops
        self.checkpointer.collect_shards()
        raise Preempted(
            self.stop.signum or signal.SIGTERM,
            f"at step {self.step} (epoch {epoch}, {self.position}/{self.num_train} samples)",
        )

    def _any_rank(self, condition: bool) -> bool:
        """Whether the condition holds on any rank (one tiny all-reduce)."""
        return self.strategy.all_reduce_sum(torch.tensor([float(condition)], device=self.device)).item() > 0

    def _log_train(self, epoch: int) -> bool:
        """Record the window's losses (averaged over ranks); whether any rank must stop."""
        window = self.losses.log(self.strategy, self.stop.signum != 0, self.times.take())
        losses, count, seconds, stop = window[:4]
        times = self.times.per_step(window[4], self.world_size, self.step - self.losses.window_from + 1)
        lrs = {name: first_lr({name: opt}) for name, opt in self.optimizers.items()}
        self.outputs.record(
            {
                "kind": "train",
                "epoch": epoch,
                "step": self.step,
                "epoch_progress": epoch - 1 + self.position / self.num_train,
                **losses,
                "lr": first_lr(self.optimizers),
                **({"lrs": lrs} if len(lrs) > 1 else {}),
                "samples_per_s": count / max(seconds, 1e-9),
                "samples": count,
                "seconds": seconds,
                "time": time.time(),
                "world_size": self.world_size,
                **times,
            }
        )
        self.losses.check_finite(losses, self.step, epoch, self.epoch, self.base_lr, self.cfg.optim.precision)
        return stop

    def _stop_if_diverged(self, epoch: int, losses: dict[str, torch.Tensor] | None = None) -> None:
        """Stop before a non-finite loss or weight is trained on, evaluated or saved (at a process's
        first step and once an epoch: one host sync and one tiny all-reduce, not at every step)."""
        what = first_non_finite(losses or {}, self.bare_models(), self.device)
        if self._any_rank(what is not None):
            if self.step == 1 and losses and (what is None or what.startswith("train ")):  # a loss, before any update
                raise non_finite_at_start(f"the {what or 'train loss of another rank'} is non-finite (inf or nan)")
            raise diverged(
                f"the {what or 'weights of another rank'} became non-finite (inf or nan) at step {self.step}",
                epoch,
                self.epoch,
                self.base_lr,
                self.cfg.optim.precision,
            )

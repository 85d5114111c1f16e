"""The training loop: fit, evaluate, checkpoint. No argv, no environment reads, no printing of
its own: what to print goes through ``say``, what to record (metrics, snapshots, uploads) through
``RunOutputs``.

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
from .data import DataBundle, loader_workers
from .errors import RunFailed
from .finetune import param_groups
from .optim import build_optimizer, effective_lr, lr_factor, set_lr
from .outputs import RunOutputs
from .parallel import Strategy
from .preempt import Preempted, StopRequest
from .progress import ProgressBar
from .recipe import Recipe
from .sampling import EpochBatches, MicroBatch, ShardSampler, derive_seed, epoch_order, plan_epoch
from .watch import ValidationSample

MAX_CONFUSION_CLASSES = 100


def seed_streams(seed: int) -> None:
    """Seed every random stream a model or user code may draw from (dropout, Python's random)."""
    torch.manual_seed(seed)
    random.seed(seed)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(seed % 2**32)


class Trainer:
    def __init__(self, cfg: RunConfig, strategy: Strategy, data: DataBundle, model: nn.Module, recipe: Recipe,
                 outputs: RunOutputs, run_id: str, say: Callable[[str], None], stop: StopRequest | None = None):
        self.cfg, self.strategy, self.outputs, self.say = cfg, strategy, outputs, say
        self.run_id, self.recipe = run_id, recipe
        self.stop = stop or StopRequest()
        self.device = strategy.device
        self.world_size, self.rank = strategy.world_size, strategy.rank
        groups = param_groups(model, cfg.head_lr_mult)  # before compilation renames the parameters' owner
        self.model = strategy.wrap(recipe.prepare(model))
        pin = self.device.type == "cuda"
        self.num_workers = loader_workers(cfg, strategy.local_world_size, strategy.training_threads)
        workers = {"num_workers": self.num_workers, "pin_memory": pin, "persistent_workers": self.num_workers > 0}
        self.num_train = len(data.train)
        # What the data resolved to (classes, image size, normalisation): inference needs it.
        self.data_info = {"classes": data.classes, "channels": data.in_channels, "size": data.pipeline.size,
                          "crop_pct": data.pipeline.crop_pct, "mean": list(data.pipeline.mean),
                          "std": list(data.pipeline.std)}
        self.classes = data.classes
        # Rank 0 shows a fixed sample of validation images with their predictions each epoch.
        self.sample = ValidationSample(data.val, data.classes, data.pipeline.mean, data.pipeline.std) \
            if strategy.is_main else None
        self.batches = EpochBatches()
        self.train_loader = DataLoader(data.train, batch_sampler=self.batches, **workers)
        self.val_loader = DataLoader(data.val, batch_size=cfg.batch_size, **workers,
                                     sampler=ShardSampler(len(data.val), self.rank, self.world_size))
        self.base_lr = effective_lr(cfg, strategy.num_devices)
        self.optimizer = build_optimizer(cfg, groups, self.base_lr)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=cfg.precision == "fp16" and pin)
        self.amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision)
        self.epoch = 0  # completed epochs
        self.position = 0  # samples of epoch + 1 consumed, over all ranks (mid-epoch checkpoints)
        self.step = 0  # optimizer steps taken (a count for logs; progress is epoch + position)
        self.best_acc = -1.0
        self.epoch_sums = [0.0, 0.0]  # the current epoch's train loss sum and samples, over all ranks
        self.first_step_pending = True

    @property
    def effective_batch(self) -> int:
        return self.cfg.batch_size * self.cfg.grad_accum * self.world_size

    # --- checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "step": self.step,
                "epoch_sums": list(self.epoch_sums), "world_size": self.world_size,
                "effective_batch": self.effective_batch, "best_val_acc": self.best_acc, "run_id": self.run_id,
                "model": self.strategy.unwrap(self.model).state_dict(),
                "optimizer": self.optimizer.state_dict(), "scaler": self.scaler.state_dict(),
                "ema": self.recipe.ema.module.state_dict() if self.recipe.ema else None,
                "config": self.cfg.to_dict(), "data": self.data_info}

    def restore(self, state: dict[str, Any]) -> None:
        self.strategy.unwrap(self.model).load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        if self.recipe.ema is not None:  # a checkpoint from before --ema-decay starts the average at its weights
            self.recipe.ema.module.load_state_dict(state.get("ema") or state["model"])
        self.epoch, self.step, self.best_acc = state["epoch"], state["step"], state["best_val_acc"]
        self.position = state["position"]
        self.epoch_sums = list(state["epoch_sums"])

    def _save(self, val_acc: float) -> None:
        run_dir = self.cfg.run_dir
        paths = [run_dir / checkpoint.LATEST]
        if val_acc > self.best_acc:
            self.best_acc = val_acc
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
            train_loss, rate = self._train_epoch(epoch)
            val_loss, val_acc, confusion = self.evaluate()
            extra, shown = self._peak_memory(), ""
            if self.recipe.ema is not None:
                extra["ema_loss"], extra["ema_acc"], _ = self.evaluate(self.recipe.ema.module)
                shown = f"  ema_acc {100 * extra['ema_acc']:.2f}%"
            self.epoch = epoch
            self._record_epoch(epoch, confusion)
            self.outputs.record({"kind": "val", "epoch": epoch, "step": self.step, "loss": val_loss, "acc": val_acc,
                                 "samples": self.val_samples, "world_size": self.world_size,
                                 "train_loss": train_loss, **extra}, flush=True)
            self._save(val_acc)
            self.say(f"epoch {epoch}/{self.cfg.epochs}  train_loss {train_loss:.4f}  val_loss {val_loss:.4f}  "
                     f"val_acc {100 * val_acc:.2f}%{shown}  lr {self._lr():.4g}  {rate:,.0f} samples/s  "
                     f"{time.perf_counter() - started:.1f}s")
            summary = {"epochs": epoch, "train_loss": train_loss, "val_loss": val_loss, "val_acc": val_acc}
            if epoch < self.cfg.epochs and self._agreed_stop(self.stop.signum):
                raise Preempted(self.stop.signum or signal.SIGTERM, f"after epoch {epoch}")
        summary["best_val_acc"] = self.best_acc
        summary["max_rank_divergence"] = self.strategy.max_divergence(self.strategy.unwrap(self.model))
        if summary["max_rank_divergence"] > 0:
            self.say(f"phalanx: warning: the ranks' parameters differ by up to {summary['max_rank_divergence']:.3g} "
                     "(DDP keeps them identical; something changed parameters outside backward and the optimizer)")
        self.outputs.record({"kind": "end", "epoch": self.epoch, "step": self.step, **summary}, flush=True)
        self.strategy.barrier()  # no rank tears down its process group while another still writes
        return summary

    def _record_epoch(self, epoch: int, confusion: torch.Tensor) -> None:
        """For the dashboard: the confusion matrix (up to 100 classes; larger ones would swell the
        metrics log), and the sample of validation images with their predictions (snapshots only)."""
        if len(self.classes) <= MAX_CONFUSION_CLASSES:
            self.outputs.record({"kind": "confusion", "epoch": epoch, "classes": self.classes,
                                 "matrix": confusion.tolist()})
        if self.sample is not None:
            model = self.strategy.unwrap(self.model)
            with self._autocast():
                self.outputs.snapshot_only(self.sample.record(model, epoch, self.device, self.recipe.eval_inputs))

    def _peak_memory(self) -> dict[str, Any]:
        """On CUDA: each rank's peak allocated memory (GiB), gathered with one small all-reduce."""
        if self.device.type != "cuda":
            return {}
        peaks = torch.zeros(self.world_size, device=self.device, dtype=torch.float64)
        peaks[self.rank] = torch.cuda.max_memory_allocated(self.device) / 2**30
        return {"memory_gib": self.strategy.all_reduce_sum(peaks).tolist()}

    def _lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def _train_epoch(self, epoch: int) -> tuple[float, float]:
        """The rest of one epoch from ``self.position``; returns the train loss (all ranks, the
        whole epoch) and the samples/s of this process's part."""
        self.recipe.train_mode(self.model)
        total = self.num_train
        plan = plan_epoch(epoch_order(total, self.cfg.seed, epoch), self.position, self.cfg.batch_size,
                          self.world_size, self.rank, self.cfg.grad_accum)
        self.batches.set(epoch, plan)
        # Sums stay on the device: no .item() (a host sync) per step, only when logging.
        window = torch.zeros(2, device=self.device)
        trained = 0
        bar = ProgressBar(len(plan), f"epoch {epoch}/{self.cfg.epochs}", self.cfg.progress and self.strategy.is_main)
        started = window_start = time.perf_counter()
        for micro, (inputs, targets) in zip(plan, self.train_loader):
            inputs = inputs.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            # Dropout, batch mixing and the like draw from a stream that is a function of the
            # position alone.
            seed_streams(derive_seed(self.cfg.seed, "train", self.rank, epoch, micro.start))
            inputs, targets = self.recipe.batch(inputs, targets)
            with contextlib.nullcontext() if micro.ends_step else self.strategy.no_sync(self.model):
                with self._autocast():
                    summed = self.recipe.loss(self.model(inputs), targets).sum()
                if not micro.real:
                    summed = summed * 0.0  # a padding sample: in the all-reduce, weighing nothing
                self.scaler.scale(summed * micro.loss_scale(self.world_size)).backward()
            window[0] += summed.detach().float()
            window[1] += micro.real
            trained += micro.end - micro.start
            bar.update(micro.end - micro.start, lambda: (window[0] / window[1].clamp(min=1)).item())
            if not micro.ends_step:
                continue
            self._optimizer_step(epoch, micro)
            # A lone process stops at the very next step; DDP ranks agree at the next log step,
            # where the stop flag rides along with the loss all-reduce (no extra collective).
            stop_now = self.stop.signum != 0 and self.world_size == 1
            if self.step % self.cfg.log_every == 0 or micro.end == total or stop_now:
                window_start, stop = self._log_train(epoch, window, window_start)
                if stop and micro.end < total:
                    bar.close()
                    self._preempt(epoch)
        bar.close()
        (loss_sum, count), self.epoch_sums, self.position = self.epoch_sums, [0.0, 0.0], 0
        return loss_sum / max(count, 1), trained / (time.perf_counter() - started)

    def _optimizer_step(self, epoch: int, micro: MicroBatch) -> None:
        """Step with the learning rate of this point of training, then count the step."""
        end = micro.end / self.num_train
        start = end - micro.step_samples / self.num_train
        set_lr(self.optimizer, self.base_lr, lr_factor(self.cfg, epoch - 1 + start, epoch - 1 + end))
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.recipe.after_step(self.strategy.unwrap(self.model))
        self.step += 1
        self.position = micro.end
        if self.first_step_pending:  # startup latency, for users and benchmarks: once a process
            self.first_step_pending = False
            self.outputs.record({"kind": "first_step", "epoch": epoch, "step": self.step, "time": time.time()})

    def _preempt(self, epoch: int) -> None:
        """Save a mid-epoch checkpoint (the step just finished) and stop with the signal's code."""
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
        """Log the loss window (averaged over ranks); returns the time and whether any rank must stop."""
        now = time.perf_counter()
        stop = window.new_tensor([float(self.stop.signum != 0)])
        loss_sum, count, stops = self.strategy.all_reduce_sum(torch.cat([window, stop])).tolist()
        self.epoch_sums = [self.epoch_sums[0] + loss_sum, self.epoch_sums[1] + count]
        self.outputs.record({"kind": "train", "epoch": epoch, "step": self.step,
                             "epoch_progress": epoch - 1 + self.position / self.num_train,
                             "loss": loss_sum / max(count, 1), "lr": self._lr(),
                             "samples_per_s": count / max(now - since, 1e-9), "samples": int(count),
                             "seconds": now - since, "time": time.time(), "world_size": self.world_size})
        window.zero_()
        if not math.isfinite(loss_sum):  # every rank sees the same sum, so every rank stops here
            kept = f"{checkpoint.LATEST} holds epoch {self.epoch}" if self.epoch else "no checkpoint was saved yet"
            raise RunFailed(f"the train loss became {loss_sum / max(count, 1)} at step {self.step} (epoch {epoch}): "
                            f"training diverged, so it stopped; {kept}. Lower --lr or add --warmup-epochs")
        return now, stops > 0

    @torch.no_grad()
    def evaluate(self, model: nn.Module | None = None) -> tuple[float, float, torch.Tensor]:
        """Validation loss, top-1 accuracy and the confusion matrix (true x predicted) over the
        whole validation set, every sample once."""
        model = self.strategy.eval_model(self.model) if model is None else model
        model.eval()
        sums = torch.zeros(3, device=self.device)  # loss sum, correct, count
        classes = len(self.classes)
        confusion = torch.zeros(classes * classes, device=self.device, dtype=torch.int64)
        for inputs, targets in self.val_loader:
            inputs = self.recipe.eval_inputs(inputs.to(self.device, non_blocking=True))
            targets = targets.to(self.device, non_blocking=True)
            with self._autocast():
                logits = model(inputs)
            predicted = logits.argmax(1)
            sums[0] += nn.functional.cross_entropy(logits.float(), targets, reduction="sum")
            sums[1] += (predicted == targets).sum()
            sums[2] += targets.size(0)
            confusion += torch.bincount(targets * classes + predicted.clamp(max=classes - 1), minlength=classes ** 2)
        loss_sum, correct, count = self.strategy.all_reduce_sum(sums).tolist()
        self.val_samples = int(count)
        return loss_sum / count, correct / count, self.strategy.all_reduce_sum(confusion).view(classes, classes)

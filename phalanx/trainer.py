"""The training loop: fit, evaluate, checkpoint. No argv, no environment reads, no printing of
its own: what to print goes through ``say``, what to record (metrics, snapshots, uploads) through
``RunOutputs``.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import signal
import time
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, Sampler

from . import checkpoint
from .config import RunConfig
from .data import DataBundle
from .optim import build_optimizer, build_scheduler, effective_lr
from .parallel import Strategy
from .preempt import Preempted, StopRequest
from .outputs import RunOutputs
from .progress import ProgressBar


class ShardSampler(Sampler[int]):
    """Exact validation shards: index i goes to rank i % world, so every sample is counted once
    (DistributedSampler would pad with duplicates to even out the ranks)."""

    def __init__(self, length: int, rank: int, world_size: int):
        self.indices = range(rank, length, world_size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class SkipFirst(Sampler[int]):
    """The wrapped sampler's order without its first ``skip`` indices: a run stopped mid-epoch
    resumes at the very next batch of the same shuffle."""

    def __init__(self, base: Sampler[int]):
        self.base, self.skip = base, 0

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(iter(self.base), self.skip, None)

    def __len__(self) -> int:
        return len(self.base) - self.skip


class Trainer:
    def __init__(self, cfg: RunConfig, strategy: Strategy, data: DataBundle, model: nn.Module,
                 outputs: RunOutputs, run_id: str, say: Callable[[str], None], stop: StopRequest | None = None):
        self.cfg, self.strategy, self.outputs, self.say = cfg, strategy, outputs, say
        self.run_id = run_id
        self.stop = stop or StopRequest()
        self.device = strategy.device
        self.model = strategy.wrap(model)
        pin = self.device.type == "cuda"
        self.train_sampler = DistributedSampler(data.train, num_replicas=strategy.world_size,
                                                rank=strategy.rank, shuffle=True, seed=cfg.seed)
        loader_args = {"batch_size": cfg.batch_size, "num_workers": cfg.num_workers, "pin_memory": pin,
                       "persistent_workers": cfg.num_workers > 0}
        self.resumable = SkipFirst(self.train_sampler)
        self.train_loader = DataLoader(data.train, sampler=self.resumable, **loader_args)
        self.val_loader = DataLoader(data.val, sampler=ShardSampler(len(data.val), strategy.rank,
                                                                    strategy.world_size), **loader_args)
        self.steps_per_epoch = math.ceil(len(self.train_loader) / cfg.grad_accum)
        self.base_lr = effective_lr(cfg, strategy.num_devices)
        self.optimizer = build_optimizer(cfg, self.model.parameters(), self.base_lr)
        self.scheduler = build_scheduler(cfg, self.optimizer, self.steps_per_epoch)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=cfg.precision == "fp16" and pin)
        self.amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision)
        self.loss_fn = nn.CrossEntropyLoss()
        self.epoch = 0  # completed epochs
        self.step = 0  # optimizer steps taken
        self.best_acc = -1.0
        # A checkpoint taken mid-epoch (preemption): batches of the next epoch already done, and
        # that epoch's running loss sums, so the resumed epoch reports what it would have.
        self.resume_batch = 0
        self.resume_sums: list[float] | None = None
        self.first_step_pending = True

    # --- checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "step": self.step, "best_val_acc": self.best_acc, "run_id": self.run_id,
                "resume_batch": self.resume_batch, "epoch_sums": self.resume_sums,
                "model": self.strategy.unwrap(self.model).state_dict(),
                "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict(), "rng": checkpoint.capture_rng(),
                "config": self.cfg.to_dict()}

    def restore(self, state: dict[str, Any]) -> None:
        self.strategy.unwrap(self.model).load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.epoch, self.step, self.best_acc = state["epoch"], state["step"], state["best_val_acc"]
        self.resume_batch, self.resume_sums = state.get("resume_batch", 0), state.get("epoch_sums")
        checkpoint.restore_rng(state["rng"])

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
            train_loss, rate = self._train_epoch(epoch, self.resume_batch, self.resume_sums)
            self.resume_batch, self.resume_sums = 0, None
            val_loss, val_acc = self.evaluate()
            self.epoch = epoch
            self.outputs.record({"kind": "val", "epoch": epoch, "step": self.step, "loss": val_loss, "acc": val_acc,
                                 "samples": self.val_samples, "world_size": self.strategy.world_size}, flush=True)
            self._save(val_acc)
            self.say(f"epoch {epoch}/{self.cfg.epochs}  train_loss {train_loss:.4f}  val_loss {val_loss:.4f}  "
                     f"val_acc {100 * val_acc:.2f}%  lr {self._lr():.4g}  {rate:,.0f} samples/s  "
                     f"{time.perf_counter() - started:.1f}s")
            summary = {"epochs": epoch, "train_loss": train_loss, "val_loss": val_loss, "val_acc": val_acc}
            if epoch < self.cfg.epochs and self._agreed_stop(self.stop.signum):
                raise Preempted(self.stop.signum or signal.SIGTERM, f"after epoch {epoch}")
        summary["best_val_acc"] = self.best_acc
        summary["max_rank_divergence"] = self.strategy.max_divergence(self.strategy.unwrap(self.model))
        self.outputs.record({"kind": "end", "epoch": self.epoch, "step": self.step, **summary}, flush=True)
        self.strategy.barrier()  # no rank tears down its process group while another still writes
        return summary

    def _lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def _train_epoch(self, epoch: int, first_batch: int = 0, sums: list[float] | None = None) -> tuple[float, float]:
        """One epoch (from ``first_batch`` when resuming mid-epoch); returns the train loss and
        samples/s, both over all ranks."""
        self.model.train()
        self.train_sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        samples, batch, accum = len(self.train_sampler), self.cfg.batch_size, self.cfg.grad_accum
        self.resumable.skip = first_batch * batch
        batches = first_batch + len(self.train_loader)
        # Sums stay on the device: no .item() (a host sync) per step, only when logging.
        window = torch.zeros(2, device=self.device)
        epoch_sum = torch.tensor(sums or [0.0, 0.0], device=self.device)
        bar = ProgressBar(batches - first_batch, f"epoch {epoch}/{self.cfg.epochs}",
                          self.cfg.progress and self.strategy.is_main)
        started = window_start = time.perf_counter()
        for i, (inputs, targets) in enumerate(self.train_loader, start=first_batch):
            inputs = inputs.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            ends_step = (i + 1) % accum == 0 or i + 1 == batches
            # Weight each batch by its share of the step's samples, so that N accumulated batches
            # give the gradient of one N-times-larger batch, a short last batch included.
            group_start = i - i % accum
            group_samples = min(samples, (group_start + accum) * batch) - group_start * batch
            with contextlib.nullcontext() if ends_step else self.strategy.no_sync(self.model):
                with self._autocast():
                    loss = self.loss_fn(self.model(inputs), targets)
                self.scaler.scale(loss * (targets.size(0) / group_samples)).backward()
            window[0] += loss.detach().float() * targets.size(0)
            window[1] += targets.size(0)
            bar.update(targets.size(0) * self.strategy.world_size, lambda: (window[0] / window[1]).item())
            if not ends_step:
                continue
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
            self.scheduler.step()
            self.step += 1
            if self.first_step_pending:  # startup latency, for users and benchmarks: once a process
                self.first_step_pending = False
                self.outputs.record({"kind": "first_step", "epoch": epoch, "step": self.step, "time": time.time()})
            # A lone process stops at the very next step; DDP ranks agree at the next log step,
            # where the stop flag rides along with the loss all-reduce (no extra collective).
            stop_now = self.stop.signum != 0 and self.strategy.world_size == 1
            if self.step % self.cfg.log_every == 0 or i + 1 == batches or stop_now:
                epoch_sum += window
                window_start, stop = self._log_train(epoch, (i + 1) / batches, window, window_start)
                if stop and i + 1 < batches:
                    bar.close()
                    self._preempt(epoch, i + 1, batches, epoch_sum)
        bar.close()
        total = self.strategy.all_reduce_sum(epoch_sum)
        return (total[0] / total[1]).item(), total[1].item() / (time.perf_counter() - started)

    def _preempt(self, epoch: int, done: int, batches: int, epoch_sum: torch.Tensor) -> None:
        """Save a mid-epoch checkpoint (the step just finished) and stop with the signal's code."""
        self.epoch = epoch - 1
        self.resume_batch, self.resume_sums = done, epoch_sum.tolist()
        if self.strategy.is_main:
            path = self.cfg.run_dir / checkpoint.LATEST
            checkpoint.save([path], self.state_dict())
            self.outputs.files_written([path])
        raise Preempted(self.stop.signum or signal.SIGTERM,
                        f"at step {self.step} (epoch {epoch}, batch {done}/{batches})")

    def _agreed_stop(self, signum: int) -> bool:
        """Whether any rank was asked to stop (one tiny all-reduce, once an epoch)."""
        flag = torch.tensor([float(signum != 0)], device=self.device)
        return self.strategy.all_reduce_sum(flag).item() > 0

    def _log_train(self, epoch: int, fraction: float, window: torch.Tensor, since: float) -> tuple[float, bool]:
        """Log the loss window (averaged over ranks); returns the time and whether any rank must stop."""
        now = time.perf_counter()
        stop = window.new_tensor([float(self.stop.signum != 0)])
        loss_sum, count, stops = self.strategy.all_reduce_sum(torch.cat([window, stop])).tolist()
        self.outputs.record({"kind": "train", "epoch": epoch, "step": self.step,
                            "epoch_progress": epoch - 1 + fraction, "loss": loss_sum / count,
                            "lr": self._lr(), "samples_per_s": count / max(now - since, 1e-9),
                            "samples": count, "seconds": now - since, "time": time.time()})
        window.zero_()
        return now, stops > 0

    @torch.no_grad()
    def evaluate(self) -> tuple[float, float]:
        """Validation loss and top-1 accuracy over the whole validation set, every sample once."""
        model = self.strategy.eval_model(self.model)
        model.eval()
        sums = torch.zeros(3, device=self.device)  # loss sum, correct, count
        for inputs, targets in self.val_loader:
            inputs = inputs.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            with self._autocast():
                logits = model(inputs)
            sums[0] += nn.functional.cross_entropy(logits.float(), targets, reduction="sum")
            sums[1] += (logits.argmax(1) == targets).sum()
            sums[2] += targets.size(0)
        loss_sum, correct, count = self.strategy.all_reduce_sum(sums).tolist()
        self.val_samples = int(count)
        return loss_sum / count, correct / count

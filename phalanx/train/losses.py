"""The named train losses of a run: summed on the device over a window of steps (no host sync per
step), all-reduced and recorded at each log step, and summed over the epoch (checkpointed, so a
mid-epoch resume reports the whole epoch)."""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from .divergence import diverged, loss_name


class TrainLosses:
    def __init__(self, loss_names: tuple[str, ...], device: torch.device):
        self.names = loss_names
        self.window = torch.zeros(len(loss_names) + 1, device=device, dtype=torch.float64)  # sums, samples
        self.epoch_sums = [0.0] * (len(loss_names) + 1)  # the epoch's sums and samples, all ranks
        self.window_from = 1  # the first step whose losses the next log covers
        self.since = time.perf_counter()

    def start_epoch(self, step: int) -> None:
        self.window_from, self.since = step + 1, time.perf_counter()

    def add(self, losses: dict[str, torch.Tensor], samples: int) -> None:
        self.window[:-1] += torch.stack([_summed(losses[name], samples) for name in self.names])
        self.window[-1] += samples

    def window_mean(self) -> float:
        """The first loss's mean over the window so far (a host sync: for the progress line)."""
        return (self.window[0] / self.window[-1].clamp(min=1)).item()

    def log(
        self, strategy: Any, stopping: bool, extra: list[float]
    ) -> tuple[dict[str, float], int, float, bool, list[float]]:
        """All-reduce the window (with this rank's stop flag and ``extra`` numbers riding along): the
        losses averaged over ranks, the samples, the seconds the window took, whether any rank must
        stop, and ``extra`` summed over the ranks."""
        now = time.perf_counter()
        riders = self.window.new_tensor([float(stopping), *extra])
        reduced = strategy.all_reduce_sum(torch.cat([self.window, riders])).tolist()
        size = len(self.window)  # the losses' sums, then the samples
        sums, count, stops, summed = reduced[: size - 1], reduced[size - 1], reduced[size], reduced[size + 1 :]
        self.epoch_sums = [a + b for a, b in zip(self.epoch_sums, [*sums, count])]
        losses = {name: value / max(count, 1) for name, value in zip(self.names, sums)}
        seconds, self.since = now - self.since, now
        self.window.zero_()
        return losses, int(count), seconds, stops > 0, summed

    def check_finite(
        self, losses: dict[str, float], step: int, epoch: int, saved_epoch: int, lr: float, precision: str
    ) -> None:
        """A non-finite window stops the run (every rank sees the same sums, so every rank stops)."""
        bad = {name: value for name, value in losses.items() if not math.isfinite(value)}
        if bad:
            name, value = next(iter(bad.items()))
            steps = f"step {step}" if self.window_from == step else f"steps {self.window_from}-{step}"
            raise diverged(f"the train {loss_name(name)} became {value} in {steps}", epoch, saved_epoch, lr, precision)
        self.window_from = step + 1

    def end_epoch(self) -> dict[str, float]:
        """The epoch's mean of each loss over every rank's samples; the sums start again."""
        sums, self.epoch_sums = self.epoch_sums, [0.0] * (len(self.names) + 1)
        return {name: value / max(sums[-1], 1) for name, value in zip(self.names, sums)}

    def state(self) -> dict[str, Any]:
        return {"losses": dict(zip(self.names, self.epoch_sums)), "samples": self.epoch_sums[-1]}

    def restore(self, sums: dict[str, Any]) -> None:
        self.epoch_sums = [float(sums["losses"].get(name, 0.0)) for name in self.names] + [float(sums["samples"])]


def _summed(loss: torch.Tensor, samples: int) -> torch.Tensor:
    """A named loss's sum over this micro-batch's samples (per-sample values, or a mean)."""
    loss = loss.detach().double()
    return loss.sum() if loss.dim() else loss * samples

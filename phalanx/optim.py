"""Optimizer, learning-rate schedule and the linear scaling rule.

The schedule is a function of training progress in epochs (fractional mid-epoch), never of a count
of optimizer steps: the number of steps per epoch changes with the world size, and a run resumed at
another world size must get the learning rate of the same point of training. The schedule's
length is the current ``--epochs``; a resume that changes it continues on the new schedule.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch

from .config_sections import OptimOptions, ScheduleOptions


def effective_lr(lr: float, schedule: ScheduleOptions, num_devices: int) -> float:
    """``--scale-lr linear``: the LR grows with the devices that share a step (Goyal et al., 2017)."""
    return lr * num_devices if schedule.scale_lr == "linear" else lr


def build_optimizer(optim: OptimOptions, params: Iterable, lr: float) -> torch.optim.Optimizer:
    if optim.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=optim.betas, weight_decay=optim.weight_decay)
    if optim.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, betas=optim.betas, weight_decay=optim.weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=optim.momentum, weight_decay=optim.weight_decay)


def lr_factor(schedule: ScheduleOptions, start: float, end: float) -> float:
    """Multiplier of the base LR for an optimizer step that trains from progress ``start`` to
    ``end`` (in epochs): linear warmup up to ``end``, then the schedule at ``start``."""
    warmup = schedule.warmup_epochs
    if warmup > 0 and start < warmup:
        return min(1.0, end / warmup)
    if schedule.lr_schedule == "cosine":
        span = schedule.epochs - warmup
        fraction = min(1.0, (start - warmup) / span) if span > 0 else 1.0
        return 0.5 * (1.0 + math.cos(math.pi * fraction))
    if schedule.lr_schedule == "linear":  # pix2pix: constant, then linearly to zero over the last decay epochs
        decay = schedule.lr_decay_epochs or schedule.epochs / 2
        return max(0.0, min(1.0, (schedule.epochs - start) / decay))
    if schedule.lr_schedule == "step":
        # A small epsilon: progress is a sum of fractions, and epoch 3 must not read as 2.9999999.
        return 0.1 ** (int(start + 1e-9) // schedule.lr_step_epochs)
    return 1.0


def set_lr(optimizer: torch.optim.Optimizer, base_lr: float, factor: float) -> None:
    """Each param group keeps its own multiple of the base LR (``lr_mult``, 1 unless set)."""
    for group in optimizer.param_groups:
        group["lr"] = base_lr * factor * group.get("lr_mult", 1.0)


def first_lr(optimizers: dict[str, torch.optim.Optimizer]) -> float:
    """The learning rate the console and the ``lr`` record show: the first optimizer's (each
    optimizer's is in the record's ``lrs`` where a run has several)."""
    return next(iter(optimizers.values())).param_groups[0]["lr"]

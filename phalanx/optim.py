"""Optimizer, learning-rate schedule and the linear scaling rule."""

from __future__ import annotations

import math
from typing import Iterable

import torch

from .config import RunConfig


def effective_lr(cfg: RunConfig, num_devices: int) -> float:
    """``--scale-lr linear``: the LR grows with the devices that share a step (Goyal et al., 2017)."""
    return cfg.lr * num_devices if cfg.scale_lr == "linear" else cfg.lr


def build_optimizer(cfg: RunConfig, params: Iterable[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def lr_factor(cfg: RunConfig, step: int, steps_per_epoch: int) -> float:
    """Multiplier of the base LR at optimizer step ``step``: linear warmup, then the schedule."""
    warmup = round(cfg.warmup_epochs * steps_per_epoch)
    if step < warmup:
        return (step + 1) / warmup
    if cfg.lr_schedule == "cosine":
        total = cfg.epochs * steps_per_epoch
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    if cfg.lr_schedule == "step":
        return 0.1 ** ((step // steps_per_epoch) // cfg.lr_step_epochs)
    return 1.0


def build_scheduler(cfg: RunConfig, optimizer: torch.optim.Optimizer, steps_per_epoch: int):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(cfg, step, steps_per_epoch))

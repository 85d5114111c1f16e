"""Optimizer, learning-rate schedule and the linear scaling rule.

The schedule is a function of training progress in epochs (fractional mid-epoch), never of a count
of optimizer steps: the number of steps per epoch changes with the world size, and a run resumed at
another world size must get the learning rate of the same point of training. The schedule's
length is the current ``--epochs``; a resume that changes it continues on the new schedule.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable

import torch

from ..config.sections import OptimOptions, ScheduleOptions

FUSED_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def build_optimizer(optim: OptimOptions, params: Iterable, lr: float) -> torch.optim.Optimizer:
    """torch's fused implementation where it has one for every parameter's device and dtype: one
    kernel for all parameters instead of a few per parameter. Measured on a 2-core CPU (one thread,
    median of 7, benchmarks/optimizer_step.py): translate's two Adams 7.9 -> 1.3 ms a step,
    resnet18's SGD 13.2 -> 5.3 ms; float64 6e-17 from torch's loop (tests/test_optim.py: within 1e-12), float32
    within rounding. Steps go through ``step``."""
    params = list(params) if optim.norm_bias_decay else without_decay_for_1d(params)
    if optim.optimizer in ("adam", "adamw"):
        kind = torch.optim.AdamW if optim.optimizer == "adamw" else torch.optim.Adam
        beta1, beta2 = optim.betas  # (two: the configuration checks them)
        make: Callable[..., torch.optim.Optimizer] = functools.partial(
            kind, params, lr=lr, betas=(beta1, beta2), weight_decay=optim.weight_decay
        )
    else:
        make = functools.partial(
            torch.optim.SGD,
            params,
            lr=lr,
            momentum=optim.momentum,
            weight_decay=optim.weight_decay,
            nesterov=optim.nesterov,
        )
    tensors = [t for p in params for t in (p["params"] if isinstance(p, dict) else [p])]
    # Plain tensors only: torch 2.14 has no sharding rule for fused steps of FSDP's DTensor shards.
    fusable = all(
        type(t.data) is torch.Tensor and t.device.type in ("cpu", "cuda") and t.dtype in FUSED_DTYPES for t in tensors
    )
    return make(fused=True) if fusable else make()  # (elsewhere: torch's default implementation)


def without_decay_for_1d(params: Iterable) -> list[dict]:
    """``--no-norm-bias-decay``: each group split in two, its 1-D parameters (biases, normalisation
    weights) without weight decay, as timm's ``train.py`` groups them; the rest as given."""
    given = list(params)
    groups = []
    for group in given if given and isinstance(given[0], dict) else [{"params": given}]:
        tensors = list(group["params"])
        for chosen, extra in (
            ([t for t in tensors if t.dim() > 1], {}),
            ([t for t in tensors if t.dim() <= 1], {"weight_decay": 0.0}),
        ):
            if chosen:
                groups.append({**group, "params": chosen, **extra})
    return groups


def clip_gradients(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, optim: OptimOptions) -> None:
    """``--clip-grad``: the optimizer's gradients bounded before its step, unscaled first (fp16's
    GradScaler: the bound is on the true gradient, as torch's AMP recipe does). Under DDP every rank
    holds the all-reduced gradient and clips it alike; under FSDP the gradients are DTensor shards,
    whose norm torch all-reduces into the whole network's (a replicated DTensor, measured) before
    any is scaled."""
    if not optim.clip_grad:
        return
    scaler.unscale_(optimizer)
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if optim.clip_mode == "value":
        torch.nn.utils.clip_grad_value_(params, optim.clip_grad)
        return
    torch.nn.utils.clip_grad_norm_(params, optim.clip_grad)


def step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> None:
    """One optimizer step, made safe for torch 2.14's fused kernels:
    - a fused step reads each parameter and its gradient as flat memory: a gradient laid out
      otherwise (autograd makes some, pytorch#106951) is first copied into the parameter's layout.
      On the CPU fused SGD and Adam do not check, and update the wrong elements (a channels-last
      weight with a contiguous gradient: off by 0.4, measured);
    - fused SGD fails when some parameters have a momentum buffer and others none yet (a layer
      frozen for the first steps, as DINO's last): a parameter's first gradient gets a zero buffer,
      and 0 x momentum + gradient is the per-parameter loop's first buffer, the gradient itself."""
    for group in optimizer.param_groups:
        if not group.get("fused"):
            continue
        for param in group["params"]:
            grad = param.grad
            if grad is None:
                continue
            if grad.stride() != param.stride() and not same_layout(param, grad):
                param.grad = torch.empty_like(param).copy_(grad)
            if group.get("momentum") and optimizer.state[param].get("momentum_buffer") is None:
                optimizer.state[param]["momentum_buffer"] = torch.zeros_like(param)
    scaler.step(optimizer)


def keep_implementation(optimizer: torch.optim.Optimizer) -> None:
    """After ``load_state_dict``: this run's implementation, not the checkpoint's. torch restores the
    saved groups whole, flags included: a DDP checkpoint's ``fused`` would reach FSDP's shards,
    which have no fused kernels. And the state in its parameter's layout: a run resumed with
    --channels-last switched has momentum and moments laid out as the checkpoint's weights were,
    which a fused step would misread as it would such a gradient (``step``)."""
    for group in optimizer.param_groups:
        group["fused"], group["foreach"] = optimizer.defaults.get("fused"), optimizer.defaults.get("foreach")
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            for key, value in state.items():
                if key == "step" and torch.is_tensor(value):  # fused steps count on the parameter's device
                    state[key] = value.to(param.device if group["fused"] else "cpu", torch.float32)
                elif torch.is_tensor(value) and value.shape == param.shape and not same_layout(param, value):
                    state[key] = torch.empty_like(param).copy_(value)


def same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal strides wherever a dimension has more than one element (elsewhere a stride is unused)."""
    return all(x == y for x, y, size in zip(a.stride(), b.stride(), a.shape) if size > 1)


def lr_factor(schedule: ScheduleOptions, start: float, end: float, base_lr: float) -> float:
    """Multiplier of the base LR for an optimizer step that trains from progress ``start`` to
    ``end`` (in epochs): linear warmup up to ``end``, then the schedule at ``start``."""
    warmup = schedule.warmup_epochs
    if warmup > 0 and start < warmup:
        return min(1.0, end / warmup)
    if schedule.lr_schedule == "cosine":
        span = schedule.epochs - warmup
        fraction = min(1.0, (start - warmup) / span) if span > 0 else 1.0
        floor = min(schedule.min_lr / base_lr, 1.0)  # --min-lr is a rate: the same after --scale-lr or a new --lr
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * fraction))
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
    """The learning rate the console and the ``lr`` record show: the first optimizer's base rate
    at this point of the schedule, as the start line's and ``--lr``'s (a group's ``lr_mult``, as
    --head-lr-mult's, left out: the head's 10x once showed as the run's rate); each optimizer's is
    in the record's ``lrs`` where a run has several."""
    group = next(iter(optimizers.values())).param_groups[0]
    return group["lr"] / group.get("lr_mult", 1.0)

"""What makes a run diverged: a non-finite loss, weight or validation metric, named for the one
line that stops the run (the trainer decides when to look; this module what it sees)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from ..checkpoint import LATEST
from ..errors import RunFailed


def loss_name(name: str) -> str:
    return "loss" if name == "loss" else f"loss {name}"


def first_non_finite(losses: dict[str, torch.Tensor], models: dict[str, nn.Module], device: torch.device) -> str | None:
    """The first loss or weight with an inf or nan in it, named; None when all are finite. One host
    sync, however many tensors."""
    named = [(f"train {loss_name(name)}", value.detach()) for name, value in losses.items()]
    named += [
        (f"weight {model}.{name}", _local(param.detach()))
        for model, network in models.items()
        for name, param in network.named_parameters()
    ]
    if not named:
        return None
    finite = torch.stack([torch.isfinite(value).all().to(device) for _, value in named]).tolist()
    return next((name for (name, _), ok in zip(named, finite) if not ok), None)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a sharded weight (``--strategy fsdp``; each rank checks its own shard)."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def non_finite_metric(metrics: dict[str, Any]) -> str | None:
    """The first validation metric that is inf or nan, as ``name value``; None when all are finite."""
    bad = [name for name, value in metrics.items() if isinstance(value, numbers.Real) and not math.isfinite(value)]
    return f"{bad[0]} became {metrics[bad[0]]}" if bad else None


def diverged(what: str, epoch: int, saved_epoch: int, lr: float, precision: str) -> RunFailed:
    """The one line that stops a diverged run: what, when, what was kept, what to try."""
    kept = f"{LATEST} holds epoch {saved_epoch}" if saved_epoch else "no checkpoint was saved yet"
    # fp16 ends at 65504: a network whose activations grow (Barlow Twins on a backbone without
    # normalisation did, on an H100 and on the CPU) overflows there while fp32 and bf16 go on.
    range_hint = "; fp16 overflows above 65504, where bf16 has float32's range" if precision == "fp16" else ""
    return RunFailed(
        f"{what} (epoch {epoch}): training diverged, so it stopped; {kept}. "
        f"Lower --lr (it is {lr:g}) or add --warmup-epochs{range_hint}"
    )


def non_finite_at_start(what: str) -> RunFailed:
    """A loss that is inf or nan at the very first step came before any update: from the data or
    the model as built, not from the learning rate."""
    return RunFailed(
        f"{what} at step 1, before any update: the data or the model gave it, not the learning rate; "
        "look for inf or nan in the inputs and targets (a division by zero, log(0) in the loss, an "
        "image that did not decode)"
    )


def rank_divergence(strategy: Any, models: Iterable[nn.Module]) -> tuple[float, str | None]:
    """The largest difference between the ranks' copies of any parameter or buffer at the end of a
    run, and a warning where there is one (DDP keeps the parameters identical, phalanx the buffers)."""
    worst = max((strategy.max_divergence(model) for model in models), default=0.0)
    return worst, (
        f"phalanx: warning: the ranks' parameters or buffers differ by up to {worst:.3g} (DDP keeps the "
        "parameters identical, phalanx the buffers after each step; something changed them outside the "
        "forward, backward and optimizer)"
        if worst > 0
        else None
    )

"""What keeps DDP ranks' networks the same beyond their weights: rank 0's buffers (BatchNorm's
running statistics) on every rank once a step, and the end-of-run comparison of every parameter
and buffer with rank 0's.

DDP's default broadcasts rank 0's buffers before every forward. A task calls a network once per
view, and each of those broadcasts stopped both ranks mid-step (SimSiam's step under 2 gloo workers
took 6% longer with them and its monitor's gather): phalanx's DDP networks broadcast none, and
``broadcast_from_rank0`` sends every network's buffers after each optimizer step instead (a
momentum teacher's too, which DDP never wraps). A network called once a step sees what DDP's default
gives it: rank 0's buffers at its forward."""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn


def ddp_without_buffer_broadcasts(
    model: nn.Module, device_ids: list[int] | None, find_unused_parameters: bool
) -> nn.Module:
    """``model`` in DDP, its buffers rank 0's at the start and never broadcast by a forward."""
    ddp = nn.parallel.DistributedDataParallel
    if "forward_sync_buffers" in inspect.signature(ddp.__init__).parameters:  # torch >= 2.13
        return ddp(
            model, device_ids=device_ids, find_unused_parameters=find_unused_parameters, forward_sync_buffers=False
        )  # (still synchronised at construction)
    wrapped = ddp(model, device_ids=device_ids, find_unused_parameters=find_unused_parameters, broadcast_buffers=False)
    broadcast_from_rank0([model])  # the older flag also skips the start's broadcast
    return wrapped


def _on_the_wire(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor every backend broadcasts (gloo takes no bool)."""
    return tensor.to(torch.uint8) if tensor.dtype == torch.bool else tensor


def broadcast_from_rank0(models: Iterable[nn.Module], clock: Any = None) -> None:
    """Every rank takes rank 0's buffers of ``models``: one broadcast per dtype."""
    import contextlib

    import torch.distributed as dist

    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for model in models:
        for buffer in model.buffers():
            if buffer.numel():
                by_dtype.setdefault(buffer.dtype, []).append(buffer)
    for buffers in by_dtype.values():
        flat = _on_the_wire(torch.cat([buffer.detach().reshape(-1) for buffer in buffers]))
        with clock.collective() if clock is not None else contextlib.nullcontext():
            dist.broadcast(flat, src=0)
        at = 0
        for buffer in buffers:
            buffer.data.copy_(flat[at : at + buffer.numel()].view_as(buffer))
            at += buffer.numel()


def max_difference_from_rank0(model: nn.Module, device: torch.device) -> float:
    """The largest difference of any parameter or buffer of this rank's ``model`` from rank 0's,
    over every rank (each tensor broadcast in turn: once, at the end of a run)."""
    import torch.distributed as dist

    worst = torch.zeros((), device=device, dtype=torch.float64)
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if not tensor.numel():
                continue
            mine = _on_the_wire(tensor.detach())
            reference = mine.clone()
            dist.broadcast(reference, src=0)
            difference = (mine - reference).abs() if mine.is_complex() else (mine.double() - reference.double()).abs()
            worst = torch.maximum(worst, difference.max().double())
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return worst.item()

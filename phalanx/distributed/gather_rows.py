"""all_gather with gradients, for losses over the global batch (SimCLR's negatives, Barlow Twins'
cross-correlation, ...): ``DDPStrategy.all_gather_rows``."""

from __future__ import annotations

from typing import Any

import torch

from .comm_clock import CommClock


class GatherRows(torch.autograd.Function):
    """all_gather with gradients. Forward: every rank's rows (padded to the largest share for the
    collective, the padding dropped). Backward: the gradient of every rank's loss with respect to
    this rank's rows is the sum over ranks, so it is all-reduced before this rank takes its own
    rows. Without that sum each rank would keep only its own loss's share (the bug of Lightly's
    GatherLayer, lightly-ai/lightly#1528)."""

    @staticmethod
    def forward(
        ctx: Any, tensor: torch.Tensor, rows: int, counts: list[int], rank: int, clock: CommClock
    ) -> torch.Tensor:
        import torch.distributed as dist

        most = max(counts)
        padded = tensor.new_zeros((most, *tensor.shape[1:]))
        padded[:rows] = tensor[:rows]
        parts = [torch.empty_like(padded) for _ in counts]
        dist.all_gather(parts, padded)
        ctx.rows, ctx.counts, ctx.rank, ctx.most, ctx.local_rows = rows, counts, rank, most, tensor.shape[0]
        ctx.clock = clock
        return torch.cat([part[:n] for part, n in zip(parts, counts)])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        import torch.distributed as dist

        padded = grad.new_zeros((len(ctx.counts), ctx.most, *grad.shape[1:]))
        at = 0
        for index, count in enumerate(ctx.counts):
            padded[index, :count] = grad[at : at + count]
            at += count
        with ctx.clock.collective():
            dist.all_reduce(padded)
        mine = grad.new_zeros((ctx.local_rows, *grad.shape[1:]))
        mine[: ctx.rows] = padded[ctx.rank, : ctx.rows]
        return mine, None, None, None, None

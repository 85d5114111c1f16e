"""``--sync-bn`` on CPU workers: BatchNorm over every rank's rows together.

torch's SyncBatchNorm computes with CUDA kernels only. ``GlobalBatchNorm`` does the same with
differentiable all-reduces, so gloo workers train with the statistics of the global batch: 2 workers
x B train what one process x 2B trains with plain BatchNorm. Two all-reduces per layer and forward
(the sums, then the squared deviations from the global mean, which keeps the variance as accurate
as one process's); their backward all-reduces the gradients of those sums, which is how each
rank's rows reach the other ranks' losses. A rank whose share of a step is a padding sample adds
nothing to the statistics (``padding_rows``), so an uneven last batch stays exact.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from ..errors import PhalanxError

_padding = False  # set while a rank's micro-batch is a padding sample (see padding_rows)


@contextlib.contextmanager
def padding_rows(active: bool) -> Iterator[None]:
    """While ``active``, this rank's rows count nothing in the global statistics."""
    global _padding
    before, _padding = _padding, active
    try:
        yield
    finally:
        _padding = before


def _summed_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist

    total = tensor.clone()
    dist.all_reduce(total)
    return total


class _SumOverRanks(torch.autograd.Function):
    """The sum over ranks of a tensor; its gradient, the sum over ranks of the gradients (every
    rank's loss depends on every rank's rows through the statistics)."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor) -> torch.Tensor:
        return _summed_over_ranks(tensor)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return _summed_over_ranks(grad)


def _all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    return _SumOverRanks.apply(tensor)


class GlobalBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm whose training statistics span every rank's rows (computed in float32 at least,
    as torch's BatchNorm accumulates them); in eval mode, or in a lone process, torch's BatchNorm."""

    def _check_input_dim(self, input: torch.Tensor) -> None:  # a converted SyncBatchNorm's check
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        if not (self.training and dist.is_initialized() and dist.get_world_size() > 1):
            return super().forward(x)
        self._check_input_dim(x)
        dims = [0, *range(2, x.dim())]
        shape = [1, -1] + [1] * (x.dim() - 2)
        counted = 0.0 if _padding else 1.0
        values = x.to(torch.promote_types(x.dtype, torch.float32))  # bf16 sums would keep 3 digits
        rows = values.new_full((1,), x.numel() // x.shape[1] * counted)
        totals = _all_reduce(torch.cat([values.sum(dims) * counted, rows]))
        count = totals[-1]
        mean = totals[:-1] / count
        centred = values - mean.view(shape)
        var = _all_reduce((centred * centred).sum(dims) * counted) / count
        y = centred * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        if self.track_running_stats:
            self._track(mean.detach(), var.detach(), count.detach())
        return y.to(x.dtype)

    @torch.no_grad()
    def _track(self, mean: torch.Tensor, var: torch.Tensor, count: torch.Tensor) -> None:
        """The running statistics as torch's BatchNorm moves them (the unbiased variance)."""
        tracked, running_mean, running_var = self.num_batches_tracked, self.running_mean, self.running_var
        assert tracked is not None and running_mean is not None and running_var is not None  # (track_running_stats)
        tracked.add_(1)
        factor = 1.0 / tracked.item() if self.momentum is None else self.momentum
        running_mean.mul_(1 - factor).add_(mean.to(running_mean), alpha=factor)
        unbiased = var * count / (count - 1).clamp_min(1)
        running_var.mul_(1 - factor).add_(unbiased.to(running_var), alpha=factor)


class GlobalBatchNorm1d(GlobalBatchNorm, nn.BatchNorm1d):
    _check_input_dim = nn.BatchNorm1d._check_input_dim


class GlobalBatchNorm2d(GlobalBatchNorm, nn.BatchNorm2d):
    _check_input_dim = nn.BatchNorm2d._check_input_dim


class GlobalBatchNorm3d(GlobalBatchNorm, nn.BatchNorm3d):
    _check_input_dim = nn.BatchNorm3d._check_input_dim


_GLOBAL = {
    nn.BatchNorm1d: GlobalBatchNorm1d,
    nn.BatchNorm2d: GlobalBatchNorm2d,
    nn.BatchNorm3d: GlobalBatchNorm3d,
    nn.SyncBatchNorm: GlobalBatchNorm,
}


def convert(model: nn.Module) -> nn.Module:
    """torch's BatchNorm layers of ``model`` become GlobalBatchNorm in place: the same objects, so
    their parameters, buffers, hooks and every reference to them stay (a checkpoint keeps its keys,
    ``isinstance(m, nn.BatchNorm2d)`` still holds). A BatchNorm subclass of another library (timm's
    BatchNormAct2d applies an activation in its forward) is refused rather than stripped of it."""
    for name, module in model.named_modules():
        if type(module) in _GLOBAL:
            module.__class__ = _GLOBAL[type(module)]
        elif isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(module, GlobalBatchNorm):
            raise PhalanxError(
                f"{name or 'the model'} is a {type(module).__name__}, a BatchNorm of its own that "
                "phalanx cannot synchronise on CPU workers; train without --sync-bn",
                "--sync-bn",
            )
    return model

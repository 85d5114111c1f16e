"""``--task barlowtwins`` and ``--task vicreg``: no negatives, no teacher; the loss is a statistic of
the batch's embeddings (Barlow Twins: their cross-correlation towards the identity; VICReg: their
invariance, a variance kept up and the covariances brought down).

A statistic of the batch is only the same at any world size if it is the global batch's: the
embeddings are all-gathered with their gradients (``ctx.all_gather``) and every rank computes the
loss of the whole batch, so 2 workers x B train what one process x 2B does. Lightly's
``BarlowTwinsLoss(gather_distributed=True)`` normalises each rank's embeddings by that rank's own
mean and std before summing the cross-correlations, which is not the global batch's loss
(``tests/test_ssl_family.py`` measures the difference); its VICReg is the global batch's, and
phalanx's equals it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from ..base import Batch, TaskData
from .base import SelfSupervisedTask, gather_views, mlp
from .losses import BarlowTwinsLoss, VICRegLoss
from .options import BarlowTwinsOptions, GlobalBatchOptions, VICRegOptions

if TYPE_CHECKING:
    from ...config import RunConfig
    from ..contract import Pending, StepContext, StepLosses


def embedding_std(z: torch.Tensor) -> torch.Tensor:
    """The mean over dimensions of the std of the l2-normalised embeddings: about 1/sqrt(dim) while
    they spread over the sphere, towards 0 when they collapse to one point (SimSiam's monitor).
    Give it the global batch's rows: a rank's own would make it depend on the world size."""
    if len(z) < 2:
        return z.new_zeros(())
    return nn.functional.normalize(z.detach(), dim=1).std(0).mean()


def global_embedding_std(ctx: StepContext, *views: torch.Tensor) -> Pending:
    """``embedding_std`` of the global batch's rows of each view, averaged over the views, without
    gathering the rows: per-dimension sums of this rank's counted rows, all-reduced beside the
    backward pass (a gather here stopped every rank mid-step), finished after it."""
    rows = ctx.samples  # none of a padding sample
    unit = [nn.functional.normalize(z.detach()[:rows].double(), dim=1) for z in views]
    sums = {f"{i}": torch.stack([u.sum(0), (u * u).sum(0)]) for i, u in enumerate(unit)}

    def spread(total: dict[str, torch.Tensor]) -> torch.Tensor:
        count = total["count"]
        if count < 2:
            return count.new_zeros(())
        stds = [
            ((s[1] - s[0] * s[0] / count) / (count - 1)).clamp(min=0).sqrt().mean()
            for key, s in total.items()
            if key != "count"
        ]
        return cast(torch.Tensor, sum(stds)) / len(stds)  # (cast: tensors, never none; typeshed's sum allows 0)

    return ctx.all_reduce_sums_later({**sums, "count": torch.tensor(float(rows))}, spread)


class GlobalBatchTask(SelfSupervisedTask):
    """A backbone, a three-layer projector, and a loss of the (gathered) batch's embeddings."""

    options: GlobalBatchOptions
    criterion: nn.Module  # the method's loss: its parts by name

    def build_models(self, data: TaskData) -> dict[str, nn.Module]:
        backbone, size = self.backbone(data.info)
        o = self.options
        return {"backbone": backbone, "projector": mlp(size, o.hidden_dim, o.projection_dim, o.head_norm, 2)}

    def training_step(self, batch: Batch, ctx: StepContext) -> StepLosses:
        v1, v2 = batch
        z1, z2 = self.embed(ctx.models, v1), self.embed(ctx.models, v2)
        if self.options.gather:  # every rank's rows (none of a rank whose share is a padding sample)
            z1, z2, _ = gather_views(ctx, z1, z2)
        if len(z1) < 2:  # a batch of one sample has no statistics: it weighs nothing, its graph still runs
            zero = (z1.sum() + z2.sum()) * 0.0
            return {name: zero for name in self.loss_names}
        # Every rank returns the same global loss, 0-dim: the trainer weighs it by this rank's
        # samples and the gather's backward sums every rank's share, so DDP's mean is its gradient.
        return {**self.criterion(z1, z2), "embedding_std": 0.5 * (embedding_std(z1) + embedding_std(z2))}


class BarlowTwinsTask(GlobalBatchTask):
    name = "barlowtwins"
    Options = BarlowTwinsOptions
    loss_label = "Barlow Twins loss"
    loss_names = ("loss", "on_diagonal", "off_diagonal", "embedding_std")
    metric_labels = {
        **SelfSupervisedTask.metric_labels,
        "on_diagonal": "invariance: sum of (1 - C_ii)^2",
        "off_diagonal": "redundancy: sum of C_ij^2, i != j",
        "embedding_std": "embedding std",
    }
    options: BarlowTwinsOptions

    def __init__(self, cfg: RunConfig):
        super().__init__(cfg)
        self.criterion = BarlowTwinsLoss(self.options.redundancy_weight)


class VICRegTask(GlobalBatchTask):
    name = "vicreg"
    Options = VICRegOptions
    loss_label = "VICReg loss"
    loss_names = ("loss", "invariance", "variance", "covariance", "embedding_std")
    metric_labels = {
        **SelfSupervisedTask.metric_labels,
        "invariance": "invariance (mean squared distance)",
        "variance": "variance (hinge on the std)",
        "covariance": "covariance (off-diagonal)",
        "embedding_std": "embedding std",
    }
    options: VICRegOptions

    def __init__(self, cfg: RunConfig):
        super().__init__(cfg)
        o = self.options
        self.criterion = VICRegLoss(o.invariance_weight, o.variance_weight, o.covariance_weight, o.variance_eps)

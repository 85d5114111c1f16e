"""``--task simclr``: NT-Xent over two views, its negatives from the global batch (embeddings
all-gathered with their gradients), so 2 workers x B train what one process x 2B does."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..base import TaskData
from .decorrelation import global_embedding_std
from .options import SimCLROptions
from .base import SelfSupervisedTask, gather_views, mlp


class SimCLRTask(SelfSupervisedTask):
    name = "simclr"
    Options = SimCLROptions
    loss_label = "NT-Xent loss"
    # The spread of the embeddings: a collapse (the default head on a network without BatchNorm here)
    # leaves NT-Xent near log(2B - 1) and the view loss near 0, which alone look like nothing wrong.
    loss_names = ("loss", "embedding_std")
    metric_labels = {**SelfSupervisedTask.metric_labels, "embedding_std": "embedding std (collapse: 0)"}
    options: SimCLROptions

    def build_models(self, data: TaskData) -> dict[str, nn.Module]:
        backbone, size = self.backbone(data.info)
        o = self.options
        return {"backbone": backbone, "projector": mlp(size, o.hidden_dim or size, o.projection_dim, o.head_norm)}

    def nt_xent(self, z1: torch.Tensor, z2: torch.Tensor, all1: torch.Tensor, all2: torch.Tensor,
                start: int) -> torch.Tensor:
        """Per sample: the mean of its two views' NT-Xent (Chen et al. 2020): each view's positive is
        the other view of its image, its negatives every other view in ``all1``/``all2``."""
        z1, z2 = nn.functional.normalize(z1, dim=1), nn.functional.normalize(z2, dim=1)
        candidates = torch.cat([nn.functional.normalize(all1, dim=1), nn.functional.normalize(all2, dim=1)])
        count, local = len(all1), torch.arange(len(z1), device=z1.device)
        own = local + start
        losses = []
        for anchors, itself, positive in ((z1, own, own + count), (z2, own + count, own)):
            logits = anchors @ candidates.T / self.options.temperature
            logits[local, itself] = -math.inf  # a view is not its own negative
            losses.append(nn.functional.cross_entropy(logits, positive, reduction="none"))
        return 0.5 * (losses[0] + losses[1])

    def training_step(self, batch: Any, ctx: Any) -> dict[str, torch.Tensor]:
        v1, v2 = batch
        z1, z2 = self.embed(ctx.models, v1), self.embed(ctx.models, v2)
        spread = global_embedding_std(ctx, z1, z2)  # every rank joins its all-reduce, a padding one too
        if self.options.gather:
            all1, all2, start = gather_views(ctx, z1, z2)
        else:
            (all1, start), all2 = (z1, 0), z2
        if not ctx.samples:  # a padding sample: it takes part, weighing nothing, through the gather
            # (whose backward is a collective every rank must join: through z1 alone, the other
            # rank's all-reduce met this rank's DDP gradient bucket and gloo aborted)
            return {"loss": (all1.sum() + all2.sum()) * 0.0, "embedding_std": spread}
        return {"loss": self.nt_xent(z1, z2, all1, all2, start), "embedding_std": spread}

"""``--task simclr``: NT-Xent over two views, its negatives from the global batch (embeddings
all-gathered with their gradients), so 2 workers x B train what one process x 2B does."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from ..base import Batch, TaskData
from .base import SelfSupervisedTask, gather_views, mlp
from .decorrelation import global_embedding_std
from .losses import NTXentLoss
from .options import SimCLROptions

if TYPE_CHECKING:
    from ...config import RunConfig
    from ..contract import StepContext, StepLosses


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

    def __init__(self, cfg: RunConfig):
        super().__init__(cfg)
        self.criterion = NTXentLoss(self.options.temperature)

    def training_step(self, batch: Batch, ctx: StepContext) -> StepLosses:
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
        return {"loss": self.criterion(z1, z2, all1, all2, start), "embedding_std": spread}

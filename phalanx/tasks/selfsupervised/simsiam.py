"""``--task simsiam``: each view's embedding, through a predictor, is pulled towards the other view's
embedding, which gets no gradient (Chen & He 2021). No negatives and no teacher: the loss is per
sample, so it is the same at any world size without a gather."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..base import Batch, TaskData
from .base import SelfSupervisedTask, mlp
from .decorrelation import global_embedding_std
from .losses import NegativeCosineLoss
from .options import SimSiamOptions

if TYPE_CHECKING:
    from ..contract import StepContext, StepLosses


class SimSiamTask(SelfSupervisedTask):
    name = "simsiam"
    Options = SimSiamOptions
    loss_label = "SimSiam loss (-cos)"
    view_loss_meaning = "SimSiam's loss between an image's two views"
    loss_names = ("loss", "embedding_std")
    metric_labels = {**SelfSupervisedTask.metric_labels, "embedding_std": "embedding std (collapse: 0)"}
    options: SimSiamOptions
    criterion = NegativeCosineLoss()

    def build_models(self, data: TaskData) -> dict[str, nn.Module]:
        backbone, size = self.backbone(data.info)
        o = self.options
        return {
            "backbone": backbone,
            "projector": mlp(size, o.hidden_dim, o.projection_dim, o.head_norm, 2),
            "predictor": mlp(o.projection_dim, o.predictor_dim, o.projection_dim, o.head_norm),
        }

    def predict_pair(
        self, models: Mapping[str, nn.Module], v1: torch.Tensor, v2: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        z1, z2 = self.embed(models, v1), self.embed(models, v2)
        return models["predictor"](z1), models["predictor"](z2), z1, z2

    def training_step(self, batch: Batch, ctx: StepContext) -> StepLosses:
        p1, p2, z1, z2 = self.predict_pair(ctx.models, *batch)
        # The collapse monitor of the global batch: the same at any world size.
        return {"loss": self.criterion(p1, p2, z1, z2), "embedding_std": global_embedding_std(ctx, z1, z2)}

    def view_loss(self, models: Mapping[str, nn.Module], v1: torch.Tensor, v2: torch.Tensor) -> torch.Tensor:
        return self.criterion(*self.predict_pair(models, v1, v2))

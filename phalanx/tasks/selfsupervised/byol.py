"""``--task byol``: each view's embedding predicts a momentum teacher's embedding of the other view;
no negatives. The teacher is a network of its own without gradients, updated through phalanx's one
moving average (``recipe.ema_update``), checkpointed and resumed exactly; MoCo's is the same
(``MomentumTeacherTask``)."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
from torch import nn

from ...models.recipe import ema_update
from ..base import Batch, TaskData
from .base import SelfSupervisedTask, mlp
from .decorrelation import global_embedding_std
from .losses import BYOLLoss
from .options import BYOLOptions, DINOOptions, MoCoOptions

if TYPE_CHECKING:
    from ...config import RunConfig
    from ..contract import StepContext, StepLosses


class MomentumTeacherTask(SelfSupervisedTask):
    """A method with a momentum teacher (BYOL, MoCo): a copy of the backbone and projector without
    gradients that follows them as a moving average, its decay rising from ``--teacher-momentum``
    to 1 on a cosine over training (BYOL's schedule; Lightly's MoCo benchmark's)."""

    options: BYOLOptions | MoCoOptions | DINOOptions  # (each with its teacher_momentum)

    def __init__(self, cfg: RunConfig):
        super().__init__(cfg)
        self.progress = 0.0  # of the whole run, at the last training step (the teacher's schedule)

    @staticmethod
    def teacher_of(backbone: nn.Module, projector: nn.Module) -> nn.Module:
        # The teacher starts as the student's copy and follows it as a moving average, never by
        # backward: a network without trainable parameters (no optimizer, no DDP wrapper), moved,
        # put in train and eval mode and checkpointed as the others are.
        return copy.deepcopy(nn.Sequential(backbone, projector)).requires_grad_(False)

    def track(self, ctx: StepContext) -> None:
        self.progress = ctx.progress / max(ctx.epochs, 1)

    def after_step(self, models: Mapping[str, nn.Module]) -> None:
        """The teacher moves towards the student."""
        decay = 1 - (1 - self.options.teacher_momentum) * (math.cos(math.pi * self.progress) + 1) / 2
        ema_update(models["teacher"], nn.Sequential(models["backbone"], models["projector"]), decay)


class BYOLTask(MomentumTeacherTask):
    name = "byol"
    Options = BYOLOptions
    options: BYOLOptions
    loss_label = "BYOL loss (2 - 2 cos)"
    view_loss_meaning = "BYOL's loss between an image's two views"
    loss_names = ("loss", "embedding_std")  # the online projections' spread: a collapse warns
    metric_labels = {**MomentumTeacherTask.metric_labels, "embedding_std": "embedding std (collapse: 0)"}
    criterion = BYOLLoss()

    def build_models(self, data: TaskData) -> dict[str, nn.Module]:
        backbone, size = self.backbone(data.info)
        o = self.options
        hidden = o.hidden_dim or 4 * size
        projector = mlp(size, hidden, o.projection_dim, o.head_norm)
        predictor = mlp(o.projection_dim, hidden, o.projection_dim, o.head_norm)
        return {
            "backbone": backbone,
            "projector": projector,
            "predictor": predictor,
            "teacher": self.teacher_of(backbone, projector),
        }

    def training_step(self, batch: Batch, ctx: StepContext) -> StepLosses:
        v1, v2 = batch
        z1, z2 = self.embed(ctx.models, v1), self.embed(ctx.models, v2)
        p1, p2 = ctx.models["predictor"](z1), ctx.models["predictor"](z2)
        with torch.no_grad():
            t1, t2 = ctx.models["teacher"](v1), ctx.models["teacher"](v2)
        self.track(ctx)
        loss = self.criterion(p1, p2, t1, t2)
        return {"loss": loss, "embedding_std": global_embedding_std(ctx, z1, z2)}

    def view_loss(self, models: Mapping[str, nn.Module], v1: torch.Tensor, v2: torch.Tensor) -> torch.Tensor:
        teacher = models["teacher"]
        p1, p2 = models["predictor"](self.embed(models, v1)), models["predictor"](self.embed(models, v2))
        return self.criterion(p1, p2, teacher(v1), teacher(v2))

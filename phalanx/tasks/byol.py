"""``--task byol``: each view's embedding predicts a momentum teacher's embedding of the other view;
no negatives. The teacher is task state, checkpointed and resumed exactly."""

from __future__ import annotations

import copy
import math
from typing import Any, Mapping

import torch
from torch import nn

from . import BUILTIN
from .base import Evaluation, TaskData
from .options import BYOLOptions
from .ssl import SelfSupervisedTask, mlp


class BYOLTask(SelfSupervisedTask):
    name = "byol"
    defaults = BUILTIN["byol"].defaults  # also a subclass's (your own task built on it)
    reads = BUILTIN["byol"].reads
    Options = BYOLOptions
    loss_label = "BYOL loss (2 - 2 cos)"
    options: BYOLOptions

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        self.teacher: nn.Module | None = None
        self.progress = 0.0

    def build_models(self, data: TaskData) -> dict[str, nn.Module]:
        backbone, size = self.backbone(data.info)
        o = self.options
        hidden = o.hidden_dim or 4 * size
        projector = mlp(size, hidden, o.projection_dim, o.head_norm)
        predictor = mlp(o.projection_dim, hidden, o.projection_dim, o.head_norm)
        # The teacher starts as the student's copy and follows it as a moving average (never by backward).
        self.teacher = copy.deepcopy(nn.Sequential(backbone, projector)).requires_grad_(False)
        return {"backbone": backbone, "projector": projector, "predictor": predictor}

    def _teacher(self, like: torch.Tensor) -> nn.Module:
        param = next(self.teacher.parameters())
        if param.device != like.device or param.dtype != like.dtype:
            self.teacher.to(device=like.device, dtype=like.dtype)
        return self.teacher

    @staticmethod
    def byol(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return 2 - 2 * nn.functional.cosine_similarity(prediction, target.detach(), dim=1)

    def training_step(self, batch: Any, ctx: Any) -> dict[str, torch.Tensor]:
        v1, v2 = batch
        p1 = ctx.models["predictor"](self.embed(ctx.models, v1))
        p2 = ctx.models["predictor"](self.embed(ctx.models, v2))
        teacher = self._teacher(p1)
        with torch.no_grad():
            t1, t2 = teacher(v1), teacher(v2)
        self.progress = ctx.progress / max(ctx.epochs, 1)
        return {"loss": 0.5 * (self.byol(p1, t2) + self.byol(p2, t1))}

    def train_mode(self, models: Mapping[str, nn.Module]) -> None:
        super().train_mode(models)
        self.teacher.train()

    def evaluate(self, models: Mapping[str, nn.Module], loader: Any, ctx: Any) -> Evaluation:
        # The teacher validates as the networks do, in eval mode: its BatchNorm uses its running
        # statistics (a last validation batch of one image would fail in train mode) and validation
        # leaves them unchanged. train_mode puts it back for the next epoch.
        self.teacher.eval()
        return super().evaluate(models, loader, ctx)

    @torch.no_grad()
    def after_step(self, models: Mapping[str, nn.Module]) -> None:
        """The teacher moves towards the student; its decay rises from --teacher-momentum to 1 on a
        cosine over training (BYOL's schedule)."""
        decay = 1 - (1 - self.options.teacher_momentum) * (math.cos(math.pi * self.progress) + 1) / 2
        student = nn.Sequential(models["backbone"], models["projector"])
        teacher = self._teacher(next(student.parameters()))
        for t, s in zip(teacher.state_dict().values(), student.state_dict().values()):
            if t.is_floating_point():
                t.lerp_(s, 1 - decay)
            else:
                t.copy_(s)

    def state_dict(self) -> dict[str, Any]:
        return {"teacher": {k: v.detach().cpu().clone() for k, v in self.teacher.state_dict().items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("teacher"):
            self.teacher.load_state_dict(state["teacher"])

    def view_loss(self, models: Mapping[str, nn.Module], v1: torch.Tensor, v2: torch.Tensor) -> torch.Tensor:
        teacher = self._teacher(v1)
        p1, p2 = models["predictor"](self.embed(models, v1)), models["predictor"](self.embed(models, v2))
        return 0.5 * (self.byol(p1, teacher(v2)) + self.byol(p2, teacher(v1)))

"""``--task dino`` (Caron et al. 2021, as Lightly's ``DINOLoss`` computes it): a student learns to
give every crop of an image (two global crops and ``--local-views`` small ones) the distribution a
momentum teacher gives the other global crop. The teacher's outputs are centred (a moving average
of their batch mean) and sharpened (a low temperature, warmed up over the first epochs); the
head's last layer does not train in the first ``--freeze-last-layer`` epochs.

Exact at any world size (with ``--head-norm batch``, under ``--sync-bn``, as any BatchNorm): the
loss is per sample, and the centre moves with the mean of the global
batch's teacher outputs (summed over ranks with their count, so an uneven or padding share weighs
what it holds). The centre is task state, checkpointed and resumed. Lightly's centre averages each
rank's mean, which is the global mean only when every rank holds as many samples.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..base import Batch, Plain, PlainRecord, TaskData
from .byol import MomentumTeacherTask
from .losses import DINOLoss
from .options import DINOOptions

if TYPE_CHECKING:
    from ...config import RunConfig
    from ..contract import Pending, RunContext, StepContext, StepLosses

# A teacher's mean entropy above this share of the uniform distribution's warns of a collapse: at the
# first epoch 0.40-0.73 of it here (heads of 64 to 4,096 outputs); collapsed runs reached 0.99.
COLLAPSED = 0.95


class DINOHead(nn.Module):
    """Linear-GELU-Linear-GELU-Linear to a bottleneck (with ``norm`` batch, a BatchNorm after each
    hidden Linear), l2-normalised, then a last layer whose rows are unit vectors (DINO's
    weight-normalised layer with its norm fixed at 1). A step's crops go through it together
    (``DINOTask.student``), as in DINO."""

    def __init__(self, inputs: int, hidden: int, bottleneck: int, outputs: int, norm: str = "none"):
        super().__init__()

        def block(size: int) -> list[nn.Module]:  # DINO's use_bn_in_head: a BatchNorm after each hidden Linear
            return [nn.Linear(size, hidden), *([nn.BatchNorm1d(hidden)] if norm == "batch" else []), nn.GELU()]

        self.layers = nn.Sequential(*block(inputs), *block(hidden), nn.Linear(hidden, bottleneck))
        for layer in self.layers:
            if isinstance(layer, nn.Linear):  # DINO's initialisation
                nn.init.trunc_normal_(layer.weight, std=0.02, a=-2, b=2)
                nn.init.zeros_(layer.bias)
        self.last_layer = nn.Parameter(nn.Linear(bottleneck, outputs, bias=False).weight.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.normalize(self.layers(x), dim=-1)
        return x @ nn.functional.normalize(self.last_layer, dim=1).T


class DINOTask(MomentumTeacherTask):
    name = "dino"
    Options = DINOOptions
    loss_label = "DINO loss (teacher to student cross-entropy)"
    view_loss_meaning = "DINO's loss between an image's two views"
    loss_names = ("loss", "teacher_entropy", "center_norm")
    metric_labels = {
        **MomentumTeacherTask.metric_labels,
        "teacher_entropy": "teacher entropy (nats)",
        "center_norm": "centre norm",
    }
    manual_optimization = True  # the last layer's gradient is dropped in the first epochs
    options: DINOOptions

    def __init__(self, cfg: RunConfig):
        super().__init__(cfg)
        self.center = torch.zeros(self.options.output_dim, dtype=torch.float64)
        self.criterion = DINOLoss(self.options.student_temp)

    def build_models(self, data: TaskData) -> dict[str, nn.Module]:
        backbone, size = self.backbone(data.info)
        o = self.options
        head = DINOHead(size, o.hidden_dim, o.bottleneck_dim, o.output_dim, o.head_norm)
        return {"backbone": backbone, "projector": head, "teacher": self.teacher_of(backbone, head)}

    def param_groups(self, models: Mapping[str, nn.Module]) -> dict[str, list[dict[str, object]]]:
        return {
            "student": [
                {"params": [*models["backbone"].parameters(), *models["projector"].parameters()], "lr_mult": 1.0}
            ]
        }

    def teacher_temperature(self, epoch: int) -> float:
        """Linear from --warmup-teacher-temp to --teacher-temp over the warmup epochs (epoch 1-based)."""
        o = self.options
        if epoch > o.warmup_teacher_temp_epochs:
            return o.teacher_temp
        steps = torch.linspace(o.warmup_teacher_temp, o.teacher_temp, o.warmup_teacher_temp_epochs, dtype=torch.float64)
        return float(steps[epoch - 1])

    @torch.no_grad()
    def update_center(self, teacher: torch.Tensor, ctx: RunContext, counted: bool = True) -> Pending:
        """The centre moves towards the global batch's mean teacher output (every rank's rows; none
        of a rank whose share is a padding sample: ``counted`` False). Started now, moved at the
        result (the new centre's norm): the sums' all-reduce runs beside the backward pass."""
        rows = teacher if counted else teacher[:, :0]
        momentum = self.options.center_momentum

        def move(sums: dict[str, torch.Tensor]) -> torch.Tensor:
            self.center = self.center.to(sums["sum"]) * momentum + sums["sum"] / sums["count"] * (1 - momentum)
            return self.center.norm()

        count = torch.tensor(float(rows.shape[0] * rows.shape[1]))
        return ctx.all_reduce_sums_later({"sum": rows.sum((0, 1)), "count": count}, move)

    @staticmethod
    def student(models: Mapping[str, nn.Module], views: list[torch.Tensor]) -> list[torch.Tensor]:
        """The crops of each size through the backbone together (the global ones, then the local
        ones), then every crop through the head at once, as DINO's multi-crop wrapper does: a
        BatchNorm normalises over the crops of a size (the backbone's) or of the step (the head's)."""
        sizes = [same for same in (views[:2], views[2:]) if same]
        outputs = models["projector"](torch.cat([models["backbone"](torch.cat(same)) for same in sizes]))
        return list(outputs.split([len(view) for view in views]))

    @staticmethod
    def teacher(models: Mapping[str, nn.Module], views: list[torch.Tensor]) -> list[torch.Tensor]:
        """The global crops through the teacher together (DINO's teacher sees no local crop)."""
        return list(models["teacher"](torch.cat(views[:2])).split([len(view) for view in views[:2]]))

    def training_step(self, batch: Batch, ctx: StepContext) -> StepLosses:
        views = list(batch)
        self.track(ctx)
        with torch.no_grad():
            teacher = self.teacher(ctx.models, views)
        student = self.student(ctx.models, views)
        loss, entropy = self.criterion(teacher, student, self.center, self.teacher_temperature(ctx.epoch))
        center_norm = self.update_center(torch.stack(teacher), ctx, bool(ctx.samples))  # moved after the backward
        ctx.backward(loss, "student")
        if ctx.epoch <= self.options.freeze_last_layer:
            for name, param in ctx.models["projector"].named_parameters():
                if name.endswith("last_layer"):
                    param.grad = None
        ctx.step("student")
        return {"loss": loss.detach(), "teacher_entropy": entropy, "center_norm": center_norm}

    def collapse(self, train: dict[str, float]) -> str | None:
        """The teacher's outputs near the uniform distribution: DINO's collapse (seen here with small
        networks on the built-in digits, and with Lightly's DINO on the same work)."""
        uniform = math.log(self.options.output_dim)
        if train["teacher_entropy"] < COLLAPSED * uniform:
            return None
        return (
            f"the teacher's mean entropy is {train['teacher_entropy']:.3f} nats, the uniform distribution's over "
            f"{self.options.output_dim} outputs {uniform:.3f}: DINO has collapsed (the teacher gives every image "
            "the same distribution; the loss is then its entropy whatever the backbone gives)"
            + (
                "; try --head-norm batch (it kept DINO from collapsing on the built-in digits)"
                if self.options.head_norm == "none"
                else ""
            )
        )

    def view_loss(self, models: Mapping[str, nn.Module], v1: torch.Tensor, v2: torch.Tensor) -> torch.Tensor:
        """Per sample: DINO's own loss between the two validation views (the views' alignment says
        nothing here: the head's outputs of any two views are nearly parallel)."""
        return self.criterion(
            self.teacher(models, [v1, v2]), self.student(models, [v1, v2]), self.center, self.options.teacher_temp
        )[0]

    def state_dict(self) -> dict[str, Plain]:
        return {"center": self.center.detach().cpu().clone()}

    def load_state_dict(self, state: PlainRecord) -> None:
        if "center" in state:
            self.center = state["center"]

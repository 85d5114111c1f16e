"""``--task deepliif-kd``: DeepLIIFKD (DeepLIIF 1.2.7's ``DeepLIIFKDModel``), DeepLIIF's model
distilled from a trained one.

The student is ``--task deepliif``'s model, networks, names and files. The teacher is a DeepLIIF
model directory (``--teacher DIR``, read as ``predict --checkpoint DIR`` reads one: its
``train_opt.txt``, its ``latest_net_*.pth`` or ``G*.pt``), run without gradients as ``deepliif
test`` runs it, its segmentation networks weighted equally (DeepLIIF's distillation passes no
weights). Each step is DeepLIIF's (``--gan-mode vanilla`` and ``--gan-mode-s lsgan`` fixed, as
DeepLIIFKD fixes them) plus, in the generators' loss, ``--kd-weight`` (10) x the KL divergence from
the teacher's output to the student's, for every modality, every segmentation network and the
weighted segmentation. DeepLIIF takes each divergence over one softmax of all the batch's pixels
(``view(1, 1, -1)``): under DDP the outputs are gathered from every rank, so 2 workers x B compute
what one process x 2B does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from ...errors import PhalanxError
from ..base import Declaration, StepContext, TaskData
from ..inference import Trained
from ..translate.nets import check_generator
from .options import DeepLIIFKDOptions
from .task import DeepLIIFTask

if TYPE_CHECKING:
    from ...config import RunConfig

OPTION = "--teacher"


class DeepLIIFKDTask(DeepLIIFTask):
    name = "deepliif-kd"
    Options = DeepLIIFKDOptions
    options: DeepLIIFKDOptions

    def __init__(self, cfg: RunConfig):
        super().__init__(cfg)
        self.teacher: Trained | None = None
        self.channels = 3  # (the data's, once read)
        if cfg.optim.grad_accum > 1:
            raise PhalanxError(
                "DeepLIIFKD's divergences take one softmax over each batch's pixels; --grad-accum would split the "
                "batch into several: give the batch whole (--batch-size)",
                "--grad-accum",
            )

    def distilled(self) -> list[str]:
        """The outputs distilled, by their KL loss's suffix: each modality (1 ... m), each
        segmentation network (S0 ... Sm) and the weighted segmentation (S)."""
        m = self.modalities
        return [str(i + 1) for i in range(m)] + [f"S{k}" for k in range(m + 1)] + ["S"]

    def declare(self, data: TaskData, models: Mapping[str, nn.Module]) -> Declaration:
        declared = super().declare(data, models)
        return replace(declared, loss_names=declared.loss_names + tuple(f"G_KLDiv_{s}" for s in self.distilled()))

    def build_data(self) -> TaskData:
        data = super().build_data()
        self.channels = data.info["channels"]
        self.load_teacher()  # before the first step: a wrong directory is one line, nothing written
        return data

    def load_teacher(self) -> Trained:
        if self.teacher is None:
            from . import train_opt
            from .model_dir import trained_from

            folder, m = Path(self.options.teacher), self.modalities
            found = train_opt.settings(folder, OPTION) if folder.is_dir() else None
            if found is None:
                raise PhalanxError(
                    f"{folder} is not a DeepLIIF model directory (train_opt.txt and latest_net_G1.pth, ... or G1.pt, ...)",
                    OPTION,
                )
            if (int(found["modalities_no"]), bool(found["seg_gen"])) != (m, True):
                raise PhalanxError(
                    f"{folder} makes {found['modalities_no']} modalities{' and a segmentation' if found['seg_gen'] else ''};"
                    f" this student's data {m} and a segmentation",
                    OPTION,
                )
            size = self.cfg.data.image_size
            for key in ("netG", "net_gs"):  # the teacher runs on the student's images, at their size
                check_generator(train_opt.one_value(found[key], key, folder, OPTION), size, OPTION)
            teacher = trained_from(folder, False, {}, {"seg_weights": tuple([1 / (m + 1)] * (m + 1))}, OPTION)
            assert teacher is not None  # (its train_opt.txt was read above)
            if teacher.info["channels"] != self.channels:
                raise PhalanxError(f"{folder} takes RGB images; the student's data is grayscale", OPTION)
            for model in teacher.models.values():
                model.requires_grad_(False)
            self.teacher = teacher
        return self.teacher

    @torch.no_grad()
    def teacher_outputs(self, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        """The teacher's outputs by the student's loss suffixes, as DeepLIIF's ``run_dask`` makes
        them (in eval mode, each batch's BatchNorm statistics)."""
        teacher = self.load_teacher()
        task = teacher.task
        assert isinstance(task, DeepLIIFTask)
        models = {name: model.to(device=inputs.device, dtype=inputs.dtype) for name, model in teacher.models.items()}
        outputs = task.test_outputs(models, inputs, intermediate=True)
        names = task.modality_names()
        found = {str(i + 1): outputs[task.output_folder(i)] for i in range(task.modalities)}
        found.update({f"S{k}": outputs[f"{names[k]}_s"] for k in range(task.modalities + 1)})
        found["S"] = outputs["Seg"]
        return found

    def distillation(
        self,
        inputs: torch.Tensor,
        outputs: list[torch.Tensor],
        parts: list[torch.Tensor],
        losses: dict[str, torch.Tensor],
        ctx: StepContext,
    ) -> torch.Tensor | int:
        """``--kd-weight`` x the divergence of each output from the teacher's."""
        m = self.modalities
        students = {str(i + 1): outputs[i] for i in range(m)}
        students.update({f"S{k}": part for k, part in enumerate(parts)})
        students["S"] = outputs[m]
        teacher = self.teacher_outputs(inputs)
        total: torch.Tensor | int = 0
        for suffix, student in students.items():
            losses[f"G_KLDiv_{suffix}"], share = batch_kl(student, teacher[suffix], ctx)
            total = total + share * self.options.kd_weight
        return total


def batch_kl(student: torch.Tensor, teacher: torch.Tensor, ctx: StepContext) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepLIIF's ``KLDivLoss('batchmean')(log_softmax(student.view(1, 1, -1)), softmax(teacher.view(1,
    1, -1)))``: one softmax over every pixel of the batch, gathered from every rank. Returns the
    divergence (for each of this rank's samples, to log) and this rank's samples' per-sample loss:
    each one's share of the divergence times the batch's samples, whose mean over the batch is the
    divergence."""
    everyone, start = ctx.all_gather(student.flatten(1))
    theirs, _ = ctx.all_gather(teacher.flatten(1))
    log_student = torch.log_softmax(everyone.flatten(), 0).view_as(everyone)
    log_teacher = torch.log_softmax(theirs.flatten(), 0).view_as(theirs)
    rows = (log_teacher.exp() * (log_teacher - log_student)).sum(1)
    divergence = rows.detach().sum().expand(len(student))
    if not ctx.samples:  # a padding sample: its rows were not gathered, and it weighs nothing
        return divergence, student.new_zeros(len(student))
    return divergence, rows[start : start + len(student)] * len(everyone)

"""``--task swav`` (Caron et al. 2020, as Lightly's ``SwaVLoss`` computes it):
each image's crops are scored against learned prototypes; the scores of each global crop are
turned into codes by Sinkhorn-Knopp (equal use of the prototypes over the batch), and every other
crop predicts them. The prototypes are unit vectors (renormalised after every step) and do not
train in the first ``--freeze-prototypes`` epochs.

Sinkhorn-Knopp balances the prototypes over the **global** batch: every rank's scores are
gathered (without gradients) and the codes computed once for all of them, so 2 workers x B train
what one process x 2B does, uneven shares included; Lightly's distributed Sinkhorn assumes every
rank holds as many samples. With ``--queue-length``, the features of the latest global batches
(each global crop's, in the samples' order, the same on every rank) are scored by the current
prototypes and join the codes' balance (Lightly's ``queue_outputs``), from ``--queue-start-epoch``
once the queue is full; the queue is the task's state, checkpointed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from ..base import Batch, Plain, PlainRecord, TaskData
from .base import SelfSupervisedTask, mlp
from .decorrelation import global_embedding_std
from .losses import SwAVLoss, sinkhorn
from .options import SwAVOptions

if TYPE_CHECKING:
    from ...config import RunConfig
    from ..contract import StepContext, StepLosses


class SwAVTask(SelfSupervisedTask):
    name = "swav"
    Options = SwAVOptions
    loss_label = "SwAV loss (swapped prediction)"
    loss_names = ("loss", "prototype_usage", "embedding_std")  # the features' spread: a collapse warns
    metric_labels = {
        **SelfSupervisedTask.metric_labels,
        "prototype_usage": "prototypes in use (fraction)",
        "embedding_std": "embedding std (collapse: 0)",
    }
    manual_optimization = True  # the prototypes' gradient is dropped in the first epochs
    options: SwAVOptions

    def build_models(self, data: TaskData) -> dict[str, nn.Module]:
        backbone, size = self.backbone(data.info)
        o = self.options
        prototypes = nn.Linear(o.projection_dim, o.prototypes, bias=False)  # SwAV's (Lightly's has a bias)
        self.normalize(prototypes)
        return {
            "backbone": backbone,
            "projector": mlp(size, o.hidden_dim, o.projection_dim, o.head_norm),
            "prototypes": prototypes,
        }

    @staticmethod
    @torch.no_grad()
    def normalize(prototypes: nn.Module) -> None:
        weight = cast(torch.Tensor, prototypes.weight)  # (nn.Module's types: any attribute a Tensor or a Module)
        weight.div_(weight.norm(dim=1, keepdim=True))

    def param_groups(self, models: Mapping[str, nn.Module]) -> dict[str, list[dict[str, object]]]:
        return {"model": [{"params": [p for m in models.values() for p in m.parameters()], "lr_mult": 1.0}]}

    def __init__(self, cfg: RunConfig):
        super().__init__(cfg)
        self.queue: torch.Tensor | None = None  # (2, --queue-length, projection) features, newest first
        self.queued = 0
        self.criterion = SwAVLoss(self.options.temperature)

    @torch.no_grad()
    def codes(self, everyone: torch.Tensor, queued: torch.Tensor | None) -> torch.Tensor:
        """Sinkhorn-Knopp's codes of the global batch's scores, balanced with the queue's scores
        beside them (their own codes dropped), as Lightly's ``SwaVLoss`` with ``queue_outputs``."""
        scores = everyone if queued is None else torch.cat([everyone, queued])
        return sinkhorn(scores, self.options.sinkhorn_iterations, self.options.sinkhorn_epsilon)[: len(everyone)]

    def queued_scores(self, crop: int, prototypes: nn.Module, epoch: int) -> torch.Tensor | None:
        length = self.options.queue_length
        if not length or epoch < self.options.queue_start_epoch or self.queued < length:
            return None
        assert self.queue is not None  # (queued: the queue is full)
        with torch.no_grad():
            return prototypes(self.queue[crop].to(next(prototypes.parameters())))

    @torch.no_grad()
    def enqueue(self, features: list[torch.Tensor]) -> None:
        """The global batch's features (each global crop's) in front, the oldest dropped."""
        length = self.options.queue_length
        new = torch.stack(features)
        if self.queue is None:
            self.queue = new.new_zeros((len(features), length, new.shape[-1]))
        self.queue = torch.cat([new, self.queue.to(new)], dim=1)[:, :length]  # (a resumed queue: to the device)
        self.queued = min(length, self.queued + new.shape[1])

    def state_dict(self) -> dict[str, Plain]:
        return {} if self.queue is None else {"queue": self.queue.detach().cpu().clone(), "queued": self.queued}

    def load_state_dict(self, state: PlainRecord) -> None:
        if "queue" in state:  # (a run resumed with a shorter --queue-length keeps the newest)
            length = self.options.queue_length
            self.queue, self.queued = state["queue"][:, :length], min(int(state["queued"]), length)

    def training_step(self, batch: Batch, ctx: StepContext) -> StepLosses:
        views = list(batch)
        features = [nn.functional.normalize(self.embed(ctx.models, v), dim=1) for v in views]
        scores = [ctx.models["prototypes"](f) for f in features]
        spread = global_embedding_std(ctx, *features[:2])  # the global crops'; every rank joins, a padding one too
        codes, used = [], []
        for crop, score in enumerate(scores[:2]):  # the global crops' codes, from the global batch's scores
            everyone, start = ctx.all_gather(score.detach())
            with ctx.frozen("prototypes") as prototypes:  # (outside DDP's bookkeeping)
                queued = self.queued_scores(crop, prototypes, ctx.epoch)
            code = self.codes(everyone, queued)
            used.append(code.argmax(1))
            codes.append(code[start : start + len(score)] if ctx.samples else torch.zeros_like(score))
        if self.options.queue_length:  # this global batch's features, in the samples' order, on every rank
            self.enqueue([ctx.all_gather_in_order(f.detach()) for f in features[:2]])
        loss = self.criterion(scores, codes)
        ctx.backward(loss, "model")
        if ctx.epoch <= self.options.freeze_prototypes:
            for param in ctx.models["prototypes"].parameters():
                param.grad = None
        ctx.step("model")
        usage = torch.cat(used).unique().numel() / self.options.prototypes
        return {"loss": loss.detach(), "prototype_usage": loss.new_tensor(usage), "embedding_std": spread}

    def after_step(self, models: Mapping[str, nn.Module]) -> None:
        self.normalize(models["prototypes"])  # back on the unit sphere before the next step

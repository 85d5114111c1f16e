"""``--task moco`` (MoCo v2, as Lightly's benchmark trains it): a query (the student's embedding of
one view) is told apart from a queue of keys (a momentum encoder's embeddings of earlier batches)
by its own key (the momentum encoder's embedding of the other view): InfoNCE, per sample.

The queue is task state, checkpointed and resumed exactly. Every rank's keys enter it after each
micro-batch, gathered in the batch's sample order (``ctx.all_gather_in_order``), so every rank
holds the same queue and 2 workers x B fill it as one process x 2B does; Lightly's memory bank with
``gather_distributed=True`` enqueues in rank order, which differs from one process's as soon as the
queue wraps within a batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from ..base import Batch, Plain, PlainRecord, TaskData
from .base import mlp
from .byol import MomentumTeacherTask
from .decorrelation import embedding_std
from .losses import InfoNCELoss
from .options import MoCoOptions

if TYPE_CHECKING:
    from ...config import RunConfig
    from ..contract import StepContext, StepLosses


class MoCoTask(MomentumTeacherTask):
    name = "moco"
    Options = MoCoOptions
    loss_label = "InfoNCE loss against the queue"
    loss_names = ("loss", "embedding_std")
    metric_labels = {**MomentumTeacherTask.metric_labels, "embedding_std": "key embedding std (collapse: 0)"}
    options: MoCoOptions

    def __init__(self, cfg: RunConfig):
        super().__init__(cfg)
        # Lightly's memory bank starts as random unit vectors; seeded, so every rank's is the same.
        generator = torch.Generator().manual_seed(cfg.seed)
        queue = torch.randn(
            self.options.queue_size, self.options.projection_dim, generator=generator, dtype=torch.float64
        )
        self.queue = nn.functional.normalize(queue, dim=1)
        self.queue_at = 0  # where the next key goes
        self.criterion = InfoNCELoss(self.options.temperature)

    def build_models(self, data: TaskData) -> dict[str, nn.Module]:
        backbone, size = self.backbone(data.info)
        o = self.options
        projector = mlp(size, o.hidden_dim or size, o.projection_dim, o.head_norm)
        return {"backbone": backbone, "projector": projector, "teacher": self.teacher_of(backbone, projector)}

    @torch.no_grad()
    def enqueue(self, keys: torch.Tensor) -> None:
        """The keys replace the oldest; at the queue's end the rest of a batch is dropped and the next
        batch starts over at the front (Lightly's memory bank does the same)."""
        keys = nn.functional.normalize(keys, dim=1)
        self.queue = self.queue.to(keys)
        size, at = len(self.queue), self.queue_at
        if at + len(keys) >= size:
            self.queue[at:] = keys[: size - at]
            self.queue_at = 0
        else:
            self.queue[at : at + len(keys)] = keys
            self.queue_at = at + len(keys)

    def training_step(self, batch: Batch, ctx: StepContext) -> StepLosses:
        v1, v2 = batch
        query = self.embed(ctx.models, v1)
        with torch.no_grad():
            key = ctx.models["teacher"](v2)
        loss = self.criterion(query, key, self.queue.clone())  # (the queue changes in place after this step)
        keys = ctx.all_gather_in_order(key)  # the batch's keys, as one process would hold them
        self.enqueue(keys)
        self.track(ctx)
        return {"loss": loss, "embedding_std": embedding_std(keys)}

    def state_dict(self) -> dict[str, Plain]:
        return {"queue": self.queue.detach().cpu().clone(), "queue_at": self.queue_at}

    def load_state_dict(self, state: PlainRecord) -> None:
        if "queue" in state:
            self.queue, self.queue_at = state["queue"], int(state["queue_at"])

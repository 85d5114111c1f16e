"""The epoch-end half of the trainer: validation of the networks (and of their moving averages),
every sample once at any world size, checked finite, with the task's records and pictures of it.
``Trainer`` mixes it in; it reads the trainer's networks, loader, contexts and outputs."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from torch import nn

from .divergence import diverged, non_finite_metric
from ..data.sampling import every_batch
from ..tasks.base import Evaluation, Visuals

if TYPE_CHECKING:
    from .trainer import Trainer


class Validation:
    @functools.cached_property
    def visuals(self: Trainer) -> Visuals | None:
        """What rank 0 shows of each epoch (validation images with predictions, ...), built at the first
        validation: encoding its pictures is off the way to the first step (36 ms of a classifier's
        startup, measured)."""
        return self.task.visuals(self.data) if self.strategy.is_main else None

    def _validate(self: Trainer, epoch: int) -> dict[str, float]:
        """The epoch's validation metrics (and the moving average's), checked finite, and the task's
        records and pictures of them."""
        with self.strategy.whole_networks(self.models.values()):  # (sharded networks: whole until the pictures)
            evaluation = self.evaluate()
            metrics = dict(evaluation.metrics)
            if self.ema:
                averaged = self.evaluate({**self.eval_models(), **{n: e.module for n, e in self.ema.items()}})
                metrics.update({f"ema_{k}": v for k, v in averaged.metrics.items()})
            bad = non_finite_metric(metrics)  # all-reduced already: every rank stops here
            if bad:  # a model whose outputs are nan still has an accuracy (argmax of nan is 0)
                raise diverged(f"the validation {bad} after step {self.step}", epoch, self.epoch, self.base_lr,
                               self.cfg.optim.precision)
            self._record_epoch(epoch, evaluation)
        return metrics

    def _record_epoch(self: Trainer, epoch: int, evaluation: Evaluation) -> None:
        for record in self.task.epoch_records(evaluation, epoch):
            self.outputs.record(record)
        if self.visuals is not None:  # image bytes: the snapshots keep them, the metrics log does not
            models = self.bare_models()
            for model in models.values():  # as in validation; the next epoch's train_mode restores them
                model.eval()
            self.outputs.snapshot_only(self.visuals.record(models, epoch, self.eval_ctx))

    def eval_models(self: Trainer) -> dict[str, nn.Module]:
        return {name: self.strategy.eval_model(model) for name, model in self.models.items()}

    def evaluate(self: Trainer, models: dict[str, nn.Module] | None = None) -> Evaluation:
        """The task's validation over the whole validation set, every sample once."""
        models = self.eval_models() if models is None else models
        for model in models.values():
            model.eval()
        evaluation = self.task.evaluate(models, every_batch(self.val_loader), self.eval_ctx)
        self.val_samples = int(evaluation.extra.get("samples", self.val_samples))
        return evaluation

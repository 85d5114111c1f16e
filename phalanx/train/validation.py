"""The trainer's validation, a part it holds: the networks (and their moving averages) over the
validation set, every sample once at any world size, checked finite, with the task's records and
pictures of it. The trainer calls it with the networks and the epoch, never lends it itself."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from torch import nn

from ..data.sampling import every_batch
from ..distributed.strategy import Strategy
from ..tasks.base import Evaluation, Task, TaskData, Visuals
from .context import DeviceContext
from .divergence import non_finite_metric
from .outputs import RunOutputs


class Validator:
    def __init__(
        self,
        task: Task,
        strategy: Strategy,
        loader: Iterable[Any],
        ctx: DeviceContext,
        outputs: RunOutputs,
        data: TaskData,
    ):
        self.task, self.strategy, self.loader, self.ctx, self.outputs, self.data = (
            task,
            strategy,
            loader,
            ctx,
            outputs,
            data,
        )
        self.samples = 0  # validation samples of the last pass, all ranks

    @functools.cached_property
    def visuals(self) -> Visuals | None:
        """What rank 0 shows of each epoch (validation images with predictions, ...), built at the first
        validation: encoding its pictures is off the way to the first step (36 ms of a classifier's
        startup, measured)."""
        return self.task.visuals(self.data) if self.strategy.is_main else None

    def eval_models(self, models: dict[str, nn.Module]) -> dict[str, nn.Module]:
        return {name: self.strategy.eval_model(model) for name, model in models.items()}

    def evaluate(self, models: dict[str, nn.Module]) -> Evaluation:
        """The task's validation over the whole validation set, every sample once."""
        for model in models.values():
            model.eval()
        evaluation = self.task.evaluate(models, every_batch(self.loader), self.ctx)
        self.samples = int(evaluation.extra.get("samples", self.samples))
        return evaluation

    def validate(
        self,
        epoch: int,
        models: dict[str, nn.Module],
        averaged: dict[str, nn.Module],
        bare: Callable[[], dict[str, nn.Module]],
        diverged: Callable[[str], Exception],
    ) -> dict[str, float]:
        """The epoch's validation metrics (and, with ``averaged`` networks, the moving averages' as
        ``ema_*``), checked finite (``diverged`` makes the run's stop), and the task's records and
        pictures of them. ``models``: the wrapped networks; ``bare``: the networks unwrapped."""
        with self.strategy.whole_networks(models.values()):  # (sharded networks: whole until the pictures)
            evaluation = self.evaluate(self.eval_models(models))
            metrics = dict(evaluation.metrics)
            if averaged:
                ema = self.evaluate({**self.eval_models(models), **averaged})
                metrics.update({f"ema_{k}": v for k, v in ema.metrics.items()})
            bad = non_finite_metric(metrics)  # all-reduced already: every rank stops here
            if bad:  # a model whose outputs are nan still has an accuracy (argmax of nan is 0)
                raise diverged(f"the validation {bad}")
            self.record(epoch, evaluation, bare)
        return metrics

    def record(self, epoch: int, evaluation: Evaluation, bare: Callable[[], dict[str, nn.Module]]) -> None:
        for record in self.task.epoch_records(evaluation, epoch):
            self.outputs.record(record)
        if self.visuals is not None:  # image bytes: the snapshots keep them, the metrics log does not
            models = bare()
            for model in models.values():  # as in validation; the next epoch's train_mode restores them
                model.eval()
            self.outputs.snapshot_only(self.visuals.record(models, epoch, self.ctx))

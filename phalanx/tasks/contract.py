"""The plain types the task contract exchanges: what a task's data is, what a validation pass found,
what a task declares about itself, a dashboard pane, and what the trainer lends a task
(``RunContext``, ``StepContext``: protocols the trainer implements, so tasks import nothing of it).
Kept apart from ``base.Task`` so the contract reads in one screen; ``phalanx.tasks.base`` re-exports
them."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils.data import Dataset

# What a loader yields and a step takes: tensors, in tuples, lists and dicts (a detector's targets).
# The containers hold what the task's collate made of its samples: the task knows their shape.
Batch = torch.Tensor | tuple[Any, ...] | list[Any] | dict[Any, Any]
# Plain data: what checkpoints, records and JSON hold (numbers, strings, lists, dicts, tensors).
Plain = bool | int | float | str | list[Any] | tuple[Any, ...] | dict[Any, Any] | torch.Tensor | None
# Plain data read back (a checkpoint's data info, a task's state): a dict of ``Plain`` by name whose
# values only the task that wrote them knows the types of (a class list, an image size, ...).
PlainRecord = dict[str, Any]


@dataclass
class TaskData:
    """What a task trains and validates on.

    ``train[(epoch, index)]`` is a training sample as training sees it (seeded augmentation: see
    ``data.SeededView``), ``train[index]`` the same sample without augmentation. ``info`` is
    what inference needs (classes, image size, normalisation, ...): saved in every checkpoint.
    """

    train: Dataset[Any]
    val: Dataset[Any]
    description: str
    info: PlainRecord
    collate: Callable[[list[Any]], Batch] | None = None
    skipped: dict[str, str] = field(default_factory=dict)


@dataclass
class Evaluation:
    """A validation pass over every sample once: metrics by name, and what else the task keeps
    of it (a confusion matrix) for its own records."""

    metrics: dict[str, float]
    extra: dict[str, Any] = field(default_factory=dict)  # the task's own: it reads back what it put


def pane(
    win: str, title: str, ylabel: str, record: str, traces: list[tuple[str, str]], *, percent: bool = False
) -> dict[str, Plain]:
    """A line pane of the dashboard (plain data: it travels in the snapshots to ``visualize``).

    ``record`` is the kind of record whose ``traces`` keys it plots (``train``: against epochs of
    progress; ``val``: against epochs); ``percent`` plots 100 x the value on a 0-100 axis.
    """
    return {
        "win": win,
        "title": title,
        "ylabel": ylabel,
        "record": record,
        "traces": [[key, label] for key, label in traces],
        "percent": percent,
    }


@dataclass(frozen=True)
class Declaration:
    """What a task says about itself, made once by ``Task.declare`` (after its data and networks
    exist) and never changed: the trainer, ``best.pt``, the dashboard and the step checks read
    this, so no call order can change what they see."""

    loss_names: tuple[str, ...]  # what training_step returns, logged averaged over ranks
    metrics: tuple[str, ...]  # validation metrics: each gets a pane; --best-metric takes one
    primary_model: str  # predict/export's network, and --weights'
    best_metric: tuple[str, str]  # (metric, "max" | "min") that picks best.pt
    ema_models: tuple[str, ...]  # what --ema-decay averages
    metric_labels: Mapping[str, str]  # the words for a metric or loss on axes and in the status pane
    manual_optimization: bool
    find_unused_parameters: bool

    def label(self, name: str) -> str:
        return self.metric_labels.get(name, name)


class Visuals(Protocol):
    """What a task's ``visuals`` returns: each epoch, an ``images`` record of the networks' outputs."""

    def record(self, models: Mapping[str, nn.Module], epoch: int, ctx: RunContext) -> dict[str, Plain]: ...


class Pending(Protocol):
    """Sums on their way through an all-reduce (``RunContext.all_reduce_sums_later``)."""

    def result(self) -> Any:
        """The sums (or what ``finish`` made of them), waiting for the all-reduce if it is still running."""


# What a training step returns, a dict: its named losses (per-sample, or 0-dim means), and monitors it
# sums over the ranks beside its backward pass (``RunContext.all_reduce_sums_later``: the trainer
# takes their ``result()`` after the backward). (A Mapping, read-only, so that a step's
# ``dict[str, Tensor]`` is one; the trainer refuses another kind of mapping.)
StepLosses = Mapping[str, torch.Tensor | Pending]


class RunContext(Protocol):
    """What a task gets for validation and pictures: its process's device, precision and collectives."""

    device: torch.device
    rank: int
    world_size: int

    def autocast(self) -> contextlib.AbstractContextManager[object]:
        """The run's mixed precision (``--precision bf16`` or ``fp16``), or nothing."""

    def to_device(self, batch: Any) -> Any:
        """A batch (tensors in tuples, lists and dicts) on this process's device, as the run's
        precision and memory format want it."""

    def all_reduce_sums(self, sums: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Each tensor summed over the ranks (float64), in one collective."""

    def all_reduce_sums_later(
        self, sums: dict[str, torch.Tensor], finish: Callable[[dict[str, torch.Tensor]], Any] | None = None
    ) -> Pending:
        """``all_reduce_sums`` started now, finished at ``result()`` (beside a step's backward)."""

    def all_gather(self, tensor: torch.Tensor, rows: int | None = None) -> tuple[torch.Tensor, int]:
        """Every rank's rows in rank order, with gradients back to each rank's own, and where this
        rank's begin."""

    def all_gather_objects(self, items: list[Any]) -> list[Any]:
        """Every rank's plain-data items, in rank order."""


class StepContext(RunContext, Protocol):
    """What a training step gets: the networks, their optimizers, the step's place in training and,
    for a task with ``manual_optimization``, backward and the optimizer steps."""

    models: Mapping[str, nn.Module]
    optimizers: Mapping[str, torch.optim.Optimizer]
    scalers: Mapping[str, torch.amp.GradScaler]
    epoch: int  # the epoch being trained (1-based)
    progress: float  # epochs of training done at the end of this micro-batch
    epochs: int  # the run's length in epochs

    @property
    def samples(self) -> int:
        """Samples of this micro-batch that count on this rank (0: a padding sample)."""

    @property
    def ends_step(self) -> bool:
        """Whether this micro-batch ends an optimizer step (with ``--grad-accum``, the last one does)."""

    def backward(self, loss: torch.Tensor, optimizer: str | None = None) -> None:
        """Backpropagate a per-sample (1-D) or mean (0-dim) loss, scaled for DDP's average."""

    def step(self, optimizer: str | None = None) -> None:
        """Step an optimizer where this micro-batch ends a step, and clear its gradients."""

    def frozen(self, name: str) -> contextlib.AbstractContextManager[nn.Module]:
        """A network for a forward pass whose gradients must not reach its weights."""

    def all_gather_in_order(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's rows of this micro-batch in the order one process holding it has them."""

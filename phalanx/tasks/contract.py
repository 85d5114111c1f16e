"""The plain types the task contract exchanges: what a task's data is, what a validation pass
found, what a task declares about itself, and a dashboard pane. Kept apart from ``base.Task`` so
the contract reads in one screen; ``phalanx.tasks.base`` re-exports them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Union

import torch
from torch import nn
from torch.utils.data import Dataset

from ..errors import PhalanxError, RunFailed

if TYPE_CHECKING:
    from ..train.context import RunContext

# What a loader yields and a step takes: tensors, in tuples, lists and dicts (a detector's targets).
Batch = Union[torch.Tensor, tuple, list, dict]
# Plain data: what checkpoints, records and JSON hold (numbers, strings, lists, dicts, tensors).
Plain = Union[None, bool, int, float, str, list, tuple, dict, torch.Tensor]


# What torch.load(weights_only=True) reads back besides tensors and containers: anything else in a
# checkpoint (a numpy scalar, a Path) would make every checkpoint of the run unloadable.
PLAIN = (str, int, float, bool, type(None), torch.dtype, torch.device, torch.Size)


def check_loadable(value: Any, where: str = "checkpoint", error: type[PhalanxError] = RunFailed) -> None:
    """Refuse a value that phalanx could not load back from a checkpoint, naming its key and type
    (``error``: bad input before the run starts, a failure at a save)."""
    if isinstance(value, torch.Tensor) or type(value) in PLAIN:  # exact types: numpy.float64 is a float
        return
    if isinstance(value, dict):
        for key, item in value.items():
            check_loadable(key, f"{where}, a key,", error)
            check_loadable(item, f"{where}[{key!r}]", error)
        return
    if type(value) in (list, tuple, set):
        for index, item in enumerate(value):
            check_loadable(item, f"{where}[{index}]", error)
        return
    kind = f"{type(value).__module__}.{type(value).__qualname__}".removeprefix("builtins.")
    raise error(f"{where} is a {kind} ({str(value)[:40]}); a checkpoint holds tensors and plain Python data "
                "(str, int, float, bool, None, lists, dicts) only, as torch.load(weights_only=True) reads them "
                "back: convert it (float(x), str(path), x.tolist())")


@dataclass
class TaskData:
    """What a task trains and validates on.

    ``train[(epoch, index)]`` is a training sample as training sees it (seeded augmentation: see
    ``data.SeededView``), ``train[index]`` the same sample without augmentation. ``info`` is
    what inference needs (classes, image size, normalisation, ...): saved in every checkpoint.
    """

    train: Dataset
    val: Dataset
    description: str
    info: dict[str, Plain]
    collate: Callable | None = None
    skipped: dict[str, str] = field(default_factory=dict)


@dataclass
class Evaluation:
    """A validation pass over every sample once: metrics by name, and what else the task keeps
    of it (a confusion matrix) for its own records."""

    metrics: dict[str, float]
    extra: dict[str, object] = field(default_factory=dict)


def pane(win: str, title: str, ylabel: str, record: str, traces: list[tuple[str, str]], *,
         percent: bool = False) -> dict[str, Plain]:
    """A line pane of the dashboard (plain data: it travels in the snapshots to ``visualize``).

    ``record`` is the kind of record whose ``traces`` keys it plots (``train``: against epochs of
    progress; ``val``: against epochs); ``percent`` plots 100 x the value on a 0-100 axis.
    """
    return {"win": win, "title": title, "ylabel": ylabel, "record": record,
            "traces": [[key, label] for key, label in traces], "percent": percent}


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

"""What ``evaluate``, ``predict`` and ``export`` do with a trained task, apart from its training:
each task names its own ``Inference`` (``Task.Inference``). The loops (the evaluation pass, the
predict loader and its progress, the files written atomically) are the commands' own, the same for
every task; an ``Inference`` says what is task-specific."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.data import Dataset

from ..data.layout import evaluation_dir
from ..errors import PhalanxError

if TYPE_CHECKING:
    from ..config import RunConfig
    from ..config.inference import PredictOptions
    from .base import Task
    from .contract import Batch, Evaluation, Plain, PlainRecord


@dataclass
class Trained:
    """A task rebuilt from its checkpoint alone."""

    path: Path
    config: RunConfig
    task: Task
    models: dict[str, nn.Module]  # bare networks, in eval mode, on the CPU
    info: PlainRecord  # what the data resolved to (classes, image size, normalisation)

    def inference(self) -> Inference:
        return inference_class(type(self.task))(self)


def inference_class(task_class: type) -> type[Inference]:
    """A task's ``Inference``: its class, or its name, ``"module:Class"`` (``".inference:Class"``:
    beside the module of the class that declares it). A built-in task names its inference, which
    imports the task's module for its types, instead of importing it. A name that does not lead to
    a subclass of ``Inference`` is one line naming the task (checked before a run starts)."""
    owner = next(cls for cls in task_class.__mro__ if "Inference" in cls.__dict__)
    named: type[Inference] | str = owner.__dict__["Inference"]
    where, given = f"{owner.__name__}.Inference", repr(named)
    if isinstance(named, str):
        module, _, name = named.partition(":")
        package = owner.__module__.rpartition(".")[0] if module.startswith(".") else None
        if module.startswith(".") and not package:
            raise PhalanxError(
                f"{where} is {named!r}, a name relative to {owner.__module__}, which is in no package: "
                "name it 'module:Class', or give the class itself",
                "--task",
            )
        try:
            named = getattr(importlib.import_module(module, package), name)
        except (ImportError, AttributeError, ValueError) as exc:
            raise PhalanxError(
                f"{where} is {named!r}, which does not import ({type(exc).__name__}: {exc})", "--task"
            ) from None
    if not (isinstance(named, type) and issubclass(named, Inference)):
        raise PhalanxError(f"{where} is {given}, not a subclass of phalanx.tasks.Inference", "--task")
    return named


class Predictor:
    """One ``predict`` over a list of image files.

    ``inputs`` is a ``data.inputs.InputImages`` of the paths (its ``prepare`` makes an image what
    the network takes); ``batch_size`` images go through ``predict`` at once (1 where each image
    keeps its own size). ``predict`` writes each image's outputs, or keeps them for ``finish``,
    which writes them once at least one image was predicted.
    """

    batch_size = 1
    dtype = torch.float32  # what floating images become before ``predict`` (the networks' own: set by the loop)

    def __init__(self, inputs: Dataset[Any], paths: list[Path], device: torch.device):
        self.inputs, self.paths, self.device = inputs, paths, device
        self.unreadable: list[tuple[Path, str]] = []  # (image, why) found unreadable only by ``predict``

    def predict(self, indices: list[int], images: list[Any], raws: list[Any]) -> None:
        """``images[i]`` is ``paths[indices[i]]`` prepared (a tensor, or what the task's inputs make of
        an image they do not decode: a whole slide); ``raws[i]`` its decoded pixels where the inputs
        keep them (``keep_raw``), else None."""
        raise NotImplementedError

    def finish(self) -> None:
        """Write what ``predict`` kept (a table, a JSON of every detection); nothing by default."""


STDOUT = "-"  # ``predict --output -``: the predictions on stdout (an Inference that ``streams``)


class Inference:
    """A trained task's evaluation, prediction and export. This base evaluates on the run's
    validation split (or ``--dataroot``'s, read as training reads it) and has no predict or export.

    Declarations: ``script_export`` (export scripts the networks, TorchScript only: for networks
    whose input is not one tensor, such as a detector's list of images); ``eval_collate`` (how
    ``evaluate`` batches samples; None: stacked); ``predict_options``.
    """

    script_export = False
    eval_collate: Callable[[list[Any]], Batch] | None = None
    # The task-specific ``predict`` options its predictor reads (of PredictOptions.TASK_SPECIFIC):
    # another is refused when typed, as ``train`` refuses another task's option.
    predict_options: tuple[str, ...] = ()
    # ``predict --output -``: its predictions as lines on stdout (a table's rows), for a pipe.
    streams = False

    def __init__(self, trained: Trained):
        self.trained, self.task, self.cfg = trained, trained.task, trained.config
        self.models, self.info = trained.models, trained.info

    # --- evaluate ------------------------------------------------------------------------------
    def evaluation_data(self, dataroot: str | None, dataset: str | None) -> tuple[Dataset[Any], str]:
        """``evaluate``'s data: the run's validation split; with ``--dataroot DIR``, ``DIR/val/`` (or
        validation/, valid/; else
        DIR) as ``evaluation_split`` reads it, or the validation split of the task's data read from DIR."""
        if dataroot:
            root = Path(dataroot)
            found = self.evaluation_split(evaluation_dir(root))
            if found is not None:
                return found
        data = self.task.build_data()  # from this command's configuration: --dataroot if given
        return (
            data.val,
            f"the run's validation split ({data.description})"
            if not dataroot
            else f"the validation split of {data.description}",
        )

    def evaluation_split(self, split: Path) -> tuple[Dataset[Any], str] | None:
        """``evaluate --dataroot``: one folder read as a split of this task's data (no train/ needed),
        and what it is; None: read DIR as ``build_data`` does and take its validation split."""
        return None

    def results(self, evaluation: Evaluation) -> dict[str, Plain]:
        """``evaluate``'s results beyond the metrics (JSON-able)."""
        return {"samples": evaluation.extra.get("samples")}

    def results_table(self, results: PlainRecord) -> str:
        """``evaluate``'s table, below its header line (the checkpoint and the data)."""
        return "  ".join(f"{k} {v:.4g}" for k, v in results.get("metrics", {}).items())

    # --- predict -------------------------------------------------------------------------------
    def check_predict_output(self, output: str) -> None:
        """Refuse an ``--output`` this task's ``predict`` does not write, before any work."""

    def predictor(self, paths: list[Path], opts: PredictOptions, device: torch.device) -> Predictor:
        """``predict``: the images prepared for the network and what to write of each batch; the
        loop over them is ``phalanx predict``'s."""
        raise PhalanxError(f"--task {self.cfg.task} has no predict", "--checkpoint")

    def feature_inputs(self, paths: list[Path]) -> tuple[nn.Module, Dataset[Any]] | None:
        """``predict --features``: the network whose outputs are an image's features, and the images
        prepared for it (``data.inputs.InputImages``); None where the task has no such network."""
        return None

    # --- export --------------------------------------------------------------------------------
    def export_modules(self) -> dict[str, tuple[nn.Module, torch.Tensor]]:
        """``export``: the networks to write (by name) with an example input each."""
        raise PhalanxError(f"--task {self.cfg.task} has nothing to export", "--checkpoint")

    def native_files(self, fmt: str) -> dict[str, Callable[[], bytes]] | None:
        """``export --format FMT`` (``registry.native_formats``): the files of another tool's model
        directory, each name with what makes its bytes (called once the directory is checked: a
        refused export does no work); None where this task does not write that format."""
        return None

    def export_metadata(self) -> dict[str, Plain]:
        """What goes beside an exported file (FILE.json): how to prepare its input, what its output is.
        Default: the preprocessing the task's data info records (``channels``, ``size``, ``mean``,
        ``std``), where it records them."""
        names = {"channels": "channels", "size": "image_size", "mean": "mean", "std": "std"}
        meta: dict[str, Plain] = {out: self.info[key] for key, out in names.items() if key in self.info}
        if "mean" in meta and "std" in meta:
            meta["scale"] = "pixels / 255, then (x - mean) / std"
        return meta

"""Tasks: what phalanx trains. A task owns its data, models, losses, steps, metrics and dashboard
panes (``base.Task``); the trainer runs any of them the same way.

This module is the registry: the built-in tasks by name, with their options (``options``) and the
defaults they give general options. Standard library only; a task's own module (which imports
torch) is loaded by ``task_class`` when a run starts. ``--task package.module:Class`` names your
own, imported by name like ``--model`` (the current directory first, never ``exec``).
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import PhalanxError
from ..config.fields import check_fields, flag, parse_text, suggest
from .default_lr import classifier_lr, optimizer_lr
from .options import (BarlowTwinsOptions, BYOLOptions, ClassifyOptions, DeepLIIFOptions, DetectOptions, DINOOptions,
                      MoCoOptions, SegmentOptions, SimCLROptions, SimSiamOptions, SwAVOptions, TranslateOptions,
                      VICRegOptions)

OPTION = "--task"
# The general options a task's own data and networks read; the trainer reads the others. A task
# lists those it reads in ``Task.reads``: given to a task that does not read it, one is refused in
# one line, not ignored.
DATA_OPTIONS = ("dataroot", "dataset", "download", "synthetic_samples", "val_fraction", "image_size", "augment",
                "hflip", "crop_scale", "val_crop_pct", "normalize", "mean", "std", "skip_broken", "fast_decode",
                "model")


@dataclass(frozen=True)
class TaskInfo:
    name: str
    heading: str  # the --help heading of its options
    summary: str
    options: type  # the frozen dataclass of its own options
    target: str  # "module:Class"
    defaults: dict[str, Any] = field(default_factory=dict)  # general options it sets otherwise
    # general options it sets otherwise depending on what else was given (the LR of a model and batch)
    adapt: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    # general options it does not read -> what to use instead: given, they are refused, not ignored
    unused: dict[str, str] = field(default_factory=dict)
    aka: str = ""  # what its users know it as (pix2pix), in the --task help
    predicts: str = ""  # what `predict --output` names for it
    exports: str = ""  # the name of another tool's model directory that `export --format` writes for it

    @property
    def reads(self) -> tuple[str, ...]:
        return tuple(name for name in DATA_OPTIONS if name not in self.unused)


BUILTIN: dict[str, TaskInfo] = {info.name: info for info in [
    TaskInfo("classify", "Classification (--task classify)", "image classification: one network, cross-entropy, accuracy",
             ClassifyOptions, "phalanx.tasks.classify.task:ClassifyTask", adapt=classifier_lr,
             predicts=".csv, .jsonl or - (JSON lines on stdout)"),
    TaskInfo("translate", "Translation (--task translate)",
             "paired image-to-image translation with GANs (pix2pix, DeepLIIF)", TranslateOptions,
             "phalanx.tasks.translate.task:TranslateTask",
             # pix2pix's recipe: Adam(2e-4, beta1 0.5), constant then linearly to zero, batch 1, 256 px.
             {"lr": 2e-4, "optimizer": "adam", "betas": (0.5, 0.999), "weight_decay": 0.0, "lr_schedule": "linear",
              "batch_size": 1, "image_size": 256, "model": "pix2pix"},
             unused={"model": "its networks are pix2pix's: --generator, --ngf, --ndf, --d-layers, --norm",
                     "drop_path": "pix2pix's networks have no stochastic depth"},
             aka="pix2pix", predicts="a folder"),
    TaskInfo("deepliif", "DeepLIIF (--task deepliif)",
             "DeepLIIF's model: modalities and a segmentation from an IHC image, and their networks' files",
             DeepLIIFOptions, "phalanx.tasks.deepliif.task:DeepLIIFTask",
             # deepliif train's recipe: Adam(2e-4, beta1 0.5), constant then linearly to zero, batch 1, 512 px.
             {"lr": 2e-4, "optimizer": "adam", "betas": (0.5, 0.999), "weight_decay": 0.0, "lr_schedule": "linear",
              "batch_size": 1, "image_size": 512, "model": "deepliif"},
             unused={"model": "its networks are DeepLIIF's: --net-g, --net-gs, --ngf, --ndf, --d-layers, --norm",
                     "drop_path": "DeepLIIF's networks have no stochastic depth"},
             predicts="a folder", exports="deepliif"),
    TaskInfo("simclr", "Self-supervised: SimCLR (--task simclr)",
             "contrastive pretraining, negatives from the global batch (Lightly's job)", SimCLROptions,
             "phalanx.tasks.selfsupervised.simclr:SimCLRTask", {"optimizer": "sgd", "lr": 0.06, "momentum": 0.9, "weight_decay": 5e-4},
             predicts=".npy"),
    TaskInfo("byol", "Self-supervised: BYOL (--task byol)",
             "pretraining with a momentum teacher, no negatives", BYOLOptions,
             "phalanx.tasks.selfsupervised.byol:BYOLTask", {"optimizer": "sgd", "lr": 0.06, "momentum": 0.9, "weight_decay": 5e-4},
             predicts=".npy"),
    TaskInfo("moco", "Self-supervised: MoCo (--task moco)",
             "contrastive pretraining against a queue of a momentum encoder's keys (MoCo v2)", MoCoOptions,
             "phalanx.tasks.selfsupervised.moco:MoCoTask", {"optimizer": "sgd", "lr": 0.06, "momentum": 0.9, "weight_decay": 5e-4},
             predicts=".npy"),
    TaskInfo("dino", "Self-supervised: DINO (--task dino)",
             "self-distillation with a momentum teacher, a centre and multi-crop views", DINOOptions,
             "phalanx.tasks.selfsupervised.dino:DINOTask", {"optimizer": "sgd", "lr": 0.06, "momentum": 0.9, "weight_decay": 5e-4},
             unused={"crop_scale": "DINO's crops take --global-scale and --local-scale"}, predicts=".npy"),
    TaskInfo("swav", "Self-supervised: SwAV (--task swav)",
             "online clustering: swapped predictions of Sinkhorn-Knopp codes over the global batch", SwAVOptions,
             "phalanx.tasks.selfsupervised.swav:SwAVTask", {"optimizer": "sgd", "lr": 0.06, "momentum": 0.9, "weight_decay": 5e-4},
             unused={"crop_scale": "SwAV's crops take --global-scale and --local-scale"}, predicts=".npy"),
    TaskInfo("simsiam", "Self-supervised: SimSiam (--task simsiam)",
             "pretraining with a predictor and a stop-gradient, no negatives, no teacher", SimSiamOptions,
             "phalanx.tasks.selfsupervised.simsiam:SimSiamTask", {"optimizer": "sgd", "lr": 0.06, "momentum": 0.9, "weight_decay": 5e-4},
             predicts=".npy"),
    TaskInfo("barlowtwins", "Self-supervised: Barlow Twins (--task barlowtwins)",
             "pretraining by decorrelating the global batch's embeddings", BarlowTwinsOptions,
             "phalanx.tasks.selfsupervised.decorrelation:BarlowTwinsTask",
             {"optimizer": "sgd", "lr": 0.06, "momentum": 0.9, "weight_decay": 5e-4}, predicts=".npy"),
    TaskInfo("vicreg", "Self-supervised: VICReg (--task vicreg)",
             "pretraining with invariance, variance and covariance terms over the global batch", VICRegOptions,
             "phalanx.tasks.selfsupervised.decorrelation:VICRegTask",  # 0.06 diverged on the digits (seed 1); 0.03 trained
             {"optimizer": "sgd", "lr": 0.03, "momentum": 0.9, "weight_decay": 5e-4}, predicts=".npy"),
    TaskInfo("detect", "Detection (--task detect)", "object detection on COCO-format data (LitDet's job)",
             DetectOptions, "phalanx.tasks.detect.task:DetectTask",
             # torchvision's detection reference: SGD 0.9, weight decay 1e-4; LitDet's warmup.
             {"model": "fasterrcnn_mobilenet_v3_large_320_fpn", "lr": 0.01, "momentum": 0.9, "weight_decay": 1e-4,
              "batch_size": 4, "warmup_epochs": 1.0}, predicts=".json",
             unused={"drop_path": "torchvision's detectors have no stochastic depth"}),
    TaskInfo("segment", "Segmentation (--task segment)", "semantic segmentation on image + mask pairs",
             SegmentOptions, "phalanx.tasks.segment.task:SegmentTask",
             # torchvision's segmentation reference: SGD 0.9, weight decay 1e-4.
             {"model": "lraspp_mobilenet_v3_large", "lr": 0.01, "momentum": 0.9, "weight_decay": 1e-4,
              "batch_size": 8, "image_size": 256}, predicts="a folder",
             unused={"drop_path": "torchvision's segmenters have no stochastic depth"}),
]}
DEFAULT = "classify"


def names_help() -> str:
    """The built-in tasks for ``--task``'s help: ``classify (default), translate (pix2pix), ...``."""
    return ", ".join(name + (f" ({info.aka})" if info.aka else "") + (" (default)" if name == DEFAULT else "")
                     for name, info in BUILTIN.items())


def predict_outputs_help() -> str:
    """What ``predict --output`` names for each built-in task: ``.csv or .jsonl (classify), ...``."""
    by_output: dict[str, list[str]] = {}
    for name, info in BUILTIN.items():
        by_output.setdefault(info.predicts, []).append(name)
    return ", ".join(f"{output} ({', '.join(names)})" for output, names in by_output.items())


def native_formats() -> tuple[str, ...]:
    """``export --format`` values that write another tool's model directory (a task's ``exports``)."""
    return tuple(info.exports for info in BUILTIN.values() if info.exports)


def is_user_task(name: str) -> bool:
    return ":" in name


def check_name(name: str) -> None:
    if name in BUILTIN or is_user_task(name):
        return
    raise PhalanxError(f"unknown task '{name}'{suggest(name, list(BUILTIN))}; built in: {', '.join(BUILTIN)}, or "
                       "your own as package.module:Class", OPTION)


def option_owners() -> dict[str, list[str]]:
    """Each built-in task option's name -> the tasks that declare it."""
    owners: dict[str, list[str]] = {}
    for info in BUILTIN.values():
        for f in dataclasses.fields(info.options):
            owners.setdefault(f.name, []).append(info.name)
    return owners


def own_options(name: str) -> dict[str, tuple[Any, str]]:
    """A built-in task's own options -> (default, help): ``--task moco --help`` shows MoCo's temperature."""
    return {f.name: (f.default_factory() if callable(f.default_factory) else f.default,  # type: ignore[misc]
                     f.metadata["help"]) for f in dataclasses.fields(BUILTIN[name].options)}


def option_fields() -> dict[str, tuple[dataclasses.Field, Any, str]]:
    """Each built-in task option once: (field, default, heading of the first task declaring it)."""
    found: dict[str, tuple[dataclasses.Field, Any, str]] = {}
    for info in BUILTIN.values():
        for f in dataclasses.fields(info.options):
            if f.name not in found:
                default = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
                found[f.name] = (f, default, info.heading)
    return found


def not_an_option_of(name: str, task: str, hint: str = "", value: Any = None) -> PhalanxError:
    where = " or ".join(f"--task {t}" for t in option_owners().get(name, [])) or "another task"
    typed = flag(f"no_{name}" if value is False else name)  # --no-gather, as typed
    return PhalanxError(f"is an option of {where}; this run's task is {task}{hint}", typed)


def resolve_options(task: str, given: dict[str, Any]) -> dict[str, Any]:
    """A task's options, checked, typed and completed with defaults: a built-in's here, your own
    task's by its class (imported, as for its ``defaults``), so ``config.json`` records 32, not "32"."""
    if is_user_task(task):
        options = task_class(task).parse_options(given)
        return dataclasses.asdict(options) if dataclasses.is_dataclass(options) else dict(given)
    return dataclasses.asdict(parse_options(BUILTIN[task].options, given, f"--task {task}", task))


def parse_options(options_class: type | None, given: dict[str, Any], owner: str, task: str) -> Any:
    """A task's options from plain data (``--task-option`` text, a config's ``task:`` section): the
    one parser of built-in and user tasks' options, which are then checked as every option is
    (types, finite numbers, bounds), whether or not their dataclass checks itself."""
    known = {f.name: f for f in dataclasses.fields(options_class)} if options_class is not None else {}
    values = {}
    for key, value in given.items():
        name = str(key).replace("-", "_")
        if name not in known:
            raise not_an_option_of(name, task, value=value) if name in option_owners() else \
                PhalanxError(f"{owner} has no option '{key}'{suggest(name, sorted(known))}", "--task-option")
        if isinstance(value, str) and known[name].type not in ("str", "str | None") \
                and not known[name].type.startswith("tuple["):  # --task-option ngf=32
            value = parse_text(value, known[name].type, flag(name) if task in BUILTIN else f"--task-option {name}")
        values[name] = value
    if options_class is None:
        return None
    try:
        options = options_class(**values)
    except TypeError as exc:
        raise PhalanxError(f"{owner}'s options: {exc}", "--task-option") from None
    check_fields(options)
    return options


def check_used(task: str, given: dict[str, Any], general_defaults: dict[str, Any]) -> None:
    """A general option the task does not read, given with another value than its default, is
    refused in one line (it would be ignored without a word)."""
    info = BUILTIN.get(task)
    if info is not None:
        for name, instead in info.unused.items():
            if name in given and given[name] != info.defaults.get(name, general_defaults.get(name)):
                raise PhalanxError(f"--task {task} does not use it ({instead})", flag(name))
        return
    cls = task_class(task)
    for name in DATA_OPTIONS:
        if name in given and name not in cls.reads \
                and given[name] not in (general_defaults.get(name), cls.defaults.get(name, general_defaults.get(name))):
            read = ", ".join(cls.reads) or "none"
            raise PhalanxError(f"{cls.__name__} does not read it (the general options a task reads are its "
                               f"`reads`: {read})", flag(name))


def defaults_of(task: str, given: dict[str, Any] | None = None) -> dict[str, Any]:
    """General options this task gives other defaults (pix2pix's Adam and LR for translate, a
    torchvision classifier's LR for its batch, ...), given the options set explicitly."""
    given = given or {}
    if task in BUILTIN:
        info = BUILTIN[task]
        defaults = {**info.defaults, **(info.adapt({**info.defaults, **given}) if info.adapt else {})}
    else:
        defaults = dict(getattr(task_class(task), "defaults", {}) or {})  # your own task's (imports it)
    return {**defaults, **optimizer_lr(defaults, given)}


def task_class(name: str) -> type:
    """The task's class: a built-in by name, or ``package.module:Class`` (imports torch)."""
    check_name(name)
    if name in BUILTIN:
        module_name, _, class_name = BUILTIN[name].target.partition(":")
        return getattr(importlib.import_module(module_name), class_name)
    from ..plugins import import_user_module
    from .base import Task

    module_name, _, class_name = name.partition(":")
    module = import_user_module(module_name, OPTION)
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        found = sorted(n for n, v in vars(module).items()
                       if isinstance(v, type) and issubclass(v, Task) and v.__module__ == module.__name__)
        hint = suggest(class_name, found) or (f"; its tasks: {', '.join(found[:8])}{', ...' if len(found) > 8 else ''}"
                                              if found else "; it defines no subclass of phalanx.tasks.Task")
        raise PhalanxError(f"module '{module_name}' has no class '{class_name}'{hint}", OPTION)
    if not issubclass(cls, Task):
        raise PhalanxError(f"'{name}' is not a subclass of phalanx.tasks.Task", OPTION)
    missing = [m for m in ("build_data", "build_models", "training_step") if getattr(cls, m) is getattr(Task, m)]
    if missing:
        raise PhalanxError(f"'{name}' does not define {', '.join(missing)}, which every task must", OPTION)
    return cls


def __getattr__(name: str) -> Any:
    """``from phalanx.tasks import Task, TaskData, Inference, pane, window, images_item, png, strip,
    denormalize``: the API, imported (with torch) on first use. ``window`` is a pane of another kind
    than lines (``phalanx.records.windows.KINDS``); the last four make a ``visuals`` record's pictures."""
    if name in ("Task", "TaskData", "Evaluation", "Declaration", "pane"):
        from . import base

        return getattr(base, name)
    if name in ("Inference", "Predictor", "Trained"):
        from . import inference

        return getattr(inference, name)
    if name in ("png", "strip", "denormalize"):
        from ..records import pictures

        return getattr(pictures, name)
    if name == "images_item":
        from ..records import images_item

        return images_item
    if name == "window":
        from ..records.windows import window

        return window
    raise AttributeError(name)

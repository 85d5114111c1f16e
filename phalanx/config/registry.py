"""The task registry: the built-in tasks by name, with their options and the defaults they give
general options, and your own (``--task package.module:Class``), imported by name like ``--model``
(the current directory first, never ``exec``). Standard library only: ``phalanx --help`` reads it.

Each built-in task's folder declares it (``phalanx/tasks/<folder>/__init__.py``: its ``SPECS``,
with its options from the folder's ``options.py``); its code (which imports torch) is imported by
``task_class`` when a run starts. Tasks are found by name, never by a static import, so the
configuration stays below them.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import PhalanxError
from .fields import check_fields, flag, help_of, parse_text, suggest

OPTION = "--task"
# The general options a task's own data and networks read; the trainer reads the others. A task
# lists those it reads in ``Task.reads``: given to a task that does not read it, one is refused in
# one line, not ignored.
DATA_OPTIONS = (
    "dataroot",
    "dataset",
    "download",
    "synthetic_samples",
    "val_fraction",
    "image_size",
    "augment",
    "hflip",
    "crop_scale",
    "val_crop_pct",
    "normalize",
    "mean",
    "std",
    "skip_broken",
    "fast_decode",
    "model",
)


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
    # another tool's model directory that evaluate, predict and export take as a checkpoint of this
    # task: "module:function" (folder, ema, changes, task changes) -> Trained, or None where the
    # folder is not one; and what such a folder holds, for the message where no reader takes one
    reads_folders: str = ""
    folders_words: str = ""
    # ``--weights DIR``: "module:function" (DIR) -> the task options the directory's own settings
    # say, taken where not given, or None where DIR says nothing (stdlib only: read by the config)
    weights_options: str = ""
    # ``prepare-training-data``: "module:function" (input_dir, output_dir, validation_ratio, seed,
    # size) -> what was written, in words: another tool's raw layout made into its training data;
    # and that layout in words, for --help
    prepares: str = ""
    prepares_words: str = ""

    @property
    def reads(self) -> tuple[str, ...]:
        return tuple(name for name in DATA_OPTIONS if name not in self.unused)


# The built-in tasks' folders: each declares its tasks (``SPECS``) in its ``__init__``. A new built-in
# task is a new folder and its name here.
PACKAGES = ("classify", "translate", "deepliif", "selfsupervised", "detect", "segment")


@functools.cache
def builtin() -> dict[str, TaskInfo]:
    """The built-in tasks by name, from their folders' declarations (standard library only: found by
    name, as your own task is, so the configuration never imports the tasks' code)."""
    found: dict[str, TaskInfo] = {}
    for package in PACKAGES:
        for info in importlib.import_module(f"phalanx.tasks.{package}").SPECS:
            found[info.name] = info
    return found


DEFAULT = "classify"


def names_help() -> str:
    """The built-in tasks for ``--task``'s help: ``classify (default), translate (pix2pix), ...``."""
    return ", ".join(
        name + (f" ({info.aka})" if info.aka else "") + (" (default)" if name == DEFAULT else "")
        for name, info in builtin().items()
    )


def predict_outputs_help() -> str:
    """What ``predict --output`` names for each built-in task: ``.csv or .jsonl (classify), ...``."""
    by_output: dict[str, list[str]] = {}
    for name, info in builtin().items():
        by_output.setdefault(info.predicts, []).append(name)
    return ", ".join(f"{output} ({', '.join(names)})" for output, names in by_output.items())


def native_formats() -> tuple[str, ...]:
    """``export --format`` values that write another tool's model directory (a task's ``exports``)."""
    return tuple(dict.fromkeys(info.exports for info in builtin().values() if info.exports))


def folder_readers() -> list[tuple[str, str]]:
    """(reader, what its folders hold) of the built-in tasks that read another tool's model directory."""
    return [(info.reads_folders, info.folders_words) for info in builtin().values() if info.reads_folders]


def named_function(target: str) -> Callable[..., Any]:
    """A function named "module:function"."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def is_user_task(name: str) -> bool:
    return ":" in name


def check_name(name: str) -> None:
    if name in builtin() or is_user_task(name):
        return
    raise PhalanxError(
        f"unknown task '{name}'{suggest(name, list(builtin()))}; built in: {', '.join(builtin())}, or "
        "your own as package.module:Class",
        OPTION,
    )


def option_owners() -> dict[str, list[str]]:
    """Each built-in task option's name -> the tasks that declare it."""
    owners: dict[str, list[str]] = {}
    for info in builtin().values():
        for f in dataclasses.fields(info.options):
            owners.setdefault(f.name, []).append(info.name)
    return owners


def own_options(name: str) -> dict[str, tuple[Any, str]]:
    """A built-in task's own options -> (default, help): ``--task moco --help`` shows MoCo's temperature."""
    return {
        f.name: (f.default_factory() if callable(f.default_factory) else f.default, help_of(f))
        for f in dataclasses.fields(builtin()[name].options)
    }


def option_fields() -> dict[str, tuple[dataclasses.Field, Any, str]]:
    """Each built-in task option once: (field, default, heading of the first task declaring it)."""
    found: dict[str, tuple[dataclasses.Field, Any, str]] = {}
    for info in builtin().values():
        for f in dataclasses.fields(info.options):
            if f.name not in found:
                default = f.default_factory() if callable(f.default_factory) else f.default
                found[f.name] = (f, default, info.heading)
    return found


def not_an_option_of(name: str, task: str, hint: str = "", value: Any = None) -> PhalanxError:
    owners = option_owners().get(name, [])
    where = (
        (f"--task {' or '.join(owners)}" if len(owners) < 3 else f"--task {', '.join(owners[:-1])} or {owners[-1]}")
        if owners
        else "another task"
    )
    typed = flag(f"no_{name}" if value is False else name)  # --no-gather, as typed
    return PhalanxError(f"is an option of {where}; this run's task is {task}{hint}", typed)


def resolve_options(task: str, given: dict[str, Any]) -> dict[str, Any]:
    """A task's options, checked, typed and completed with defaults: a built-in's here, your own
    task's by its class (imported, as for its ``defaults``), so ``config.json`` records 32, not "32"."""
    if is_user_task(task):
        options = task_class(task).parse_options(given)
        # (is_dataclass is True of a dataclass's class too, which asdict refuses: typeshed's narrowing keeps both)
        return (
            dataclasses.asdict(options)
            if dataclasses.is_dataclass(options) and not isinstance(options, type)
            else dict(given)
        )
    return dataclasses.asdict(parse_options(builtin()[task].options, given, f"--task {task}", task))


def parse_options(options_class: type | None, given: Mapping[str, Any], owner: str, task: str) -> Any:
    """A task's options from plain data (``--task-option`` text, a config's ``task:`` section): the
    one parser of built-in and user tasks' options, which are then checked as every option is
    (types, finite numbers, bounds), whether or not their dataclass checks itself."""
    known = {f.name: f for f in dataclasses.fields(options_class)} if options_class is not None else {}
    values = {}
    for key, value in given.items():
        name = str(key).replace("-", "_")
        if name not in known:
            raise (
                not_an_option_of(name, task, value=value)
                if name in option_owners()
                else PhalanxError(f"{owner} has no option '{key}'{suggest(name, sorted(known))}", "--task-option")
            )
        if (
            isinstance(value, str)
            and known[name].type not in ("str", "str | None")
            and not known[name].type.startswith("tuple[")
        ):  # --task-option ngf=32
            value = parse_text(
                value,
                str(known[name].type),  # (the annotation's text)
                flag(name) if task in builtin() else f"--task-option {name}",
            )
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
    info = builtin().get(task)
    if info is not None:
        for name, instead in info.unused.items():
            if name in given and given[name] != info.defaults.get(name, general_defaults.get(name)):
                raise PhalanxError(f"--task {task} does not use it ({instead})", flag(name))
        return
    cls = task_class(task)
    for name in DATA_OPTIONS:
        if (
            name in given
            and name not in cls.reads
            and given[name] not in (general_defaults.get(name), cls.defaults.get(name, general_defaults.get(name)))
        ):
            read = ", ".join(cls.reads) or "none"
            raise PhalanxError(
                f"{cls.__name__} does not read it (the general options a task reads are its `reads`: {read})",
                flag(name),
            )


def defaults_of(task: str, given: dict[str, Any] | None = None) -> dict[str, Any]:
    """General options this task gives other defaults (pix2pix's Adam and LR for translate, a
    torchvision classifier's LR for its batch, ...), given the options set explicitly."""
    given = given or {}
    if task in builtin():
        info = builtin()[task]
        defaults = {**info.defaults, **(info.adapt({**info.defaults, **given}) if info.adapt else {})}
    else:
        defaults = dict(getattr(task_class(task), "defaults", {}) or {})  # your own task's (imports it)
    return {**defaults, **optimizer_lr(defaults, given)}


_task_base: list[type] = []


def register_task_base(base: type) -> None:
    """Called by ``phalanx.tasks.base`` with its ``Task``: ``task_class`` checks user classes against
    it without this layer below the tasks importing them."""
    _task_base[:] = [base]


def task_class(name: str) -> Any:
    """The task's class: a built-in by name, or ``package.module:Class`` (imports torch). (Typed Any:
    a subclass of ``phalanx.tasks.base.Task``, which this layer below the tasks cannot name; the
    trainer and inference, above them, name it where they take it.)"""
    check_name(name)
    if name in builtin():
        module_name, _, class_name = builtin()[name].target.partition(":")
        return getattr(importlib.import_module(module_name), class_name)
    from ..system.plugins import import_user_module

    module_name, _, class_name = name.partition(":")
    module = import_user_module(module_name, OPTION)
    # The base class, as phalanx.tasks.base registered it on import (a layer above this one); a
    # module that never imported it defines no task: every class then fails the check below.
    Task: Any = _task_base[0] if _task_base else type("NoTaskBase", (), {})
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        found = sorted(
            n
            for n, v in vars(module).items()
            if isinstance(v, type) and issubclass(v, Task) and v.__module__ == module.__name__
        )
        hint = suggest(class_name, found) or (
            f"; its tasks: {', '.join(found[:8])}{', ...' if len(found) > 8 else ''}"
            if found
            else "; it defines no subclass of phalanx.tasks.Task"
        )
        raise PhalanxError(f"module '{module_name}' has no class '{class_name}'{hint}", OPTION)
    if not issubclass(cls, Task):
        raise PhalanxError(f"'{name}' is not a subclass of phalanx.tasks.Task", OPTION)
    required = ["build_data", "build_models", "training_step"]
    task: Any = cls  # (a Task subclass, checked above)
    if task.evaluate is Task.evaluate:  # a task with an evaluation pass of its own needs no validation_step
        required.append("validation_step")
    missing = [m for m in required if getattr(cls, m) is getattr(Task, m)]
    if missing:
        raise PhalanxError(f"'{name}' does not define {', '.join(missing)}, which every task must", OPTION)
    return cls


# torch's default for Adam and AdamW (a Lightning or plain-torch user's habit): what an SGD task's
# rate becomes when its user picks one of them without --lr. An SGD rate means nothing to Adam:
# resnet18 on the built-in digits, 2 epochs, one run each: 97.2% at 0.001, 94.7% at the classifier's
# 0.0125; smallcnn 90.3% at 0.001, 92.2% at 0.1 (2026-11-27).
ADAPTIVE_LR = 1e-3


def optimizer_lr(defaults: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """Adam or AdamW without ``--lr``: torch's default rate for them, unless the task gives its own
    for its own Adam (pix2pix's 0.0002). An SGD task's rate (or none: the general 0.1) is SGD's."""
    adaptive = ("adam", "adamw")
    own = defaults.get("optimizer", "sgd")
    if "lr" in given or given.get("optimizer", own) not in adaptive or (own in adaptive and "lr" in defaults):
        return {}
    return {"lr": ADAPTIVE_LR}


def __getattr__(name: str) -> Any:
    """``BUILTIN``: the built-in tasks by name (``builtin()``), read once."""
    if name == "BUILTIN":
        return builtin()
    raise AttributeError(name)

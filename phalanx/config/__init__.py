"""The run configuration: every training option, declared once.

``RunConfig`` is the one object that travels from the command line to the trainer and, as JSON, to
every DDP worker: the run's own options (task, name, where, seed) and one frozen section per concern
(``config_sections``). Option names are unique across sections, so flags, ``--config``, the JSON and
``to_dict`` stay flat. ``cli.py`` generates the click options of ``train`` and ``trainlaunch`` from
``FIELDS``, so both commands accept exactly the same training options. The task's own options
(each task folder's ``options.py``) travel inside it, as ``task_options``. Standard library only: this module is
imported by ``phalanx --help``, which must not pay for torch.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from . import habits
from . import registry
from ..errors import PhalanxError
from .checks import check_config
from .sections import (SECTIONS, DataOptions, DeviceOptions, ModelOptions, OptimOptions, OutputOptions, RemoteOptions,
                       ScheduleOptions)
from .fields import option, suggest

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class RunConfig:
    """The run (its task, name, place and seed) and one section per concern."""

    heading: ClassVar[str] = "Run"
    task: str = option(registry.DEFAULT, f"What to train: {registry.names_help()}, or your own task as "
                       "package.module:Class (see the README's \"Your own task\"). Recorded in checkpoints: "
                       "evaluate, predict, export and --resume need no --task.", metavar="NAME")
    task_options: dict = option({}, "The task's own options (flags under the task's heading, --task-option for "
                                "your own task, or a task: section of --config).", cli=False)
    name: str = option("experiment", "Run name; files go to <checkpoints-dir>/<name>/.", identity=False)
    checkpoints_dir: str = option("./checkpoints", "Directory that holds run directories.",
                                  identity=False, metavar="DIR")
    resume: str | None = option(None, "Continue a run: a checkpoint path, or 'auto' for the latest "
                                "checkpoint in the run directory.", identity=False, metavar="PATH|auto")
    overwrite: bool = option(False, "Replace a previous run in the run directory.", identity=False)
    resumed_with: tuple[str, ...] = option((), "What --resume took from the run it continues, as flags (said when "
                                           "the run starts).", identity=False, cli=False)
    seed: int = option(0, "Random seed (runs are deterministic on CPU).")
    data: DataOptions = field(default_factory=DataOptions)
    network: ModelOptions = field(default_factory=ModelOptions)
    optim: OptimOptions = field(default_factory=OptimOptions)
    schedule: ScheduleOptions = field(default_factory=ScheduleOptions)
    devices: DeviceOptions = field(default_factory=DeviceOptions)
    output: OutputOptions = field(default_factory=OutputOptions)
    storage: RemoteOptions = field(default_factory=RemoteOptions)

    def __post_init__(self) -> None:
        if not isinstance(self.task_options, dict):
            raise PhalanxError(f"expected a mapping of option: value, got {self.task_options!r}", "--task-option")
        check_config(self)

    @classmethod
    def flat(cls, **values: Any) -> "RunConfig":
        """A config from options by their flat names (as flags, ``--config`` and the JSON name them);
        options not given take their defaults (not a task's: see ``from_mapping``)."""
        unknown = [name for name in values if name not in FIELDS]
        if unknown:
            raise PhalanxError(f"unknown option '{unknown[0]}'{suggest(unknown[0], list(FIELDS))}", "--config")
        sections = {attr: section(**{k: v for k, v in values.items() if SECTION_OF[k] == attr})
                    for attr, section in SECTIONS.items()}
        return cls(**{k: v for k, v in values.items() if SECTION_OF[k] is None}, **sections)

    # --- derived values
    @property
    def run_dir(self) -> Path:
        return Path(self.checkpoints_dir) / self.name

    @property
    def snapshot_dir(self) -> Path:
        return Path(self.output.pickle_dir) if self.output.pickle_dir else self.run_dir / "pickle"

    # --- plain-data round trip (saved beside the run, handed to workers): flat, as the flags
    def to_dict(self) -> dict[str, Any]:
        data = {}
        for name, f in FIELDS.items():
            section = SECTION_OF[name]
            value = getattr(getattr(self, section) if section else self, name)
            data[name] = list(value) if f.type.startswith("tuple[") else dict(value) if isinstance(value, dict) else value
        return data

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps({"schema": SCHEMA_VERSION, "config": self.to_dict()}, indent=indent, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "RunConfig":
        return from_mapping(json.loads(text)["config"], source="config JSON")

    def identity(self) -> dict[str, Any]:
        """The options that decide what the run computes; compared on resume."""
        return {k: v for k, v in self.to_dict().items() if FIELDS[k].metadata["identity"]}

    def replace(self, **changes: Any) -> "RunConfig":
        """This config with options changed by their flat names, checked as a new one is."""
        return RunConfig.flat(**{**self.to_dict(), **changes})


#: Every option by its flat name, and the section that holds it (None: the run's own).
FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(RunConfig) if f.name not in SECTIONS}
SECTION_OF: dict[str, str | None] = dict.fromkeys(FIELDS)
for _attr, _section in SECTIONS.items():
    for _f in dataclasses.fields(_section):
        assert _f.name not in FIELDS, f"option {_f.name} is declared in two sections"  # flags are flat
        FIELDS[_f.name], SECTION_OF[_f.name] = _f, _attr


def section_of(name: str) -> str:
    """The --help heading of an option."""
    section = SECTION_OF[name]
    return SECTIONS[section].heading if section else RunConfig.heading


def split_keys(values: dict[str, Any], source: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Keys spelled ``batch-size`` or ``batch_size`` -> (general options, task options). A task's
    options may be given flat (as their flags are), under ``task_options``, or in a ``task:``
    mapping with the task's ``name``. Unknown keys name ``source``."""
    general: dict[str, Any] = {}
    task_values: dict[str, Any] = {}
    owners = registry.option_owners()
    for key, value in values.items():
        name = str(key).replace("-", "_")
        if name == "task" and isinstance(value, dict):  # task: {name: translate, ngf: 32}
            section = {str(k).replace("-", "_"): v for k, v in value.items()}
            if "name" in section:
                general["task"] = section.pop("name")
            task_values.update(section)
        elif name == "task_options":
            if not isinstance(value, dict):
                raise PhalanxError("task_options must be a mapping of option: value", source)
            task_values.update({str(k).replace("-", "_"): v for k, v in value.items()})
        elif name in FIELDS:
            general[name] = value
        elif name in owners:
            task_values[name] = value
        else:
            hint = habits.key_hint(name) or suggest(name, list(FIELDS) + list(owners))
            raise PhalanxError(f"unknown option '{key}'{hint}", source)
    return general, task_values


def from_mapping(values: dict[str, Any], source: str) -> RunConfig:
    """Build a config from plain data, naming ``source`` in errors about unknown keys. Options not
    given take the task's defaults (``registry.defaults_of``), then ``RunConfig``'s."""
    general, task_values = split_keys(values, source)
    task = general.get("task", registry.DEFAULT)
    if not isinstance(task, str):
        raise PhalanxError(f"expected a task name, got {task!r}", "--task")
    registry.check_name(task)
    defaults = {k: v for k, v in registry.defaults_of(task, general).items() if k not in general}
    return RunConfig.flat(**{**defaults, **general, "task_options": task_values})

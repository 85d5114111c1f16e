"""The configuration package: ``RunConfig`` and its checks (this module), its sections
(``sections``), field declarations (``fields``), config files (``file``), the task registry
(``registry``), the inference commands' options (``inference``), what a resume takes from its run
(``resume``) and other tools' option names (``habits``). Standard library only; it imports nothing
of phalanx above the base modules, but for the registry, which finds the task folders and your
task by name when it is asked (``importlib``, as ``--model`` finds a factory): the one place the
layers are crossed upwards, at run time, and never by an import statement.

The run configuration: every training option, declared once.

``RunConfig`` is the one object that travels from the command line to the trainer and, as JSON, to
every DDP worker: the run's own options (task, name, where, seed) and one frozen section per concern
(``sections``). Option names are unique across sections, so flags, ``--config``, the JSON and
``to_dict`` stay flat. ``phalanx.cli.options`` generates the click options of ``train`` and ``trainlaunch`` from
``FIELDS``, so both commands accept exactly the same training options. The task's own options
(each task folder's ``options.py``) travel inside it, as ``task_options``. Standard library only: this module is
imported by ``phalanx --help``, which must not pay for torch.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..errors import PhalanxError
from . import habits, registry, sections
from .fields import check_fields, flag, option, suggest
from .sections import (
    SECTIONS,
    DataOptions,
    DeviceOptions,
    ModelOptions,
    OptimOptions,
    OutputOptions,
    RemoteOptions,
    ScheduleOptions,
)

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class RunConfig:
    """The run (its task, name, place and seed) and one section per concern."""

    heading: ClassVar[str] = "Run"
    task: str = option(
        registry.DEFAULT,
        lambda: (
            f"What to train: {registry.names_help()}, or your own task as "
            'package.module:Class (see the README\'s "Your own task"). Recorded in checkpoints: '
            "evaluate, predict, export and --resume need no --task."
        ),
        metavar="NAME",
    )
    task_options: dict = option(
        {},
        "The task's own options (flags under the task's heading, --task-option for "
        "your own task, or a task: section of --config).",
        cli=False,
    )
    name: str = option("experiment", "Run name; files go to <checkpoints-dir>/<name>/.", identity=False)
    checkpoints_dir: str = option(
        "./checkpoints", "Directory that holds run directories.", identity=False, metavar="DIR"
    )
    resume: str | None = option(
        None,
        "Continue a run: a checkpoint path, or 'auto' for the latest checkpoint in the run directory.",
        identity=False,
        metavar="PATH|auto",
    )
    overwrite: bool = option(False, "Replace a previous run in the run directory.", identity=False)
    resumed_with: tuple[str, ...] = option(
        (),
        "What --resume took from the run it continues, as flags (said when the run starts).",
        identity=False,
        cli=False,
    )
    weights_with: tuple[str, ...] = option(
        (),
        "What --weights DIR's own settings (a DeepLIIF directory's train_opt.txt) set, as flags (said when the run starts).",
        identity=False,
        cli=False,
    )
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
    def flat(cls, **values: Any) -> RunConfig:
        """A config from options by their flat names (as flags, ``--config`` and the JSON name them);
        options not given take their defaults (not a task's: see ``from_mapping``)."""
        unknown = [name for name in values if name not in FIELDS]
        if unknown:
            raise PhalanxError(f"unknown option '{unknown[0]}'{suggest(unknown[0], list(FIELDS))}", "--config")
        # (each section of its own type: Any, as RunConfig's field of that name takes it)
        sections: dict[str, Any] = {
            attr: section(**{k: v for k, v in values.items() if SECTION_OF[k] == attr})
            for attr, section in SECTIONS.items()
        }
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
            data[name] = (
                list(value) if f.type.startswith("tuple[") else dict(value) if isinstance(value, dict) else value
            )
        return data

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps({"schema": SCHEMA_VERSION, "config": self.to_dict()}, indent=indent, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunConfig:
        return from_mapping(json.loads(text)["config"], source="config JSON")

    def identity(self) -> dict[str, Any]:
        """The options that decide what the run computes; compared on resume."""
        return {k: v for k, v in self.to_dict().items() if FIELDS[k].metadata["identity"]}

    def replace(self, **changes: Any) -> RunConfig:
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


# --- the checks of a run configuration: each field's own (``fields.check_fields``), and those across
# options that no one field's bounds can say


def check_config(cfg: RunConfig) -> None:
    """Every field as its declaration says (types, choices, bounds, finite numbers), then the rules
    that join several options."""

    def bad(name: str, message: str) -> PhalanxError:
        return PhalanxError(message, flag(name))

    # Types, choices, finite numbers, and lists from JSON and YAML ("0,1", a lone 0) as tuples: the
    # one check every options dataclass goes through.
    check_fields(cfg)
    registry.check_name(cfg.task)
    object.__setattr__(cfg, "task_options", registry.resolve_options(cfg.task, cfg.task_options))
    _check_required(cfg)
    if not (cfg.data.val_crop_pct == 0 or 0.5 <= cfg.data.val_crop_pct <= 1.25):
        raise bad("val_crop_pct", f"must be in [0.5, 1.25], or 0 for auto (got {cfg.data.val_crop_pct})")
    if cfg.data.num_workers != "auto" and not cfg.data.num_workers.isdigit():
        raise bad("num_workers", f"must be a number of processes or 'auto' (got {cfg.data.num_workers!r})")
    if len(cfg.data.mean) != len(cfg.data.std):
        raise bad(
            "mean" if cfg.data.mean else "std",
            f"--mean has {len(cfg.data.mean)} values, --std {len(cfg.data.std)}; give both, one per channel",
        )
    if any(s <= 0 for s in cfg.data.std):
        raise bad("std", f"must be positive (got {cfg.data.std})")
    _check_optim(cfg, bad)
    if not cfg.name or "/" in cfg.name or cfg.name in (".", ".."):
        raise bad("name", f"must be a plain directory name (got {cfg.name!r})")
    if cfg.data.dataset not in ("digits", "synthetic") and not cfg.data.dataroot:
        raise bad("dataroot", f"is required with --dataset {cfg.data.dataset}")
    if cfg.resume is not None and cfg.overwrite:
        raise bad("overwrite", "conflicts with --resume; pick one")
    if cfg.storage.remote_transfer is not None:
        sections.parse_s3_url(cfg.storage.remote_transfer, "--remote-transfer")
    if cfg.devices.sync_bn and cfg.devices.uses_cpu and (cfg.network.compile or cfg.devices.strategy == "fsdp"):
        raise bad(
            "compile" if cfg.network.compile else "strategy",
            "with --sync-bn on CPU workers is not built "
            "yet (phalanx's own synchronised BatchNorm runs eagerly under DDP); train without one of them",
        )
    if cfg.devices.backend == "nccl" and cfg.devices.uses_cpu:
        raise bad("backend", "nccl needs GPUs; give --gpu-ids, or use gloo on the CPU")
    if cfg.devices.strategy == "fsdp":
        _check_fsdp(cfg, bad)
    ids = cfg.devices.gpu_ids
    if len(set(ids)) != len(ids):
        raise bad("gpu_ids", f"lists an id twice ({' '.join(map(str, ids))}); give each GPU once")
    if -1 in ids and len(ids) > 1:
        raise bad("gpu_ids", "-1 (CPU) cannot be mixed with GPU ids")
    if any(i < -1 for i in ids):
        raise bad("gpu_ids", f"ids are >= 0, or -1 for CPU (got {min(ids)})")
    if len(ids) > 1 and cfg.optim.batch_size < len(ids):
        raise bad(
            "batch_size",
            f"{cfg.optim.batch_size} is smaller than the {len(ids)} DataParallel devices; use at least {len(ids)}",
        )


def _check_required(cfg: RunConfig) -> None:
    """Your own task's ``requires``: each general option it cannot run without, given."""
    if not registry.is_user_task(cfg.task):
        return  # (a built-in task refuses a missing --dataroot itself, saying what it reads)
    cls = registry.task_class(cfg.task)
    values = cfg.to_dict()
    for name in getattr(cls, "requires", ()):
        if name not in values:
            raise PhalanxError(
                f"{cls.__name__}.requires names '{name}', which is not a general option "
                f"(they are the flags of `phalanx train --help`, spelt with underscores)",
                "--task",
            )
        if values[name] in (None, "", ()):
            raise PhalanxError(f"is required by --task {cfg.task} (its `requires`)", flag(name))


def _check_optim(cfg: RunConfig, bad: Callable[[str, str], PhalanxError]) -> None:
    if len(cfg.optim.betas) != 2 or not all(0 <= b < 1 for b in cfg.optim.betas):
        raise bad("betas", f"must be two numbers in [0, 1) (got {','.join(map(str, cfg.optim.betas))})")
    if cfg.schedule.min_lr and cfg.schedule.lr_schedule != "cosine":
        raise bad("min_lr", f"is where the cosine schedule ends; --lr-schedule {cfg.schedule.lr_schedule} has no floor")
    if cfg.schedule.min_lr >= cfg.optim.lr:
        raise bad("min_lr", f"{cfg.schedule.min_lr:g} is not below --lr {cfg.optim.lr:g}")
    if cfg.optim.nesterov and (cfg.optim.optimizer != "sgd" or not cfg.optim.momentum):
        raise bad(
            "nesterov",
            "is SGD's with a momentum: give --optimizer sgd and --momentum above 0"
            if cfg.optim.optimizer == "sgd"
            else f"is SGD's; --optimizer {cfg.optim.optimizer} has none",
        )


def _check_fsdp(cfg: RunConfig, bad: Callable[[str, str], PhalanxError]) -> None:
    """What --strategy fsdp does not do yet, refused before anything runs."""
    for name, on in (("ema_decay", cfg.optim.ema_decay), ("compile", cfg.network.compile)):
        if on:
            raise bad(name, "with --strategy fsdp is not built yet; use --strategy ddp")
    if cfg.devices.fsdp_checkpoints == "sharded" and (cfg.storage.remote_transfer or cfg.storage.remote_transfer_cmd):
        raise bad(
            "fsdp_checkpoints",
            "uploading sharded checkpoints is not built yet; add --fsdp-checkpoints whole to upload whole ones",
        )

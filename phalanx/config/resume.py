"""What a resumed run takes from the run it continues: the options its command line leaves out.

``--resume`` continues a run, so the options that decide what the run computes (its task, model,
data, task options: the identity options), its --dataroot, --epochs and what it records are the
saved run's where they are neither typed nor in ``--config`` and would otherwise resolve to another
value: ``phalanx train --name X --resume auto`` needs nothing else, as ``evaluate``, ``predict`` and
``export`` need no ``--task``. A typed value that differs from the saved
one is still refused, naming both (``rundir``). Where the saved configuration cannot be read
here, nothing is taken and ``rundir`` reports the checkpoint's problem.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import PhalanxError
from . import FIELDS, from_mapping, registry, split_keys
from .fields import flag

CONFIG_BYTES = 1 << 20  # a run's config.json is a few kB; anything larger is not one
# Beyond the identity options: where the data is (it may move: typed, it is used), the schedule's
# length, the batch and the LR (typed, they may change, as the world size may) and what the run records. Never
# what this machine or invocation decides (devices, workers, --max-steps) nor anything that sends
# or runs something (--remote-transfer(-cmd), --pickle-dir): a checkpoint from elsewhere must not
# choose where your files go.
TAKEN_BEYOND_IDENTITY = (
    "dataroot",
    "epochs",
    "batch_size",
    "grad_accum",
    "lr",
    "best_metric",
    "val_every",
    "save_epoch_freq",
    "log_every",
    "snapshot_every",
    "clip_grad",
    "clip_mode",
    "min_lr",
    # never loaded at a resume (the checkpoint holds the weights): kept so that the resumed run's
    # configuration still says where its weights came from (the normalisation they decided is
    # recorded apart, as mean and std)
    "weights",
)


def saved_options(given: dict[str, Any]) -> dict[str, Any]:
    """For a ``--resume`` in ``given`` (typed flags and --config): the saved run's ``task`` (where
    none is given), its options that ``given`` lacks and that would otherwise resolve to another
    value, and its task options that ``given`` lacks (``task_options``); {} for a new run, an
    unreadable save, or another --task given."""
    if not given.get("resume") or not isinstance(given["resume"], str):
        return {}
    try:
        general, task_values = split_keys(given, "--config")
        saved = from_mapping(
            _saved_config(given["resume"], general), source="the resumed run's configuration"
        ).to_dict()
        task = general.get("task", saved["task"])
        if task != saved["task"]:
            return {}  # another task: nothing of this run's applies (rundir names the difference)
        options = {key: value for key, value in saved["task_options"].items() if key not in task_values}
        # What this command line alone resolves to (the task's and the model's defaults included).
        alone = from_mapping(
            {**general, "task": task, "task_options": {**options, **task_values}}, source="--config"
        ).to_dict()
        taken = {name: value for name, value in saved.items() if _takes(name, general) and value != alone[name]}
        # A default that follows another option (Adam's rate follows --optimizer, a torchvision
        # model's rate its batch) follows it as the run had it: an Adam run's typed 0.1 is not Adam's 0.001.
        followed = registry.defaults_of(task, {**general, **taken})
        taken.update(
            {
                name: saved[name]
                for name, value in followed.items()
                if name in saved and _takes(name, general) and _plain(saved[name]) != _plain(value)
            }
        )
    except (PhalanxError, TypeError, AttributeError, ValueError):  # not a configuration: take nothing
        return {}
    return {**({} if "task" in general else {"task": task}), **taken, "task_options": options}


def _takes(name: str, typed: dict[str, Any]) -> bool:
    """Whether a resume takes the saved run's ``name`` where its value would otherwise differ."""
    return (
        name in FIELDS
        and name not in typed
        and name not in ("task", "task_options")
        and (FIELDS[name].metadata["identity"] or name in TAKEN_BEYOND_IDENTITY)
    )


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def described(taken: dict[str, Any], task: str) -> list[str]:
    """What was taken for a run of ``task``, as flags, leaving out task options at their defaults:
    what the user should know."""
    if not taken:
        return []
    try:
        defaults = from_mapping({"task": task}, source="defaults").to_dict()["task_options"]
    except PhalanxError:  # a task option with no default: every taken one is said
        defaults = {}
    named = [f"--task {task}"] if "task" in taken and task != registry.DEFAULT else []
    named += [_as_flag(name, value) for name, value in taken.items() if name not in ("task", "task_options")]
    return named + [
        _as_flag(key, value)
        for key, value in taken.get("task_options", {}).items()
        if key not in defaults or value != defaults[key]
    ]


def _as_flag(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return flag(name) if value else "--no-" + flag(name)[2:]
    if isinstance(value, (list, tuple)):
        return f"{flag(name)} {','.join(map(str, value))}"
    return f"{flag(name)} {value}"


def _saved_config(resume: str, general: dict[str, Any]) -> Any:
    if resume == "auto":  # the run directory's config.json (written at each start): no checkpoint to load here
        try:
            run_dir = Path(general.get("checkpoints_dir", FIELDS["checkpoints_dir"].default)) / general.get(
                "name", FIELDS["name"].default
            )
            with open(run_dir / "config.json", "rb") as fh:
                return json.loads(fh.read(CONFIG_BYTES + 1)[:CONFIG_BYTES]).get("config")
        except (OSError, TypeError, ValueError, AttributeError):  # no such file, or not a run's (rundir says why)
            return None
    try:  # the checkpoint's own configuration; mapped, so its tensors are not read
        import torch

        state = torch.load(resume, map_location="cpu", weights_only=True, mmap=True)
        return state.get("config") if isinstance(state, dict) else None
    except Exception:  # noqa: BLE001 - any unreadable file: rundir's load names the problem
        return None

"""What a resumed run takes from the run it continues: the options its command line leaves out.

``--resume`` continues a run, so the options that decide what the run computes (its task, model,
data, task options: the identity options), its --dataroot, --epochs and what it records are the
saved run's unless they are typed or in ``--config``: ``phalanx train --name X --resume auto`` needs nothing else, as
``evaluate``/``predict``/``export`` need no ``--task``. A typed value that differs from the saved
one is still refused, naming both (``rundir``). Where the saved configuration cannot be read
here, nothing is taken and ``rundir`` reports the checkpoint's problem.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import tasks
from .config import FIELDS, from_mapping, split_keys
from .errors import PhalanxError
from .fields import flag

CONFIG_BYTES = 1 << 20  # a run's config.json is a few kB; anything larger is not one
# Beyond the identity options: where the data is (it may move: typed, it is used), the schedule's
# length and what the run records. Never what this machine or invocation decides (devices, workers,
# --max-steps) nor anything that sends or runs something (--remote-transfer(-cmd), --pickle-dir):
# a checkpoint from elsewhere must not choose where your files go.
TAKEN_BEYOND_IDENTITY = ("dataroot", "epochs", "best_metric", "val_every", "save_epoch_freq", "log_every",
                         "snapshot_every")


def saved_options(given: dict[str, Any]) -> dict[str, Any]:
    """The saved run's values of the options ``given`` (typed flags and --config, as
    ``config.from_mapping`` reads them) lacks, for a ``--resume`` in ``given``; {} for a new run,
    an unreadable save, or another --task typed."""
    resume = given.get("resume")
    if not resume:
        return {}
    raw = _saved_config(resume, given)
    try:  # an older phalanx's configuration, read as this one reads it
        general, task_values = split_keys(given, "--config")
        saved = from_mapping(raw, source="the resumed checkpoint's configuration").to_dict()
    except (PhalanxError, TypeError, AttributeError):  # not a mapping, or not a configuration
        return {}
    if general.get("task", saved["task"]) != saved["task"]:
        return {}  # another task: nothing of this run's applies (rundir names the difference)
    taken = {name: value for name, value in saved.items()
             if name not in general and name != "task_options"
             and (FIELDS[name].metadata["identity"] or name in TAKEN_BEYOND_IDENTITY)}
    options = {key: value for key, value in saved["task_options"].items() if key not in task_values}
    return {**taken, "task_options": options}


def differing(taken: dict[str, Any]) -> list[str]:
    """The taken options whose values are not their defaults, as flags: what the user should know."""
    task = taken.get("task", tasks.DEFAULT)
    defaults = from_mapping({"task": task}, source="defaults").to_dict()  # the task's own defaults
    flags = [f"--task {task}"] if task != tasks.DEFAULT else []
    flags += [f"{flag(name)} {value}" for name, value in taken.items()
              if name not in ("task", "task_options") and value != defaults[name]]
    return flags + [f"{flag(key)} {value}" for key, value in taken.get("task_options", {}).items()
                    if value != defaults["task_options"].get(key)]


def _saved_config(resume: str, given: dict[str, Any]) -> Any:
    if resume == "auto":  # the run directory's config.json (written at each start): no checkpoint to load here
        run_dir = Path(given.get("checkpoints_dir", FIELDS["checkpoints_dir"].default)) / \
            given.get("name", FIELDS["name"].default)
        try:
            with open(run_dir / "config.json", "rb") as fh:
                return json.loads(fh.read(CONFIG_BYTES + 1)[:CONFIG_BYTES]).get("config")
        except (OSError, ValueError, AttributeError):
            return None
    try:  # the checkpoint's own configuration; mapped, so its tensors are not read
        import torch

        state = torch.load(resume, map_location="cpu", weights_only=True, mmap=True)
        return state.get("config") if isinstance(state, dict) else None
    except Exception:  # noqa: BLE001 - any unreadable file: rundir's load names the problem
        return None

"""Sharded checkpoints (``--fsdp-checkpoints sharded``, the default under ``--strategy fsdp``):
every rank writes its own shard of the networks and optimizer states with
``torch.distributed.checkpoint`` (DCP), so no process ever holds a network whole.

A sharded checkpoint is two things: a directory ``shards/<tag>/`` (one ``.distcp`` file per rank
and DCP's ``.metadata``), and the usual small file (``latest.pt``, ``best.pt``, ``epoch_NNNN.pt``)
holding the rest of the state (progress, the task's state, the configuration, ...) and the
directory's name under ``sharded``. Written in that order, atomically: the shards go to
``shards/.writing`` and are renamed once every rank's are complete, and the file that names them
is replaced only then, so a crash at any moment leaves the previous checkpoint whole. A directory
no checkpoint names any more is removed at the next save.

The networks and optimizer states are stored by parameter name (``G.0.weight``), as torch's
``get_model_state_dict``/``get_optimizer_state_dict`` give them, so they load at any world size
and under either strategy (DCP reads each rank's part of every tensor); ``whole`` turns one into
the single-file format for ``evaluate``, ``predict``, ``export``, ``--weights`` and ``phalanx
consolidate``.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .. import checkpoint
from ..errors import PhalanxError, RunFailed
from ..system.atomic import _fsync_dir

SHARDS = "shards"
WRITING = ".writing"


def _networks(models: dict[str, nn.Module]) -> nn.ModuleDict:
    """Every network under its name, so an optimizer's parameters are named ``G.0.weight`` whatever
    networks it steps (DeepLIIF's generators share one)."""
    return nn.ModuleDict(models)


def _states(models: dict[str, nn.Module], optimizers: dict[str, torch.optim.Optimizer]) -> dict[str, Any]:
    """This rank's part of every network and optimizer state: shards (DTensors) under FSDP, whole
    tensors otherwise; a fresh optimizer's state made (zero steps) so that a load has a place to go."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    networks = _networks(models)
    return {
        "models": {name: get_model_state_dict(model) for name, model in models.items()},
        "optimizers": {name: get_optimizer_state_dict(networks, optimizer) for name, optimizer in optimizers.items()},
    }


def save(
    run_dir: Path, tag: str, models: dict[str, nn.Module], optimizers: dict[str, torch.optim.Optimizer], strategy: Any
) -> str:
    """Every rank: write the shards; rank 0 renames them into place and returns their directory,
    relative to the run directory (the other ranks get ""). Nothing refers to them yet."""
    import torch.distributed.checkpoint as dcp

    writing = run_dir / SHARDS / WRITING
    if strategy.is_main:
        shutil.rmtree(writing, ignore_errors=True)  # left by a run that died while writing
        writing.mkdir(parents=True)
    strategy.barrier()
    dcp.save(_states(models, optimizers), checkpoint_id=writing)
    if not strategy.is_main:
        return ""
    _check_complete(writing)
    name = tag
    while (run_dir / SHARDS / name).exists():  # the same step saved again (a rerun from an older checkpoint)
        name += "+"
    writing.rename(run_dir / SHARDS / name)
    _fsync_dir(run_dir / SHARDS)  # the rename durable before any file names the directory
    return f"{SHARDS}/{name}"


def _check_complete(directory: Path) -> None:
    """Every file the metadata names is here: ranks on other machines write to their own disks
    unless the run directory is shared."""
    missing = _incomplete(directory)
    if missing:
        raise RunFailed(
            f"{missing} in {directory}: with --fsdp-checkpoints sharded every worker writes its shard into "
            "the run directory, which must be shared by all machines (or use --fsdp-checkpoints whole)"
        )


def collect(run_dir: Path) -> None:
    """Rank 0, with no save in flight: remove the shard directories no checkpoint names."""
    shards = run_dir / SHARDS
    if not shards.is_dir():
        return
    named = set()
    for path in run_dir.glob("*.pt"):  # latest, best, epoch_NNNN and any copy the user made
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception:
            return  # unsure what it names (an I/O error, a file being copied): remove nothing now
        if isinstance(state, dict) and isinstance(state.get("sharded"), str):
            named.add(state["sharded"].split("/")[-1])
    for directory in shards.iterdir():
        if directory.name != WRITING and directory.name not in named:
            shutil.rmtree(directory, ignore_errors=True)


def restore(directory: Path, models: dict[str, nn.Module], optimizers: dict[str, torch.optim.Optimizer]) -> None:
    """Every rank: load its part of each network and optimizer state (any world size, either strategy)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    states = _states(models, optimizers)
    stored = _stored_keys(directory)
    for name, saved in states["optimizers"].items():
        # a weight that never had a gradient has no optimizer state (as Optimizer.state_dict() leaves it out)
        saved["state"] = {
            fqn: values
            for fqn, values in saved["state"].items()
            if any(f"optimizers.{name}.state.{fqn}.{key}" in stored for key in values)
        }
    try:
        with _quiet():
            dcp.load(states, checkpoint_id=directory, no_dist=not dist.is_initialized())  # one process: no warning
    except Exception as exc:  # a shard missing, cut short, or of other networks
        raise PhalanxError(f"the shards in {directory} do not load: {_first_line(exc)}", "--resume") from None
    for name, model in models.items():
        set_model_state_dict(model, states["models"][name])
    networks = _networks(models)
    for name, optimizer in optimizers.items():
        set_optimizer_state_dict(networks, optimizer, states["optimizers"][name])


def _stored_keys(directory: Path, option: str = "--resume") -> set[str]:
    """The keys the shards hold, once every file the metadata names is there and long enough (a
    checkpoint copied in part, or cut short, is one line here, not DCP's tracebacks later)."""
    from torch.distributed.checkpoint import FileSystemReader

    try:
        metadata = FileSystemReader(directory).read_metadata()
    except Exception as exc:
        raise PhalanxError(f"the shards in {directory} do not load: {_first_line(exc)}", option) from None
    missing = _incomplete(directory, metadata)
    if missing:
        raise PhalanxError(f"the shards in {directory} do not load: {missing}", option)
    return set(metadata.state_dict_metadata)


def _incomplete(directory: Path, metadata: Any = None) -> str:
    """The first file the shards' metadata names that is missing or shorter than it says, in words
    ("" when every one is whole)."""
    from torch.distributed.checkpoint import FileSystemReader

    metadata = metadata or FileSystemReader(directory).read_metadata()
    ends: dict[str, int] = {}
    for item in (metadata.storage_data or {}).values():
        ends[item.relative_path] = max(ends.get(item.relative_path, 0), item.offset + item.length)
    for name, end in sorted(ends.items()):
        size = (directory / name).stat().st_size if (directory / name).is_file() else None
        if size is None or size < end:
            return f"{name} {'is missing' if size is None else f'is cut short ({size} of {end} bytes)'}"
    return ""


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """DCP logs a traceback before it raises; phalanx says what failed in one line."""
    logger = logging.getLogger("torch.distributed.checkpoint")
    level, logger.level = logger.level, logging.CRITICAL
    try:
        yield
    finally:
        logger.setLevel(level)


def _first_line(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"[:200]


def whole(state: dict[str, Any], optimizers: bool = True, option: str = "--checkpoint") -> dict[str, Any]:
    """A sharded checkpoint (as ``checkpoint.load`` returns it) in the single-file format: every
    tensor read whole into this process, each optimizer's state numbered as ``state_dict()`` does
    (``optimizers`` False: the networks alone, what inference needs)."""
    if not state.get("sharded"):
        return state
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    _stored_keys(Path(state["sharded"]), option)
    stored: dict[str, Any] = {}
    try:  # DCP's own reader for a checkpoint without a state dict to load into (format_utils.dcp_to_torch_save)
        with _quiet():
            _load_state_dict(
                stored,
                storage_reader=FileSystemReader(state["sharded"]),
                planner=_EmptyStateDictLoadPlanner(keys=None if optimizers else {"models"}),
                no_dist=True,
            )
    except Exception as exc:  # a shard missing or cut short, a foreign .metadata
        raise PhalanxError(f"the shards in {state['sharded']} do not load: {_first_line(exc)}", option) from None
    models = stored["models"]
    rest = {key: value for key, value in state.items() if key != "sharded"}
    whole_state = {**rest, "models": models, "model": models[state["primary"]]}
    if optimizers:
        whole_state["optimizers"] = {name: _numbered(saved) for name, saved in stored["optimizers"].items()}
    return whole_state


def _numbered(saved: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state keyed by parameter name as ``Optimizer.state_dict()`` keys it: parameters
    numbered in the order of the groups."""
    index: dict[str, int] = {}
    groups = []
    for group in saved["param_groups"]:
        numbers = [index.setdefault(name, len(index)) for name in group["params"]]
        groups.append({**group, "params": numbers})
    state = {index[name]: values for name, values in saved["state"].items()}
    return {"state": state, "param_groups": groups}


def load_whole(path: Path, option: str, optimizers: bool = True) -> dict[str, Any]:
    """A checkpoint of either format, whole."""
    return whole(checkpoint.load(path, option), optimizers, option)


def consolidate(source: Path, target: Path) -> dict[str, Any]:
    """``phalanx consolidate``: one file holding the checkpoint whole (written atomically)."""
    if target.exists() or target.is_symlink():  # nothing already written is lost
        raise PhalanxError(f"{target} exists; give a new file name", "--output")
    if not target.parent.is_dir():
        raise PhalanxError(f"{target.parent} does not exist", "--output")
    source, which = checkpoint.in_run_directory(source, "--checkpoint")
    if which:
        print(which, file=sys.stderr, flush=True)
    state = load_whole(source, "--checkpoint")
    checkpoint.save([target], {k: v for k, v in state.items() if k not in ("format", "version", "primary")})
    return state

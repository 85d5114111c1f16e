"""A trained task from its checkpoint alone: configuration, task, networks and what the data
resolved to (classes, image size, normalisation)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..checkpoint import BEST, LATEST, in_run_directory, is_run_directory
from ..checkpoint.sharded import load_whole
from ..config import RunConfig, from_mapping, registry
from ..config.fields import flag
from ..config.registry import task_class
from ..errors import PhalanxError
from ..tasks.base import Task, TaskData
from ..tasks.inference import Trained
from ..train.state import NetworkMismatch, load_for_inference

OPTION = "--checkpoint"


def load_trained(
    path: str,
    ema: bool = False,
    changes: Mapping[str, Any] | None = None,
    task_changes: Mapping[str, Any] | None = None,
) -> Trained:
    """Rebuild the task's networks by name and load their weights and the task's own state (a
    momentum teacher, ...); a foreign, truncated or mismatched file is one clear error (exit 2).
    ``changes``: this command's options over the run's (devices, batch size, data); ``task_changes``:
    over the task's own, each refused where the checkpoint's task has no such option. A run
    directory is its best.pt, else its latest.pt, said on the first line; another tool's model
    directory that a task reads (``TaskInfo.reads_folders``: DeepLIIF's) is that task's, trained."""
    folder = Path(path)
    if folder.is_dir() and not is_run_directory(folder):
        for reader, _ in registry.folder_readers():
            found = registry.named_function(reader)(folder, ema, changes or {}, task_changes or {})
            if found is not None:
                return found
        kinds = "".join(f", or {words}" for _, words in registry.folder_readers())
        raise PhalanxError(
            f"{path} is a directory without {BEST} or {LATEST} (a run directory holds them{kinds}); give a "
            "checkpoint file or such a directory",
            OPTION,
        )
    file, which = in_run_directory(folder, OPTION)
    if which:
        print(which, file=sys.stderr, flush=True)
    path = str(file)
    state = load_whole(file, OPTION, optimizers=False)  # a sharded checkpoint: its networks read whole
    try:
        cfg = from_mapping(state["config"], source=OPTION)
    except (KeyError, TypeError, PhalanxError) as exc:
        raise PhalanxError(f"{path} has no usable run configuration ({exc})", OPTION) from None
    if changes:
        cfg = cfg.replace(**changes)
    for name in task_changes or {}:
        if name not in cfg.task_options:
            raise PhalanxError(f"--task {cfg.task} (this checkpoint's) does not read it", flag(name))
    if task_changes:
        cfg = cfg.replace(task_options={**cfg.task_options, **task_changes})
    task: Task = task_class(cfg.task)(cfg)
    info = state.get("data") or _infer_data(cfg, state["models"]["model"])
    task.restore_info(info)
    torch.manual_seed(cfg.seed)
    # No training data: build_models reads data.info alone here (Task.restore_info)
    models = task.build_models(TaskData(None, None, "", info))  # type: ignore[arg-type]  # (no datasets: see above)
    if cfg.optim.precision == "fp64":
        models = {name: model.double() for name, model in models.items()}
    if ema and not state.get("ema"):
        raise PhalanxError(f"{path} has no moving average of the weights (trained without --ema-decay)", "--ema")
    try:
        load_for_inference(state, models, task, ema)
    except KeyError as exc:
        raise PhalanxError(f"{path} holds no weights for the network {exc.args[0]!r}", OPTION) from None
    except NetworkMismatch as exc:  # missing keys, unexpected keys, shapes
        name = exc.name
        first = str(exc.error).strip().splitlines()[0]
        what = cfg.network.model if name == "model" else f"{cfg.task}'s {name}"  # one whole model: --model's name
        raise PhalanxError(f"{path} does not fit model {what!r} ({first[:200]})", OPTION) from None
    return Trained(Path(path), cfg, task, models, info)


def _infer_data(cfg: RunConfig, weights: dict[str, torch.Tensor]) -> dict[str, Any]:
    """phalanx 0.1 checkpoints predate the "data" entry: rebuild it as 0.1 trained ([-1, 1] inputs)."""
    outputs = [v for k, v in weights.items() if k.endswith("weight") and v.dim() == 2][-1].shape[0]
    channels = next(v for v in weights.values() if v.dim() == 4).shape[1]
    size = cfg.data.image_size or (8 if cfg.data.dataset == "digits" else 32)
    return {
        "classes": [str(i) for i in range(outputs)],
        "channels": channels,
        "size": size,
        "crop_pct": 1.0,
        "mean": [0.5] * channels,
        "std": [0.5] * channels,
    }

"""A DeepLIIF model directory as a checkpoint: ``evaluate``, ``predict`` and ``export
--checkpoint DIR`` read DeepLIIF's own files, with no training step and no copy on disk.

The directory's ``train_opt.txt`` says which networks, their width, normalisation and padding, the
modalities' names and the segmentation's weights (``train_opt.settings``: DeepLIIF 1.2.7's test
mode, its defaults for an older file); an option given on the command line wins. The generators
come from ``latest_net_*.pth`` (one epoch's where there is no latest), built as ``train_opt.txt``
says and loaded key for key, else from ``deepliif serialize``'s TorchScript ``G*.pt``, run as they
are (as ``deepliif test`` runs them). Only the generators are built: memory is theirs alone.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...config import from_mapping
from ...errors import PhalanxError
from ..inference import Trained
from . import train_opt
from .files import MAX_BYTES, generator_files, read_state
from .task import DeepLIIFTask

OPTION = "--checkpoint"


def holds_networks(folder: Path) -> bool:
    """Files named as DeepLIIF names its generators (``*_net_G*.pth``, ``G*.pt``)."""
    return bool(train_opt.network_names(folder))


def trained_from(
    folder: Path, ema: bool, changes: Mapping[str, Any], task_changes: Mapping[str, Any], option: str = OPTION
) -> Trained | None:
    """The directory's generators as a trained ``--task deepliif``; None where ``folder`` is no
    DeepLIIF directory. ``changes``: the command's general options (data, batch size);
    ``task_changes``: task options given, over the file's; ``option``: the one that named it."""
    found = train_opt.settings(folder, option)
    if found is None:
        if holds_networks(folder):
            raise PhalanxError(
                f"{folder} holds DeepLIIF networks but no {train_opt.FILE}, which says how they were built and "
                "how their segmentations are weighed (deepliif test needs it too)",
                option,
            )
        return None
    if ema:
        raise PhalanxError(f"{folder} is a DeepLIIF model directory: it has no moving average of the weights", "--ema")
    from_file = train_opt.task_options(found, option)
    options = {**from_file, **task_changes}
    size = int(found["scale_size"])
    try:
        cfg = from_mapping(
            {"task": "deepliif", "image_size": size, **(changes or {}), "task_options": options}, source=option
        )
    except PhalanxError as exc:
        raise PhalanxError(f"{folder / train_opt.FILE}: {exc.message}", exc.option) from None
    task = DeepLIIFTask(cfg)
    m, seg = options["modalities"], options["seg"]
    info = {
        "targets": m + seg,
        "channels": 3,
        "size": size,
        "mode": "RGB",
        "layout": "plain",
        "mean": [0.5] * 3,
        "std": [0.5] * 3,
        "net_g": options["net_g"],
        "net_gs": options["net_gs"],
        "modalities": m,
        "seg": seg,
        "background_colors": [list(c) for c in found["background_colors"]],
    }
    task.restore_info(info)
    names = task.generator_names()
    files = generator_files(folder, m, names, option, serialized=lambda name: deepliif_name(name, found))
    scripted = files[names[0]].suffix == ".pt"
    models = scripted_models(files, names, option) if scripted else built_models(task, files, names, option)
    kind = (
        "TorchScript G*.pt (deepliif serialize's)"
        if scripted
        else f"{files[names[0]].name.split('_net_')[0]}_net_*.pth"
    )
    print(
        f"phalanx: {option} {folder} is a DeepLIIF model directory (model {found['model']}): {len(names)} generators "
        f"({', '.join(names)}) from {kind}; " + train_opt.described(found, options, frozenset(task_changes)),
        file=sys.stderr,
        flush=True,
    )
    return Trained(folder, cfg, task, models, info)


def deepliif_name(name: str, found: train_opt.ModelSettings) -> str:
    """A phalanx generator name as the directory's files name it (GS0 is the released model's G51)."""
    if not name.startswith("GS"):
        return name
    return f"G{found['seg_id']}{int(name[2:]) + found['input_id']}"


def built_models(
    task: DeepLIIFTask, files: dict[str, Path], names: list[str], option: str = OPTION
) -> dict[str, nn.Module]:
    """phalanx's networks, built as the directory's options say, each loaded from its state dict."""
    models = task.build_generators(3)
    for name in names:
        state, own = read_state(files[name], option), models[name].state_dict()
        wrong = sorted(set(own) ^ set(state)) or [k for k in own if state[k].shape != own[k].shape]
        if wrong:
            key = wrong[0]
            shape = (
                f" {tuple(state[key].shape)} where {train_opt.FILE} builds {tuple(own[key].shape)}"
                if key in state and key in own
                else f" is not in the network {train_opt.FILE} describes"
                if key in state
                else " is missing"
            )
            raise PhalanxError(
                f"{files[name]}: {key}{shape}: the file and {files[name].parent / train_opt.FILE} disagree "
                f"(netG/net_gs/ngf/norm/padding/no_dropout)",
                option,
            )
        models[name].load_state_dict(state)
        models[name].eval()
    return models


def scripted_models(files: dict[str, Path], names: list[str], option: str = OPTION) -> dict[str, nn.Module]:
    """``deepliif serialize``'s traced generators, loaded as ``deepliif test`` loads them."""
    models: dict[str, nn.Module] = {}
    for name in names:
        path = files[name]
        if path.stat().st_size > MAX_BYTES:
            raise PhalanxError(f"{path} is larger than {MAX_BYTES // 2**20} MiB: not a DeepLIIF network", option)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # TorchScript's deprecation notes
                models[name] = torch.jit.load(str(path), map_location="cpu").eval()
        except Exception as exc:
            raise PhalanxError(f"cannot read {path} ({type(exc).__name__}: {str(exc)[:200]})", option) from None
    return models

"""DeepLIIF's model directories, read: ``--weights DIR`` starts ``--task deepliif`` from the
networks a user already has.

DeepLIIF writes one file per network, ``<epoch>_net_<name>.pth`` (``latest_net_G1.pth``, ...: a
state dict, ``BaseModel.save_networks``), and serializes the generators of a released model as
TorchScript (``G1.pt``, ...). Names: ``G1`` ... ``Gm`` and ``D1`` ... ``Dm`` per modality; the
segmentation's ``GS0`` ... ``GSm`` and ``DS0`` ... (DeepLIIF 1.2's), or ``G51`` ... ``G55`` (the
released DeepLIIF model's, segmentation id m + 1, sources counted from 1).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from torch import nn

from ...errors import PhalanxError

OPTION = "--weights"
MAX_BYTES = 2**31  # one network's file; DeepLIIF's largest (unet_512, ngf 64) is 218 MB


def phalanx_name(name: str, modalities: int, first: int = 1) -> str | None:
    """A DeepLIIF network name as phalanx names it (None: not one of this model's); ``first``: the
    number of an old-style segmentation network from the input (1: G51; 0: G50)."""
    match = re.fullmatch(r"([GD])(S?)(\d+)", name)
    if not match:
        return None
    kind, seg, number = match.group(1), match.group(2), match.group(3)
    if seg:
        return name if int(number) <= modalities else None
    if 1 <= int(number) <= modalities:
        return name
    old = str(modalities + 1)  # DeepLIIF before 1.2: G51 ... G55 from the input and each modality
    source = number[len(old) :]
    if number.startswith(old) and source.isdigit() and first <= int(source) <= modalities + first:
        return f"{kind}S{int(source) - first}"
    return None


def model_files(folder: Path, modalities: int, option: str = OPTION) -> dict[str, Path]:
    """phalanx name -> the file of that network in a DeepLIIF model directory: ``latest_net_*.pth``
    (else the only epoch there), else TorchScript ``*.pt``."""
    if not folder.is_dir():
        export = (
            f"; `phalanx export --checkpoint {folder} --format deepliif --output DIR` writes one from a phalanx "
            "checkpoint"
            if folder.is_file()
            else ""
        )
        raise PhalanxError(
            f"{folder} is not a directory (--task deepliif takes a DeepLIIF model directory: "
            f"latest_net_G1.pth, ... or G1.pt, ...){export}",
            option,
        )
    by_epoch: dict[str, dict[str, Path]] = {}
    scripted: dict[str, Path] = {}
    paths = sorted(folder.iterdir())
    first = 0 if any(re.search(rf"(^|_net_)G{modalities + 1}0\.pth?$", p.name) for p in paths) else 1
    for path in paths:
        state = re.fullmatch(r"(.+)_net_(\w+)\.pth", path.name)
        if state and (name := phalanx_name(state.group(2), modalities, first)):
            by_epoch.setdefault(state.group(1), {})[name] = path
        elif path.suffix == ".pt" and (name := phalanx_name(path.stem, modalities, first)):
            scripted[name] = path
    if "latest" in by_epoch:
        return by_epoch["latest"]
    if len(by_epoch) > 1:
        raise PhalanxError(
            f"{folder} holds the networks of epochs {', '.join(sorted(by_epoch))} and no latest_net_*.pth; "
            "give a directory of one epoch",
            option,
        )
    return next(iter(by_epoch.values()), scripted)


def read_state(path: Path, option: str = OPTION) -> dict[str, torch.Tensor]:
    if path.stat().st_size > MAX_BYTES:
        raise PhalanxError(f"{path} is larger than {MAX_BYTES // 2**20} MiB: not a DeepLIIF network", option)
    try:
        if path.suffix == ".pt":
            return dict(torch.jit.load(str(path), map_location="cpu").state_dict())
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise PhalanxError(f"cannot read {path} ({type(exc).__name__}: {str(exc)[:200]})", option) from None
    if not isinstance(state, dict):
        raise PhalanxError(f"{path} is not a state dict", option)
    return {k.removeprefix("module."): v for k, v in state.items()}  # a DataParallel's save


def trained_with(folder: Path) -> str:
    """What the directory's ``train_opt.txt`` says of the networks' shapes, for an error message."""
    path = folder / "train_opt.txt"
    if not path.is_file() or path.stat().st_size > 2**20:
        return ""
    found = {}
    for line in path.read_text(errors="replace").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in (
            "netG",
            "net_g",
            "net_gs",
            "ngf",
            "ndf",
            "norm",
            "n_layers_D",
            "modalities_no",
            "padding",
            "no_dropout",
        ):
            found[key.strip()] = value.split("[")[0].strip()
    return f"; its train_opt.txt says {', '.join(f'{k} {v}' for k, v in found.items())}" if found else ""


def generator_files(
    folder: Path,
    modalities: int,
    generators: list[str],
    option: str,
    serialized: Callable[[str], str] = lambda name: name,
    note: str = "",
) -> dict[str, Path]:
    """``model_files``, every generator among them: else one line naming the first missing one's
    files as DeepLIIF names them (``serialized``: its ``.pt`` name)."""
    files = model_files(folder, modalities, option)
    missing = [name for name in generators if name not in files]
    if missing:
        raise PhalanxError(
            f"{folder} has no file for generator(s) {', '.join(missing)} (DeepLIIF's names: "
            f"latest_net_{missing[0]}.pth or {serialized(missing[0])}.pt){note}",
            option,
        )
    return files


def load_model_dir(
    models: Mapping[str, nn.Module],
    folder: Path,
    generators: list[str],
    discriminators: list[str],
    modalities: int,
    option: str = OPTION,
) -> list[str]:
    """Load every network the directory holds into ``models``; a generator missing is an error,
    discriminators missing (a released model ships generators only) start anew, and say so."""
    files = generator_files(folder, modalities, generators, option, note=trained_with(folder))
    return load_networks(models, files, folder, discriminators, option)


def named_files(
    folder: Path, generators: list[str], discriminators: list[str], option: str = OPTION
) -> dict[str, Path]:
    """The files of networks DeepLIIFExt and SDG name ``G_1``, ``GS_1``, ``D_1``, ``DS_1``: each
    ``latest_net_<name>.pth``; a generator missing is an error."""
    if not folder.is_dir():
        raise PhalanxError(f"{folder} is not a directory (a DeepLIIF model directory: latest_net_G_1.pth, ...)", option)
    files = {name: folder / f"latest_net_{name}.pth" for name in generators + discriminators}
    files = {name: path for name, path in files.items() if path.is_file()}
    missing = [name for name in generators if name not in files]
    if missing:
        raise PhalanxError(
            f"{folder} has no latest_net_{missing[0]}.pth (the generators {', '.join(generators)}, as DeepLIIF's "
            f"save_networks names them){trained_with(folder)}",
            option,
        )
    return files


def load_networks(
    models: Mapping[str, nn.Module], files: dict[str, Path], folder: Path, discriminators: list[str], option: str
) -> list[str]:
    """Each file's state into the network of its name, key for key; what was loaded, in words."""
    for name, path in files.items():
        if name not in models:
            continue
        state = read_state(path, option)
        own = models[name].state_dict()
        if path.suffix == ".pt":  # `deepliif serialize` drops BatchNorm's running statistics before tracing
            state = {**{k: v for k, v in own.items() if k.endswith(("running_mean", "running_var"))}, **state}
        wrong = [k for k in own if k not in state or state[k].shape != own[k].shape]
        if wrong or len(state) != len(own):
            key = wrong[0] if wrong else next(k for k in state if k not in own)
            shape = (
                f" {tuple(state[key].shape)} where {name} has {tuple(own[key].shape)}"
                if key in state and key in own
                else " (not in this run's network)"
                if key in state
                else " missing"
            )
            raise PhalanxError(
                f"{path}: {key}{shape}: trained with other --net-g/--net-gs/--ngf/--ndf/--d-layers/--norm/"
                f"--padding/--dropout than this run{trained_with(folder)}",
                option,
            )
        models[name].load_state_dict(state)
    kinds = "generators and discriminators" if all(d in files for d in discriminators) else "generators"
    lines = [f"phalanx: weights: {len([n for n in files if n in models])} DeepLIIF networks ({kinds}) from {folder}"]
    fresh = [name for name in discriminators if name not in files]
    if fresh:
        named = ", ".join(fresh[:3]) + (", ..." if len(fresh) > 3 else "")
        lines.append(
            f"phalanx: weights: {folder} has no discriminators ({named}): they start from DeepLIIF's initialisation"
        )
    return lines

"""DeepLIIF's ``train_opt.txt``: what a DeepLIIF model directory says of its networks, read as
DeepLIIF 1.2.7's ``test`` reads it (``Options(path_file=..., mode='test')``), with DeepLIIF's own
defaults for what an older file lacks. Standard library only: the configuration reads it for
``--weights DIR`` without importing torch.

DeepLIIF writes one ``'{key:>25}: {value}'`` line per option (``print_options``) and reads each
value back with ``eval``; here ``ast.literal_eval``, a value that is not a Python literal staying
the text it is, as DeepLIIF's fallback keeps it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import PhalanxError

FILE = "train_opt.txt"
MAX_BYTES = 1 << 20  # DeepLIIF's files are about 4 KB
# DeepLIIF's --model -> the phalanx task that trains and predicts it
TASKS = {"DeepLIIF": "deepliif", "DeepLIIFKD": "deepliif"}
RELEASED_NAMES = ["IHC", "Hema", "DAPI", "Lap2", "Marker"]  # DeepLIIF's names for 4 modalities without names
RELEASED_SEG_WEIGHTS = [0.5, 0.0, 0.0, 0.0, 0.5]  # ... and the segmentation weights it then uses
DEEPLIIF_SEG_WEIGHTS = [0.25, 0.15, 0.25, 0.1, 0.25]  # a DeepLIIF file without seg_weights
DEEPLIIF_BACKGROUNDS = [(201, 211, 208), (10, 10, 10), (0, 0, 0), (10, 10, 10)]


@dataclass
class ModelSettings:
    """A directory's settings as DeepLIIF's ``test`` resolves them, and where each came from."""

    folder: Path
    values: dict[str, Any]
    defaults: dict[str, str] = field(default_factory=dict)  # key -> why DeepLIIF's default applies

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


def parse(text: str) -> dict[str, Any]:
    """Each ``key: value`` line (DeepLIIF's ``read_model_params``: split at the first colon, a
    ``[default: ...]`` note dropped), the value as the literal it spells, else as text."""
    values: dict[str, Any] = {}
    for line in text.splitlines():
        key, colon, value = line.partition(":")
        if not colon or not key.strip() or key.strip().startswith("-"):
            continue
        value = re.sub(r"\[default:[^\]]*\]", "", value, count=1).strip()
        try:
            values[key.strip()] = ast.literal_eval(value)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            values[key.strip()] = value
    return values


def read(folder: Path, option: str) -> dict[str, Any] | None:
    """The directory's ``train_opt.txt`` parsed; None where there is none."""
    path = folder / FILE
    if not path.is_file():
        return None
    if path.stat().st_size > MAX_BYTES:
        raise PhalanxError(f"{path} is larger than {MAX_BYTES >> 10} KiB: not DeepLIIF's options file", option)
    try:
        return parse(path.read_text(encoding="utf-8", errors="replace"))
    except OSError as exc:
        raise PhalanxError(f"cannot read {path} ({exc.strerror or exc})", option) from None


def network_names(folder: Path) -> list[str]:
    """The generators' names in the directory's files, as DeepLIIF lists them to find the
    segmentation's id: ``*_net_G*.pth``, else ``G*.pt``."""
    names = [p.name for p in folder.iterdir()]
    states = [n[:-4].split("_net_", 1)[1] for n in names if n.endswith(".pth") and "_net_G" in n]
    return states or [n[:-3] for n in names if n.endswith(".pt") and n.startswith("G")]


@contextmanager
def values_read(folder: Path, option: str) -> Iterator[None]:
    """A value of the wrong kind (``ngf: [4``, ``modalities_no: four``) said in one line."""
    try:
        yield
    except (ValueError, TypeError, KeyError) as exc:
        raise PhalanxError(f"{folder / FILE} has a value phalanx cannot read: {exc}", option) from None


def settings(folder: Path, option: str) -> ModelSettings | None:
    """The directory's settings with DeepLIIF 1.2.7's test-mode defaults (``Options.__init__``,
    mode 'test'); None where the folder has no ``train_opt.txt``."""
    with values_read(folder, option):
        return _settings(folder, option)


def _settings(folder: Path, option: str) -> ModelSettings | None:
    given = read(folder, option)
    if given is None:
        return None
    out = ModelSettings(folder, dict(given))
    v, defaults = out.values, out.defaults

    def default(key: str, value: Any, why: str) -> None:
        if key not in v:
            v[key] = value
            defaults[key] = why

    default("model", "DeepLIIF", "the file names no model")
    model = v["model"]
    if model not in TASKS:
        trains = {"DeepLIIFExt": "deepliif-ext", "SDG": "sdg", "CycleGAN": "cyclegan"}.get(str(model))
        hint = f" (a {model} directory: `--task {trains} --weights DIR` trains from it)" if trains else ""
        raise PhalanxError(
            f"{folder / FILE} says model {model!r}; phalanx reads DeepLIIF's {', '.join(TASKS)} directories{hint}",
            option,
        )
    if "modalities_no" not in v and "targets_no" in v:  # a file from before modalities_no
        v["modalities_no"] = int(v["targets_no"]) - 1
        defaults["modalities_no"] = "targets_no - 1 (an older file)"
    default("modalities_no", 4, "DeepLIIF's 4")
    m = int(v["modalities_no"])
    default("seg_no", 1, "DeepLIIF's: a segmentation")
    if "seg_gen" not in v:
        v["seg_gen"] = True
    names = v.get("modalities_names")
    if m == 4 and "modalities_names" not in v:  # DeepLIIF's released model (test mode, options line 100)
        v["modalities_names"] = list(RELEASED_NAMES)
        v["seg_weights"] = list(RELEASED_SEG_WEIGHTS)
        defaults["modalities_names"] = defaults["seg_weights"] = (
            "DeepLIIF's for 4 modalities in a file without modalities_names (its released model's)"
        )
    elif not names:
        v["modalities_names"] = [f"input{i + 1}" for i in range(int(v.get("input_no", 1)))] + [
            f"mod{i + 1}" for i in range(m)
        ]
        defaults["modalities_names"] = "DeepLIIF's input1, mod1, ... for a file without names"
    default("seg_weights", list(DEEPLIIF_SEG_WEIGHTS) if m == 4 else [1 / m] * m, "DeepLIIF's default")
    default("background_colors", list(DEEPLIIF_BACKGROUNDS), "DeepLIIF's default")
    default("input_no", 1, "DeepLIIF's default")
    default("scale_size", 512, "DeepLIIF's default")
    default("norm", "batch", "DeepLIIF's default")
    default("ngf", 64, "DeepLIIF's default")
    default("ndf", 64, "DeepLIIF's default")
    default("n_layers_D", 4, "DeepLIIF's default")
    default("padding", "zero", "deepliif train's default")
    default("upsample", "convtranspose", "DeepLIIF's default")
    default("no_dropout", False, "deepliif train's default")
    default("net_gs", "unet_512", "DeepLIIF's default")
    if "netG" not in v:
        default("netG", v.get("net_g", "resnet_9blocks"), "net_g" if "net_g" in v else "deepliif train's default")
    v["seg_id"], v["input_id"] = seg_and_input_ids(folder, v)
    return out


def seg_and_input_ids(folder: Path, values: dict[str, Any]) -> tuple[str, int]:
    """The segmentation's id and the input's number in the generators' names (``GS0``: "S", 0;
    the released ``G51``: "5", 1), as DeepLIIF finds them: the file's ``mod_id_seg``, else the
    longest generator name's second character; the input 0 where a name ends in 0."""
    names = network_names(folder) if folder.is_dir() else []
    seg_id = values.get("mod_id_seg")
    if seg_id is None:
        longest = max(names, key=len, default="GS0")
        seg_id = longest[1] if len(longest) > 1 else "S"
    input_id = 0 if any(name[2:] == "0" for name in names) or not names else 1
    return str(seg_id), input_id


def one_value(value: Any, key: str, folder: Path, option: str) -> Any:
    """DeepLIIF keeps one network name per modality (a list); phalanx one for all."""
    if isinstance(value, (list, tuple)):
        if len(set(value)) != 1:
            raise PhalanxError(
                f"{folder / FILE} gives the modalities different networks ({key} {list(value)}); phalanx builds "
                "one kind for all",
                option,
            )
        return value[0]
    return value


def task_options(found: ModelSettings, option: str) -> dict[str, Any]:
    """``--task deepliif``'s options that build the directory's networks and weigh its outputs."""
    v, folder = found.values, found.folder
    if v["upsample"] != "convtranspose":
        raise PhalanxError(
            f"{folder / FILE} says upsample {v['upsample']!r}; phalanx builds DeepLIIF's convtranspose generators",
            option,
        )
    with values_read(folder, option):
        return _task_options(v, folder, option)


def _task_options(v: dict[str, Any], folder: Path, option: str) -> dict[str, Any]:
    return {
        "net_g": one_value(v["netG"], "netG", folder, option),
        "net_gs": one_value(v["net_gs"], "net_gs", folder, option),
        "ngf": int(v["ngf"]),
        "ndf": int(v["ndf"]),
        "d_layers": int(v["n_layers_D"]),
        "norm": str(v["norm"]),
        "padding": str(v["padding"]),
        "dropout": not bool(v["no_dropout"]),
        "modalities": int(v["modalities_no"]),
        "seg": bool(v["seg_gen"]),
        "seg_weights": tuple(float(w) for w in v["seg_weights"]),
        "modalities_names": tuple(str(n) for n in v["modalities_names"]),
    }


def weights_options(spec: str) -> dict[str, Any] | None:
    """``--weights DIR``: the task options a DeepLIIF directory's ``train_opt.txt`` says (its
    networks' shapes, modalities' names and segmentation weights); None where DIR has none."""
    folder = Path(spec)
    if not folder.is_dir():
        return None
    found = settings(folder, "--weights")
    return task_options(found, "--weights") if found is not None else None


def described(found: ModelSettings, used: dict[str, Any], typed: frozenset[str] = frozenset()) -> str:
    """Which of ``used`` came from the file, which from DeepLIIF's defaults, which were given."""
    keys = {
        "net_g": "netG",
        "net_gs": "net_gs",
        "ngf": "ngf",
        "norm": "norm",
        "padding": "padding",
        "modalities": "modalities_no",
        "modalities_names": "modalities_names",
        "seg_weights": "seg_weights",
    }
    from_file, from_defaults, given = [], [], []

    def shown(value: Any) -> str:
        return (
            ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in value)
            if isinstance(value, tuple)
            else str(value)
        )

    for name, key in keys.items():
        if name not in used:
            continue
        text = f"{key} {shown(used[name])}"
        if name in typed:
            given.append(f"--{name.replace('_', '-')} {shown(used[name])}")
        elif key in found.defaults:
            from_defaults.append(f"{text} ({found.defaults[key]})")
        else:
            from_file.append(text)
    parts = [f"from {FILE}: {', '.join(from_file)}" if from_file else f"{FILE} names none of them"]
    parts += [f"DeepLIIF's defaults: {'; '.join(from_defaults)}"] if from_defaults else []
    parts += [f"given: {', '.join(given)}"] if given else []
    return "; ".join(parts)

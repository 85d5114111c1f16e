"""Where samples come from: the built-in digits, ImageFolder trees, torchvision's MNIST /
FashionMNIST / CIFAR-10, and synthetic data. A source gives raw images (uint8 tensors from files,
[0, 1] floats from memory) and labels; ``transforms`` decides what the model sees.

Every problem with the data is found here, before a run directory is created, and reported as one
line that names the option and the file.
"""

from __future__ import annotations

import gzip
import itertools
import os
from collections.abc import Sized
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from ..config.sections import DataOptions
from ..errors import PhalanxError
from . import manifest
from .images import ImageFiles, PathTable
from .layout import TRAIN_NAMES, VALIDATION_NAMES, train_dir, validation_dir

DIGITS_FILE = Path(__file__).with_name("digits.csv.gz")
FOLDER_SIZE = 32  # --image-size for folders when none is given


@dataclass
class Source:
    train: Dataset
    val: Dataset
    classes: list[str]
    channels: int
    native_size: int
    description: str
    in_memory: tuple[torch.Tensor, torch.Tensor] | None = None  # (train, val) images when they fit a tensor
    skipped: dict[str, str] = field(default_factory=dict)  # unreadable files left out (--skip-broken)
    val_from: str = ""


def load(data: DataOptions, seed: int, channels: int | None, unlabelled: bool = False) -> Source:
    """``channels``: what the model insists on (3 for torchvision models), or None for any;
    ``unlabelled``: a folder of images without class folders is valid (labels -1, no classes)."""
    if data.dataset == "digits":
        return _digits(data, seed, channels)
    if data.dataset == "folder":
        return _image_folder(data, seed, channels, unlabelled)
    if data.dataset == "synthetic":
        return _synthetic(data, seed, channels)
    return _torchvision_dataset(data, seed, channels)


def holdout_split(dataset: Dataset, fraction: float, seed: int) -> tuple[Subset, Subset]:
    """A seeded split, identical on every rank and every resume."""
    train, val = holdout_indices(dataset_size(dataset), fraction, seed)
    return Subset(dataset, train), Subset(dataset, val)


def dataset_size(dataset: Dataset[Any]) -> int:
    """``len(dataset)`` of a map-style data set (every one here has a length). Cast: torch's
    ``Dataset`` declares no ``__len__``, though DataLoader and its samplers need one (the task
    contract re-exports it)."""
    return len(cast(Sized, dataset))


def holdout_indices(n: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    n_val = max(1, round(n * fraction))
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    return sorted(order[n_val:]), sorted(order[:n_val])


class Tensors(Dataset):
    """Images and labels already in memory."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.images[index], int(self.labels[index])


def split_in_place(
    images: torch.Tensor, train_idx: list[int], val_idx: list[int], chunk: int = 256
) -> tuple[torch.Tensor, torch.Tensor]:
    """The hold-out split of images no one else holds, without a second copy of the training rows:
    the validation rows copied out, the training rows (ascending) moved to the front where they lie.
    Row k receives row ``train_idx[k] >= k``, and a chunk is read whole before it is written, so no
    row is overwritten before it is read. The tail (the validation rows) stays allocated behind the view."""
    val = images[val_idx]
    order = torch.tensor(train_idx, dtype=torch.long)
    for start in range(0, len(order), chunk):
        part = order[start : start + chunk]
        images[start : start + len(part)] = images[part]
    return images[: len(order)], val


def _in_memory(
    images: torch.Tensor, labels: torch.Tensor, data: DataOptions, seed: int, classes: list[str], what: str
) -> Source:
    """``images``: generated or decoded for this source alone (split where they lie)."""
    train_idx, val_idx = holdout_indices(len(labels), data.val_fraction, seed)
    train, val = split_in_place(images, train_idx, val_idx)
    size = images.shape[-1]
    return Source(
        Tensors(train, labels[train_idx]),
        Tensors(val, labels[val_idx]),
        classes,
        images.shape[1],
        size,
        f"{what} ({len(train_idx)} train / {len(val_idx)} val, {size}x{size})",
        in_memory=(train, val),
    )


# --- built-in digits --------------------------------------------------------------------------


def load_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """The 1,797 8x8 handwritten digits (UCI, as shipped by scikit-learn): pixels in [0, 1]."""
    with gzip.open(DIGITS_FILE, "rt") as fh:
        rows = [[int(v) for v in line.split(",")] for line in fh if line.strip()]
    table = torch.tensor(rows, dtype=torch.float32)
    images = (table[:, :64] / 16.0).reshape(-1, 1, 8, 8)
    return images, table[:, 64].long()


def _digits(data: DataOptions, seed: int, channels: int | None) -> Source:
    images, labels = load_digits()
    # The digits are held upscaled in memory: a size that would take more than 2 GiB is refused
    # before it is allocated (an --image-size of 3000 would ask for 60 GiB).
    per_pixel = len(images) * (channels or 1) * 4
    _refuse_beyond(
        per_pixel * data.image_size**2,
        2**31,
        f"the built-in digits at {data.image_size} px",
        f"give at most {int((2**31 / per_pixel) ** 0.5)} px, or a folder of your own images",
        "--image-size",
    )
    if data.image_size and data.image_size != 8:
        images = torch.nn.functional.interpolate(
            images, size=data.image_size, mode="bilinear", align_corners=False
        ).clamp(0, 1)
    if channels and channels != 1:
        images = images.expand(-1, channels, -1, -1).contiguous()
    return _in_memory(images, labels, data, seed, [str(d) for d in range(10)], "built-in digits")


def _synthetic(data: DataOptions, seed: int, channels: int | None) -> Source:
    """Seeded random images and labels, already in memory: benchmarks measure training, not I/O."""
    size, chans = data.image_size or 32, channels or 3
    # Every process holds its own copy: more than a quarter of the machine's memory is refused
    # before it is allocated (a fuzzed dry run took 23 GB and was killed for memory).
    limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
    _refuse_beyond(
        data.synthetic_samples * chans * size * size * 4,
        limit,
        f"synthetic data ({data.synthetic_samples} images at {size} px)",
        "give fewer --synthetic-samples or a smaller --image-size",
        "--synthetic-samples",
    )
    generator = torch.Generator().manual_seed(seed)
    images = torch.rand(data.synthetic_samples, chans, size, size, generator=generator)
    labels = torch.randint(0, 10, (data.synthetic_samples,), generator=generator)
    return _in_memory(images, labels, data, seed, [str(i) for i in range(10)], "synthetic")


def _refuse_beyond(nbytes: int, limit: int, what: str, advice: str, option: str) -> None:
    """Images generated into memory: refused before they are allocated when larger than ``limit``."""
    if nbytes > limit:
        raise PhalanxError(
            f"{what} would take {nbytes / 2**30:.0f} GiB in memory, more than the "
            f"{limit / 2**30:.0f} GiB allowed; {advice}",
            option,
        )


# --- ImageFolder trees ------------------------------------------------------------------------


def _checked(
    split_dir: Path, classes: list[str] | None, data: DataOptions, unlabelled: bool = False
) -> manifest.Checked:
    """A split's readable images (the manifest's listing); a broken one refused unless --skip-broken."""
    found = manifest.checked(split_dir, classes, unlabelled)
    if found.broken and not data.skip_broken:
        path, why = next(iter(found.broken.items()))
        more = f" (and {len(found.broken) - 1} more)" if len(found.broken) > 1 else ""
        raise PhalanxError(
            f"cannot read image {split_dir / path} ({why}){more}; --skip-broken leaves unreadable images out",
            "--dataroot",
        )
    if not found.paths:
        raise PhalanxError(f"no readable image in {split_dir}", "--dataroot")
    return found


def _files(
    split_dir: Path, found: manifest.Checked, mode: str, data: DataOptions
) -> tuple[list[str], ImageFiles, dict]:
    files = ImageFiles(
        split_dir, PathTable(found.paths), np.asarray(found.labels, dtype=np.int64), mode, fast=data.fast_decode
    )
    return found.classes, files, {str(split_dir / p): why for p, why in found.broken.items()}


def _image_folder(data: DataOptions, seed: int, channels: int | None, unlabelled: bool = False) -> Source:
    assert data.dataroot is not None  # (the configuration requires it with a folder)
    root = Path(data.dataroot)
    if not root.is_dir():
        raise PhalanxError(f"{root} is not a directory", "--dataroot")
    if not train_dir(root).is_dir():
        layout = f"{root}/train/<images> (class folders optional)" if unlabelled else f"{root}/train/<class>/<images>"
        raise PhalanxError(f"{root} has no train/ folder; expected {layout}{_layout_hint(root)}", "--dataroot")
    if channels not in (None, 1, 3):
        raise PhalanxError(f"the model needs {channels} input channels; folders give 1 or 3", "--model")
    found = _checked(train_dir(root), None, data, unlabelled)
    mode = "L" if channels == 1 or channels is None and _grayscale(train_dir(root), found) else "RGB"
    classes, train, skipped = _files(train_dir(root), found, mode, data)
    labels = f"{len(classes)} classes" if classes else "no labels"
    val_root = validation_dir(root)
    train_set: Dataset[Any]
    val_set: Dataset[Any]
    if val_root.is_dir():
        val_found = _checked(val_root, classes or None, data, unlabelled)
        val_classes, val, val_skipped = _files(val_root, val_found, mode, data)
        how: str = f"{val_root.name}/"
        if not classes and val_classes:  # label-free train/: val/'s classes, for monitoring only
            classes, labels = val_classes, f"{len(val_classes)} classes in {how} (train/ has no labels)"
        skipped.update(val_skipped)
        train_set, val_set = train, val
    else:
        train_set, val_set = holdout_split(train, data.val_fraction, seed)
        how = f"{data.val_fraction:g} hold-out"
    size = data.image_size or FOLDER_SIZE
    gone = f"; {len(skipped)} unreadable image(s) left out" if skipped else ""
    return Source(
        train_set,
        val_set,
        classes,
        1 if mode == "L" else 3,
        size,
        f"{root} ({len(train_set)} train / {len(val_set)} val from {how}, {labels}, {size}x{size}{gone})",
        skipped=skipped,
    )


def _layout_hint(root: Path, looked_at: int = 64) -> str:
    """Where a root without train/ seems to point: a split itself, or class folders (torchvision's
    ImageFolder root). Only the first ``looked_at`` entries are read: an error message must not
    list a folder of a million images."""
    if root.name in (*TRAIN_NAMES, *VALIDATION_NAMES) and train_dir(root.parent).is_dir():
        return f" (did you mean --dataroot {root.parent}?)"
    try:
        with os.scandir(root) as entries:
            folders = sorted(
                e.name for e in itertools.islice(entries, looked_at) if e.is_dir() and not e.name.startswith(".")
            )
    except OSError:
        return ""
    if folders and not set(folders) & set(VALIDATION_NAMES):
        shown = ", ".join(folders[:3]) + (", ..." if len(folders) > 3 else "")
        return f" (its folders {shown} would be the classes of {root}/train/: move them there)"
    return ""


GRAY_MODES = {"1", "L", "LA", "I", "I;16", "F"}


def _grayscale(split_dir: Path, found: manifest.Checked, per_class: int = 2, looked_at: int = 16) -> bool:
    """Whether a folder holds grayscale images (the first few readable ones of each class in the
    manifest's listing, up to ``looked_at``): then a model that takes any number of channels trains on
    one, not on three copies of it. The listing is the scan's: a second listing of every class
    folder, sorted as Path objects, took 0.15 s at 100,000 files."""
    from PIL import Image

    seen = 0
    labels = found.labels
    for first in np.unique(np.asarray(labels), return_index=True)[1].tolist():  # each class's (or the folder's) first
        for index in range(first, min(first + per_class, len(labels))):
            if labels[index] != labels[first]:
                break
            try:
                with Image.open(split_dir / found.paths[index]) as img:
                    if img.mode not in GRAY_MODES:
                        return False
                    seen += 1
            except Exception:  # changed since the check: the decode names it
                continue
            if seen >= looked_at:
                return True
    return seen > 0


def image_files(dataset: Dataset) -> ImageFiles | None:
    """The ImageFiles under a split (for the decoder's size hint), if the data set is one."""
    base = dataset.dataset if isinstance(dataset, Subset) else dataset
    return base if isinstance(base, ImageFiles) else None


# --- torchvision datasets ---------------------------------------------------------------------


class Channels(Dataset):
    """A torchvision data set's images as uint8 tensors with the channels the model takes."""

    def __init__(self, base: Dataset, channels: int):
        self.base, self.channels = base, channels

    def __len__(self) -> int:
        return dataset_size(self.base)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from torchvision.transforms.v2.functional import pil_to_tensor, rgb_to_grayscale

        image, label = self.base[index]
        image = pil_to_tensor(image)
        if image.shape[0] == 1 and self.channels == 3:
            image = image.expand(3, -1, -1)
        elif image.shape[0] == 3 and self.channels == 1:
            image = rgb_to_grayscale(image)
        return image, int(label)


def _torchvision_dataset(data: DataOptions, seed: int, channels: int | None) -> Source:
    import torchvision.datasets as tvd

    assert data.dataset is not None  # (DataOptions fills it in; load sends spec's names here)
    spec = {"mnist": (tvd.MNIST, 1, 28), "fashionmnist": (tvd.FashionMNIST, 1, 28), "cifar10": (tvd.CIFAR10, 3, 32)}
    cls, native_channels, native_size = spec[data.dataset]
    out_channels = channels or native_channels
    try:
        train = cls(data.dataroot, train=True, download=data.download)
        val = cls(data.dataroot, train=False, download=data.download)
    except RuntimeError as exc:  # torchvision: "Dataset not found. You can use download=True ..."
        raise PhalanxError(
            f"no {cls.__name__} files under {data.dataroot} ({str(exc).splitlines()[0]}); "
            "add --download where there is internet",
            "--dataroot",
        ) from None
    except OSError as exc:
        raise PhalanxError(f"cannot read {cls.__name__} under {data.dataroot} ({exc})", "--dataroot") from None
    size = data.image_size or native_size
    return Source(
        Channels(train, out_channels),
        Channels(val, out_channels),
        list(train.classes),
        out_channels,
        native_size,
        f"{cls.__name__} ({len(train)} train / {len(val)} val, {size}x{size})",
    )

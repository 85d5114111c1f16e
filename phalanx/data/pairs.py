"""Paired images for image-to-image translation, in the two layouts users have:

- aligned (pix2pix's and DeepLIIF's): ``SPLIT/*.png``, each image the input and its targets
  stitched side by side as square panels (the panel count is width / height);
- plain: ``SPLIT/A/name.png`` (inputs) and ``SPLIT/B/name.png`` (targets, same names), or
  ``B1/``, ``B2/``, ... for several targets (and a task's last target folder after them: DeepLIIF's
  ``seg/``).

Every file is looked at before training starts (its size from its header, bounded in bytes): a
missing or mismatched partner, panels of unequal size or a file that does not open is named in one
line (or left out and counted with ``--skip-broken``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils.data import Dataset

from ..errors import PhalanxError
from .images import MAX_FILE_BYTES, decode, read_bounded, too_large
from .manifest import IMAGE_SUFFIXES
from .sources import dataset_size

OPTION = "--dataroot"


@dataclass
class Pairs:
    """One split: each sample's files (one stitched file, or an input and its targets)."""

    root: Path
    layout: str  # "aligned" or "plain"
    samples: list[tuple[str, ...]]  # paths relative to root: (stitched,) or (input, target1, ...)
    targets: int
    mode: str  # "RGB" or "L"
    skipped: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.samples)


def _images(folder: Path) -> list[str]:
    return sorted(
        e.name for e in os.scandir(folder) if e.is_file() and os.path.splitext(e.name)[1].lower() in IMAGE_SUFFIXES
    )


def _size(path: Path) -> tuple[tuple[int, int], str]:
    """(width, height) and mode from an image's header; raises ValueError with a reason."""
    from PIL import Image

    if path.stat().st_size > MAX_FILE_BYTES:
        raise too_large()
    try:
        with Image.open(path) as img:
            return img.size, img.mode
    except Exception as exc:
        raise ValueError(type(exc).__name__ if not str(exc) else f"not an image ({type(exc).__name__})") from None


def find_pairs(split: Path, targets: int, skip_broken: bool, last: str = "") -> Pairs:
    """The pairs of one split, checked; ``targets``: how many the run expects (0: what the data has);
    ``last``: a plain layout's target folder that follows the ``B`` ones (DeepLIIF's ``seg``)."""
    if not split.is_dir():
        raise PhalanxError(f"{split} is not a directory", OPTION)
    target_dirs = [
        Path(d.path)
        for d in sorted(
            (
                d
                for d in os.scandir(split)
                if d.is_dir() and (d.name == "B" or (d.name[:1] == "B" and d.name[1:].isdigit()))
            ),
            key=lambda d: (len(d.name), d.name),
        )
    ]
    if last and (split / last).is_dir():
        target_dirs.append(split / last)
    if (split / "A").is_dir() or target_dirs:
        return _plain(split, target_dirs, targets, skip_broken)
    return _aligned(split, targets, skip_broken)


def _broken(split: Path, bad: dict[str, str], skip_broken: bool) -> None:
    if bad and not skip_broken:
        path, why = next(iter(bad.items()))
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise PhalanxError(f"{split / path}: {why}{more}; --skip-broken leaves such samples out", OPTION)


def _aligned(split: Path, targets: int, skip_broken: bool) -> Pairs:
    names = _images(split)
    if not names:
        raise PhalanxError(
            f"{split} has no images: expected {split}/*.png of input and target panels side by side "
            f"(aligned), or {split}/A/ and {split}/B/ (plain)",
            OPTION,
        )
    kept: list[tuple[str, ...]] = []
    bad: dict[str, str] = {}
    panels_seen: int | None = None
    modes: set[str] = set()
    for name in names:
        try:
            (width, height), mode = _size(split / name)
        except ValueError as exc:
            bad[name] = f"cannot be read ({exc})"
            continue
        panels = width // height if height else 0
        if panels < 2 or width != panels * height:
            bad[name] = (
                f"is {width}x{height}: not square panels side by side (the width must be 2 or more times the "
                "height: input | target ...)"
            )
            continue
        if panels_seen is None:
            panels_seen = panels
        if panels != panels_seen or (targets and panels - 1 != targets):
            expected = targets + 1 if targets else panels_seen
            bad[name] = f"has {panels} panels where {expected} are expected (input + {expected - 1} target(s))"
            continue
        modes.add(mode)
        kept.append((name,))
    _broken(split, bad, skip_broken)
    if not kept:
        raise PhalanxError(f"no readable pair in {split}", OPTION)
    assert panels_seen is not None  # (a kept pair set it)
    return Pairs(split, "aligned", kept, panels_seen - 1, _mode(modes), {str(split / k): v for k, v in bad.items()})


def _plain(split: Path, target_dirs: list[Path], targets: int, skip_broken: bool) -> Pairs:
    inputs = split / "A"
    if not inputs.is_dir() or not target_dirs:
        raise PhalanxError(f"{split} must hold A/ (inputs) and B/ or B1/, B2/, ... (targets, same names)", OPTION)
    if targets and len(target_dirs) != targets:
        raise PhalanxError(
            f"{split} has {len(target_dirs)} target folder(s), the run expects {targets} (--targets)", OPTION
        )
    names = _images(inputs)
    if not names:
        raise PhalanxError(f"{inputs} has no images", OPTION)
    kept, bad, modes = [], {}, set()
    for name in names:
        try:
            size, mode = _size(inputs / name)
            modes.add(mode)
            for target in target_dirs:
                if not (target / name).is_file():
                    raise ValueError(f"has no partner {target.name}/{name}")
                target_size, target_mode = _size(target / name)
                if target_size != size:
                    raise ValueError(
                        f"is {size[0]}x{size[1]} but {target.name}/{name} is {target_size[0]}x{target_size[1]}"
                    )
                modes.add(target_mode)
        except ValueError as exc:
            bad[f"A/{name}"] = str(exc) if str(exc).startswith(("has no", "is ")) else f"cannot be read ({exc})"
            continue
        kept.append((f"A/{name}", *(f"{t.name}/{name}" for t in target_dirs)))
    orphans = sorted(set().union(*(_images(t) for t in target_dirs)) - set(names))
    if orphans:
        bad.setdefault(f"{target_dirs[0].name}/{orphans[0]}", "has no input A/" + orphans[0])
    _broken(split, bad, skip_broken)
    if not kept:
        raise PhalanxError(f"no readable pair in {split}", OPTION)
    return Pairs(split, "plain", kept, len(target_dirs), _mode(modes), {str(split / k): v for k, v in bad.items()})


def _mode(modes: set[str]) -> str:
    return "L" if modes and modes <= {"1", "L", "LA", "I", "I;16", "F"} else "RGB"


class PairFiles(Dataset):
    """``(input, targets)``: uint8 tensors (C, H, W) and (T, C, H, W), decoded on access."""

    def __init__(self, pairs: Pairs):
        self.pairs = pairs

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        files = self.pairs.samples[index]
        try:
            images = [decode(read_bounded(self.pairs.root / f), self.pairs.mode, None, fast=False) for f in files]
        except Exception as exc:  # vanished or changed since the scan
            raise PhalanxError(
                f"cannot read {self.pairs.root / files[0]} ({type(exc).__name__}: {exc})"[:300], OPTION
            ) from None
        if self.pairs.layout == "aligned":
            image = images[0]
            side = image.shape[1]
            panels = [image[:, :, i * side : (i + 1) * side] for i in range(image.shape[2] // side)]
            return panels[0], torch.stack(panels[1:])
        return images[0], torch.stack(images[1:])


class PairTransform:
    """uint8 panels -> [-1, 1] floats at ``size`` x ``size``. Training (pix2pix's resize_and_crop and
    flip): resized to ``load`` (286/256 of the size), a random crop, a random horizontal flip, the
    same for the input and every target; ``crop=False`` (DeepLIIF's default): resized to the size
    and flipped only. Evaluation: resized to the size."""

    def __init__(self, size: int, train: bool, flip: bool, crop: bool = True):
        self.size, self.train, self.flip = size, train, flip
        self.load = round(size * 286 / 256) if train and crop else size

    def __call__(self, sample: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        image, targets = sample
        stack = torch.cat([image[None], targets]).float()  # (1 + T, C, H, W): one geometry for all
        if stack.shape[-2:] != (self.load, self.load):
            stack = torch.nn.functional.interpolate(
                stack, size=(self.load, self.load), mode="bilinear", antialias=True, align_corners=False
            )
        if self.train:
            top, left = (int(v) for v in torch.randint(0, self.load - self.size + 1, (2,)))
            stack = stack[..., top : top + self.size, left : left + self.size]
            if self.flip and torch.rand(()) < 0.5:
                stack = stack.flip(-1)
        stack = (stack / 127.5 - 1.0).clamp(-1, 1)
        return stack[0], stack[1:]


class Transformed(Dataset):
    def __init__(self, base: Dataset, transform):
        self.base, self.transform = base, transform

    def __len__(self) -> int:
        return dataset_size(self.base)

    def __getitem__(self, index: int):
        return self.transform(self.base[index])

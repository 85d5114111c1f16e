"""Semantic segmentation data: ``SPLIT/images/x.png`` (or .jpg, ...) with ``SPLIT/masks/x.png``, a
class index per pixel (0 the background; ``--ignore-index`` pixels neither train nor count).

Every pair is checked before training starts (sizes from headers, each mask's values decoded): a
missing mask, a mask whose size differs from its image or a value above the classes is one line
naming the file (or the pair is left out and counted with ``--skip-broken``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import PhalanxError
from .images import MAX_FILE_BYTES, decode, read_bounded, too_large
from .manifest import IMAGE_SUFFIXES

OPTION = "--dataroot"


@dataclass
class MaskSplit:
    root: Path
    pairs: list[tuple[str, str]]  # (images/x.jpg, masks/x.png)
    largest: int  # the largest class value in the masks (ignore_index aside)
    skipped: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.pairs)


def _mask_values(path: Path, ignore_index: int) -> tuple[tuple[int, int], int]:
    from PIL import Image

    if path.stat().st_size > MAX_FILE_BYTES:
        raise too_large()
    with Image.open(path) as img:
        if img.mode not in ("L", "P", "I", "I;16", "1"):
            raise ValueError(f"is a {img.mode} image; a mask is one channel of class indices (mode L, P or I)")
        values = np.asarray(img)
        size = img.size
    valid = values[values != ignore_index]
    return size, int(valid.max()) if valid.size else 0


def find_masks(split: Path, classes: int, ignore_index: int, skip_broken: bool) -> MaskSplit:
    """One split's pairs, checked; ``classes``: the number the run expects (0: from the masks)."""
    from PIL import Image

    images_dir, masks_dir = split / "images", split / "masks"
    if not images_dir.is_dir() or not masks_dir.is_dir():
        raise PhalanxError(
            f"{split} must hold images/ and masks/ (masks/x.png for images/x.png, a class index per pixel)", OPTION
        )
    names = sorted(
        e.name for e in os.scandir(images_dir) if e.is_file() and os.path.splitext(e.name)[1].lower() in IMAGE_SUFFIXES
    )
    if not names:
        raise PhalanxError(f"{images_dir} has no images", OPTION)
    kept, bad, largest = [], {}, 0
    for name in names:
        mask = masks_dir / (os.path.splitext(name)[0] + ".png")
        try:
            if not mask.is_file():
                raise ValueError(f"has no mask masks/{mask.name}")
            with Image.open(images_dir / name) as img:
                size = img.size
            mask_size, top = _mask_values(mask, ignore_index)
            if mask_size != size:
                raise ValueError(f"is {size[0]}x{size[1]} but masks/{mask.name} is {mask_size[0]}x{mask_size[1]}")
            if classes and top >= classes:
                raise ValueError(
                    f"has masks/{mask.name} with class {top}, beyond the {classes} classes "
                    f"(0-{classes - 1}; --ignore-index {ignore_index})"
                )
        except ValueError as exc:
            bad[f"images/{name}"] = str(exc)
            continue
        except Exception as exc:  # not an image
            bad[f"images/{name}"] = f"cannot be read ({type(exc).__name__})"
            continue
        largest = max(largest, top)
        kept.append((f"images/{name}", f"masks/{mask.name}"))
    if bad and not skip_broken:
        path, why = next(iter(bad.items()))
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise PhalanxError(f"{split / path}: {why}{more}; --skip-broken leaves such pairs out", OPTION)
    if not kept:
        raise PhalanxError(f"no usable pair in {split}", OPTION)
    return MaskSplit(split, kept, largest, {str(split / k): v for k, v in bad.items()})


class MaskPairs(Dataset):
    """``(image, mask)``: tv_tensors Image (uint8, 3 x H x W) and Mask (int64, H x W); ``transform``
    (torchvision v2) moves the mask with the image."""

    def __init__(self, split: MaskSplit, transform=None):
        self.split, self.transform = split, transform

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index: int):
        from PIL import Image
        from torchvision import tv_tensors

        image_file, mask_file = self.split.pairs[index]
        try:
            image = decode(read_bounded(self.split.root / image_file), "RGB", None, fast=False)
            with Image.open(self.split.root / mask_file) as img:
                mask = torch.from_numpy(np.asarray(img).astype(np.int64))
        except Exception as exc:
            raise PhalanxError(
                f"cannot read {self.split.root / image_file} ({type(exc).__name__}: {exc})"[:300], OPTION
            ) from None
        sample = tv_tensors.Image(image), tv_tensors.Mask(mask)
        return self.transform(*sample) if self.transform is not None else sample

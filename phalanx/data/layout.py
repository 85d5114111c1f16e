"""Where a data root keeps its splits, under the names the scripts users come from find: ``train/``
(or timm's ``training/``) and ``val/`` (or ``validation/``, ``valid/``)."""

from __future__ import annotations

from pathlib import Path

TRAIN_NAMES = ("train", "training")
VALIDATION_NAMES = ("val", "validation", "valid")


def _first(root: Path, names: tuple[str, ...]) -> Path:
    """The first of ``names`` that is a folder in ``root``; else the first name's path."""
    return next((root / name for name in names if (root / name).is_dir()), root / names[0])


def train_dir(root: Path) -> Path:
    """``root``'s training folder, the first of ``TRAIN_NAMES`` there; ``root/train`` where it has
    none (callers ask ``is_dir()`` and name train/ in their errors)."""
    return _first(root, TRAIN_NAMES)


def validation_dir(root: Path) -> Path:
    """``root``'s validation folder, the first of ``VALIDATION_NAMES`` there (timm's way); ``root/val``
    where it has none (callers ask ``is_dir()``)."""
    return _first(root, VALIDATION_NAMES)


def evaluation_dir(root: Path) -> Path:
    """What ``evaluate --dataroot DIR`` reads: DIR's validation folder, else DIR itself. Under the
    other names only beside a train/ folder: a split whose classes are named valid and invalid is
    read as the split it is."""
    found = validation_dir(root)
    return found if found.is_dir() and (found.name == "val" or train_dir(root).is_dir()) else root

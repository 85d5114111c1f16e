"""Where a data root keeps its splits: ``train/`` and a validation folder under one of the names the
scripts users come from find (timm's ``train.py`` takes ``val/``, ``validation/`` and ``valid/``)."""

from __future__ import annotations

from pathlib import Path

from ..errors import PhalanxError

VALIDATION_NAMES = ("val", "validation", "valid")


def validation_dir(root: Path) -> Path:
    """``root``'s validation folder; ``root/val`` where it has none (callers ask ``is_dir()``). Two
    of them are refused: which one validates would be a guess."""
    found = [root / name for name in VALIDATION_NAMES if (root / name).is_dir()]
    if len(found) > 1:
        names = " and ".join(f"{path.name}/" for path in found)
        raise PhalanxError(f"{root} holds {names}: which one validates is unclear; keep one", "--dataroot")
    return found[0] if found else root / "val"

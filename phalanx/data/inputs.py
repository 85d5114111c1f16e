"""Images given to ``predict``: files and folders (searched recursively), decoded and prepared in
loader workers; an image that cannot be read is reported with its reason, never raised."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.data import Dataset

from ..errors import PhalanxError
from .images import decode, import_decoders, read_bounded
from .manifest import IMAGE_SUFFIXES
from .slides import slide_of


def image_paths(inputs: tuple[str, ...]) -> list[Path]:
    """Files as given, folders searched recursively for image files, in a stable order; an image
    given twice (a file and its folder) is predicted once."""
    found: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found += sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        elif path.is_file():
            found.append(path)
        else:
            raise PhalanxError(f"{item} is neither an image file nor a folder", "IMAGES")
    if not found:
        raise PhalanxError(f"no image files in {', '.join(inputs)}", "IMAGES")
    unique: dict[str, Path] = {}
    for path in found:
        unique.setdefault(os.path.abspath(path), path)
    return list(unique.values())


def output_names(paths: list[Path], suffix: str = ".png") -> list[Path]:
    """Where each image's own output file goes under an output folder: its path relative to the
    deepest folder that holds every image (``train/images/a.png`` and ``val/images/a.png`` stay
    apart), with ``suffix``. Two images that would still share a name (``a.jpg`` and ``a.png``) are
    refused before any work, so no output overwrites another."""
    absolute = [Path(os.path.abspath(p)) for p in paths]
    base = Path(os.path.commonpath([str(p.parent) for p in absolute]))
    names: dict[Path, Path] = {}
    for path, full in zip(paths, absolute):
        name = full.relative_to(base).with_suffix(suffix)
        if name in names:
            raise PhalanxError(
                f"{names[name]} and {path} would both be written as {name}; predict them in separate "
                "runs (or rename one)",
                "IMAGES",
            )
        names[name] = path
    return list(names)


def why_unreadable(exc: Exception) -> str:
    """One line for an image that could not be read."""
    if type(exc).__name__ == "UnidentifiedImageError":
        return "not an image (no image format recognises it)"
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:200]


class InputImages(Dataset):
    """``(index, prepared image or None, raw image or None, why it could not be read or None)``;
    with ``slides_above``, a TIFF larger than that on a side is a ``Slide`` instead, not decoded
    (the predictor reads it region by region). ``fast=False``: every image decoded by PIL, as a
    tool that opens images with PIL sees them (a JPEG otherwise goes to torchvision's decoder)."""

    def __init__(
        self,
        paths: list[Path],
        mode: str,
        prepare: Callable[[torch.Tensor], torch.Tensor],
        min_side: int | None = None,
        keep_raw: bool = False,
        slides_above: int | None = None,
        fast: bool = True,
    ):
        self.paths, self.mode, self.prepare, self.min_side, self.keep_raw = paths, mode, prepare, min_side, keep_raw
        self.slides_above, self.fast = slides_above, fast
        import_decoders()

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        try:
            slide = slide_of(self.paths[index], self.slides_above) if self.slides_above is not None else None
            if slide is not None:
                return index, slide, None, None
            image = decode(read_bounded(self.paths[index]), self.mode, self.min_side, fast=self.fast)
            return index, self.prepare(image), image if self.keep_raw else None, None
        except Exception as exc:
            return index, None, None, why_unreadable(exc)


def collate_inputs(items: list) -> tuple[list[int], list[torch.Tensor], list, list[tuple[int, str]]]:
    """Readable images (a list: sizes may differ) apart from the unreadable ones."""
    good = [(i, image, raw) for i, image, raw, _ in items if image is not None]
    bad = [(i, why) for i, image, _, why in items if image is None]
    return [i for i, _, _ in good], [image for _, image, _ in good], [raw for _, _, raw in good], bad

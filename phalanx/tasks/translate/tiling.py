"""``predict --task translate``: an image of any size through a generator trained on square tiles,
tile by tile with blended overlaps, and what a user's ``--tile-overlap`` becomes for those tiles."""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from torch import nn


def tile_overlap(given: int | None, size: int) -> int:
    """The overlap of ``size`` px tiles: ``auto`` (None) a quarter of the tile, so the default never
    leaves a tile every pixel at a small training size; a value that leaves no stride (the tile or
    more) becomes half a tile, with one line that says so."""
    if given is None:
        return size // 4
    if given < size:
        return given
    print(
        f"phalanx: warning: --tile-overlap {given} is not smaller than the {size} px tiles (the training size); "
        f"using {size // 2}",
        file=sys.stderr,
        flush=True,
    )
    return size // 2


def tiled(
    generator: Callable[[torch.Tensor], torch.Tensor], image: torch.Tensor, size: int, overlap: int
) -> torch.Tensor:
    """The generator's output for an image (1, C, H, W) of any size: tiles of ``size`` (the training
    size) every ``size - overlap`` pixels, each weighted by a ramp that falls towards its edges inside
    the overlaps, summed and normalised; an image smaller than a tile is padded by reflection (or by
    its edge, where it is too small to reflect) and cropped back."""
    _, _, height, width = image.shape
    padded_h, padded_w = max(height, size), max(width, size)
    if (padded_h, padded_w) != (height, width):
        mode = "reflect" if padded_h - height < height and padded_w - width < width else "replicate"
        image = nn.functional.pad(image, (0, padded_w - width, 0, padded_h - height), mode=mode)
    overlap = max(0, min(overlap, size - 1))
    stride = size - overlap
    tops = _starts(padded_h, size, stride)
    lefts = _starts(padded_w, size, stride)
    ramp = torch.ones(size, dtype=image.dtype, device=image.device)
    if overlap:
        edge = torch.arange(1, overlap + 1, dtype=image.dtype, device=image.device) / (overlap + 1)
        ramp[:overlap], ramp[-overlap:] = edge, edge.flip(0)
    out: torch.Tensor | None = None
    weight: torch.Tensor | None = None
    for top in tops:
        for left in lefts:
            tile = generator(image[..., top : top + size, left : left + size])
            w = ramp[:, None] * ramp[None, :]
            if out is None or weight is None:  # (both, at the first tile)
                out = image.new_zeros((1, tile.shape[1], padded_h, padded_w))
                weight = image.new_zeros((1, 1, padded_h, padded_w))
            out[..., top : top + size, left : left + size] += tile * w
            weight[..., top : top + size, left : left + size] += w
    assert out is not None and weight is not None  # (one tile at least)
    return (out / weight)[..., :height, :width]


def _starts(length: int, size: int, stride: int) -> list[int]:
    starts = list(range(0, max(length - size, 0) + 1, stride))
    if starts[-1] != length - size:
        starts.append(length - size)  # the last tile ends at the edge
    return starts

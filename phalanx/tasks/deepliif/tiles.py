"""DeepLIIF's tiling, as ``deepliif test`` tiles an image of any size (DeepLIIF 1.2.7's
``InferenceTiler`` with ``overlap = tile // 16``, and ``run_wrapper``): the positions of its tiles,
each tile's outputs resized as DeepLIIF resizes them, and each output pixel taken from the one tile
DeepLIIF takes it from. Pixel for pixel DeepLIIF's, at every size; a slide region by region gives
the whole image's.

- An image narrower than a tile is extended to the right by mirror images of itself, [A|A'|A|...],
  and cut at the tile; one shorter, downwards by upside-down ones. The outputs are cut back.
- Tiles every ``tile - 2 overlap`` pixels from 0, rows outer; a tile past the edge starts at
  ``side - tile`` instead. There is no overlap along a side a single tile covers.
- Each tile's outputs are pasted whole but for ``overlap`` pixels on each side that faces another
  tile, in that order; a later tile overwrites an earlier one. So every output pixel comes from
  one tile: along each axis, the last tile whose pasted span holds it (the spans are products, and
  the last in row order is the last row's last column).
- A tile whose grayscale pixels other than 0 and 255 vary by less than 9 (DeepLIIF's
  ``is_empty``) is not run: each output is the task's colour for it (``Tiler.background``).
- Otherwise the tile is resized to the networks' size (``scale_size``) with PIL's default filter,
  made a tensor as DeepLIIF's ``transform`` makes it, and each output, made 8-bit as DeepLIIF's
  ``tensor_to_pil`` (truncated), is resized back to the tile's size when it differs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

EMPTY_VARIANCE = 9  # DeepLIIF's is_empty threshold
EMPTY_SIZE = 512  # DeepLIIF makes an empty tile's outputs 512 px, then resizes them to the tile


def overlap_of(tile: int) -> int:
    """``deepliif test``'s overlap: a sixteenth of the tile."""
    return tile // 16


@dataclass(frozen=True)
class Axis:
    """Where DeepLIIF's tiles fall along one side of ``length`` pixels (after the extension)."""

    length: int  # at least the tile
    tile: int
    overlap: int  # 0 where one tile covers the side

    @classmethod
    def of(cls, side: int, tile: int, overlap: int) -> Axis:
        length = max(side, tile)
        return cls(length, tile, 0 if tile >= length else overlap)

    def starts(self) -> list[int]:
        """Each tile's first pixel, in DeepLIIF's order (clamped duplicates kept: DeepLIIF runs them again)."""
        return [min(at, self.length - self.tile) for at in range(0, self.length, self.tile - 2 * self.overlap)]

    def pasted(self, start: int) -> tuple[int, int]:
        """The span a tile at ``start`` pastes: all but the overlap on a side that faces another tile."""
        first = start if start == 0 else start + self.overlap
        end = start + self.tile if start == self.length - self.tile else start + self.tile - self.overlap
        return first, end

    def owners(self, begin: int, end: int) -> Iterator[tuple[int, int, int]]:
        """(tile start, first, end) of the pixels [begin, end) each tile is the last to paste."""
        starts = self.starts()
        for i, start in enumerate(starts):
            first, last = self.pasted(start)
            later = [self.pasted(s)[0] for s in starts[i + 1 :]]
            last = min([last, *later])  # a later tile takes over from its first pasted pixel
            first, last = max(first, begin), min(last, end)
            if first < last:
                yield start, first, last


def extended(pixels: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """(H, W, C) extended as DeepLIIF extends an image smaller than a tile, to at least ``rows`` x
    ``cols``: to the right by its mirror image, repeatedly ([A|A'|A|...]), then downwards by its
    upside-down image."""
    while pixels.shape[1] < cols:
        pixels = np.concatenate([pixels, pixels[:, ::-1]], 1)
    while pixels.shape[0] < rows:
        pixels = np.concatenate([pixels, pixels[::-1]], 0)
    return pixels


def is_empty(tile: np.ndarray) -> bool:
    """DeepLIIF's ``is_empty``: the variance of the tile's grayscale pixels (PIL's L) other than 0
    and 255 is below 9."""
    from PIL import Image

    gray = np.asarray(Image.fromarray(tile).convert("L"))
    values = gray[(gray != 0) & (gray != 255)]
    return not values.size or float(np.var(values)) < EMPTY_VARIANCE


def network_input(tile: np.ndarray, size: int) -> torch.Tensor:
    """A tile as DeepLIIF hands it to its networks: resized to ``size`` (PIL's default filter),
    sides rounded to multiples of 4 (its ``__make_power_2``), ``ToTensor`` and ``Normalize(0.5,
    0.5)``, a batch of one."""
    from PIL import Image
    from torchvision.transforms import functional

    image = Image.fromarray(tile)
    if image.size != (size, size):
        image = image.resize((size, size))
    width, height = image.size
    rounded = (int(round(width / 4) * 4), int(round(height / 4) * 4))
    if rounded != image.size:
        image = image.resize(rounded, Image.Resampling.BICUBIC)
    tensor = functional.to_tensor(image)
    return functional.normalize(tensor, [0.5] * len(tensor), [0.5] * len(tensor)).unsqueeze(0)


def to_tile(output: np.ndarray, tile: int) -> np.ndarray:
    """An output image resized to the tile's size when it has another (PIL's default filter)."""
    if output.shape[:2] == (tile, tile):
        return output
    from PIL import Image

    return np.asarray(Image.fromarray(output).resize((tile, tile)))


class Tiler:
    """DeepLIIF's tiling of an image (or a region of a slide) through a task's networks.

    ``run(input) -> {name: (H, W, 3) uint8}``: one tile's outputs, from ``network_input``'s tensor;
    ``background() -> {name: (r, g, b)}``: an empty tile's outputs."""

    def __init__(
        self,
        tile: int,
        scale_size: int,
        run: Callable[[torch.Tensor], dict[str, np.ndarray]],
        background: Callable[[], dict[str, tuple[int, int, int]]],
        overlap: int | None = None,
    ):
        self.tile, self.scale_size, self.run, self.background = tile, scale_size, run, background
        self.overlap = overlap_of(tile) if overlap is None else overlap

    def axes(self, height: int, width: int) -> tuple[Axis, Axis]:
        return Axis.of(height, self.tile, self.overlap), Axis.of(width, self.tile, self.overlap)

    def image(self, pixels: np.ndarray) -> dict[str, np.ndarray]:
        """A whole (H, W, 3) uint8 image's outputs, each (H, W, 3)."""
        height, width = pixels.shape[:2]
        return self.region(lambda top, left, rows, cols: pixels[top : top + rows, left : left + cols], height, width)

    def region(
        self,
        read: Callable[[int, int, int, int], np.ndarray],
        height: int,
        width: int,
        top: int = 0,
        left: int = 0,
        rows: int | None = None,
        cols: int | None = None,
    ) -> dict[str, np.ndarray]:
        """The outputs of the pixels [top, top + rows) x [left, left + cols) of an image of
        ``height`` x ``width`` read by ``read(top, left, rows, cols) -> (rows, cols, 3) uint8``:
        exactly the whole image's outputs there."""
        rows = height - top if rows is None else rows
        cols = width - left if cols is None else cols
        y_axis, x_axis = self.axes(height, width)
        outputs: dict[str, np.ndarray] = {}
        across = list(x_axis.owners(left, left + cols))
        for y, y0, y1 in y_axis.owners(top, top + rows):
            for x, x0, x1 in across:
                tile = self.read_tile(read, height, width, y, x)
                for name, out in self.tile_outputs(tile).items():
                    if name not in outputs:
                        outputs[name] = np.zeros((rows, cols, out.shape[2]), dtype=np.uint8)
                    outputs[name][y0 - top : y1 - top, x0 - left : x1 - left] = out[y0 - y : y1 - y, x0 - x : x1 - x]
        return outputs

    def read_tile(
        self, read: Callable[[int, int, int, int], np.ndarray], height: int, width: int, y: int, x: int
    ) -> np.ndarray:
        """The tile at (y, x) of the image extended as DeepLIIF extends it (a side shorter than a
        tile is read whole, then extended)."""
        rows, cols = min(self.tile, height), min(self.tile, width)
        pixels = read(y if height >= self.tile else 0, x if width >= self.tile else 0, rows, cols)
        if pixels.shape[:2] != (self.tile, self.tile):
            pixels = extended(pixels, self.tile, self.tile)[: self.tile, : self.tile]
        return np.ascontiguousarray(pixels)

    def tile_outputs(self, tile: np.ndarray) -> dict[str, np.ndarray]:
        if is_empty(tile):
            from PIL import Image

            return {
                name: to_tile(np.asarray(Image.new("RGB", (EMPTY_SIZE, EMPTY_SIZE), tuple(colour))), self.tile)
                for name, colour in self.background().items()
            }
        return {name: to_tile(out, self.tile) for name, out in self.run(network_input(tile, self.scale_size)).items()}

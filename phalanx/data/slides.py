"""Images too large for memory (whole slides: TIFF, OME-TIFF, SVS), read and written region by
region with ``tifffile``. A region is read through tifffile's zarr view of the file, which decodes
only the tiles (or strips) it covers; outputs are written into compressed zarr arrays beside the
output first (any region in any order), then into a tiled OME-TIFF tile row by tile row, renamed
into place when complete. Memory stays about one region (and one tile row of an output)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..system.atomic import atomic_write
from .images import eight_bit

if TYPE_CHECKING:  # imported where a slide is read or written
    import tifffile
    import zarr

SLIDE_SUFFIXES = {".tif", ".tiff", ".svs"}
TILE = 512  # the OME-TIFF tiles written, as DeepLIIF writes its slides' (its tile size)


class SlideUnreadable(Exception):
    """A slide whose pixels could not be read (a region's tiles are broken): one line, why."""


@dataclass(frozen=True)
class Slide:
    """An input image read region by region (``predict`` hands it to the predictor undecoded)."""

    path: Path
    height: int
    width: int


def _series(tiff: tifffile.TiffFile) -> tuple[str, tuple[int, ...], tifffile.TiffPageSeries]:
    """The first image of a TIFF as (axes without leading singleton axes, zarr-able series)."""
    series = tiff.series[0]
    axes, shape = series.axes, series.shape
    while len(axes) > 2 and shape[0] == 1 and axes[0] not in "YX":
        axes, shape = axes[1:], shape[1:]
    return axes, shape, series


def slide_of(path: Path, larger_than: int) -> Slide | None:
    """The file as a ``Slide`` when it is a TIFF whose larger side exceeds ``larger_than`` pixels
    (its header read, no pixels); None for any other file, left to the usual decoding."""
    if path.suffix.lower() not in SLIDE_SUFFIXES:
        return None
    import tifffile

    try:
        with tifffile.TiffFile(path) as tiff:
            axes, shape, _ = _series(tiff)
    except Exception:  # not a TIFF tifffile reads: the usual decoding reports why
        return None
    if axes not in ("YX", "YXS", "SYX", "CYX"):
        return None
    height, width = (shape[0], shape[1]) if axes.startswith("Y") else (shape[1], shape[2])
    return Slide(path, height, width) if max(height, width) > larger_than else None


class SlideReader:
    """Regions of a slide as uint8 tensors (C, H, W) in a PIL mode, as the decoder makes whole images."""

    def __init__(self, slide: Slide, mode: str):
        import tifffile
        import zarr

        self.slide, self.mode = slide, mode
        tiff = None
        try:
            tiff = tifffile.TiffFile(slide.path)
            self.axes, _, series = _series(tiff)
            pixels = zarr.open(series.aszarr(level=0), mode="r")
            assert isinstance(pixels, zarr.Array)  # (one level of a series: an array, not a group)
            self.pixels = pixels
        except Exception as exc:
            if tiff is not None:
                tiff.close()
            raise self.unreadable(exc) from None
        self.tiff = tiff

    def __enter__(self) -> SlideReader:
        return self

    def __exit__(self, *exc) -> None:
        self.tiff.close()

    def unreadable(self, exc: Exception) -> SlideUnreadable:
        why = str(exc).splitlines()[0][:200] if str(exc) else ""
        return SlideUnreadable(f"cannot read it region by region ({type(exc).__name__}: {why}); nothing of it written")

    def region(self, top: int, left: int, height: int, width: int) -> torch.Tensor:
        """Pixels [top, top + height) x [left, left + width)."""
        try:
            return self._region(top, left, height, width)
        except Exception as exc:
            raise self.unreadable(exc) from None

    def _region(self, top: int, left: int, height: int, width: int) -> torch.Tensor:
        from PIL import Image

        index = (slice(top, top + height), slice(left, left + width))
        planar = self.axes[0] in "SC"  # samples first (planar RGB)
        array = np.asarray(self.pixels[(slice(None), *index) if planar else index])
        if planar:
            array = np.moveaxis(array, 0, -1)
        array = eight_bit(array)
        if array.ndim == 3 and array.shape[-1] <= 2:  # grey, or grey and alpha
            array = array[..., 0]
        picture = Image.fromarray(array[..., :3] if array.ndim == 3 else array)
        picture = picture if picture.mode == self.mode else picture.convert(self.mode)
        values = torch.from_numpy(np.array(picture))
        return values[None] if values.ndim == 2 else values.permute(2, 0, 1).contiguous()


class SlideOutputs:
    """One slide's outputs, each a (height, width, channels) array written region by region into a
    zarr array under ``scratch`` and then into its OME-TIFF (``finish``)."""

    def __init__(self, scratch: Path, height: int, width: int):
        self.scratch, self.height, self.width = scratch, height, width
        shutil.rmtree(scratch, ignore_errors=True)  # what a killed run left
        scratch.mkdir(parents=True)
        self.arrays: dict[str, zarr.Array] = {}
        self.scratch_only: set[str] = set()  # arrays kept for the computation, not outputs

    def write(self, name: str, top: int, left: int, array: np.ndarray, output: bool = True) -> None:
        if name not in self.arrays:
            if not output:
                self.scratch_only.add(name)
            import zarr

            shape = (self.height, self.width, *array.shape[2:])
            self.arrays[name] = zarr.create_array(
                store=str(self.scratch / name.replace("/", "_")),
                shape=shape,
                chunks=(TILE, TILE, *array.shape[2:]),
                dtype=array.dtype,
                fill_value=0,
            )
        self.arrays[name][top : top + array.shape[0], left : left + array.shape[1]] = array

    def read(self, name: str, top: int, left: int, height: int, width: int) -> np.ndarray:
        return np.asarray(self.arrays[name][top : top + height, left : left + width])

    def outputs(self) -> list[str]:
        return [name for name in self.arrays if name not in self.scratch_only]

    def finish(self, name: str, target: Path) -> None:
        """The output as a tiled, deflate-compressed OME-TIFF at ``target``, written atomically."""
        import tifffile

        array = self.arrays[name]

        def tiles():
            for top in range(0, self.height, TILE):
                row = np.asarray(array[top : top + TILE])  # one tile row in memory
                for left in range(0, self.width, TILE):
                    yield row[:, left : left + TILE]

        target.parent.mkdir(parents=True, exist_ok=True)

        def write(fh) -> None:
            tifffile.imwrite(
                fh,
                tiles(),
                shape=array.shape,
                dtype=array.dtype,
                tile=(TILE, TILE),
                compression="zlib",
                photometric="rgb" if array.ndim == 3 and array.shape[2] == 3 else "minisblack",
                ome=True,
            )

        atomic_write(target, write)  # synced and renamed into place; a full disk is one line

    def discard(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)

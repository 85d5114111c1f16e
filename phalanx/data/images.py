"""Image files: held in flat arrays, decoded by the fastest path that gives the reference image.

The reference path is PIL's full decode, then an antialiased resize in the transforms. JPEG files
take one of two faster paths:
- reduced-scale decoding (PIL's ``draft``: libjpeg scales the DCT by 1/2, 1/4 or 1/8) when the
  pipeline needs a shorter side at most half the image's, e.g. 32 px from 160, 224 from 500+;
- otherwise torchvision's ``decode_jpeg`` (libjpeg-turbo into a tensor, no PIL image in between).
Other formats go through PIL. docs/training.md (Input pipeline) states how far the fast paths are from the reference.
"""

from __future__ import annotations

import functools
import io
import os
import stat
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import PhalanxError

MAX_FILE_BYTES = 256 * 1024 * 1024  # an image file larger than this is refused, not read
READ_ON_BYTES = 64 * 1024  # reads past a file's stated size: below malloc's mmap threshold
JPEG_MAGIC = b"\xff\xd8\xff"
# Reduced-scale decoding goes through PIL, whose full decode is 1.5x torchvision's: measured on
# 600x500 photos, 1/2 scale was slower than decode_jpeg at full scale, 1/4 scale 17% faster. 1/8
# scale (DC coefficients only) was 10% faster again but strayed from the reference on fine texture
# (mean 15/255 at 1200x900 -> 100), so the reduction is 1/4 or none.
DRAFT_REDUCTION = 4
# Below this shorter side PIL's cost per image (its header parsing in Python) outweighs the smaller
# decode: 160x160 -> 32 px took 280 us with the 1/4-scale decode and 240 us with decode_jpeg and the
# resize; 224 -> 56 px 347 against 415 us (one thread, 2026-11-26).
DRAFT_MIN_SIDE = 192
# Start-of-frame markers (baseline, extended, progressive, lossless...); not DHT (C4), JPG (C8), DAC (CC).
SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


class UnreadableImage(PhalanxError):
    pass


class PathTable:
    """Many paths as one byte buffer and an offset array.

    A list of a million Python strings is copied page by page into every DataLoader worker as
    reference counts change (pytorch/pytorch#13246); two numpy arrays are two objects, shared
    for good after the fork.
    """

    def __init__(self, paths: list[str]):
        encoded = [p.encode() for p in paths]
        self.offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=self.offsets[1:])
        self.blob = np.frombuffer(b"".join(encoded), dtype=np.uint8) if encoded else np.zeros(0, np.uint8)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> str:
        return self.blob[self.offsets[index] : self.offsets[index + 1]].tobytes().decode()


def too_large() -> ValueError:
    """The refusal of a file over ``MAX_FILE_BYTES``, however it was found to be."""
    return ValueError(f"larger than {MAX_FILE_BYTES // 2**20} MiB")


def read_bounded(path: str | os.PathLike[str]) -> bytes:
    """A file's bytes, refused beyond ``MAX_FILE_BYTES``. Read unbuffered, one byte past the size the
    file says it has, then on in small chunks (a file that grew, a pipe): a read of
    ``MAX_FILE_BYTES + 1`` allocated that much for every image (``benchmarks/read_decode.py``)."""
    with open(path, "rb", buffering=0) as fh:
        info = os.fstat(fh.fileno())
        if stat.S_ISREG(info.st_mode) and info.st_size > MAX_FILE_BYTES:
            raise too_large()
        want = info.st_size + 1
        chunks, total = [], 0
        while want > 0:
            chunk = fh.read(min(want, MAX_FILE_BYTES + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            want = READ_ON_BYTES if total <= MAX_FILE_BYTES else 0
    if total > MAX_FILE_BYTES:  # it grew past the limit, or states no size
        raise too_large()
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def decode(data: bytes, mode: str, min_side: int | None, fast: bool) -> torch.Tensor:
    """An image file's bytes -> a uint8 tensor (C, H, W) in ``mode`` ("L" or "RGB").

    ``min_side``: the shortest side the pipeline may receive without a visible difference; a JPEG
    at least ``DRAFT_REDUCTION`` times that size, and at least ``DRAFT_MIN_SIDE``, is decoded at
    1 / ``DRAFT_REDUCTION`` scale.
    """
    from PIL import Image

    img: Image.Image  # an opened file, or its pixels made 8-bit
    if fast and data[:3] == JPEG_MAGIC:
        size = jpeg_size(data) if min_side else None
        if size and min_side and min(size) >= max(DRAFT_REDUCTION * min_side, DRAFT_MIN_SIDE):
            with Image.open(io.BytesIO(data)) as img:
                img.draft(mode, (img.size[0] // DRAFT_REDUCTION, img.size[1] // DRAFT_REDUCTION))
                img.load()
                return _to_tensor(img if img.mode == mode else img.convert(mode))
        decode_jpeg = _torchvision_jpeg()
        if decode_jpeg is not None:
            return decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode)
    with Image.open(io.BytesIO(data)) as img:
        img.load()
        if img.mode in WIDE_MODES:  # PIL's convert clips them at 255: a 16-bit image turned white
            img = Image.fromarray(eight_bit(np.asarray(img)))
        return _to_tensor(img if img.mode == mode else img.convert(mode))


# One-channel modes wider than 8 bits: 16-bit and 32-bit integers, 32-bit floats.
WIDE_MODES = frozenset({"I;16", "I;16B", "I;16L", "I;16N", "I", "F"})


def eight_bit(array: np.ndarray) -> np.ndarray:
    """Pixels of a wider type as 8 bits, as DeepLIIF's whole-slide reader rescales them: to [0, 1]
    by the type's range (floats taken as [0, 1]), x 255, truncated. One scale per type, never from
    the values: a slide read region by region is scaled as the whole image is."""
    if array.dtype == np.uint8:
        return array
    scale = 1.0 if array.dtype.kind == "f" else float(np.iinfo(array.dtype).max)
    return (np.clip(array.astype(np.float64) / scale, 0, 1) * 255).astype(np.uint8)


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a JPEG's frame header, or None where the markers do not lead to one
    (PIL then reads the file as usual). A few markers in, no image object: 1 us, not PIL's 25."""
    at = 2
    while at + 9 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in SOF_MARKERS:
            height, width = int.from_bytes(data[at + 5 : at + 7], "big"), int.from_bytes(data[at + 7 : at + 9], "big")
            return (width, height) if width and height else None
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # markers without a length
            at += 2
            continue
        at += 2 + int.from_bytes(data[at + 2 : at + 4], "big")
    return None


def import_decoders() -> None:
    """Import torchvision's JPEG decoder in the process that forks the loader workers: each worker
    would otherwise import it on its first image (1.3 s each, measured)."""
    _torchvision_jpeg()


@functools.cache
def _torchvision_jpeg() -> Callable[[torch.Tensor, str], torch.Tensor] | None:
    """torchvision's JPEG decoder (the same pixels as PIL, and faster), while torchvision has it:
    ``(bytes as a uint8 tensor, "RGB" or "L") -> (C, H, W)``. Its registered op, called as
    torchvision's ``decode_jpeg`` calls it for one CPU tensor, without that Python wrapper (it logs
    the call and warns that torchvision's decoding is deprecated, for every image). Without the op
    (torchvision's image extension did not load; its ``decode_jpeg`` would fail too): None, PIL decodes."""
    try:
        from torchvision.io import ImageReadMode

        op = torch.ops.image.decode_jpeg
    except (ImportError, AttributeError, RuntimeError):
        return None
    modes = {"RGB": ImageReadMode.RGB.value, "L": ImageReadMode.GRAY.value}
    return lambda data, mode: op(data, modes[mode], False)


def _to_tensor(img) -> torch.Tensor:
    """A PIL image as a (C, H, W) uint8 tensor over its pixels' one copy, in height-width-channel
    memory order (channels-last: the order the antialiased resize is fastest in); never written to."""
    array = np.asarray(img)
    if array.ndim == 2:
        array = array[:, :, None]
    with warnings.catch_warnings():  # read-only memory: the tensors made from it are only read
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array).permute(2, 0, 1)


class ImageFiles(Dataset):
    """(path, label) pairs from flat arrays, decoded on access; a decode failure names the file."""

    def __init__(self, root: Path, paths: PathTable, labels: np.ndarray, mode: str, fast: bool = True):
        self.root, self.paths, self.labels, self.mode, self.fast = root, paths, labels, mode, fast
        # An image's path as one string: pathlib's join took 4 us an image, 1% of a 160-px JPEG's way.
        self.prefix = os.path.join(root, "")
        self.min_side: int | None = None  # set once the pipeline is known
        if fast:
            import_decoders()

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path = self.prefix + self.paths[index]
        try:
            image = decode(read_bounded(path), self.mode, self.min_side, self.fast)
        except Exception as exc:  # truncated, corrupt, vanished since the scan
            raise UnreadableImage(
                f"cannot read image {path} ({type(exc).__name__}: {exc})"[:300], "--dataroot"
            ) from None
        return image, int(self.labels[index])

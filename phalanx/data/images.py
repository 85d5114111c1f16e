"""Image files: held in flat arrays, decoded by the fastest path that gives the reference image.

The reference path is PIL's full decode, then an antialiased resize in the transforms. JPEG files
take one of two faster paths:
- reduced-scale decoding (PIL's ``draft``: libjpeg scales the DCT by 1/2, 1/4 or 1/8) when the
  pipeline needs a shorter side at most half the image's, e.g. 32 px from 160, 224 from 500+;
- otherwise torchvision's ``decode_jpeg`` (libjpeg-turbo into a tensor, no PIL image in between).
Other formats go through PIL. The README states how far the fast paths are from the reference.
"""

from __future__ import annotations

import functools
import io
import warnings
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import PhalanxError

MAX_FILE_BYTES = 256 * 1024 * 1024  # an image file larger than this is refused, not read
JPEG_MAGIC = b"\xff\xd8\xff"


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
        return self.blob[self.offsets[index]:self.offsets[index + 1]].tobytes().decode()


def read_bounded(path: Path) -> bytes:
    with open(path, "rb") as fh:
        data = fh.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"larger than {MAX_FILE_BYTES // 2**20} MiB")
    return data


def decode(data: bytes, mode: str, min_side: int | None, fast: bool) -> torch.Tensor:
    """An image file's bytes -> a uint8 tensor (C, H, W) in ``mode`` ("L" or "RGB").

    ``min_side``: the shortest side the pipeline may receive without a visible difference; a JPEG
    at least twice that size is decoded at reduced scale (never below ``min_side``).
    """
    from PIL import Image

    if fast and data[:3] == JPEG_MAGIC:
        with Image.open(io.BytesIO(data)) as img:
            if min_side and min(img.size) >= 2 * min_side:
                scale = min(img.size) / min_side
                img.draft(mode, (max(1, int(img.size[0] / scale)), max(1, int(img.size[1] / scale))))
                return _to_tensor(img.convert(mode))
        torchvision_jpeg = _torchvision_jpeg()
        if torchvision_jpeg is not None:
            decode_jpeg, modes = torchvision_jpeg
            with warnings.catch_warnings():  # torchvision 0.29 calls its image decoding deprecated
                warnings.simplefilter("ignore", DeprecationWarning)
                return decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8),
                                   mode=modes.RGB if mode == "RGB" else modes.GRAY)
    with Image.open(io.BytesIO(data)) as img:
        return _to_tensor(img.convert(mode))


@functools.cache
def _torchvision_jpeg():
    """torchvision's decode_jpeg (the same pixels as PIL, and faster), while torchvision has it."""
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
    except ImportError:
        return None
    return decode_jpeg, ImageReadMode




def _to_tensor(img) -> torch.Tensor:
    array = np.asarray(img)
    if array.ndim == 2:
        array = array[:, :, None]
    return torch.from_numpy(array.copy()).permute(2, 0, 1).contiguous()


class ImageFiles(Dataset):
    """(path, label) pairs from flat arrays, decoded on access; a decode failure names the file."""

    def __init__(self, root: Path, paths: PathTable, labels: np.ndarray, mode: str, fast: bool = True):
        self.root, self.paths, self.labels, self.mode, self.fast = root, paths, labels, mode, fast
        self.min_side: int | None = None  # set once the pipeline is known

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path = self.root / self.paths[index]
        try:
            image = decode(read_bounded(path), self.mode, self.min_side, self.fast)
        except Exception as exc:  # truncated, corrupt, vanished since the scan
            raise UnreadableImage(f"cannot read image {path} ({type(exc).__name__}: {exc})"[:300],
                                  "--dataroot") from None
        return image, int(self.labels[index])

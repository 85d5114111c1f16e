"""Unpaired images, CycleGAN's data as DeepLIIF lays it out: ``DIR/trainA/*.png`` (the input
domain) and ``DIR/trainB1/`` ... ``trainBm/`` (one folder per target domain), any names, any
counts. An epoch is one pass over A; each A image meets an image of every B folder drawn at random
(DeepLIIF's ``UnalignedDataset``), seeded by the run's seed, the epoch and the index, so the
same on any rank, in any loader worker and after a resume; ``serial``: B_k's image i mod its count
(DeepLIIF's ``--serial-batches``). Every file's header is read before training (bounded in bytes):
one that does not open is named in one line."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset, Subset

from ...data import SeededView
from ...data.images import decode, read_bounded
from ...data.pairs import Transformed, _images, _size
from ...data.sampling import derive_seed
from ...errors import PhalanxError

OPTION = "--dataroot"


@dataclass
class UnpairedFiles:
    """One split's files: A's, and each B folder's."""

    root: Path
    a: list[Path]
    b: list[list[Path]]
    mode: str

    def __len__(self) -> int:
        return len(self.a)


def find_unpaired(root: Path, split: str, domains: int) -> UnpairedFiles | None:
    """``root/<split>A`` and ``root/<split>B1`` ...; None where there is no ``<split>A``.
    ``domains`` 0: every ``<split>B<k>`` folder, numbered from 1 without a gap."""
    folder_a = root / f"{split}A"
    if not folder_a.is_dir():
        return None
    found = sorted(
        (int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := re.fullmatch(rf"{split}B(\d+)", p.name))
    )
    numbers = [n for n, _ in found]
    wanted = domains or len(found)
    if numbers[:wanted] != list(range(1, wanted + 1)) or not wanted:
        missing = next((k for k in range(1, wanted + 1) if k not in numbers), 1)
        raise PhalanxError(
            f"{root} has no {split}B{missing}/ (CycleGAN's layout: {split}A/ and {split}B1/ ... {split}B<m>/, "
            "DeepLIIF's unaligned data)",
            OPTION,
        )
    folders = [folder_a] + [p for _, p in found[:wanted]]
    files: list[list[Path]] = []
    modes = set()
    for folder in folders:
        names = _images(folder)
        if not names:
            raise PhalanxError(f"{folder} holds no images", OPTION)
        for name in names:
            try:
                modes.add(_size(folder / name)[1])
            except ValueError as exc:
                raise PhalanxError(f"{folder / name}: {exc}", OPTION) from None
        files.append([folder / name for name in names])
    mode = "L" if modes <= {"L", "1", "I;16", "I"} else "RGB"
    return UnpairedFiles(root, files[0], files[1:], mode)


class UnpairedImages(Dataset):
    """``(A, Bs)``: uint8 tensors (C, size, size) and (m, C, size, size). ``images[i]``: A's image i
    with each B folder's image i mod its count (evaluation, and ``serial``); ``images[i, draw]``
    with a generator: each B image drawn at random."""

    def __init__(self, files: UnpairedFiles, size: int):
        self.files, self.size = files, size

    def __len__(self) -> int:
        return len(self.files)

    def read(self, path: Path) -> torch.Tensor:
        try:
            image = decode(read_bounded(path), self.files.mode, None, fast=False)
        except Exception as exc:  # vanished or changed since the scan
            raise PhalanxError(f"cannot read {path} ({type(exc).__name__}: {exc})"[:300], OPTION) from None
        if image.shape[-2:] != (self.size, self.size):  # each domain's images at the size (they differ)
            image = (
                torch.nn.functional.interpolate(
                    image[None].float(),
                    size=(self.size, self.size),
                    mode="bilinear",
                    antialias=True,
                    align_corners=False,
                )[0]
                .round()
                .clamp(0, 255)
                .to(torch.uint8)
            )
        return image

    def pick(self, index: int, draw: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        b = [
            folder[index % len(folder)] if draw is None else folder[int(torch.randint(len(folder), (), generator=draw))]
            for folder in self.files.b
        ]
        return self.read(self.files.a[index]), torch.stack([self.read(path) for path in b])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pick(index)


class UnpairedView(SeededView):
    """The training split (A's images ``indices``, all by default): ``view[(epoch, i)]`` draws
    its partners (unless ``serial``) and augments the sample, both seeded by the run's seed, the
    epoch and A's index; ``view[i]``: the sample as evaluation prepares it."""

    def __init__(
        self, base: UnpairedImages, augment, seed: int, prepare, serial: bool, indices: list[int] | None = None
    ):
        self.indices = list(range(len(base))) if indices is None else indices
        super().__init__(base, augment, seed, Subset(Transformed(base, prepare), self.indices))
        self.images, self.serial = base, serial

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, key):
        if not isinstance(key, tuple):
            return self.plain[key]
        epoch, position = key
        index = self.indices[position]
        draw = None if self.serial else torch.Generator().manual_seed(derive_seed(self.seed, "pairing", epoch, index))
        sample = self.images.pick(index, draw)
        if self.augment is None:
            return sample
        torch.default_generator.manual_seed(derive_seed(self.seed, "augment", epoch, index))
        return self.augment(sample)

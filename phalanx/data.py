"""Datasets: the built-in digits, ImageFolder trees, and torchvision's MNIST/FashionMNIST/CIFAR-10.

Every problem with the data is found here, before a run directory is created, and reported as one
line that names the option and the file.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset, Subset, TensorDataset

from .config import RunConfig
from .errors import PhalanxError

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}
DIGITS_FILE = Path(__file__).with_name("data") / "digits.csv.gz"


@dataclass
class DataBundle:
    train: Dataset
    val: Dataset
    classes: list[str]
    in_channels: int
    description: str

    @property
    def num_classes(self) -> int:
        return len(self.classes)


def build_datasets(cfg: RunConfig, channels: int | None) -> DataBundle:
    """``channels``: what the model insists on (3 for torchvision models), or None for any."""
    if cfg.dataset == "digits":
        return _digits(cfg, channels)
    if cfg.dataset == "folder":
        return _image_folder(cfg, channels)
    if cfg.dataset == "synthetic":
        return _synthetic(cfg, channels)
    return _torchvision_dataset(cfg, channels)


def _normalise(x: torch.Tensor) -> torch.Tensor:
    """[0, 1] pixels -> [-1, 1]: the same fixed normalisation for every dataset."""
    return (x - 0.5) / 0.5


class EpochKeyed(Dataset):
    """Training samples looked up by ``(epoch, index)`` keys (see ``sampling.EpochBatches``)."""

    def __init__(self, base: Dataset):
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, key: tuple[int, int]):
        return self.base[key[1]]


def holdout_split(dataset: Dataset, fraction: float, seed: int) -> tuple[Subset, Subset]:
    """A seeded split, identical on every rank and every resume."""
    n = len(dataset)
    n_val = max(1, round(n * fraction))
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    return Subset(dataset, sorted(order[n_val:])), Subset(dataset, sorted(order[:n_val]))


# --- built-in digits --------------------------------------------------------------------------

def load_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """The 1,797 8x8 handwritten digits (UCI, as shipped by scikit-learn): pixels in [0, 1]."""
    with gzip.open(DIGITS_FILE, "rt") as fh:
        rows = [[int(v) for v in line.split(",")] for line in fh if line.strip()]
    table = torch.tensor(rows, dtype=torch.float32)
    images = (table[:, :64] / 16.0).reshape(-1, 1, 8, 8)
    return images, table[:, 64].long()


def _digits(cfg: RunConfig, channels: int | None) -> DataBundle:
    images, labels = load_digits()
    if cfg.image_size and cfg.image_size != 8:
        images = torch.nn.functional.interpolate(images, size=cfg.image_size, mode="bilinear",
                                                 align_corners=False)
    images = _normalise(images)
    if channels and channels != 1:
        images = images.expand(-1, channels, -1, -1).contiguous()
    train, val = holdout_split(TensorDataset(images, labels), cfg.val_fraction, cfg.seed)
    size = images.shape[-1]
    return DataBundle(train, val, [str(d) for d in range(10)], images.shape[1],
                      f"built-in digits ({len(train)} train / {len(val)} val, {size}x{size})")


def _synthetic(cfg: RunConfig, channels: int | None) -> DataBundle:
    """Seeded random images and labels, already in memory: benchmarks measure training, not I/O."""
    size, chans = cfg.image_size or 32, channels or 3
    generator = torch.Generator().manual_seed(cfg.seed)
    images = torch.rand(cfg.synthetic_samples, chans, size, size, generator=generator)
    labels = torch.randint(0, 10, (cfg.synthetic_samples,), generator=generator)
    train, val = holdout_split(TensorDataset(_normalise(images), labels), cfg.val_fraction, cfg.seed)
    return DataBundle(train, val, [str(i) for i in range(10)], chans,
                      f"synthetic ({len(train)} train / {len(val)} val, {chans}x{size}x{size})")


# --- ImageFolder trees ------------------------------------------------------------------------

class UnreadableImage(PhalanxError):
    pass


class ImageFiles(Dataset):
    """(path, label) pairs decoded on access; a decode failure names the file."""

    def __init__(self, samples: list[tuple[Path, int]], size: int, mode: str):
        self.samples, self.size, self.mode = samples, size, mode

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image
        from torchvision.transforms.functional import pil_to_tensor

        path, label = self.samples[index]
        try:
            with Image.open(path) as img:
                img = img.convert(self.mode).resize((self.size, self.size), Image.BILINEAR)
        except Exception as exc:
            raise UnreadableImage(f"cannot read image {path} ({exc})", "--dataroot") from None
        return _normalise(pil_to_tensor(img).float() / 255.0), label


def _scan_split(split_dir: Path, classes: list[str] | None) -> tuple[list[str], list[tuple[Path, int]]]:
    from PIL import Image

    found = sorted(p.name for p in split_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not found:
        raise PhalanxError(f"{split_dir} has no class folders; expected {split_dir}/<class>/<images>",
                           "--dataroot")
    if classes is not None and found != classes:
        raise PhalanxError(f"{split_dir} has classes {found}, but train/ has {classes}", "--dataroot")
    samples = []
    for label, name in enumerate(found):
        files = sorted(p for p in (split_dir / name).rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise PhalanxError(f"class folder {split_dir / name} has no images "
                               f"({', '.join(sorted(IMAGE_SUFFIXES))})", "--dataroot")
        for path in files:
            try:  # verify() checks the file's structure without decoding every pixel
                with Image.open(path) as img:
                    img.verify()
            except Exception as exc:
                raise UnreadableImage(f"cannot read image {path} ({type(exc).__name__})", "--dataroot") from None
            samples.append((path, label))
    return found, samples


def _image_folder(cfg: RunConfig, channels: int | None) -> DataBundle:
    root = Path(cfg.dataroot)
    if not root.is_dir():
        raise PhalanxError(f"{root} is not a directory", "--dataroot")
    if not (root / "train").is_dir():
        raise PhalanxError(f"{root} has no train/ folder; expected {root}/train/<class>/<images>",
                           "--dataroot")
    classes, train_samples = _scan_split(root / "train", None)
    size = cfg.image_size or 32
    mode = "L" if channels == 1 else "RGB" if channels in (None, 3) else None
    if mode is None:
        raise PhalanxError(f"the model needs {channels} input channels; folders give 1 or 3", "--model")
    in_channels = 1 if mode == "L" else 3
    train = ImageFiles(train_samples, size, mode)
    if (root / "val").is_dir():
        _, val_samples = _scan_split(root / "val", classes)
        val: Dataset = ImageFiles(val_samples, size, mode)
        how = "val/"
    else:
        train, val = holdout_split(train, cfg.val_fraction, cfg.seed)
        how = f"{cfg.val_fraction:g} hold-out"
    return DataBundle(train, val, classes, in_channels,
                      f"{root} ({len(train)} train / {len(val)} val from {how}, {len(classes)} classes, "
                      f"{size}x{size})")


# --- torchvision datasets ---------------------------------------------------------------------

def _torchvision_dataset(cfg: RunConfig, channels: int | None) -> DataBundle:
    import torchvision.datasets as tvd
    from torchvision.transforms import v2

    spec = {"mnist": (tvd.MNIST, 1, 28), "fashionmnist": (tvd.FashionMNIST, 1, 28),
            "cifar10": (tvd.CIFAR10, 3, 32)}
    cls, native_channels, native_size = spec[cfg.dataset]
    out_channels = channels or native_channels
    steps = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True)]
    if cfg.image_size and cfg.image_size != native_size:
        steps.append(v2.Resize((cfg.image_size, cfg.image_size), antialias=True))
    if out_channels != native_channels:
        steps.append(v2.Grayscale(num_output_channels=out_channels))
    steps.append(v2.Normalize([0.5] * out_channels, [0.5] * out_channels))
    transform = v2.Compose(steps)
    try:
        train = cls(cfg.dataroot, train=True, download=cfg.download, transform=transform)
        val = cls(cfg.dataroot, train=False, download=cfg.download, transform=transform)
    except RuntimeError as exc:  # torchvision: "Dataset not found. You can use download=True ..."
        raise PhalanxError(f"no {cls.__name__} files under {cfg.dataroot} ({str(exc).splitlines()[0]}); "
                           "add --download where there is internet", "--dataroot") from None
    except OSError as exc:
        raise PhalanxError(f"cannot read {cls.__name__} under {cfg.dataroot} ({exc})", "--dataroot") from None
    return DataBundle(train, val, list(train.classes), out_channels,
                      f"{cls.__name__} ({len(train)} train / {len(val)} val)")

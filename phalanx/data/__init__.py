"""Training data: sources (``sources``), image decoding (``images``), the folder manifest
(``manifest``) and what happens to each image (``transforms``), put together for a run (this
module); the samplers (``sampling``: the epoch's global order and each rank's share), the readers of
paired images (``pairs``), COCO detections (``coco``), masks (``masks``) and whole slides
(``slides``), ``predict``'s inputs (``inputs``) and the split folders' names (``layout``). May
import records, the configuration and the base modules; never a task, training or distributed.

``build_datasets`` checks everything about the data before a run directory exists. The training
split it returns is indexed two ways: by an int (the image without augmentation: statistics,
tests, inference) and by an ``(epoch, index)`` key (what training sees, see ``sampling``): a
sample's augmentation is seeded by the run's seed, the epoch and the sample, so it is the same in
any loader worker, on any rank, at any world size, and after a resume.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypedDict

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ..config import RunConfig
from ..system.cores import available_cores
from . import transforms
from .sampling import derive_seed
from .sources import dataset_size, holdout_split, image_files, load, load_digits  # noqa: F401  (the package's API)
from .transforms import Pipeline


@dataclass
class DataBundle:
    train: Dataset
    val: Dataset
    classes: list[str]
    in_channels: int
    description: str
    pipeline: Pipeline
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return len(self.classes)


class TrainView(Dataset):
    """``view[i]``: image i without augmentation; ``view[(epoch, i)]``: as training sees it."""

    takes_epoch = True

    def __init__(self, plain: Dataset, raw: Dataset, augment: Callable | None, seed: int):
        self.plain, self.raw, self.augment, self.seed = plain, raw, augment, seed

    def __len__(self) -> int:
        return dataset_size(self.plain)

    def __getitem__(self, key):
        if not isinstance(key, tuple):
            return self.plain[key]
        epoch, index = key
        if self.augment is None:
            return self.plain[index]
        image, label = self.raw[index]
        # torch's CPU generator only (augmentation runs on the CPU): a loader worker's stream,
        # or the training process's, reseeded for this sample.
        torch.default_generator.manual_seed(derive_seed(self.seed, "augment", epoch, index))
        return self.augment(image), label


class SeededView(Dataset):
    """Any task's training split: ``view[i]`` is sample i as ``base`` gives it; ``view[(epoch, i)]``
    is what training sees, ``augment(sample)`` under a random stream seeded by the run's seed, the
    epoch and the sample (the same on any rank, in any loader worker, at any world size, and after
    a resume). ``augment`` receives the whole sample, so an image and its targets (a paired image,
    boxes, a mask) move together."""

    takes_epoch = True  # the trainer asks for view[(epoch, i)]

    def __init__(self, base: Dataset, augment: Callable | None = None, seed: int = 0, plain: Dataset | None = None):
        self.base, self.augment, self.seed = base, augment, seed
        self.plain = base if plain is None else plain  # view[i]: the sample as evaluation prepares it

    def __len__(self) -> int:
        return dataset_size(self.base)

    def __getitem__(self, key):
        if not isinstance(key, tuple):
            return self.plain[key]
        epoch, index = key
        if self.augment is None:
            return self.base[index]
        sample = self.base[index]
        torch.default_generator.manual_seed(derive_seed(self.seed, "augment", epoch, index))
        return self.augment(sample)


def by_epoch(train: Dataset) -> Dataset:
    """A task's training split as the trainer reads it, ``split[(epoch, i)]``: a plain Dataset (or a
    tensor) is a SeededView without augmentation, so it needs no epoch keys of its own."""
    return train if getattr(train, "takes_epoch", False) else SeededView(train)


class Mapped(Dataset):
    """A data set with a transform applied to each image."""

    def __init__(self, base: Dataset, transform: Callable):
        self.base, self.transform = base, transform

    def __len__(self) -> int:
        return dataset_size(self.base)

    def __getitem__(self, index: int):
        image, label = self.base[index]
        return self.transform(image), label


def _in_chunks(
    transform: Callable[[torch.Tensor], torch.Tensor], images: torch.Tensor, chunk: int = 256, in_place: bool = False
) -> torch.Tensor:
    """``transform`` of a stack of images, a chunk at a time: the resize before an evaluation crop
    (``image_size / crop_pct``) would otherwise hold every image enlarged at once. The results go
    into one tensor allocated once, or, with ``in_place`` and a transform that keeps the images'
    shape and dtype (a normalisation), into ``images`` itself: 3.8 GB of synthetic images were held
    four times over (the split's copy, the chunks, their concatenation) before the first step."""
    if not len(images):
        return transform(images)
    out = None
    for start in range(0, len(images), chunk):
        part = transform(images[start : start + chunk])
        if out is None:
            keeps = in_place and part.shape[1:] == images.shape[1:] and part.dtype == images.dtype
            out = images if keeps else part.new_empty((len(images), *part.shape[1:]))
        out[start : start + len(part)] = part  # each chunk reads its own rows only, before they are written
    assert out is not None  # (one chunk at least)
    return out


def build_datasets(
    cfg: RunConfig, channels: int | None, random_erasing: float = 0.0, model: dict | None = None
) -> DataBundle:
    """``channels``: what the model insists on (3 for torchvision models), or None for any;
    ``random_erasing``: the probability of erasing a rectangle of a training image; ``model``: the
    model's own preferences for what the options leave to auto (timm: size, crop_pct, mean, std)."""
    source = load(cfg.data, cfg.seed, channels)
    size, augment, crop_pct = transforms.resolve(cfg.data, source.native_size, source.channels, cfg.data.dataset, model)
    stats = transforms.normalisation(cfg.data, cfg.network.weights, source.channels, model)
    if stats is None:  # --normalize dataset: the training split's own, resized but not augmented
        bare = Pipeline(size, "none", 1.0, (0.0,) * source.channels, (1.0,) * source.channels)
        resized = transforms.build(bare, cfg.data, train=False)
        stats = transforms.dataset_statistics(
            lambda i: resized(source.train[i][0]), dataset_size(source.train), cfg.seed
        )
    pipeline = Pipeline(size, augment, crop_pct, *stats)
    for split in (source.train, source.val):
        files = image_files(split)
        if files is not None:
            files.min_side = pipeline.min_decoded_side(cfg.data.crop_scale)
    plain = transforms.build(Pipeline(size, "none", 1.0, pipeline.mean, pipeline.std), cfg.data, train=False)
    evaluate = transforms.build(pipeline, cfg.data, train=False)
    randomised = pipeline.random or random_erasing > 0
    augmented = transforms.build(pipeline, cfg.data, train=True, random_erasing=random_erasing) if randomised else None
    if source.in_memory is not None:  # deterministic transforms on whole tensors, once
        train_images, val_images = source.in_memory
        from .sources import Tensors

        assert isinstance(source.train, Tensors) and isinstance(source.val, Tensors)  # (in memory: Tensors splits)
        # Without augmentation nothing reads the raw training images again: transformed where they lie.
        plain_train: Dataset = Tensors(_in_chunks(plain, train_images, in_place=augmented is None), source.train.labels)
        val: Dataset = Tensors(_in_chunks(evaluate, val_images, in_place=True), source.val.labels)
    else:
        plain_train, val = Mapped(source.train, plain), Mapped(source.val, evaluate)
    train = TrainView(plain_train, source.train, augmented, cfg.seed)
    description = source.description.replace(f"{source.native_size}x{source.native_size}", f"{size}x{size}")
    if pipeline.random:
        flip = " + horizontal flip" if cfg.data.hflip else ""
        policy = {
            "trivialaugment": " + TrivialAugmentWide",
            "randaugment": " + RandAugment",
            "autoaugment": " + AutoAugment (ImageNet's policy)",
        }.get(augment, "")
        note = " (--no-hflip where a flip changes the label: digits, text)" if cfg.data.hflip else ""
        description += f", augment {augment}: random crop{flip}{policy}{note}"
    return DataBundle(train, val, source.classes, source.channels, description, pipeline, source.skipped)


def dataset_labels(dataset: Dataset) -> list[int] | None:
    """The labels of a classification split without decoding its images, where the data set
    keeps them (in memory, a folder's label array, a subset of either); else None."""
    from torch.utils.data import Subset

    if isinstance(dataset, (Mapped, TrainView)):
        return dataset_labels(dataset.base if isinstance(dataset, Mapped) else dataset.plain)
    if isinstance(dataset, Subset):
        labels = dataset_labels(dataset.dataset)
        return None if labels is None else [labels[i] for i in dataset.indices]
    labels = getattr(dataset, "labels", None)
    return None if labels is None else [int(v) for v in labels]


def loader_workers(num_workers: str, local_processes: int, training_threads: int) -> int:
    """``--num-workers``: a number, or auto: the cores per local process that training leaves free
    (none on a CPU run, whose compute threads take the cores already)."""
    if num_workers != "auto":
        return int(num_workers)
    return max(0, available_cores() // max(1, local_processes) - training_threads)


class _LoaderOptions(TypedDict):
    """What run_loaders gives both its loaders."""

    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    collate_fn: Callable | None


def run_loaders(
    train: Dataset,
    val: Dataset,
    collate: Callable | None,
    batches: Sampler,
    batch_size: int,
    workers: int,
    pin: bool,
    rank: int,
    world_size: int,
) -> tuple[DataLoader, DataLoader]:
    """The training loader (the planned batches of ``batches``, as ``(epoch, index)`` keys) and the
    validation loader (this rank's shard: every sample counted once over the ranks)."""
    from .sampling import ShardSampler

    common: _LoaderOptions = {
        "num_workers": workers,
        "pin_memory": pin,
        "persistent_workers": workers > 0,
        "collate_fn": collate,
    }
    return (
        DataLoader(by_epoch(train), batch_sampler=batches, **common),
        DataLoader(val, batch_size=batch_size, sampler=ShardSampler(dataset_size(val), rank, world_size), **common),
    )


def close_loaders(*loaders: DataLoader) -> None:
    """Stop the loaders' worker processes now (they persist between epochs), not whenever the run's
    objects are garbage-collected: a later run in the same process would wait seconds for them."""
    for loader in loaders:
        iterator = getattr(loader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
        loader._iterator = None

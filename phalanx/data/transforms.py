"""What happens to an image between its source and the model: resize and crop (never a squash),
augmentation recipes, normalisation.

A source gives an image as a uint8 tensor (files) or a float tensor in [0, 1] (the digits, synthetic
data), at any size. Training applies the recipe of ``--augment``, built from torchvision's v2
transforms; evaluation (and training without augmentation) resizes the shorter side to
``image_size / crop_pct`` and takes the centre crop, as timm's ``crop_pct`` does, with torch alone:
importing torchvision costs a process seconds, and runs without augmentation never need it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..config.sections import DataOptions

SMALL = 64  # up to this size, "basic" pads and crops (CIFAR's recipe); above, a random resized crop
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
IMAGENET_GRAY_MEAN, IMAGENET_GRAY_STD = (0.449,), (0.226,)  # the RGB statistics' mean, as timm uses


@dataclass(frozen=True)
class Pipeline:
    """The image pipeline of a run, resolved from the options and the data."""

    size: int
    augment: str  # none, basic, trivialaugment, randaugment, autoaugment
    crop_pct: float
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @property
    def random(self) -> bool:
        return self.augment != "none"

    @property
    def evaluation_resize(self) -> int:
        """The shorter side an image is resized to before the evaluation crop: timm's rule,
        ``floor(size / crop_pct)`` (224 at 0.875: 256, as torchvision's references resize)."""
        return math.floor(self.size / self.crop_pct)

    def min_decoded_side(self, crop_scale: float) -> int:
        """The shorter side a decoder may reduce an image to without losing what the pipeline uses:
        a random resized crop can take ``sqrt(crop_scale)`` of the side and enlarge it to ``size``."""
        if self.augment != "none" and self.size > SMALL:
            return math.ceil(self.size / math.sqrt(crop_scale))
        return math.ceil(self.size / min(self.crop_pct, 1.0))


def one_size(data: DataOptions, task: str) -> int:
    """--image-size for a task that resizes every image to one size (pix2pix's pairs, a
    segmenter's): 0, each image's own size, failed in the first step after the run directory was
    made."""
    if not data.image_size:
        from ..errors import PhalanxError

        raise PhalanxError(
            f"--task {task} resizes every image to one size; 0 (each image's own) cannot be: give --image-size N",
            "--image-size",
        )
    return data.image_size


def resolve(
    data: DataOptions, native_size: int, channels: int, dataset: str | None, model: dict | None = None
) -> tuple[int, str, float]:
    """(image size, augmentation, evaluation crop fraction) for this run; ``model``: what the model
    prefers where the options say auto (timm's pretrained config: ``size``, ``crop_pct``)."""
    model = model or {}
    size = data.image_size or (model.get("size") if dataset == "folder" else None) or native_size
    augment = data.augment
    if augment == "auto":
        augment = "basic" if dataset in ("folder", "cifar10") else "none"
    crop_pct = data.val_crop_pct or model.get("crop_pct") or (1.0 if size <= SMALL else 0.875)
    return size, augment, crop_pct


def normalisation(
    data: DataOptions, weights: str | None, channels: int, model: dict | None = None
) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """Mean and std from the options, or None when the data set's own must be computed; ``model``:
    a model's own statistics (timm's pretrained config), taken by auto."""
    if data.normalize == "weights":  # a checkpoint's own, recorded with the run (models.weights.learnt_normalisation)
        return _learnt(data, channels)
    if data.mean:
        if len(data.mean) == 1:  # one value for every channel (--mean 0.5 --std 0.5 on RGB images)
            return tuple(data.mean) * channels, tuple(data.std) * channels
        if len(data.mean) != channels:
            from ..errors import PhalanxError

            raise PhalanxError(f"has {len(data.mean)} values for {channels}-channel images", "--mean")
        return data.mean, data.std
    kind = data.normalize
    if kind == "auto" and model and model.get("mean"):
        mean, std = tuple(model["mean"]), tuple(model["std"])
        if channels == 1:  # one channel: the mean of the colour statistics, as timm does
            return (sum(mean) / 3,), (sum(std) / 3,)
        return mean, std
    if kind == "auto":
        kind = "imagenet" if weights else "half"
    if kind == "imagenet":
        return (IMAGENET_MEAN, IMAGENET_STD) if channels == 3 else (IMAGENET_GRAY_MEAN, IMAGENET_GRAY_STD)
    if kind == "none":
        return (0.0,) * channels, (1.0,) * channels
    if kind == "half":  # [0, 1] -> [-1, 1]
        return (0.5,) * channels, (0.5,) * channels
    return None  # "dataset"


def _learnt(data: DataOptions, channels: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``--normalize weights``: the statistics the --weights checkpoint learnt on, for this run's
    channels: one value for every channel, and RGB statistics on one-channel images averaged (as
    timm adapts them)."""
    from ..errors import PhalanxError

    mean, std = tuple(data.mean), tuple(data.std)
    if not mean:
        raise PhalanxError(
            "takes the --weights checkpoint's mean and std: give --weights of a phalanx checkpoint, or "
            "another --normalize",
            "--normalize",
        )
    if len(mean) == channels:
        return mean, std
    if len(mean) == 1:
        return mean * channels, std * channels
    if len(mean) == 3 and channels == 1:
        return (sum(mean) / 3,), (sum(std) / 3,)
    raise PhalanxError(
        f"the --weights checkpoint learnt on {len(mean)}-channel images, this run's have {channels}; "
        "give --mean and --std",
        "--normalize",
    )


class Prepare:
    """Resize the shorter side (antialiased bilinear, as torchvision's Resize), take the centre
    crop, scale to [0, 1] and normalise; one image (C, H, W) or a batch (N, C, H, W).

    ``geometry`` (resize and crop, in the input's dtype) and ``scale`` (to normalised floats, one
    fused operation) are apart, so that augmentation can work on the small uint8 image between them."""

    def __init__(self, resize: int, crop: int, mean: tuple[float, ...], std: tuple[float, ...]):
        self.resize, self.crop = resize, crop
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)
        # (x / 255 - mean) / std as one multiply-add: x * factor + shift.
        self.shift = -self.mean / self.std
        self.factor = {torch.uint8: 1.0 / (255.0 * self.std), torch.float32: 1.0 / self.std}

    def geometry(self, image: torch.Tensor) -> torch.Tensor:
        x = image if image.dim() == 4 else image[None]
        h, w = x.shape[-2:]
        if min(h, w) != self.resize:
            # torchvision's rule: the shorter side becomes `resize`, the longer one is truncated.
            long = int(self.resize * max(h, w) / min(h, w))
            size = (self.resize, long) if h <= w else (long, self.resize)
            x = torch.nn.functional.interpolate(x, size=size, mode="bilinear", antialias=True, align_corners=False)
            h, w = size
        if self.crop > min(h, w):
            # A crop_pct above 1 (timm gives 1.15 for three VOLO models) crops more than the resized
            # image holds: pad with zeros around it first, as torchvision's CenterCrop does.
            pad_w, pad_h = max(self.crop - w, 0), max(self.crop - h, 0)
            x = torch.nn.functional.pad(x, (pad_w // 2, (pad_w + 1) // 2, pad_h // 2, (pad_h + 1) // 2))
            h, w = x.shape[-2:]
        top, left = int(round((h - self.crop) / 2.0)), int(round((w - self.crop) / 2.0))
        x = x[..., top : top + self.crop, left : left + self.crop]
        return x if image.dim() == 4 else x[0]

    def scale(self, x: torch.Tensor) -> torch.Tensor:
        """To normalised float32: uint8 pixels / 255, or [0, 1] floats, then (x - mean) / std."""
        if x.dtype == torch.uint8:
            return torch.addcmul(self.shift, x, self.factor[torch.uint8])
        return torch.addcmul(self.shift, x.float(), self.factor[torch.float32])

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return self.scale(self.geometry(image))


class PadCropFlip:
    """``basic`` augmentation of small images: a random crop of the prepared image padded by ``pad``
    black pixels on each side, then a horizontal flip half the time, as torchvision's RandomCrop
    and RandomHorizontalFlip do, on the small uint8 image before it is scaled. Measured here (160-px
    JPEGs to 32 px, one thread): torchvision's v2 transforms spent about 300 us an image on this,
    more than decoding it; these tensor operations, a few tens of microseconds."""

    def __init__(self, prepare: Prepare, pad: int, flip: bool):
        self.prepare, self.pad, self.flip = prepare, pad, flip

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        x = self.prepare.geometry(image)
        channels, size = x.shape[0], x.shape[-1]
        span = 2 * self.pad + 1
        draw = int(torch.randint(0, span * span * 2, ()))  # one draw: the crop's corner and the flip
        top, left, flipped = draw // (2 * span), draw // 2 % span, self.flip and draw % 2 == 1
        # The crop of the padded image, without padding it: its black border, and the image's part.
        out = torch.zeros((channels, size, size), dtype=x.dtype)
        dy, dx = top - self.pad, left - self.pad  # where the crop starts, in the image's coordinates
        rows, cols = slice(max(0, -dy), size - max(0, dy)), slice(max(0, -dx), size - max(0, dx))
        out[:, rows, cols] = x[:, max(0, dy) : size + min(0, dy), max(0, dx) : size + min(0, dx)]
        return self.prepare.scale(out.flip(-1) if flipped else out)


def _geometry(pipeline: Pipeline, data: DataOptions) -> list:
    from torchvision.transforms import v2

    size = pipeline.size
    if size <= SMALL:
        steps = [v2.Resize(size, antialias=True), v2.CenterCrop(size), v2.RandomCrop(size, padding=max(1, size // 8))]
    else:
        steps = [v2.RandomResizedCrop(size, scale=(data.crop_scale, 1.0), antialias=True)]
    if data.hflip:
        steps.append(v2.RandomHorizontalFlip())
    policy = {
        "trivialaugment": v2.TrivialAugmentWide,
        "randaugment": v2.RandAugment,
        "autoaugment": v2.AutoAugment,
    }.get(pipeline.augment)
    if policy is not None:
        steps.append(policy())
    return steps


def build(
    pipeline: Pipeline, data: DataOptions, train: bool, random_erasing: float = 0.0
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The transform of one image: uint8 or [0, 1] float in, normalised float32 out. Random erasing
    applies with or without the other augmentation (--augment none --random-erasing 0.25 erases)."""
    erasing = train and random_erasing > 0
    if not train or (not pipeline.random and not erasing):
        resize = pipeline.evaluation_resize if not train else pipeline.size
        return Prepare(resize, pipeline.size, pipeline.mean, pipeline.std)
    size = pipeline.size
    if pipeline.augment == "basic" and size <= SMALL and not erasing:  # the common small-image recipe, fast
        return PadCropFlip(Prepare(size, size, pipeline.mean, pipeline.std), max(1, size // 8), data.hflip)
    from torchvision.transforms import v2

    steps = _geometry(pipeline, data) if pipeline.random else [v2.Resize(size, antialias=True), v2.CenterCrop(size)]
    steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(pipeline.mean), list(pipeline.std))]
    if random_erasing > 0:
        steps.append(v2.RandomErasing(p=random_erasing))
    return v2.Compose(steps)


def dataset_statistics(
    images: Callable[[int], torch.Tensor], count: int, seed: int, limit: int = 10_000
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of the training images (resized, not augmented), over every image
    or a seeded sample of ``limit``: the same numbers on every rank and every resume."""
    indices = (
        range(count)
        if count <= limit
        else torch.randperm(count, generator=torch.Generator().manual_seed(seed))[:limit].tolist()
    )
    total: torch.Tensor | None = None
    squares: torch.Tensor | None = None
    pixels = 0
    for index in indices:
        image = images(index).double()
        flat = image.reshape(image.shape[0], -1)
        total = flat.sum(1) if total is None else total + flat.sum(1)
        squares = (flat**2).sum(1) if squares is None else squares + (flat**2).sum(1)
        pixels += flat.shape[1]
    assert total is not None and squares is not None  # (one image at least)
    mean = total / pixels
    std = (squares / pixels - mean**2).clamp(min=1e-12).sqrt()
    return tuple(round(v, 6) for v in mean.tolist()), tuple(round(v, 6) for v in std.tolist())

"""Two augmented views of each image, for self-supervised tasks: SimCLR's augmentation, the
validation views (the same every epoch), the kNN bank's samples, and the views drawn on the
dashboard."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, default_collate

from ... import records
from ...data.sampling import derive_seed
from ...data.transforms import SMALL
from ...records.pictures import denormalize, png, strip
from ..base import RunContext, dataset_size
from .view_batch import ViewRecipe


@dataclass
class Drawn:
    """A training sample's views half made: each view group's resized crops (count, C, size, size)
    and parameters (count, FIELDS), drawn from the sample's seeded stream."""

    crops: list[torch.Tensor]
    params: list[torch.Tensor]


class ViewSet:
    """A training sample -> groups of views: SimCLR's two, or DINO's and SwAV's multi-crop (two
    global crops and ``count`` local ones, smaller crops of a smaller part of the image). Each
    sample draws its views' parameters and crops them; ``collate`` finishes every view of a batch
    at once (view_batch.py), in view order: (view 1 of every sample, view 2 of every sample, ...)."""

    def __init__(self, groups: list[tuple[ViewRecipe, int]], description: str = ""):
        self.groups = groups
        self.description = description  # what the run's first line says of multi-crop

    @property
    def global_views(self) -> ViewRecipe:
        return self.groups[0][0]

    def __call__(self, sample: tuple[torch.Tensor, int]) -> Drawn | tuple[torch.Tensor, ...]:
        image = sample[0]
        if made_by_pil(image, max(recipe.size for recipe, _ in self.groups)):
            return tuple(per_image(recipe)(image) for recipe, count in self.groups for _ in range(count))
        height, width = image.shape[-2:]
        params = [torch.stack([recipe.draw(height, width) for _ in range(count)]) for recipe, count in self.groups]
        crops = [
            torch.stack([recipe.crop(image, row) for row in rows]) for (recipe, _), rows in zip(self.groups, params)
        ]
        return Drawn(crops, params)

    def collate(self, items: list) -> Any:
        if not isinstance(items[0], Drawn):  # views made one image at a time; the validation loader's samples
            return default_collate(items)
        made = []
        for group, (recipe, count) in enumerate(self.groups):
            crops = torch.cat([torch.stack([item.crops[group][view] for item in items]) for view in range(count)])
            params = torch.cat([torch.stack([item.params[group][view] for item in items]) for view in range(count)])
            made += list(recipe.finish(crops, params).split(len(items)))
        return tuple(made)


def made_by_pil(image: torch.Tensor, size: int) -> bool:
    """Larger views of 8-bit images (gray or colour, as PIL holds them) are made one at a time by
    torchvision's transforms on PIL images, as Lightly's are: on float tensors a batch of 128
    images' two views at 96 px took 0.61-0.71x Lightly's speed (memory-bound), at 32 px 2.9x
    (benchmarks/views.py)."""
    return image.dtype == torch.uint8 and size > SMALL and image.shape[0] in (1, 3)


def one_view(recipe: ViewRecipe, image: torch.Tensor) -> torch.Tensor:
    """One view of one image, made as training makes it."""
    return per_image(recipe)(image) if made_by_pil(image, recipe.size) else recipe(image)


@functools.cache
def per_image(recipe: ViewRecipe) -> Callable[[torch.Tensor], torch.Tensor]:
    """``recipe`` as torchvision's transforms on one 8-bit image made a PIL image (Lightly's SimCLRTransform)."""
    from torchvision import transforms as T

    steps = [T.ToPILImage(), T.RandomResizedCrop(recipe.size, scale=recipe.scale, antialias=True)]
    steps += [T.RandomHorizontalFlip()] if recipe.flip else []
    steps += [
        T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1) if recipe.channels == 3 else T.ColorJitter(0.4, 0.4)], p=0.8)
    ]
    steps += [T.RandomGrayscale(p=0.2)] if recipe.channels == 3 else []
    steps += [T.RandomApply([_pil_blur], p=recipe.blur)] if recipe.blur > 0 else []
    return T.Compose([*steps, T.ToTensor(), T.Normalize(list(recipe.mean), list(recipe.std))])


def _pil_blur(picture):
    """PIL's own Gaussian blur, sigma 0.1-2, as Lightly's GaussianBlur (torchvision's blurs a PIL
    image as a float tensor: slower)."""
    from PIL import ImageFilter

    return picture.filter(ImageFilter.GaussianBlur(radius=0.1 + 1.9 * torch.rand(1).item()))


def two_views(recipe: ViewRecipe) -> ViewSet:
    return ViewSet([(recipe, 2)])


def multi_crop(
    global_scale: float,
    local_views: int,
    local_size: int,
    local_scale: float,
    size: int,
    channels: int,
    flip: bool,
    blur: float,
    mean: tuple[float, ...],
    std: tuple[float, ...],
) -> ViewSet:
    """DINO's and SwAV's crops: global ones of ``size`` (area ``global_scale`` to 1), local ones of
    ``local_size`` (0: 3/7 of ``size``, at least 8; area ``local_scale`` to ``global_scale``)."""
    local = local_size or max(8, round(size * 3 / 7))
    if local > size:
        from ...errors import PhalanxError

        if not local_size:  # the default's 8-px floor, not a --local-size the user gave
            raise PhalanxError(
                f"{size} px is smaller than a local crop's 8 px at the least: give --image-size 8 or "
                "more, or --local-views 0",
                "--image-size",
            )
        raise PhalanxError(
            f"{local} px is larger than the images' {size} px: a local crop is a small part of an image", "--local-size"
        )
    description = (
        f"2 global crops of {size} px (area {global_scale:g}-1) and {local_views} local crops of {local} px "
        f"(area {local_scale:g}-{global_scale:g}) per image, blur {blur:g}"
    )
    local_crops = ViewRecipe(local, channels, (local_scale, global_scale), flip, blur, mean, std)
    return ViewSet(
        [
            (ViewRecipe(size, channels, (global_scale, 1.0), flip, blur, mean, std), 2),
            *([(local_crops, local_views)] if local_views else []),
        ],
        description,
    )


class ValidationViews(Dataset):
    """``(view 1, view 2, image prepared for evaluation, label, index)``; the views of sample i are the
    same every epoch (seeded by the run's seed and i), so the view loss is comparable across epochs."""

    def __init__(self, raw: Dataset, views: ViewRecipe, prepare, seed: int):
        self.raw, self.views, self.prepare, self.seed = raw, views, prepare, seed

    def __len__(self) -> int:
        return dataset_size(self.raw)

    def __getitem__(self, index: int):
        image, label = self.raw[index]
        torch.default_generator.manual_seed(derive_seed(self.seed, "validation views", index))
        return one_view(self.views, image), one_view(self.views, image), self.prepare(image), int(label), index


class Indexed(Dataset):
    """``(image, label, index)``: the kNN bank's samples."""

    def __init__(self, base: Dataset):
        self.base = base

    def __len__(self) -> int:
        return dataset_size(self.base)

    def __getitem__(self, index: int):
        image, label = self.base[index]
        return image, int(label), index


class ViewSample:
    """Each epoch: a few training images' two views, as that epoch's training drew them."""

    def __init__(
        self,
        train: Dataset[Any],
        collate: Callable[[list[Any]], Any],
        indices: list[int],
        mean: list[float],
        std: list[float],
    ):
        self.train, self.collate, self.indices, self.mean, self.std = train, collate, indices, mean, std

    def record(self, models: Mapping[str, nn.Module], epoch: int, ctx: RunContext) -> dict[str, Any]:
        state = torch.default_generator.get_state()
        try:
            items = []
            for index in self.indices:
                v1, v2 = (view[0] for view in self.collate([self.train[(epoch, index)]])[:2])  # the (global) views
                shown = [denormalize(v, self.mean, self.std) for v in (v1, v2)]
                items.append(records.images_item(png(strip(shown)), f"image {index}: view 1 | view 2"))
        finally:
            torch.default_generator.set_state(state)
        return {
            "kind": "images",
            "epoch": epoch,
            "title": "two views of training images (this epoch's augmentation)",
            "items": items,
        }

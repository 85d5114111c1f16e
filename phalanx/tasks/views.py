"""Two augmented views of each image, for self-supervised tasks: SimCLR's augmentation, the
validation views (the same every epoch), the kNN bank's samples, and the views drawn on the
dashboard."""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn
from torch.utils.data import Dataset

from .. import records
from ..pictures import denormalize, png, strip
from ..sampling import derive_seed


class Views:
    """SimCLR's augmentation of one image into a view (Chen et al. 2020; Lightly's SimCLRTransform):
    random resized crop, flip, colour jitter (p 0.8), grayscale (p 0.2, colour images), Gaussian blur
    (``blur``), then normalised. Random draws come from torch's generator (seeded per sample).

    8-bit images (1 or 3 channels) are augmented as PIL images with torchvision's transforms (v1),
    as Lightly's are: a 32 px image's two views took 1.03 ms with the tensor transforms (v2; the hue
    shift alone 0.2 ms a view against PIL's 0.03) and 0.83 ms this way, and the data made a third
    of a DDP SimCLR step (benchmarks/selfsupervised.py). Other images take the same steps as float
    tensors (v2; converted before the crop, where uint8 tensors were cropped first before)."""

    def __init__(self, size: int, channels: int, crop_scale: float, flip: bool, blur: float,
                 mean: tuple[float, ...], std: tuple[float, ...], max_scale: float = 1.0):
        from torchvision import transforms as v1
        from torchvision.transforms import v2

        def steps(t: Any) -> list[Any]:  # the same steps from either module
            chosen = [t.RandomResizedCrop(size, scale=(crop_scale, max_scale), antialias=True)]
            if flip:
                chosen.append(t.RandomHorizontalFlip())
            jitter = t.ColorJitter(0.4, 0.4, 0.4, 0.1) if channels == 3 else t.ColorJitter(0.4, 0.4)
            chosen.append(t.RandomApply([jitter], p=0.8))
            if channels == 3:
                chosen.append(t.RandomGrayscale(p=0.2))
            if blur > 0:
                kernel = max(3, int(0.1 * size) // 2 * 2 + 1)
                chosen.append(t.RandomApply([t.GaussianBlur(kernel, sigma=(0.1, 2.0))], p=blur))
            return chosen

        self.pil_transform = v1.Compose([v1.ToPILImage(), *steps(v1), v1.ToTensor(), v1.Normalize(list(mean), list(std))])
        self.tensor_transform = v2.Compose([v2.ToDtype(torch.float32, scale=True), *steps(v2),
                                            v2.Normalize(list(mean), list(std))])

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        if image.dtype == torch.uint8 and image.dim() == 3 and image.shape[0] in (1, 3):
            return self.pil_transform(image)
        return self.tensor_transform(image)


class TwoViews:
    """A training sample -> its two views (drawn in turn from the sample's seeded stream)."""

    def __init__(self, views: Views):
        self.views = views

    def __call__(self, sample: tuple[torch.Tensor, int]) -> tuple[torch.Tensor, torch.Tensor]:
        image = sample[0]
        return self.views(image), self.views(image)


class MultiCrop:
    """A training sample -> two global views and ``count`` local ones (smaller crops of a smaller
    part of the image: DINO's and SwAV's multi-crop), all drawn from the sample's seeded stream, so
    any world size and any resume sees the same crops."""

    def __init__(self, global_views: Views, local_views: Views, count: int, words: str = ""):
        self.global_views, self.local_views, self.count = global_views, local_views, count
        self.words = words  # what the run's first line says of them

    def __call__(self, sample: tuple[torch.Tensor, int]) -> tuple[torch.Tensor, ...]:
        image = sample[0]
        return (self.global_views(image), self.global_views(image),
                *(self.local_views(image) for _ in range(self.count)))


def multi_crop(global_scale: float, local_views: int, local_size: int, local_scale: float, size: int, channels: int,
               flip: bool, blur: float, mean: tuple[float, ...], std: tuple[float, ...]) -> MultiCrop:
    """DINO's and SwAV's crops: global ones of ``size`` (area ``global_scale`` to 1), local ones of
    ``local_size`` (0: 3/7 of ``size``, at least 8; area ``local_scale`` to ``global_scale``)."""
    local = local_size or max(8, round(size * 3 / 7))
    if local > size:
        from ..errors import PhalanxError

        if not local_size:  # the default's 8-px floor, not a --local-size the user gave
            raise PhalanxError(f"{size} px is smaller than a local crop's 8 px at the least: give --image-size 8 or "
                               "more, or --local-views 0", "--image-size")
        raise PhalanxError(f"{local} px is larger than the images' {size} px: a local crop is a small part of "
                           "an image", "--local-size")
    words = (f"2 global crops of {size} px (area {global_scale:g}-1) and {local_views} local crops of {local} px "
             f"(area {local_scale:g}-{global_scale:g}) per image, blur {blur:g}")
    return MultiCrop(Views(size, channels, global_scale, flip, blur, mean, std),
                     Views(local, channels, local_scale, flip, blur, mean, std, global_scale), local_views, words)


class ValidationViews(Dataset):
    """``(view 1, view 2, image prepared for evaluation, label, index)``; the views of sample i are the
    same every epoch (seeded by the run's seed and i), so the view loss is comparable across epochs."""

    def __init__(self, raw: Dataset, views: Views, prepare, seed: int):
        self.raw, self.views, self.prepare, self.seed = raw, views, prepare, seed

    def __len__(self) -> int:
        return len(self.raw)

    def __getitem__(self, index: int):
        image, label = self.raw[index]
        torch.default_generator.manual_seed(derive_seed(self.seed, "validation views", index))
        return self.views(image), self.views(image), self.prepare(image), int(label), index


class Indexed(Dataset):
    """``(image, label, index)``: the kNN bank's samples."""

    def __init__(self, base: Dataset):
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int):
        image, label = self.base[index]
        return image, int(label), index


class ViewSample:
    """Each epoch: a few training images' two views, as that epoch's training drew them."""

    def __init__(self, train: Dataset, indices: list[int], mean: list[float], std: list[float]):
        self.train, self.indices, self.mean, self.std = train, indices, mean, std

    def record(self, models: Mapping[str, nn.Module], epoch: int, ctx: Any) -> dict[str, Any]:
        state = torch.default_generator.get_state()
        try:
            items = []
            for index in self.indices:
                v1, v2 = self.train[(epoch, index)][:2]  # the two (global) views
                shown = [denormalize(v, self.mean, self.std) for v in (v1, v2)]
                items.append(records.images_item(png(strip(shown)), f"image {index}: view 1 | view 2"))
        finally:
            torch.default_generator.set_state(state)
        return {"kind": "images", "epoch": epoch, "title": "two views of training images (this epoch's augmentation)",
                "items": items}

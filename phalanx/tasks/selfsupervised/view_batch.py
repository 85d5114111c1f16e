"""SimCLR's augmentation applied to a whole batch of views at once.

Each view's random parameters (crop box, flip, colour jitter factors and order, grayscale, blur
sigma) are drawn per sample from its seeded stream, with the distributions of torchvision's
transforms; the loader's collate then makes every view of the batch: one resized crop a view, then
each later step once over all the views it applies to. Made one image at a time (torchvision's
transforms on PIL images, as Lightly's SimCLRTransform runs), a batch's views cost mostly the
per-call overhead of a dozen small operations a view (benchmarks/views.py).

Every operation acts on each view alone (elementwise, or a reduction over one view's pixels), so a
view is the same whichever batch it is made in: any world size and any resume sees the same views.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F

# A view's parameters, a row of floats: the crop box (pixels), then each step's flag and factors.
X0, Y0, X1, Y1, FLIP, JITTER, BRIGHTNESS, CONTRAST, SATURATION, HUE = range(10)
ORDER = slice(10, 14)  # the jitter's four steps (0 brightness, 1 contrast, 2 saturation, 3 hue) in their drawn order
GRAY, BLUR, SIGMA = 14, 15, 16
FIELDS = 17
# Where each of a view's uniform numbers goes, in fixed places: 4 for each try at a crop (area,
# aspect ratio, top, left; torchvision's 10 tries before the centre crop), then each step's.
ATTEMPTS = 10
U_FLIP, U_JITTER, U_FACTORS, U_ORDER, U_GRAY, U_BLUR, U_SIGMA = (4 * ATTEMPTS + k for k in (0, 1, 2, 6, 10, 11, 12))
DRAWS = U_SIGMA + 1
LOG_RATIO = (math.log(3 / 4), math.log(4 / 3))
GRAY_WEIGHTS = (0.2989, 0.587, 0.114)  # ITU-R 601-2 luma, as torchvision's rgb_to_grayscale


@dataclass(frozen=True)
class ViewRecipe:
    """SimCLR's augmentation of an image into a view of ``size`` px: random resized crop (area
    ``scale``), flip, colour jitter (p 0.8; 0.4, 0.4, 0.4, 0.1), grayscale (p 0.2, colour images),
    Gaussian blur (probability ``blur``, sigma 0.1-2), normalisation."""

    size: int
    channels: int
    scale: tuple[float, float]
    flip: bool
    blur: float
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @property
    def kernel(self) -> int:
        """The blur's kernel size: a tenth of the view, odd, 3 at least (SimCLR's)."""
        return max(3, int(0.1 * self.size) // 2 * 2 + 1)

    def draw(self, height: int, width: int) -> torch.Tensor:
        """One view's parameters for an image of ``height`` x ``width``, from one block of uniform
        numbers of torch's default generator (seeded per sample by the caller), with the
        distributions of torchvision's transforms."""
        uniforms = torch.rand(DRAWS, dtype=torch.float64).tolist()
        params = [0.0] * FIELDS
        params[X0 : Y1 + 1] = _crop_box(height, width, self.scale, uniforms)
        params[FLIP] = float(self.flip and uniforms[U_FLIP] < 0.5)
        if uniforms[U_JITTER] < 0.8:
            b, c, s, h = uniforms[U_FACTORS : U_FACTORS + 4]
            colour = self.channels == 3
            params[JITTER : HUE + 1] = [
                1.0,
                0.6 + 0.8 * b,
                0.6 + 0.8 * c,
                0.6 + 0.8 * s if colour else 1.0,
                0.2 * h - 0.1 if colour else 0.0,
            ]
            keys = uniforms[U_ORDER : U_ORDER + 4]
            order = sorted(range(4), key=keys.__getitem__)  # a random order of the four
            params[ORDER] = order
        params[GRAY] = float(self.channels == 3 and uniforms[U_GRAY] < 0.2)
        if uniforms[U_BLUR] < self.blur:
            params[BLUR], params[SIGMA] = 1.0, 0.1 + 1.9 * uniforms[U_SIGMA]
        return torch.tensor(params, dtype=torch.float64)

    def crop(self, image: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
        """The view's resized crop (C, size, size), floats in [0, 1], as torchvision's resized_crop
        (antialiased when shrinking): made per sample, so a loader keeps crops, not whole images."""
        x0, y0, x1, y1 = (int(v) for v in params[X0 : Y1 + 1].tolist())
        pixels = image[None, :, y0:y1, x0:x1]
        pixels = pixels.float() / 255 if pixels.dtype == torch.uint8 else pixels.float()
        return F.interpolate(pixels, (self.size, self.size), mode="bilinear", align_corners=False, antialias=True)[0]

    def finish(self, crops: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
        """The views of a batch of crops (V, C, size, size) under their parameters (V, FIELDS):
        each later step once over the views it applies to, then normalised."""
        views, params = crops.clone(), params.to(crops.dtype)
        for column, step in ((FLIP, _flip), (JITTER, _jitter), (GRAY, _grayscale), (BLUR, self._blur)):
            chosen = params[:, column].nonzero().squeeze(1)  # the views this step changes
            if len(chosen):
                views[chosen] = step(views[chosen], params[chosen])
        mean = torch.tensor(self.mean, dtype=views.dtype)[:, None, None]
        std = torch.tensor(self.std, dtype=views.dtype)[:, None, None]
        return (views - mean) / std

    def make(self, images: list[torch.Tensor], owners: list[int], params: torch.Tensor) -> torch.Tensor:
        """The views (V, C, size, size): view v is ``images[owners[v]]`` (uint8, or floats in [0, 1])
        under ``params[v]``."""
        return self.finish(torch.stack([self.crop(images[owner], row) for owner, row in zip(owners, params)]), params)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        """One view of one image (validation's views)."""
        return self.make([image], [0], self.draw(*image.shape[-2:])[None])[0]

    def _blur(self, views: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
        """Gaussian blur with each view's own sigma, as torchvision's (reflected borders), in two
        separable passes of shifted sums."""
        kernel, half = self.kernel, self.kernel // 2
        taps = torch.linspace(-(kernel - 1) / 2, (kernel - 1) / 2, kernel, dtype=views.dtype)
        weights = torch.exp(-0.5 * (taps[None] / params[:, SIGMA, None]) ** 2)
        weights = (weights / weights.sum(1, keepdim=True))[:, :, None, None, None]
        height, width = views.shape[-2:]
        padded = F.pad(views, (half, half, half, half), mode="reflect")
        # (cast: a sum of tensors, never empty; typeshed's sum allows the int 0 of an empty one)
        across = cast(torch.Tensor, sum(weights[:, k] * padded[..., :, k : k + width] for k in range(kernel)))
        return cast(torch.Tensor, sum(weights[:, k] * across[..., k : k + height, :] for k in range(kernel)))


def _crop_box(height: int, width: int, scale: tuple[float, float], uniforms: list[float]) -> list[float]:
    """RandomResizedCrop's box (x0, y0, x1, y1): an area in ``scale`` of the image's and an aspect
    ratio in 3/4-4/3 (log-uniform), placed uniformly; after 10 misses, the centre crop of the
    nearest ratio."""
    for attempt in range(ATTEMPTS):
        u_area, u_ratio, u_top, u_left = uniforms[4 * attempt : 4 * attempt + 4]
        area = height * width * (scale[0] + (scale[1] - scale[0]) * u_area)
        ratio = math.exp(LOG_RATIO[0] + (LOG_RATIO[1] - LOG_RATIO[0]) * u_ratio)
        w, h = int(round(math.sqrt(area * ratio))), int(round(math.sqrt(area / ratio)))
        if 0 < w <= width and 0 < h <= height:
            top, left = int(u_top * (height - h + 1)), int(u_left * (width - w + 1))
            return [left, top, left + w, top + h]
    ratio = width / height
    w, h = (
        (width, int(round(width * 4 / 3)))
        if ratio < 3 / 4
        else (int(round(height * 4 / 3)), height)
        if ratio > 4 / 3
        else (width, height)
    )
    top, left = (height - h) // 2, (width - w) // 2
    return [left, top, left + w, top + h]


def _gray(views: torch.Tensor) -> torch.Tensor:
    r, g, b = views.unbind(1)
    return (r * GRAY_WEIGHTS[0] + g * GRAY_WEIGHTS[1] + b * GRAY_WEIGHTS[2])[:, None]


def _blend(views: torch.Tensor, other: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    ratio = ratio[:, None, None, None]
    return (views * ratio + other * (1 - ratio)).clamp(0, 1)


def _flip(views: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    return views.flip(-1)


def _grayscale(views: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    return _gray(views).expand_as(views)


def _brightness(views: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return (views * factor[:, None, None, None]).clamp(0, 1)


def _contrast(views: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    gray = _gray(views) if views.shape[1] == 3 else views
    # Each view's mean in float64, rows first: a sum of one output over 32,768 values or more is
    # split among threads (its order, and last bit, would depend on how many views take the step).
    rows = gray.reshape(len(gray), -1, gray.shape[-1]).double().sum(-1)
    mean = (rows.sum(-1) / gray[0].numel()).to(views.dtype)
    return _blend(views, mean[:, None, None, None].expand_as(views), factor)


def _saturation(views: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return _blend(views, _gray(views).expand_as(views), factor)


def _hue(views: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Each view's hue turned by ``shift`` (a fraction of the colour circle), through HSV as
    torchvision's adjust_hue does."""
    r, g, b = views.unbind(1)
    high, low = views.amax(1), views.amin(1)
    spread = high - low
    same = spread == 0
    saturation = spread / torch.where(high == 0, torch.ones_like(high), high)
    divisor = torch.where(same, torch.ones_like(spread), spread)
    rc, gc, bc = (high - r) / divisor, (high - g) / divisor, (high - b) / divisor
    hue = torch.where(high == r, bc - gc, torch.where(high == g, 2.0 + rc - bc, 4.0 + gc - rc))
    hue = torch.where(same, torch.zeros_like(hue), hue)
    hue = ((hue / 6.0 + 1.0) % 1.0 + shift[:, None, None]) % 1.0
    sector = torch.floor(hue * 6)
    fraction = hue * 6 - sector
    sector = sector.long() % 6
    p = (high * (1 - saturation)).clamp(0, 1)
    q = (high * (1 - saturation * fraction)).clamp(0, 1)
    t = (high * (1 - saturation * (1 - fraction))).clamp(0, 1)
    choices = torch.stack([high, p, q, t])  # the RGB of each sector, picked from (v, p, q, t)
    pick = torch.tensor([[0, 2, 1, 1, 3, 0], [3, 0, 0, 2, 1, 1], [1, 1, 3, 0, 0, 2]], device=views.device)
    return torch.stack([choices.gather(0, pick[channel][sector][None])[0] for channel in range(3)], 1)


def _jitter(views: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """Colour jitter: brightness, contrast, saturation and hue, in each view's own random order."""
    steps = (_brightness, _contrast, _saturation, _hue)
    for position in range(4):
        for step, adjust in enumerate(steps):
            if views.shape[1] != 3 and step >= 2:
                continue  # not RGB: brightness and contrast alone
            chosen = (params[:, ORDER.start + position] == step).nonzero().squeeze(1)
            if len(chosen):
                views[chosen] = adjust(views[chosen], params[chosen, BRIGHTNESS + step])
    return views

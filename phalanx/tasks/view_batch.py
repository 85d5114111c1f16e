"""SimCLR's augmentation applied to a whole batch of views at once.

Each view's random parameters (crop box, flip, colour jitter factors and order, grayscale, blur
sigma) are drawn per sample from its seeded stream, as torchvision's transforms draw them; the
loader's collate then makes every view of the batch in one pass of tensor operations. Made one
image at a time (torchvision's transforms, PIL or tensor), a 32 px image's two views took 0.8-1 ms,
nearly all of it the per-call overhead of a dozen small operations: the data was half of a SimCLR
step in one process (benchmarks/selfsupervised.py).

Every operation acts on each view alone (elementwise, or a reduction over one view's pixels), so a
view is the same whichever batch it is made in: any world size and any resume sees the same views.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

# One view's parameters, a row of floats: the crop box (pixels), then flags and factors.
X0, Y0, X1, Y1, FLIP, JITTER, BRIGHTNESS, CONTRAST, SATURATION, HUE, ORDER, GRAY, BLUR, SIGMA = \
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 14, 15, 16
FIELDS = 17
ATTEMPTS = 10  # tries at a crop of the drawn area and aspect ratio before the centre crop (torchvision's)
DRAWS = 4 * ATTEMPTS + 12  # uniform numbers a view may use
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
        u = iter(torch.rand(DRAWS, dtype=torch.float64).tolist())
        row = [0.0] * FIELDS
        row[X0:Y1 + 1] = _crop_box(height, width, self.scale, u)
        row[FLIP] = float(self.flip and next(u) < 0.5)
        if next(u) < 0.8:
            row[JITTER] = 1.0
            row[BRIGHTNESS:HUE + 1] = [0.6 + 0.8 * next(u), 0.6 + 0.8 * next(u), 0.6 + 0.8 * next(u), 0.2 * next(u) - 0.1]
            if self.channels != 3:
                row[SATURATION], row[HUE] = 1.0, 0.0
            keys = [next(u) for _ in range(4)]
            row[ORDER:ORDER + 4] = sorted(range(4), key=keys.__getitem__)  # a random order of the four
        row[GRAY] = float(self.channels == 3 and next(u) < 0.2)
        if next(u) < self.blur:
            row[BLUR], row[SIGMA] = 1.0, 0.1 + 1.9 * next(u)
        return torch.tensor(row, dtype=torch.float64)

    def make(self, images: list[torch.Tensor], owners: list[int], rows: torch.Tensor) -> torch.Tensor:
        """The views (V, C, size, size): view v is ``images[owners[v]]`` (uint8, or floats in [0, 1])
        under parameters ``rows[v]``."""
        boxes = rows[:, X0:Y1 + 1].long().tolist()
        # Cropped and resized one view at a time, as torchvision's resized_crop (antialiased when
        # shrinking): one call a view, a few microseconds; the steps after act on the whole batch.
        views = torch.cat([F.interpolate(_floats(images[owner][None, :, y0:y1, x0:x1]), (self.size, self.size),
                                         mode="bilinear", align_corners=False, antialias=True)
                           for owner, (x0, y0, x1, y1) in zip(owners, boxes)])
        flags = rows.to(views.dtype)
        for column, step in ((FLIP, lambda v, _: v.flip(-1)), (JITTER, _jitter), (GRAY, lambda v, _: _gray(v).expand_as(v)),
                             (BLUR, lambda v, f: _blur(v, f[:, SIGMA], self.kernel))):
            chosen = flags[:, column].nonzero().squeeze(1)  # the views this step changes
            if len(chosen):
                views[chosen] = step(views[chosen], flags[chosen])
        mean = torch.tensor(self.mean, dtype=views.dtype)[:, None, None]
        std = torch.tensor(self.std, dtype=views.dtype)[:, None, None]
        return (views - mean) / std

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        """One view of one image (validation's views, the dashboard's)."""
        row = self.draw(*image.shape[-2:])
        return self.make([image], [0], row[None])[0]


def _crop_box(height: int, width: int, scale: tuple[float, float], u) -> list[float]:
    """RandomResizedCrop's box (x0, y0, x1, y1): an area in ``scale`` of the image's and an aspect
    ratio in 3/4-4/3 (log-uniform), placed uniformly; after 10 misses, the centre crop of the
    nearest ratio."""
    for _ in range(ATTEMPTS):
        area = height * width * (scale[0] + (scale[1] - scale[0]) * next(u))
        ratio = math.exp(LOG_RATIO[0] + (LOG_RATIO[1] - LOG_RATIO[0]) * next(u))
        w, h = int(round(math.sqrt(area * ratio))), int(round(math.sqrt(area / ratio)))
        top, left = int(next(u) * (height - h + 1)), int(next(u) * (width - w + 1))
        if 0 < w <= width and 0 < h <= height:
            return [left, top, left + w, top + h]
    ratio = width / height
    w, h = (width, int(round(width * 4 / 3))) if ratio < 3 / 4 else \
        (int(round(height * 4 / 3)), height) if ratio > 4 / 3 else (width, height)
    top, left = (height - h) // 2, (width - w) // 2
    return [left, top, left + w, top + h]


def _floats(pixels: torch.Tensor) -> torch.Tensor:
    return pixels.float() / 255 if pixels.dtype == torch.uint8 else pixels.float()


def _gray(views: torch.Tensor) -> torch.Tensor:
    r, g, b = views.unbind(1)
    return (r * GRAY_WEIGHTS[0] + g * GRAY_WEIGHTS[1] + b * GRAY_WEIGHTS[2])[:, None]


def _blend(views: torch.Tensor, other: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    ratio = ratio[:, None, None, None]
    return (views * ratio + other * (1 - ratio)).clamp(0, 1)


def _contrast(views: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    gray = _gray(views) if views.shape[1] == 3 else views
    # the mean in float64 per view: a float32 sum's order (threads, batch) could change its last bit
    mean = gray.reshape(len(gray), -1).double().mean(1).to(views.dtype)
    return _blend(views, mean[:, None, None, None].expand_as(views), factor)


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


def _jitter(views: torch.Tensor, flags: torch.Tensor) -> torch.Tensor:
    """Colour jitter: brightness, contrast, saturation and hue, in each view's own random order."""
    steps = (lambda v, f: (v * f[:, None, None, None]).clamp(0, 1), _contrast,
             lambda v, f: _blend(v, _gray(v).expand_as(v), f), _hue)
    for position in range(4):
        for step, adjust in enumerate(steps):
            if views.shape[1] != 3 and step >= 2:
                continue  # not RGB: brightness and contrast alone
            chosen = (flags[:, ORDER + position] == step).nonzero().squeeze(1)
            if len(chosen):
                views[chosen] = adjust(views[chosen], flags[chosen, BRIGHTNESS + step])
    return views


def _blur(views: torch.Tensor, sigma: torch.Tensor, kernel: int) -> torch.Tensor:
    """Gaussian blur with each view's own sigma, as torchvision's (reflected borders), in two
    separable passes of shifted sums."""
    half = kernel // 2
    taps = torch.linspace(-(kernel - 1) / 2, (kernel - 1) / 2, kernel, dtype=views.dtype)
    weights = torch.exp(-0.5 * (taps[None] / sigma[:, None]) ** 2)
    weights = (weights / weights.sum(1, keepdim=True))[:, :, None, None, None]
    height, width = views.shape[-2:]
    padded = F.pad(views, (half, half, half, half), mode="reflect")
    across = sum(weights[:, k] * padded[..., :, k:k + width] for k in range(kernel))
    return sum(weights[:, k] * across[..., k:k + height, :] for k in range(kernel))

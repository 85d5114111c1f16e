"""Images for the dashboard: tensors -> PNG bytes (plain data for the snapshots, which admit no
arrays), small ones enlarged to be seen, and side-by-side strips (input | output | target)."""

from __future__ import annotations

import io
from collections.abc import Sequence

import torch

SHOWN_SIDE = 64  # small images are enlarged (nearest neighbour) to be seen


def denormalize(images: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """Normalised images back to [0, 1] (one (C, H, W) or a batch)."""
    shape = (-1, 1, 1)
    out = images.float().cpu() * torch.tensor(list(std)).view(shape) + torch.tensor(list(mean)).view(shape)
    return out.clamp(0, 1)


def pixels(image: torch.Tensor):
    """A (C, H, W) image in [0, 1] as the uint8 array a PNG of it holds: (H, W), or (H, W, 3)."""
    values = (image.detach().float().cpu().clamp(0, 1) * 255).round().byte()
    return values[0].numpy() if values.shape[0] == 1 else values[:3].permute(1, 2, 0).numpy()


def png(image: torch.Tensor, min_side: int = SHOWN_SIDE) -> bytes:
    """A (C, H, W) image in [0, 1], C = 1 or 3, as PNG bytes."""
    return png_bytes(pixels(image), min_side)


def png_bytes(array, min_side: int = 0) -> bytes:
    """A uint8 array (H, W) or (H, W, 3) as PNG bytes, enlarged (nearest) to ``min_side`` if smaller."""
    from PIL import Image

    picture = Image.fromarray(array, "L" if array.ndim == 2 else "RGB")
    if max(picture.size) < min_side:
        factor = min_side // max(picture.size)
        picture = picture.resize((picture.width * factor, picture.height * factor), Image.Resampling.NEAREST)
    buffer = io.BytesIO()
    picture.save(buffer, "PNG")
    return buffer.getvalue()


def strip(images: Sequence[torch.Tensor], gap: int = 2) -> torch.Tensor:
    """Images of one height side by side, with a white gap, as one (C, H, W) image (channels
    broadcast to the most of them)."""
    channels = max(image.shape[0] for image in images)
    height = max(image.shape[1] for image in images)
    parts = []
    for index, image in enumerate(images):
        image = image.float().cpu()
        if image.shape[0] != channels:
            image = image.expand(channels, -1, -1)
        if image.shape[1] != height:
            image = torch.nn.functional.interpolate(
                image[None], size=(height, image.shape[2] * height // image.shape[1]), mode="nearest"
            )[0]
        parts.append(image)
        if index < len(images) - 1:
            parts.append(torch.ones(channels, height, gap))
    return torch.cat(parts, dim=2)

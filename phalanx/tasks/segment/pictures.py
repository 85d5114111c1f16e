"""Masks made visible: a colour per class, and an image with its mask painted over it (the
dashboard's validation pictures and ``predict``'s overlays)."""

from __future__ import annotations

import torch


def palette(classes: int) -> torch.Tensor:
    """A colour per class (0, the background, black), well apart for the first dozen."""
    colours: list[tuple[float, float, float]] = [(0, 0, 0)]
    for c in range(1, classes):
        hue = (c * 0.618034) % 1.0
        r, g, b = (max(0.0, min(1.0, abs((hue * 6 + k) % 6 - 3) - 1)) for k in (0, 4, 2))
        colours.append((r, g, b))
    return torch.tensor(colours)


def overlay(image: torch.Tensor, mask: torch.Tensor, classes: int) -> torch.Tensor:
    """An image in [0, 1] (3, H, W) with its mask's classes painted over at half strength."""
    colours = palette(max(classes, 2))[mask.clamp(0, max(classes, 2) - 1)].permute(2, 0, 1)
    painted = mask > 0
    return torch.where(painted[None], 0.5 * image + 0.5 * colours, image)

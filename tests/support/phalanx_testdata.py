"""Generated images for tests and benchmarks (no data set can be downloaded here)."""

from __future__ import annotations

import io

import numpy as np


def photo(width: int, height: int, seed: int) -> bytes:
    """A JPEG with smooth colour fields and sensor-like noise (photographs' content, not flat colour)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    image = np.stack([128 + 100 * np.sin(x / (11 + 3 * c) + seed) * np.cos(y / (17 - 2 * c) - c) for c in range(3)], -1)
    image += rng.normal(0, 12, image.shape)
    buffer = io.BytesIO()
    Image.fromarray(image.clip(0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()

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


def translation_pairs(root, layout: str = "aligned", size: int = 32, per_split: dict | None = None,
                      targets: int = 1, seed: int = 0):
    """Paired PNGs made from phalanx's built-in digits (real handwriting): the input is a digit
    blurred and noisy, target 1 the clean digit, target 2 (if asked) its negative. Aligned layout:
    ``root/<split>/<i>.png`` as [input | target ...] panels; plain: ``root/<split>/A/<i>.png`` and
    ``B/`` (or ``B1/``, ``B2/``). The digits are split 80/20 into train/ and val/."""
    from pathlib import Path

    import torch
    from PIL import Image

    from phalanx.data import load_digits

    images, _ = load_digits()
    clean = torch.nn.functional.interpolate(images, size=size, mode="bilinear", align_corners=False).clamp(0, 1)
    blurred = torch.nn.functional.avg_pool2d(torch.nn.functional.pad(clean, (2, 2, 2, 2), mode="replicate"), 5, 1)
    noise = torch.from_numpy(np.random.default_rng(seed).normal(0, 0.08, blurred.shape)).float()
    degraded = (blurred + noise).clamp(0, 1)
    wanted = [clean, 1 - clean][:targets]
    splits = {"train": [i for i in range(len(images)) if i % 5], "val": list(range(0, len(images), 5))}
    for split, indices in splits.items():
        if per_split and split in per_split:
            indices = indices[:per_split[split]]
        for i in indices:
            panels = [degraded[i, 0]] + [t[i, 0] for t in wanted]
            pixels = [(p * 255).round().byte().numpy() for p in panels]
            if layout == "aligned":
                folder = Path(root) / split
                folder.mkdir(parents=True, exist_ok=True)
                Image.fromarray(np.concatenate(pixels, axis=1), "L").save(folder / f"{i:04d}.png")
            else:
                for name, array in zip(["A"] + (["B"] if targets == 1 else [f"B{t + 1}" for t in range(targets)]), pixels):
                    folder = Path(root) / split / name
                    folder.mkdir(parents=True, exist_ok=True)
                    Image.fromarray(array, "L").save(folder / f"{i:04d}.png")
    return Path(root)

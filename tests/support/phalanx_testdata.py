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


def translation_pairs(
    root, layout: str = "aligned", size: int = 32, per_split: dict | None = None, targets: int = 1, seed: int = 0
):
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
            indices = indices[: per_split[split]]
        for i in indices:
            panels = [degraded[i, 0]] + [t[i, 0] for t in wanted]
            pixels = [(p * 255).round().byte().numpy() for p in panels]
            if layout == "aligned":
                folder = Path(root) / split
                folder.mkdir(parents=True, exist_ok=True)
                Image.fromarray(np.concatenate(pixels, axis=1), "L").save(folder / f"{i:04d}.png")
            else:
                for name, array in zip(
                    ["A"] + (["B"] if targets == 1 else [f"B{t + 1}" for t in range(targets)]), pixels
                ):
                    folder = Path(root) / split / name
                    folder.mkdir(parents=True, exist_ok=True)
                    Image.fromarray(array, "L").save(folder / f"{i:04d}.png")
    return Path(root)


SCENE_DIGITS = (0, 1, 4)  # visually distinct digits: categories 1, 2, 3


def digit_scenes(root, counts: dict | None = None, size: int = 64, seed: int = 0):
    """Scenes made from phalanx's built-in digits (real handwriting): 1-3 digits 0, 1 or 4, each
    16-28 px, pasted at random places on a dim noisy canvas; every eighth scene is empty. Writes
    ``<split>/images/<i>.png``, COCO ``<split>/annotations.json`` (the pasted squares' boxes) and
    ``<split>/masks/<i>.png`` (a digit's ink pixels get its category, 1-3; the rest 0)."""
    import json
    from pathlib import Path

    import torch
    from PIL import Image

    from phalanx.data import load_digits

    images, labels = load_digits()
    pool = {d: [i for i in range(len(labels)) if int(labels[i]) == d] for d in SCENE_DIGITS}
    rng = np.random.default_rng(seed)
    counts = counts or {"train": 96, "val": 24}
    categories = [{"id": c + 1, "name": f"digit{d}"} for c, d in enumerate(SCENE_DIGITS)]
    for split, count in counts.items():
        folder = Path(root) / split
        (folder / "images").mkdir(parents=True, exist_ok=True)
        (folder / "masks").mkdir(parents=True, exist_ok=True)
        coco = {"images": [], "annotations": [], "categories": categories}
        for n in range(count):
            canvas = rng.normal(0.1, 0.04, (size, size)).clip(0, 1)
            mask = np.zeros((size, size), dtype=np.uint8)
            boxes = []
            for _ in range(0 if n % 8 == 7 else int(rng.integers(1, 4))):
                category = int(rng.integers(0, len(SCENE_DIGITS)))
                digit = images[pool[SCENE_DIGITS[category]][int(rng.integers(0, len(pool[SCENE_DIGITS[category]])))]]
                side = int(rng.integers(16, 29))
                x, y = (int(v) for v in rng.integers(0, size - side, 2))
                if any(x < bx + bw and bx < x + side and y < by + bh and by < y + side for bx, by, bw, bh, _ in boxes):
                    continue  # no overlaps: each box holds one digit
                patch = (
                    torch.nn.functional.interpolate(
                        digit[None], size=(side, side), mode="bilinear", align_corners=False
                    )[0, 0]
                    .clamp(0, 1)
                    .numpy()
                )
                canvas[y : y + side, x : x + side] = np.maximum(canvas[y : y + side, x : x + side], patch)
                mask[y : y + side, x : x + side][patch > 0.5] = category + 1
                boxes.append((x, y, side, side, category + 1))
            name = f"{n:04d}.png"
            Image.fromarray((np.stack([canvas] * 3, -1) * 255).astype(np.uint8), "RGB").save(folder / "images" / name)
            Image.fromarray(mask, "L").save(folder / "masks" / name)
            coco["images"].append({"id": n + 1, "file_name": name, "width": size, "height": size})
            for x, y, w, h, category in boxes:
                coco["annotations"].append(
                    {
                        "id": len(coco["annotations"]) + 1,
                        "image_id": n + 1,
                        "category_id": category,
                        "bbox": [x, y, w, h],
                        "area": w * h,
                        "iscrowd": 0,
                    }
                )
        (folder / "annotations.json").write_text(json.dumps(coco))
    return Path(root)


def deepliif_samples(
    root, size: int = 32, per_split: dict | None = None, modalities: int = 4, seg: bool = True, layout: str = "aligned"
):
    """DeepLIIF-shaped RGB samples from the built-in digits: the input a blurred, noisy, stained
    digit (IHC-like), modality k the clean digit in its own colour, and the segmentation as
    DeepLIIF draws it (red: a "positive" digit, even labels; blue: a negative one; black around).
    Aligned: ``root/<split>/<i>.png`` of 2 + modalities panels; plain: ``A/``, ``B1/`` ... and ``seg/``."""
    from pathlib import Path

    import torch
    from PIL import Image

    from phalanx.data import load_digits

    images, labels = load_digits()
    clean = torch.nn.functional.interpolate(images, size=size, mode="bilinear", align_corners=False).clamp(0, 1)
    blurred = torch.nn.functional.avg_pool2d(torch.nn.functional.pad(clean, (1, 1, 1, 1), mode="replicate"), 3, 1)
    noise = torch.from_numpy(np.random.default_rng(0).normal(0, 0.05, blurred.shape)).float()
    stain = torch.tensor([0.55, 0.35, 0.7])[None, :, None, None]
    ihc = (1 - (blurred + noise).clamp(0, 1) * stain).clamp(0, 1)  # brownish digit on white
    colours = [
        torch.tensor(c)[None, :, None, None]
        for c in ([0.3, 0.3, 0.9], [0.1, 0.9, 0.9], [0.9, 0.2, 0.9], [0.9, 0.9, 0.1], [0.5, 0.9, 0.4], [0.9, 0.5, 0.2])
    ]
    mods = [clean * colours[k % len(colours)] for k in range(modalities)]
    positive = (labels % 2 == 0).float()[:, None, None, None]
    mask = (clean > 0.5).float()
    segmentation = torch.cat([mask * positive, torch.zeros_like(mask), mask * (1 - positive)], 1)
    splits = {"train": [i for i in range(len(images)) if i % 5], "val": list(range(0, len(images), 5))}
    names = ["A"] + [f"B{k + 1}" for k in range(modalities)] + (["seg"] if seg else [])
    for split, indices in splits.items():
        if per_split and split in per_split:
            indices = indices[: per_split[split]]
        for i in indices:
            panels = [ihc[i]] + [m[i] for m in mods] + ([segmentation[i]] if seg else [])
            pixels = [(p * 255).round().byte().permute(1, 2, 0).numpy() for p in panels]
            if layout == "aligned":
                folder = Path(root) / split
                folder.mkdir(parents=True, exist_ok=True)
                Image.fromarray(np.concatenate(pixels, axis=1), "RGB").save(folder / f"{i:04d}.png")
            else:
                for name, array in zip(names, pixels):
                    folder = Path(root) / split / name
                    folder.mkdir(parents=True, exist_ok=True)
                    Image.fromarray(array, "RGB").save(folder / f"{i:04d}.png")
    return Path(root)

"""The self-supervised views of one batch: phalanx's against Lightly's SimCLRTransform (torchvision's
transforms on one PIL image at a time, as Lightly's loaders run it) at the same settings (run by
hand; about two minutes).

    .venv/bin/python benchmarks/views.py [--repeats 7]

A batch of 128 random 8-bit RGB images of each size (32 px: the self-supervised benchmark's digits),
two views each: random resized crop (area 0.08-1), flip, colour jitter (p 0.8; 0.4, 0.4, 0.4, 0.1),
grayscale (p 0.2), blur above 64 px (p 0.5, sigma 0.1-2), normalisation; one thread. phalanx makes
views of 64 px and under a batch at a time (drawn per sample, finished by the loader's collate),
larger ones one image at a time as Lightly does. Milliseconds per batch, medians of the repeats
(min-max), the contenders alternating. Results: benchmarks/results/views.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
BATCH = 128
SIZES = (32, 48, 64, 96, 224)


def contenders(size: int) -> dict:
    from lightly.transforms import SimCLRTransform
    from torchvision.transforms import functional as TF

    from phalanx.tasks.selfsupervised.view_batch import ViewRecipe
    from phalanx.tasks.selfsupervised.views import two_views

    blur = 0.5 if size > 64 else 0.0
    lightly = SimCLRTransform(
        input_size=size,
        gaussian_blur=blur,
        min_scale=0.08,
        cj_strength=0.5,
        normalize={"mean": [0.5] * 3, "std": [0.25] * 3},
    )
    ours = two_views(ViewRecipe(size, 3, (0.08, 1.0), True, blur, (0.5,) * 3, (0.25,) * 3))
    images = [torch.randint(0, 256, (3, size, size), dtype=torch.uint8) for _ in range(BATCH)]
    pictures = [TF.to_pil_image(image) for image in images]  # ImageFolder's samples, decoded

    def lightly_batch():
        views = [lightly(picture) for picture in pictures]
        return [torch.stack([v[k] for v in views]) for k in (0, 1)]

    def phalanx_batch():
        return ours.collate([ours((image, 0)) for image in images])

    return {"Lightly SimCLRTransform, per image": lightly_batch, "phalanx": phalanx_batch}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    opts = parser.parse_args()
    torch.set_num_threads(1)
    results: dict = {"date": time.strftime("%Y-%m-%d"), "batch": BATCH, "repeats": opts.repeats, "ms": {}}
    lines = [
        f"{results['date']}, batch {BATCH}, two views an image, one thread, {opts.repeats} repeats",
        "",
        "| size | contender | ms a batch | phalanx's speed-up |",
        "| --- | --- | --- | --- |",
    ]
    for size in SIZES:
        runs = contenders(size)
        for make in runs.values():
            make()  # warm-up
        times: dict[str, list[float]] = {name: [] for name in runs}
        for repeat in range(opts.repeats):
            order = list(runs)[repeat % 2 :] + list(runs)[: repeat % 2]  # the order alternates
            for name in order:
                start = time.perf_counter()
                runs[name]()
                times[name].append((time.perf_counter() - start) * 1e3)
        theirs, ours = times.values()
        ratios = [a / b for a, b in zip(theirs, ours)]
        results["ms"][size] = {**times, "ratio": ratios}
        for name, values in times.items():
            speedup = (
                "" if values is theirs else f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
            )
            lines.append(
                f"| {size} px | {name} | {statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f}) "
                f"| {speedup} |"
            )
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results/views.json").write_text(json.dumps(results, indent=1))
    (HERE / "results/views.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Accuracy of the training recipes on small real data (run by hand; about 15 minutes on 2 cores).

    .venv/bin/python benchmarks/recipes.py [--seeds 3]

Data: the built-in digits as 32x32 images with few training images (a 20% split: 359 to train on,
1,438 to validate on). Model smallcnn, 30 epochs, batch 32, SGD, cosine, the same budget for every
recipe; three seeds each, mean and min-max of the last epoch's validation accuracy.

Fine-tuning: a model trained on the digits 0-4 (all their images, 30 epochs), then the digits 5-9
with 20% of their images for training: from those weights (new head), from those weights with the
backbone frozen, and from scratch, with the same budget. Results: benchmarks/results/recipes.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PYTHON = sys.executable
COMMON = ["--epochs", "30", "--batch-size", "32", "--no-progress", "--log-every", "100"]
RECIPES = {
    "no augmentation": ["--augment", "none"],
    "basic (pad-and-crop)": ["--augment", "basic", "--no-hflip"],
    "trivialaugment": ["--augment", "trivialaugment", "--no-hflip"],
    "randaugment": ["--augment", "randaugment", "--no-hflip"],
    "autoaugment": ["--augment", "autoaugment", "--no-hflip"],
    "basic + mixup 0.2": ["--augment", "basic", "--no-hflip", "--mixup-alpha", "0.2"],
    "basic + cutmix 1.0": ["--augment", "basic", "--no-hflip", "--cutmix-alpha", "1.0"],
    "basic + label smoothing 0.1": ["--augment", "basic", "--no-hflip", "--label-smoothing", "0.1"],
    "basic + random erasing 0.25": ["--augment", "basic", "--no-hflip", "--random-erasing", "0.25"],
    "basic + EMA 0.99 (EMA accuracy)": ["--augment", "basic", "--no-hflip", "--ema-decay", "0.99"],
}


def train(args: list[str], workdir: Path, name: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PHALANX_CACHE": str(workdir / "cache")}
    subprocess.run(
        [
            PYTHON,
            "-m",
            "phalanx.cli",
            "train",
            "--checkpoints-dir",
            str(workdir / "ck"),
            "--name",
            name,
            *COMMON,
            *args,
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    val = [json.loads(line) for line in (workdir / "ck" / name / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in val if r["kind"] == "val"][-1]
    return {"acc": last.get("ema_acc", last["acc"]) if "--ema-decay" in args else last["acc"]}


def digit_folders(root: Path, size: int = 32) -> tuple[Path, Path]:
    """Two ImageFolder trees of the built-in digits as size x size RGB PNGs: 0-4 and 5-9."""
    import torch
    from PIL import Image

    from phalanx.data import load_digits

    images, labels = load_digits()
    images = torch.nn.functional.interpolate(images, size=size, mode="bilinear", align_corners=False).clamp(0, 1)
    for i, (image, label) in enumerate(zip(images, labels.tolist())):
        part = root / ("low" if label < 5 else "high") / "train" / f"digit{label}"
        part.mkdir(parents=True, exist_ok=True)
        Image.fromarray((image[0] * 255).round().byte().numpy(), "L").convert("RGB").save(part / f"{i:04d}.png")
    return root / "low", root / "high"


def finetune(work: Path, seeds: int) -> dict:
    """Digits 5-9 with few images: from scratch, from weights trained on 0-4, with a frozen backbone."""
    low, high = digit_folders(work / "folders")
    basic = ["--image-size", "32", "--augment", "basic", "--no-hflip"]
    train(["--dataroot", str(low), "--val-fraction", "0.1", *basic], work, "pretrained")
    weights = str(work / "ck" / "pretrained" / "latest.pt")
    ways = {
        "from scratch": [],
        "from the 0-4 weights": ["--weights", weights],
        "from the 0-4 weights, --lr 0.01": ["--weights", weights, "--lr", "0.01"],
        "from the 0-4 weights, backbone frozen": ["--weights", weights, "--freeze-backbone"],
    }
    raw: dict = {}
    for seed in range(seeds):  # interleaved: each way once per seed
        for name, args in ways.items():
            run = train(
                ["--dataroot", str(high), "--val-fraction", "0.8", "--seed", str(seed), *basic, *args],
                work,
                f"f{seed}-{len(raw.get(name, []))}-{abs(hash(name))}",
            )
            raw.setdefault(name, []).append(run["acc"])
            print(f"[seed {seed}] digits 5-9 {name}: {100 * run['acc']:.2f}%", flush=True)
    return {name: summary(values) for name, values in raw.items()}


def summary(values: list[float]) -> dict:
    return {"mean": statistics.mean(values), "min": min(values), "max": max(values), "n": len(values)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--only", choices=("recipes", "finetune"))
    opts = parser.parse_args()
    results: dict = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "recipes": {},
        "finetune": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        raw: dict = {}
        for seed in range(opts.seeds if opts.only != "finetune" else 0):  # interleaved: each recipe once per seed
            for name, args in RECIPES.items():
                run = train(
                    ["--image-size", "32", "--val-fraction", "0.8", "--seed", str(seed), *args],
                    work,
                    f"r{seed}-{len(raw.get(name, []))}-{abs(hash(name))}",
                )
                raw.setdefault(name, []).append(run["acc"])
                print(f"[seed {seed}] {name}: {100 * run['acc']:.2f}%", flush=True)
        results["recipes"] = {name: summary(values) for name, values in raw.items()}
        if opts.only != "recipes":
            results["finetune"] = finetune(work, opts.seeds)
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    if opts.only and (out / "recipes.json").exists():  # keep the other part's results
        previous = json.loads((out / "recipes.json").read_text())
        kept = "finetune" if opts.only == "recipes" else "recipes"
        results[kept] = previous.get(kept, {})
    (out / "recipes.json").write_text(json.dumps(results, indent=2))
    lines = [
        f"{results['date']}, {results['machine']}",
        "",
        "| recipe | validation accuracy, mean (min-max) |",
        "| --- | --- |",
    ]
    lines += [
        f"| {n} | {100 * s['mean']:.1f}% ({100 * s['min']:.1f}-{100 * s['max']:.1f}) |"
        for n, s in results["recipes"].items()
    ]
    lines += ["", "| digits 5-9, 20% to train on | validation accuracy, mean (min-max) |", "| --- | --- |"]
    lines += [
        f"| {n} | {100 * s['mean']:.1f}% ({100 * s['min']:.1f}-{100 * s['max']:.1f}) |"
        for n, s in results["finetune"].items()
    ]
    (out / "recipes.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

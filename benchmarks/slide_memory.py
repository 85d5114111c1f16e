"""Peak memory of `phalanx predict` on whole slides, region by region, against slide size.

    .venv/bin/python benchmarks/slide_memory.py [--sizes 1536,3072,4608] [--region-size 512]

A small `--task deepliif` model (64 px, 4 filters) is trained for an epoch on generated samples;
then slides of each size (tiled, deflate-compressed TIFFs of random blocks) are predicted
region by region, and the smallest also whole, as a PNG. Each predict is its own process, its
peak resident memory read by GNU time (`%M`). Results: benchmarks/results/slide_memory.md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "support"))
PHALANX = [str(REPO / ".venv" / "bin" / "phalanx")]


def peak_mib(args: list[str]) -> tuple[float, float]:
    """(peak resident MiB, seconds) of one phalanx command."""
    started = time.perf_counter()
    run = subprocess.run(["/usr/bin/time", "-f", "%M", *PHALANX, *args], capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"phalanx {' '.join(args)} failed:\n{run.stderr[-2000:]}")
    return int(run.stderr.strip().splitlines()[-1]) / 1024, time.perf_counter() - started


def main() -> None:
    import tifffile
    from phalanx_testdata import deepliif_samples
    from PIL import Image

    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1536,3072,4608")
    parser.add_argument("--region-size", type=int, default=512)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    Image.MAX_IMAGE_PIXELS = None
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = deepliif_samples(tmp / "data", size=64, per_split={"train": 4}, layout="plain")
        peak_mib(
            [
                "train",
                "--task",
                "deepliif",
                "--dataroot",
                str(data),
                "--image-size",
                "64",
                "--net-g",
                "resnet_2blocks",
                "--net-gs",
                "unet_64",
                "--ngf",
                "4",
                "--ndf",
                "4",
                "--d-layers",
                "2",
                "--lambda-feat",
                "0",
                "--epochs",
                "1",
                "--batch-size",
                "4",
                "--no-progress",
                "--checkpoints-dir",
                str(tmp / "ck"),
                "--name",
                "slide",
            ]
        )
        checkpoint = str(tmp / "ck" / "slide" / "latest.pt")
        rng = np.random.default_rng(0)
        for side in sizes:
            blocks = rng.integers(0, 256, (side // 16, side // 16, 3), dtype=np.uint8)
            picture = np.kron(blocks, np.ones((16, 16, 1), dtype=np.uint8))
            slide = tmp / f"slide{side}.tif"
            tifffile.imwrite(slide, picture, tile=(512, 512), compression="zlib", photometric="rgb")
            mib, seconds = peak_mib(
                [
                    "predict",
                    "--checkpoint",
                    checkpoint,
                    str(slide),
                    "--region-size",
                    str(args.region_size),
                    "--no-progress",
                    "--output",
                    str(tmp / f"out{side}"),
                ]
            )
            rows.append((f"{side} x {side} slide, regions of {args.region_size}", mib, seconds))
            print(rows[-1], flush=True)
            if side == sizes[0]:
                Image.fromarray(picture).save(tmp / "whole.png")
                mib, seconds = peak_mib(
                    [
                        "predict",
                        "--checkpoint",
                        checkpoint,
                        str(tmp / "whole.png"),
                        "--no-progress",
                        "--output",
                        str(tmp / "out-whole"),
                    ]
                )
                rows.append((f"{side} x {side} PNG, whole", mib, seconds))
                print(rows[-1], flush=True)
    lines = ["| input | peak resident memory (MiB) | seconds |", "| --- | --- | --- |"]
    lines += [f"| {name} | {mib:.0f} | {seconds:.0f} |" for name, mib, seconds in rows]
    out = REPO / "benchmarks" / "results" / "slide_memory.md"
    out.write_text(f"# slide_memory.py, {time.strftime('%Y-%m-%d')}\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""How long a checkpoint holds up training: a synchronous save (serialise, write, fsync, rename:
`checkpoint.save`) against phalanx's `CheckpointWriter` (serialise on the training thread; the
files written by its thread), for pix2pix's networks at 256 px (translate's defaults: a U-Net of
64 filters and a PatchGAN, with Adam's state), written as latest.pt and best.pt.

    .venv/bin/python benchmarks/checkpoint_write.py [--repeats 7]

Interleaved repeats; medians and ranges. Results: benchmarks/results/checkpoint_write.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from phalanx import checkpoint  # noqa: E402
from phalanx.checkpoint.writer import CheckpointWriter  # noqa: E402
from phalanx.tasks.translate.nets import build_discriminator, build_generator  # noqa: E402


def state() -> dict:
    generator, discriminator = (
        build_generator("unet_256", 3, 3, 64, "batch", True),
        build_discriminator(6, 64, 3, "batch"),
    )
    optimizers = {}
    for name, net in (("G", generator), ("D", discriminator)):
        opt = torch.optim.Adam(net.parameters(), lr=2e-4)
        for p in net.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        optimizers[name] = opt.state_dict()
    return {
        "models": {"generator": generator.state_dict(), "discriminator": discriminator.state_dict()},
        "optimizers": optimizers,
        "epoch": 1,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.manual_seed(0)
    saved = state()
    size = len(checkpoint.serialise(saved)) / 2**20
    held = {"synchronous": [], "CheckpointWriter": []}
    finished = []
    with tempfile.TemporaryDirectory(dir=REPO) as tmp:
        paths = [Path(tmp) / "latest.pt", Path(tmp) / "best.pt"]
        writer = CheckpointWriter(lambda written: None)
        for repeat in range(args.repeats):
            order = ["synchronous", "CheckpointWriter"] if repeat % 2 == 0 else ["CheckpointWriter", "synchronous"]
            for contender in order:
                started = time.perf_counter()
                if contender == "synchronous":
                    checkpoint.save(paths, saved)
                    held[contender].append(time.perf_counter() - started)
                else:
                    writer.save(paths, saved)
                    held[contender].append(time.perf_counter() - started)
                    writer.wait()
                    finished.append(time.perf_counter() - started)
    lines = [
        f"# checkpoint_write.py, {time.strftime('%Y-%m-%d')}: a {size:.0f} MiB checkpoint written twice "
        f"(latest.pt, best.pt), {args.repeats} interleaved repeats",
        "",
        "| save | training held up (s), median (min-max) |",
        "| --- | --- |",
    ]
    for name, values in held.items():
        lines.append(f"| {name} | {statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f}) |")
    lines += [
        "",
        f"CheckpointWriter's files on disk after {statistics.median(finished):.3f} s "
        f"({min(finished):.3f}-{max(finished):.3f}), while training goes on.",
    ]
    out = REPO / "benchmarks" / "results" / "checkpoint_write.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

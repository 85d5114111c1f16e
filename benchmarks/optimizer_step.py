"""One optimizer step, torch's three implementations: the per-parameter loop (torch's CPU default),
foreach, and fused (phalanx's choice since 2026-11-26). Run by hand; about a minute on 2 cores.

    .venv/bin/python benchmarks/optimizer_step.py [--repeats 7]

Two workloads, one compute thread: translate's two Adams (benchmarks/deepliif.py's pix2pix:
``unet_64`` generator and 3-layer PatchGAN, 16 filters, Adam 2e-4, betas 0.5/0.999) and resnet18's
SGD (benchmarks/run.py's: momentum 0.9, weight decay 5e-4), gradients already in place. Each
repeat times 50 steps of each implementation in turn; medians and min-max of the repeats.
Results: benchmarks/results/optimizer_step.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from common import write_results  # noqa: E402  (benchmarks/, beside this file)

IMPLEMENTATIONS = {"loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def translate_pair() -> tuple[list[list[torch.nn.Parameter]], callable]:
    from phalanx.tasks.translate.nets import init_weights, patch_discriminator, unet

    torch.manual_seed(0)
    nets = [init_weights(unet(3, 3, 6, 16, "batch", True)), init_weights(patch_discriminator(6, 16, 3, "batch"))]
    make = lambda params, **kw: torch.optim.Adam(params, lr=2e-4, betas=(0.5, 0.999), **kw)  # noqa: E731
    return [list(net.parameters()) for net in nets], make


def resnet18_sgd() -> tuple[list[list[torch.nn.Parameter]], callable]:
    import torchvision

    torch.manual_seed(0)
    net = torchvision.models.resnet18(num_classes=10)
    make = lambda params, **kw: torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=5e-4, **kw)  # noqa: E731
    return [list(net.parameters())], make


def milliseconds_per_step(groups: list[list[torch.nn.Parameter]], make, options: dict, steps: int = 50) -> float:
    optimizers = [make(params, **options) for params in groups]
    for optimizer in optimizers:  # state made before the clock starts
        optimizer.step()
    started = time.perf_counter()
    for _ in range(steps):
        for optimizer in optimizers:
            optimizer.step()
    return (time.perf_counter() - started) / steps * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    opts = parser.parse_args()
    torch.set_num_threads(1)
    workloads = {"translate: two Adams": translate_pair(), "resnet18: SGD": resnet18_sgd()}
    raw: dict[str, dict[str, list[float]]] = {w: {i: [] for i in IMPLEMENTATIONS} for w in workloads}
    for name, (groups, make) in workloads.items():
        for group in groups:
            for param in group:
                param.grad = torch.randn_like(param) * 1e-3
        for _ in range(opts.repeats):
            for implementation, options in IMPLEMENTATIONS.items():
                raw[name][implementation].append(milliseconds_per_step(groups, make, options))
    summary = {
        w: {i: {"median": statistics.median(v), "min": min(v), "max": max(v)} for i, v in by.items()}
        for w, by in raw.items()
    }
    results = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "torch": torch.__version__,
        "ms_per_step": summary,
        "raw": raw,
    }
    lines = [
        f"{results['date']}, {results['machine']}, torch {torch.__version__}, one thread, {opts.repeats} repeats",
        "",
        "| workload | " + " | ".join(f"{i} (ms)" for i in IMPLEMENTATIONS) + " | loop / fused |",
        "| --- |" + " --- |" * (len(IMPLEMENTATIONS) + 1),
    ]
    for name, by in summary.items():
        cells = [f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})" for s in by.values()]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {by['loop']['median'] / by['fused']['median']:.1f}x |")
    write_results("optimizer_step", results, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())

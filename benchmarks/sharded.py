"""Memory and speed of `--strategy fsdp` against ddp on 2 CPU workers (gloo), on a network whose
weights and AdamW state dominate: a ViT-Base at 32 px (benchmarks/sharded_model.py, 85.8M
weights). Each configuration is a real `phalanx trainlaunch --use-torchrun "--nproc-per-node 2"`
of one epoch (64 synthetic images, 2 per worker a step, AdamW) with its checkpoint; the peak
resident memory is the largest process's (GNU time's %M over torchrun and its workers: the rank
that limits what fits) with glibc returning freed memory at once, the speed the epoch's samples/s
as the run reports it.

    .venv/bin/python benchmarks/sharded.py [--repeats 7] [--depths 6,12,24] [--activations] [--sweep-repeats 3]

Configurations interleaved, their order rotating; medians and ranges. Results:
benchmarks/results/sharded.md. With --depths, a sweep of the peak memory of ddp and fsdp over the
ViT's depth instead (--repeats 0 skips the table above): what a rank holds per block under each
strategy, hence the deepest ViT each trains within a memory limit per rank. Results:
benchmarks/results/sharded_sweep.md. With --activations, fsdp with and without
--activation-checkpointing where activations dominate (a ResNet-18 at 128 px): results in
benchmarks/results/sharded_activations.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PHALANX = str(REPO / ".venv" / "bin" / "phalanx")
CONFIGS = {
    "ddp": ["--strategy", "ddp"],
    "fsdp": ["--strategy", "fsdp"],
    "fsdp + activation checkpointing": ["--strategy", "fsdp", "--activation-checkpointing"],
}
COMMON = [
    "--model",
    "sharded_model:vit",
    "--dataset",
    "synthetic",
    "--synthetic-samples",
    "80",
    "--image-size",
    "32",
    "--batch-size",
    "4",
    "--optimizer",
    "adamw",
    "--epochs",
    "1",
    "--no-progress",
    "--num-workers",
    "0",
]


def run(
    name: str, options: list[str], directory: Path, depth: int = 12, common: list[str] = COMMON
) -> tuple[float, float]:
    """(peak resident MiB of the largest process, samples/s of the epoch)."""
    # glibc hands freed memory back at once (its variables, which phalanx then leaves alone): the
    # resident peak is then what the run holds, not what its allocator keeps for later
    env = {
        **os.environ,
        "PYTHONPATH": f"{REPO}:{REPO / 'benchmarks'}",
        "OMP_NUM_THREADS": "1",
        "MALLOC_MMAP_THRESHOLD_": "131072",
        "MALLOC_TRIM_THRESHOLD_": "131072",
        "SHARDED_DEPTH": str(depth),
    }
    done = subprocess.run(
        [
            "/usr/bin/time",
            "-f",
            "%M",
            PHALANX,
            "trainlaunch",
            *common,
            *options,
            "--checkpoints-dir",
            str(directory),
            "--name",
            name.replace(" ", "_").replace("+", ""),
            "--overwrite",
            "--use-torchrun",
            "--nproc-per-node=2",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    peak = int(done.stderr.strip().splitlines()[-1]) / 1024
    rate = next(
        float(line.split("samples/s")[0].split()[-1].replace(",", ""))
        for line in done.stdout.splitlines()
        if line.startswith("epoch 1/1")
    )
    return peak, rate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--depths", default="")
    parser.add_argument("--sweep-repeats", type=int, default=3)
    parser.add_argument("--activations", action="store_true")
    args = parser.parse_args()
    if args.depths:
        sweep([int(d) for d in args.depths.split(",")], args.sweep_repeats)
    if args.activations:
        activations(args.sweep_repeats)
    if args.repeats:
        table(args.repeats)


def sweep(depths: list[int], repeats: int) -> None:
    """Peak memory against depth under ddp and fsdp: the slope is what each block costs a rank."""
    peaks: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(repeats):
            for depth in depths:
                for name in ("ddp", "fsdp"):
                    peak, _ = run(f"{name}{depth}", CONFIGS[name], Path(tmp), depth)
                    peaks.setdefault((name, depth), []).append(peak)
                    print(repeat, name, depth, peak, flush=True)
    rows = ["| ViT depth (weights) | ddp peak MiB | fsdp peak MiB | fsdp / ddp |", "|---|---|---|---|"]
    for depth in depths:
        ddp, fsdp = (statistics.median(peaks[(name, depth)]) for name in ("ddp", "fsdp"))
        rows.append(f"| {depth} ({depth * 7.09 + 0.68:.0f}M) | {ddp:.0f} | {fsdp:.0f} | {fsdp / ddp:.2f} |")
    slopes = {
        name: (statistics.median(peaks[(name, depths[-1])]) - statistics.median(peaks[(name, depths[0])]))
        / (depths[-1] - depths[0])
        for name in ("ddp", "fsdp")
    }
    rows.append("")
    rows.append(
        f"Per block of 7.1M weights: ddp {slopes['ddp']:.0f} MiB, fsdp {slopes['fsdp']:.0f} MiB per rank "
        f"(peaks of {repeats} repeats, medians; slope between depth {depths[0]} and {depths[-1]})."
    )
    text = "\n".join(rows)
    print(text)
    (REPO / "benchmarks" / "results" / "sharded_sweep.md").write_text(
        f"# benchmarks/sharded.py --depths ({time.strftime('%Y-%m-%d')}, 2 CPU cores, gloo)\n\n{text}\n"
    )


ACTIVATIONS = [
    "--model",
    "resnet18",
    "--dataset",
    "synthetic",
    "--synthetic-samples",
    "160",
    "--image-size",
    "128",
    "--batch-size",
    "32",
    "--optimizer",
    "adamw",
    "--epochs",
    "1",
    "--no-progress",
    "--num-workers",
    "0",
]


def activations(repeats: int) -> None:
    """Where activations are what a rank holds most (a ResNet-18 at 128 px, 16 images a worker):
    fsdp with and without --activation-checkpointing, interleaved."""
    found: dict[str, list[tuple[float, float]]] = {"fsdp": [], "fsdp + activation checkpointing": []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(repeats):
            for name in list(found) if repeat % 2 == 0 else list(found)[::-1]:
                found[name].append(run(name, CONFIGS[name], Path(tmp), common=ACTIVATIONS))
                print(repeat, name, found[name][-1], flush=True)
    rows = ["| ResNet-18, 128 px, 16 a worker | peak RSS, largest process (MiB) | samples/s |", "|---|---|---|"]
    for name, runs in found.items():
        peaks, rates = [p for p, _ in runs], [r for _, r in runs]
        rows.append(
            f"| {name} | {statistics.median(peaks):.0f} ({min(peaks):.0f}-{max(peaks):.0f}) | "
            f"{statistics.median(rates):.2f} ({min(rates):.2f}-{max(rates):.2f}) |"
        )
    text = "\n".join(rows)
    print(text)
    (REPO / "benchmarks" / "results" / "sharded_activations.md").write_text(
        f"# benchmarks/sharded.py --activations ({time.strftime('%Y-%m-%d')}, {repeats} repeats, 2 CPU cores, "
        f"gloo)\n\n{text}\n"
    )


def table(repeats: int) -> None:
    args = argparse.Namespace(repeats=repeats)
    names = list(CONFIGS)
    found: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            order = names[repeat % len(names) :] + names[: repeat % len(names)]
            for name in order:
                found[name].append(run(name, CONFIGS[name], Path(tmp)))
                print(repeat, name, found[name][-1], flush=True)
    rows = ["| configuration | peak RSS, largest process (MiB) | samples/s | vs ddp (samples/s) |", "|---|---|---|---|"]
    ddp_rate = statistics.median(rate for _, rate in found["ddp"])
    for name in names:
        peaks, rates = [p for p, _ in found[name]], [r for _, r in found[name]]
        rows.append(
            f"| {name} | {statistics.median(peaks):.0f} ({min(peaks):.0f}-{max(peaks):.0f}) | "
            f"{statistics.median(rates):.2f} ({min(rates):.2f}-{max(rates):.2f}) | "
            f"{statistics.median(rates) / ddp_rate:.2f}x |"
        )
    text = "\n".join(rows)
    print(text)
    out = REPO / "benchmarks" / "results"
    (out / "sharded.json").write_text(json.dumps({"runs": found, "when": time.strftime("%Y-%m-%d")}, indent=1))
    (out / "sharded.md").write_text(
        f"# benchmarks/sharded.py ({time.strftime('%Y-%m-%d')}, {args.repeats} repeats, 2 CPU cores, gloo)\n\n{text}\n"
    )


if __name__ == "__main__":
    main()

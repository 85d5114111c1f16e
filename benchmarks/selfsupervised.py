"""Self-supervised pretraining: phalanx's eight methods against the same methods written with Lightly,
and what SimCLR's pretraining gives a classifier with few labels (run by hand; about 45 minutes on 2
cores for the speed runs, 7 repeats, and 15 for the transfer).

    .venv/bin/python benchmarks/selfsupervised.py [--repeats 7] [--only speed|transfer] [--methods simclr,moco]

Speed and kNN accuracy, for simclr, byol, moco, dino, swav, simsiam, barlowtwins and vicreg: the
built-in digits as 32x32 RGB PNG folders (718 to train, every second of the 1,437; 360 to
validate), phalanx's smallcnn without its last layer as the backbone, heads of 128 (hidden and
output; DINO's bottleneck 64 and 1,024 outputs, SwAV's 300 prototypes, MoCo's queue 1,024, SimSiam's
predictor 64), SGD 0.06 (momentum 0.9, weight decay 5e-4, cosine), batch 128 (2 x 64 under DDP),
2 epochs, one compute thread a process. The Lightly contender (benchmarks/ssl_lightly.py) is each
method as Lightly's examples write it, in a plain loop and in a DDP loop under torchrun, with
Lightly's heads (its SimCLR and SimSiam heads end in a BatchNorm, phalanx's in a Linear), losses
(gathered over ranks where they can be), momentum updates and transforms at phalanx's settings
(SimCLR's colour jitter at 0.4, no blur; for DINO and SwAV the same at their crop sizes and scales,
2 global and 6 local crops), the learning rate's cosine stepped as phalanx's. samples/s of the
epochs after the first; kNN accuracy (k 200, temperature 0.1) after the last epoch. The contenders
run interleaved, their order rotated each repeat.

kNN over seeds (`--only knn --seeds 7 --methods dino,moco`): the same runs, one process, at seeds 0
to N-1 for both contenders: how much of a kNN difference the seed alone makes.

Transfer: the digits with 10% of the training split labelled (144 images): a linear probe (frozen
backbone, 20 epochs) and a fine-tune (20 epochs) from a SimCLR backbone and from a random one;
three seeds each. Results: benchmarks/results/selfsupervised[-speed|-transfer|-knn].{json,md} (the suffix: --only).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PYTHON = sys.executable
DATA = HERE / ".data"
EPOCHS, BATCH = 2, 128
METHODS = ("simclr", "byol", "moco", "dino", "swav", "simsiam", "barlowtwins", "vicreg")
HEADS = ["--hidden-dim", "128", "--projection-dim", "128"]
# Each method's sizes, the ones benchmarks/ssl_lightly.py gives Lightly's heads and losses.
OPTIONS = {
    "simclr": [*HEADS, "--temperature", "0.5"],
    "byol": HEADS,
    "moco": [*HEADS, "--head-norm", "none", "--queue-size", "1024"],
    "dino": ["--hidden-dim", "128", "--bottleneck-dim", "64", "--output-dim", "1024"],
    "swav": [*HEADS, "--prototypes", "300"],
    "simsiam": [*HEADS, "--predictor-dim", "64"],
    "barlowtwins": HEADS,
    "vicreg": [*HEADS, "--lr", "0.06"],
}  # Lightly's SGD 0.06 (phalanx's default 0.03)
CONTENDERS = ("Lightly loop", "phalanx", "Lightly DDP loop, 2 workers", "phalanx DDP, 2 workers")


def after_first(epoch_rates: list[float]) -> float:
    """The median samples/s of the epochs after the first: one statistic, computed here for both
    contenders."""
    return statistics.median(epoch_rates[1:])


def digit_folders() -> Path:
    root = DATA / "digits-rgb"
    if not (root / "done").exists():
        sys.path.insert(0, str(REPO / "tests"))
        from conftest import write_digit_pngs
        from PIL import Image

        write_digit_pngs(root, val=True)
        for png in root.rglob("*.png"):
            Image.open(png).convert("RGB").resize((32, 32), Image.NEAREST).save(png)
        (root / "done").write_text("")
    return root


def half_of(root: Path) -> Path:
    """Every second training image of ``root`` (718 of 1,437; the same 360 to validate): the eight
    methods' runs, short enough for 7 repeats of 32 runs."""
    half = DATA / f"{root.name}-half"
    if not (half / "done").exists():
        for split in ("train", "val"):
            for index, png in enumerate(sorted((root / split).rglob("*.png"))):
                if split == "val" or index % 2:
                    target = half / split / png.parent.name / png.name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(png.read_bytes())
        (half / "done").write_text("")
    return half


def env(seed: int = 0) -> dict:
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "PHALANX_CACHE": str(DATA / "cache"),
        "BENCH_SEED": str(seed),
    }


def phalanx_method(method: str, root: Path, work: Path, workers: int, epochs: int, seed: int = 0) -> dict:
    common = [
        "--task",
        method,
        "--seed",
        str(seed),
        "--dataroot",
        str(root),
        "--image-size",
        "32",
        *OPTIONS[method],
        "--blur",
        "0",
        "--normalize",
        "imagenet",
        "--epochs",
        str(epochs),
        "--batch-size",
        str(BATCH // workers),
        "--num-workers",
        "0",
        "--checkpoints-dir",
        str(work),
        "--no-progress",
    ]
    command = (
        ["trainlaunch", *common, "--use-torchrun", f"--nproc-per-node {workers}"] if workers > 1 else ["train", *common]
    )
    done = subprocess.run([PYTHON, "-m", "phalanx.cli", *command], env=env(), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    # "1,234 samples/s", "83.1 samples/s" under 100
    rates = [float(r.replace(",", "")) for r in re.findall(r"([\d,]+(?:\.\d+)?) samples/s", done.stdout)]
    val = [
        json.loads(line)
        for line in (work / "experiment/metrics.jsonl").read_text().splitlines()
        if '"kind": "val"' in line
    ][-1]
    return {"samples_per_s": after_first(rates), "knn_acc": val["knn_acc"]}


def lightly_method(method: str, root: Path, workers: int, epochs: int, seed: int = 0) -> dict:
    script = [str(HERE / "ssl_lightly.py"), method, str(root), str(epochs), str(BATCH)]
    argv = (
        [PYTHON, *script]
        if workers == 1
        else [PYTHON, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={workers}", *script]
    )
    done = subprocess.run(argv, env=env(seed), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"samples_per_s": after_first(result["epoch_rates"]), "knn_acc": result["knn_acc"]}


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def spread(stats: dict, spec: str) -> str:
    """median (min-max)"""
    return f"{stats['median']:{spec}} ({stats['min']:{spec}}-{stats['max']:{spec}})"


def speed(repeats: int, methods: list[str], epochs: int) -> dict:
    """raw[method][contender]: one result a repeat; the contenders interleaved, their order rotated
    each repeat."""
    root = half_of(digit_folders())
    raw: dict[str, dict[str, list[dict]]] = {}
    for rep in range(repeats):
        order = CONTENDERS[rep % 4 :] + CONTENDERS[: rep % 4]
        for method in methods:
            for name in order:
                workers = 2 if "2 workers" in name else 1
                with tempfile.TemporaryDirectory() as tmp:
                    result = (
                        lightly_method(method, root, workers, epochs)
                        if name.startswith("Lightly")
                        else phalanx_method(method, root, Path(tmp), workers, epochs)
                    )
                raw.setdefault(method, {}).setdefault(name, []).append(result)
                print(
                    f"[{rep + 1}/{repeats}] {method}, {name}: {result['samples_per_s']:.0f} samples/s, kNN "
                    f"{100 * result['knn_acc']:.1f}%",
                    flush=True,
                )
    return raw


def knn_over_seeds(seeds: int, methods: list[str], epochs: int) -> dict:
    """raw[method][contender]: the kNN accuracy of one process's run at each seed (phalanx's --seed,
    the Lightly loop's torch.manual_seed: initialisation, crops and order), the two alternating. The
    speed runs use seed 0 every repeat, so their kNN ranges say nothing about the seed's share."""
    root = half_of(digit_folders())
    raw: dict[str, dict[str, list[float]]] = {}
    for seed in range(seeds):
        for method in methods:
            for name in CONTENDERS[:2] if seed % 2 == 0 else CONTENDERS[1::-1]:
                with tempfile.TemporaryDirectory() as tmp:
                    result = (
                        lightly_method(method, root, 1, epochs, seed)
                        if name.startswith("Lightly")
                        else phalanx_method(method, root, Path(tmp), 1, epochs, seed)
                    )
                raw.setdefault(method, {}).setdefault(name, []).append(result["knn_acc"])
                print(f"[seed {seed}] {method}, {name}: kNN {100 * result['knn_acc']:.1f}%", flush=True)
    return raw


def transfer(seeds: int) -> dict:
    """Linear probe and fine-tune on 10% labels, from a SimCLR backbone and from a random one."""
    raw: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(seeds):
            pretrain = [
                "--task",
                "simclr",
                "--image-size",
                "16",
                "--epochs",
                "20",
                "--batch-size",
                "128",
                "--seed",
                str(seed),
                "--checkpoints-dir",
                tmp,
                "--name",
                f"ssl{seed}",
                "--no-progress",
            ]
            subprocess.run(
                [PYTHON, "-m", "phalanx.cli", "train", *pretrain], env=env(), check=True, capture_output=True
            )
            for label, extra in (
                ("linear probe, random backbone", ["--freeze-backbone"]),
                ("linear probe, SimCLR backbone", ["--freeze-backbone", "--weights", f"{tmp}/ssl{seed}/best.pt"]),
                ("fine-tune, random init", []),
                ("fine-tune, SimCLR init", ["--weights", f"{tmp}/ssl{seed}/best.pt"]),
            ):
                name = f"{label}-{seed}".replace(" ", "_").replace(",", "")
                # The pretraining's normalisation for every contender (--weights alone would take ImageNet's).
                argv = [
                    "train",
                    "--image-size",
                    "16",
                    "--epochs",
                    "20",
                    "--val-fraction",
                    "0.9",
                    "--batch-size",
                    "16",
                    "--mean",
                    "0.5",
                    "--std",
                    "0.5",
                    "--seed",
                    str(seed),
                    "--checkpoints-dir",
                    tmp,
                    "--name",
                    name,
                    "--no-progress",
                    *extra,
                ]
                subprocess.run([PYTHON, "-m", "phalanx.cli", *argv], env=env(), check=True, capture_output=True)
                val = [
                    json.loads(line)
                    for line in Path(tmp, name, "metrics.jsonl").read_text().splitlines()
                    if '"kind": "val"' in line
                ][-1]
                raw.setdefault(label, []).append(val["acc"])
                print(f"[seed {seed}] {label}: {100 * val['acc']:.1f}%", flush=True)
    return raw


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seeds", type=int, default=3, help="of the transfer runs and of --only knn")
    parser.add_argument("--epochs", type=int, default=EPOCHS, help="of each speed run (its first is not timed)")
    parser.add_argument(
        "--only",
        choices=("speed", "transfer", "knn"),
        help="knn: kNN accuracy over --seeds seeds, one process, phalanx and the Lightly loop (not part of a full run)",
    )
    parser.add_argument(
        "--methods",
        type=lambda text: text.split(","),
        default=list(METHODS),
        help="comma-separated, of " + ",".join(METHODS),
    )
    opts = parser.parse_args()
    results: dict = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} cores"}
    lines = [f"{results['date']}, {results['machine']}"]
    if opts.only in (None, "speed"):
        raw = speed(opts.repeats, opts.methods, opts.epochs)
        results["speed"] = {
            method: {name: {key: summary([r[key] for r in runs]) for key in runs[0]} for name, runs in by_name.items()}
            for method, by_name in raw.items()
        }
        for lightly, ours in (CONTENDERS[0:2], CONTENDERS[2:4]):
            lines += [
                "",
                f"{ours} against {lightly}",
                "",
                "| method | Lightly samples/s | phalanx samples/s | phalanx / Lightly, per repeat | repeats ahead "
                "| kNN Lightly | kNN phalanx |",
                "| --- | --- | --- | --- | --- | --- | --- |",
            ]
            for method, by_name in raw.items():
                ratios = [a["samples_per_s"] / b["samples_per_s"] for a, b in zip(by_name[ours], by_name[lightly])]
                ratio = results["speed"][method][ours]["ratio"] = summary(ratios)
                theirs, mine = (results["speed"][method][n] for n in (lightly, ours))
                lines.append(
                    f"| {method} | {spread(theirs['samples_per_s'], '.0f')} | {spread(mine['samples_per_s'], '.0f')}"
                    f" | {spread(ratio, '.2f')} | {sum(r >= 1 for r in ratios)} of {len(ratios)} | "
                    f"{spread(theirs['knn_acc'], '.1%')} | {spread(mine['knn_acc'], '.1%')} |"
                )
    if opts.only == "knn":
        raw_k = knn_over_seeds(opts.seeds, opts.methods, opts.epochs)
        results["knn"] = {
            method: {name: {"summary": summary(v), "raw": v} for name, v in by_name.items()}
            for method, by_name in raw_k.items()
        }
        lines += [
            "",
            f"kNN accuracy after {opts.epochs} epochs, one process, seeds 0-{opts.seeds - 1}: median (min-max)",
            "",
            "| method | Lightly loop | phalanx | phalanx - Lightly, same seed: median (min-max) |",
            "| --- | --- | --- | --- |",
        ]
        for method, by_name in raw_k.items():
            theirs, mine = by_name[CONTENDERS[0]], by_name[CONTENDERS[1]]
            differences = summary([100 * (a - b) for a, b in zip(mine, theirs)])
            lines.append(
                f"| {method} | {spread(summary(theirs), '.1%')} | {spread(summary(mine), '.1%')} | "
                f"{spread(differences, '+.1f')} points |"
            )
    if opts.only in (None, "transfer"):
        raw_t = transfer(opts.seeds)
        results["transfer"] = {name: summary(values) for name, values in raw_t.items()}
        lines += [
            "",
            "| 10% of the digits labelled (144 images), 20 epochs | validation accuracy, median (min-max) |",
            "| --- | --- |",
        ]
        for name, s in results["transfer"].items():
            lines.append(f"| {name} | {100 * s['median']:.1f}% ({100 * s['min']:.1f}-{100 * s['max']:.1f}) |")
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    suffix = f"-{opts.only}" if opts.only else ""
    (out / f"selfsupervised{suffix}.json").write_text(json.dumps(results, indent=2))
    (out / f"selfsupervised{suffix}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

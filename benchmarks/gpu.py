"""phalanx on one GPU beside the same hand-written loop and PyTorch Lightning (benchmarks/gpu_loops.py).

    python benchmarks/gpu.py                                  # on a GPU machine (scripts/gpu_setup.sh)
    python benchmarks/gpu.py --settings bf16 fp32:hand,phalanx --repeats 7   # SETTING[:CONTENDERS]

resnet50 at 224x224 on synthetic in-memory data, batch 128, channels-last, SGD; each setting is a
precision (fp32, bf16 autocast) with or without torch.compile. Every contender is a fresh process;
runs are interleaved (each repeat runs every setting and contender once, in an order that rotates
from repeat to repeat) and each ratio is taken against the hand-written loop of the same repeat and
setting. The report gives medians and min-max of images/s, of the ratios and of peak GPU memory,
and calls a lead or a lag only when every repeat agrees. --budget-s stops before a repeat that would
not fit (repeats done are reported).
Results: benchmarks/results/gpu.{json,md} (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
VAL_FRACTION = 0.02


def synthetic_samples(train: int) -> int:
    """--synthetic-samples that leaves exactly ``train`` training samples after the hold-out."""
    total = train
    while total - max(1, round(total * VAL_FRACTION)) != train:
        total += 1
    return total


def run(argv: list[str], env: dict[str, str], warmup: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        full_env = {
            **os.environ,
            **env,
            "BENCH_RESULT": str(result),
            "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO)]),
        }
        started_wall, started = time.time(), time.perf_counter()
        done = subprocess.run(argv, cwd=tmp, env=full_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:6])} ... exited {done.returncode}: {done.stderr[-1500:]}")
        if result.exists():
            report = json.loads(result.read_text())
        else:  # phalanx: what it logged (train windows after the warm-up, GPU memory of the epoch)
            records = [json.loads(line) for line in (Path(tmp) / "ck/bench/metrics.jsonl").read_text().splitlines()]
            steady = [r for r in records if r["kind"] == "train" and r["step"] > warmup]
            first = next(r for r in records if r["kind"] == "first_step")
            val = [r for r in records if r["kind"] == "val"][-1]
            report = {
                "samples": sum(r["samples"] for r in steady),
                "seconds": sum(r["seconds"] for r in steady),
                "first_step_time": first["time"],
                "peak_gib": max(val["memory_gib"]),
            }
    return {
        "images_per_s": report["samples"] / report["seconds"],
        "peak_gib": report["peak_gib"],
        "first_step_s": report["first_step_time"] - started_wall,
        "wall_s": wall,
        **({"compute_images_per_s": report["compute_images_per_s"]} if "compute_images_per_s" in report else {}),
    }


def contenders(
    setting: str, model: str, size: int, batch: int, steps: int, warmup: int, workers: int
) -> dict[str, list[str]]:
    precision, _, compiled = setting.partition("-")
    numbers = [model, str(size), str(batch), str(steps), str(warmup), precision, "1" if compiled else "0", str(workers)]
    phalanx = [
        sys.executable,
        "-m",
        "phalanx.cli",
        "train",
        "--dataset",
        "synthetic",
        "--image-size",
        str(size),
        "--model",
        model,
        "--synthetic-samples",
        str(synthetic_samples(steps * batch)),
        "--val-fraction",
        str(VAL_FRACTION),
        "--batch-size",
        str(batch),
        "--epochs",
        "1",
        "--lr",
        "0.01",
        "--lr-schedule",
        "constant",
        "--gpu-ids",
        "0",
        "--precision",
        precision,
        "--channels-last",
        "--num-workers",
        str(workers),
        "--checkpoints-dir",
        "ck",
        "--name",
        "bench",
        "--log-every",
        "10",
        "--no-progress",
        "--snapshot-every",
        "1e9",
        *(["--compile"] if compiled else []),
    ]
    return {
        "hand": [sys.executable, str(HERE / "gpu_loops.py"), "hand", *numbers],
        "hand-ahead": [sys.executable, str(HERE / "gpu_loops.py"), "hand-ahead", *numbers],
        "phalanx": phalanx,
        "lightning": [sys.executable, str(HERE / "gpu_loops.py"), "lightning", *numbers],
    }


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def verdict(ratio: dict) -> str:
    return "lead" if ratio["min"] > 1 else "behind" if ratio["max"] < 1 else "parity"


def main() -> int:  # noqa: C901 (the benchmark's one loop)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", nargs="+", default=["fp32", "bf16", "fp32-compile", "bf16-compile"])
    # hand-ahead: the hand-written loop fetching its next batch before each step, as Lightning's loop
    # does (the plain loop was 0.85x Lightning on an H100 with the same loader; not run there yet).
    parser.add_argument("--contenders", nargs="+", default=["hand", "hand-ahead", "phalanx", "lightning"])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=10, help="a multiple of phalanx's --log-every (10)")
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--budget-s", type=float, default=float("inf"))
    parser.add_argument("--out", type=Path, default=HERE / "results")
    opts = parser.parse_args()
    import torch

    device = torch.cuda.get_device_name(0)
    # "bf16" runs every --contenders; "fp32:hand,phalanx" runs those two in that setting.
    chosen = {
        spec.partition(":")[0]: spec.partition(":")[2].split(",") if ":" in spec else list(opts.contenders)
        for spec in opts.settings
    }
    raw: dict[str, dict[str, list[dict]]] = {s: {c: [] for c in names} for s, names in chosen.items()}
    began = time.perf_counter()
    last = 0.0
    for rep in range(opts.repeats):
        if rep and time.perf_counter() - began + last > opts.budget_s:
            print(f"stopping after {rep} repeats: the next would pass --budget-s", flush=True)
            break
        started = time.perf_counter()
        for setting, names in chosen.items():
            if not names:  # every contender of this setting failed
                continue
            runs = contenders(setting, opts.model, opts.size, opts.batch, opts.steps, opts.warmup, opts.workers)
            # The order rotates each repeat, so no contender is always the first process on a cold GPU.
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                try:
                    result = run(runs[name], {}, opts.warmup)
                except RuntimeError as exc:  # the others go on; this one runs no more (its rows stay a prefix)
                    print(f"[{rep + 1}] {setting} {name} failed: {exc}", flush=True)
                    names.remove(name)
                    continue
                raw[setting][name].append(result)
                print(
                    f"[{rep + 1}] {setting} {name}: {result['images_per_s']:.0f} images/s, "
                    f"{result['peak_gib']:.2f} GiB, wall {result['wall_s']:.0f} s",
                    flush=True,
                )
        last = time.perf_counter() - started
        write_results(opts, device, torch.__version__, raw)  # after each repeat: a stopped run keeps what it measured
    return 0


def write_results(opts, device: str, torch_version: str, raw: dict) -> None:
    table = [
        f"{time.strftime('%Y-%m-%d')}, {device}, torch {torch_version}, {opts.model} {opts.size}x{opts.size}, "
        f"batch {opts.batch}, channels-last, steps {opts.warmup + 1}-{opts.steps} timed, {opts.workers} loader "
        "workers",
        "",
        "| setting | contender | images/s | / hand-written, per repeat | verdict | peak GiB |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    results = {
        "device": device,
        "torch": torch_version,
        "options": {k: str(v) for k, v in vars(opts).items()},
        "raw": raw,
        "ratios": {},
    }
    for setting, by_name in raw.items():
        base = by_name.get("hand", [])
        for name, rows in by_name.items():
            if not rows:
                continue
            rate = summary([r["images_per_s"] for r in rows])
            memory = summary([r["peak_gib"] for r in rows])
            if name == "hand" or not base:
                compared, said = "baseline", ""
            else:
                ratio = summary([r["images_per_s"] / b["images_per_s"] for r, b in zip(rows, base)])
                results["ratios"][f"{setting} {name}"] = ratio
                compared = f"{ratio['median']:.3f} ({ratio['min']:.3f}-{ratio['max']:.3f})"
                said = verdict(ratio)
            table.append(
                f"| {setting} | {name} | {rate['median']:.0f} ({rate['min']:.0f}-{rate['max']:.0f}) | "
                f"{compared} | {said} | {memory['median']:.2f} |"
            )
            ceiling = [r["compute_images_per_s"] for r in rows if "compute_images_per_s" in r]
            if ceiling and name == "hand":
                top = summary(ceiling)
                table.append(
                    f"| {setting} | hand, batch already on the GPU | {top['median']:.0f} "
                    f"({top['min']:.0f}-{top['max']:.0f}) | no input pipeline | | |"
                )
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "gpu.json").write_text(json.dumps(results, indent=1))
    (opts.out / "gpu.md").write_text("\n".join(table) + "\n")
    print("\n".join(table), flush=True)


if __name__ == "__main__":
    sys.exit(main())

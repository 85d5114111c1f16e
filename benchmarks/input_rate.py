"""The input path measured from outside (issue #64): phalanx train against a hand-written loop, and
the first step with 100,000 files against 2,000.

    .venv/bin/python benchmarks/input_rate.py                    # both parts, 7 repeats (~20 min, 2 cores)
    .venv/bin/python benchmarks/input_rate.py --only rates --repeats 3 --sets other

Rates, the issue's method:
- 6,000 JPEGs of 160x160 in 10 class folders and a ``val/`` folder (600 more), resized to 32 px;
- a model that costs nothing (``AdaptiveAvgPool2d(8)``, ``Flatten``, ``Linear``);
- ``phalanx train --augment none --num-workers 0 --batch-size 64 --epochs 2``, ``OMP_NUM_THREADS=1``;
  its rate: epoch 2's ``train`` records of ``metrics.jsonl``, samples over seconds summed (the
  windows cover the epoch's training from its first batch to its last step; validation and the
  checkpoint before it are outside, the background checkpoint write overlaps its first window);
- against a hand-written loop: ``read_file`` + ``decode_jpeg`` + ``v2.Resize((32, 32),
  antialias=True)`` + normalise, the same batch, ``num_workers=0``, an SGD step, ``torch.set_num_threads(1)``,
  its own epoch 2;
- each run a fresh process; the contenders' order rotates each repeat; the load average is kept.

Data sets: ``loader``, the JPEGs of ``benchmarks/loader.py`` (its generated photos, PIL at quality
90, 4:2:0, ~11 kB), with a ``val/`` folder of the same kind; ``other``, another encoder and content
(torchvision's ``encode_jpeg``, libjpeg-turbo at quality 80, discs and gradients, ~4.5 kB);
``loader.py``, loader.py's own end-to-end folder and flags (6,000 images, no ``val/``,
``--val-fraction 0.01``): its method for its "phalanx --augment none" and "hand-written loop" rows.
On ``--threads-set`` phalanx also runs with torch's default intra-op threads (OMP_NUM_THREADS unset),
with OpenMP's default wait policy and with ``OMP_WAIT_POLICY=PASSIVE``. The manifest cache is the
benchmark's own (``benchmarks/.data/cache``), warm after the first run.

First step: ``phalanx train`` (same settings, ``--image-size 24 --max-steps 1``) on 2,000 and 100,000
24x24 JPEGs in 10 class folders, seconds from process start to its ``first_step`` record; a cold
manifest cache (new, empty) and a warm one (filled by the same phalanx before); this tree and a
committed phalanx (``--before``, default HEAD, via ``git archive``); the order rotating each repeat.
Results: benchmarks/results/input_rate.{json,md}.
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
DATA = HERE / ".data"
PYTHON = sys.executable
CLASSES, TRAIN_PER_CLASS, VAL_PER_CLASS, SIDE = 10, 600, 60, 160

NOTHING = """import torch
def model(num_classes, in_channels):
    return torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(8), torch.nn.Flatten(),
                               torch.nn.Linear(in_channels * 64, num_classes))
"""

HAND_LOOP = r"""
import json, sys, time, torch
from torch.utils.data import DataLoader, Dataset
from torchvision.datasets import ImageFolder
from torchvision.io import decode_jpeg, read_file
from torchvision.transforms import v2
torch.set_num_threads(1)
files = ImageFolder(sys.argv[1] + "/train").samples
prepare = v2.Compose([v2.Resize((32, 32), antialias=True), v2.ToDtype(torch.float32, scale=True),
                      v2.Normalize([0.5] * 3, [0.5] * 3)])
class Jpeg(Dataset):
    def __len__(self): return len(files)
    def __getitem__(self, i): return prepare(decode_jpeg(read_file(files[i][0]))), files[i][1]
model = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(8), torch.nn.Flatten(), torch.nn.Linear(192, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
loader = DataLoader(Jpeg(), batch_size=64, shuffle=True, num_workers=0)
for epoch in (1, 2):
    started, count = time.perf_counter(), 0
    for images, labels in loader:
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad(); loss.backward(); optimizer.step()
        count += len(labels)
print(json.dumps({"rate": count / (time.perf_counter() - started)}))
"""


def other_jpeg(seed: int) -> bytes:
    """A 160x160 JPEG from torchvision's encoder (libjpeg-turbo, quality 80): overlapping discs, a
    colour gradient and mild noise; another encoder and another content than loader.py's photos."""
    import numpy as np
    import torch
    from torchvision.io import encode_jpeg

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:SIDE, 0:SIDE] / SIDE
    image = np.zeros((SIDE, SIDE, 3))
    for _ in range(6):
        cx, cy, r = rng.random(3) * [1, 1, 0.4] + [0, 0, 0.05]
        inside = (x - cx) ** 2 + (y - cy) ** 2 < r * r
        image[inside] = 0.5 * image[inside] + 0.5 * rng.random(3) * 255
    image += (rng.random(3) * 80)[None, None] * x[..., None]
    image += rng.normal(0, 6, image.shape)
    pixels = torch.from_numpy(image.clip(0, 255).astype(np.uint8)).permute(2, 0, 1).contiguous()
    return encode_jpeg(pixels, quality=80).numpy().tobytes()


def loader_jpeg(seed: int) -> bytes:
    sys.path.insert(0, str(REPO / "tests" / "support"))
    from phalanx_testdata import photo  # benchmarks/loader.py's JPEGs

    return photo(SIDE, SIDE, seed)


ENCODERS = {"loader": loader_jpeg, "other": other_jpeg}


def folder(name: str) -> Path:
    """``train/class<c>/`` with 600 images each and ``val/class<c>/`` with 60 (seeds apart)."""
    root = DATA / f"input-rate-{name}"
    if not (root / "done").exists():
        make = ENCODERS[name]
        for split, per_class, offset in (("train", TRAIN_PER_CLASS, 0), ("val", VAL_PER_CLASS, 10**6)):
            for c in range(CLASSES):
                path = root / split / f"class{c}"
                path.mkdir(parents=True, exist_ok=True)
                for i in range(per_class):
                    (path / f"{i:05d}.jpg").write_bytes(make(offset + c * per_class + i))
        (root / "done").write_text("")
    return root


def phalanx_rate(root: Path, env: dict, flags: list[str]) -> dict:
    """One ``phalanx train`` process: epoch 2's samples/s from metrics.jsonl (its train records'
    samples over their seconds: the epoch's training, from its first batch asked for to its last
    step, validation and checkpoints outside it), what it printed for epoch 2 (the same span), each
    window's rate and the step's parts."""
    import re

    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [
                PYTHON,
                "-m",
                "phalanx.cli",
                "train",
                "--model",
                "nothing_model:model",
                "--dataroot",
                str(root),
                "--image-size",
                "32",
                "--num-workers",
                "0",
                "--epochs",
                "2",
                "--batch-size",
                "64",
                "--augment",
                "none",
                "--checkpoints-dir",
                tmp,
                "--name",
                "bench",
                "--no-progress",
                *flags,
            ],
            env=env,
            cwd=tmp,
            capture_output=True,
            text=True,
        )
        if done.returncode:
            raise RuntimeError(f"phalanx train exited {done.returncode}: {done.stderr[-800:]}")
        records = [json.loads(line) for line in (Path(tmp) / "bench" / "metrics.jsonl").read_text().splitlines()]
    windows = [r for r in records if r["kind"] == "train" and r["epoch"] == 2]
    printed = re.search(r"epoch 2/2 .* ([\d,]+) samples/s", done.stdout).group(1).replace(",", "")
    parts = {
        key[5:-2]: 1000 * sum(r[key] for r in windows) / len(windows)
        for key in ("step_data_s", "step_compute_s", "step_optimizer_s")
    }
    return {
        "rate": sum(r["samples"] for r in windows) / sum(r["seconds"] for r in windows),
        "printed": float(printed),
        "windows": [round(r["samples_per_s"]) for r in windows],
        "ms_per_step": parts,
    }


def loop_rate(root: Path, env: dict) -> dict:
    done = subprocess.run([PYTHON, "-c", HAND_LOOP, str(root)], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


# set: (folder, phalanx's extra flags); "loader.py": benchmarks/loader.py's own end-to-end folder and flags
def data_sets() -> dict[str, tuple[Path, list[str]]]:
    sys.path.insert(0, str(HERE))
    from loader import jpeg_folder

    return {
        "loader": (folder("loader"), []),
        "other": (folder("other"), []),
        "loader.py": (jpeg_folder("small-6000"), ["--val-fraction", "0.01"]),
    }


def rates(repeats: int, sets: list[str], threads_set: str | None) -> dict:
    """Per repeat and data set: phalanx and the loop, the order rotating each repeat; on
    ``threads_set`` also phalanx with torch's default intra-op threads (OMP_NUM_THREADS unset: 2 on 2
    cores), with OpenMP's default wait policy and with PASSIVE (idle threads sleep at once)."""
    DATA.mkdir(parents=True, exist_ok=True)
    (DATA / "nothing_model.py").write_text(NOTHING)
    env = {
        **os.environ,
        "PYTHONPATH": f"{REPO}{os.pathsep}{DATA}",
        "PHALANX_CACHE": str(DATA / "cache"),
        "OMP_NUM_THREADS": "1",
    }
    free = {k: v for k, v in env.items() if k != "OMP_NUM_THREADS"}
    chosen = {name: spec for name, spec in data_sets().items() if name in sets}
    raw: dict = {}
    for rep in range(repeats):
        for name, (root, flags) in chosen.items():
            runs = [
                ("phalanx", lambda root=root, flags=flags: phalanx_rate(root, env, flags)),
                ("hand-written loop", lambda root=root: loop_rate(root, env)),
            ]
            if name == threads_set:
                runs.append(
                    ("phalanx, OMP_NUM_THREADS unset", lambda root=root, flags=flags: phalanx_rate(root, free, flags))
                )
                runs.append(
                    (
                        "phalanx, OMP_NUM_THREADS unset, OMP_WAIT_POLICY=PASSIVE",
                        lambda root=root, flags=flags: phalanx_rate(
                            root, {**free, "OMP_WAIT_POLICY": "PASSIVE"}, flags
                        ),
                    )
                )
            shift = rep % len(runs)
            for who, run in runs[shift:] + runs[:shift]:
                load = os.getloadavg()[0]
                result = run()
                raw.setdefault(f"{name}|{who}", []).append({**result, "load": load})
                print(
                    f"[{rep + 1}/{repeats}] {name} {who}: {result['rate']:.0f} samples/s (load {load:.1f})", flush=True
                )
    return raw


# --- the first step: 2,000 against 100,000 small files, the manifest cold and warm ------------------


def tiny_folder(count: int) -> Path:
    """``count`` 24x24 JPEGs (random pixels, PIL at quality 90) in 10 class folders."""
    import io

    import numpy as np
    from PIL import Image

    root = DATA / f"jpeg24-{count}"
    if not (root / "done").exists():
        rng = np.random.default_rng(0)
        for i in range(count):
            path = root / "train" / f"class{i % CLASSES}"
            if i < CLASSES:
                path.mkdir(parents=True, exist_ok=True)
            buffer = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)).save(buffer, "JPEG", quality=90)
            (path / f"{i:07d}.jpg").write_bytes(buffer.getvalue())
        (root / "done").write_text("")
    return root


def first_step(code: Path, root: Path, cache: Path) -> float:
    """Seconds from starting ``phalanx train`` (the phalanx at ``code``) to the end of its first
    optimizer step (its ``first_step`` record), the settings of the rate part, ``--image-size 24``."""
    env = {**os.environ, "PYTHONPATH": f"{code}{os.pathsep}{DATA}", "PHALANX_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        started = time.time()
        done = subprocess.run(
            [
                PYTHON,
                "-m",
                "phalanx.cli",
                "train",
                "--model",
                "nothing_model:model",
                "--dataroot",
                str(root),
                "--image-size",
                "24",
                "--num-workers",
                "0",
                "--epochs",
                "1",
                "--max-steps",
                "1",
                "--batch-size",
                "64",
                "--augment",
                "none",
                "--checkpoints-dir",
                tmp,
                "--name",
                "bench",
                "--no-progress",
            ],
            env=env,
            cwd=tmp,
            capture_output=True,
            text=True,
        )
        if done.returncode:
            raise RuntimeError(f"phalanx train exited {done.returncode}: {done.stderr[-800:]}")
        records = [json.loads(line) for line in (Path(tmp) / "bench" / "metrics.jsonl").read_text().splitlines()]
    return next(r["time"] for r in records if r["kind"] == "first_step") - started


def startup(repeats: int, before: str) -> dict:
    """Per repeat: 2,000 and 100,000 files, a cold manifest cache (new) and a warm one (filled by the
    same phalanx before), this tree and ``before`` (``git archive``), the order rotating."""
    DATA.mkdir(parents=True, exist_ok=True)
    (DATA / "nothing_model.py").write_text(NOTHING)
    old = DATA / f"phalanx-{before}"
    if not old.exists():
        old.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", before], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
    codes = {"this tree": REPO, f"{before}": old}
    roots = {count: tiny_folder(count) for count in (2000, 100_000)}
    raw: dict = {}
    with tempfile.TemporaryDirectory() as caches:
        warm = {}
        for label, code in codes.items():
            for count, root in roots.items():
                warm[label, count] = Path(caches) / f"warm-{len(warm)}"
                first_step(code, root, warm[label, count])  # fills the manifest
        runs = [(label, count, state) for label in codes for count in roots for state in ("cold", "warm")]
        for rep in range(repeats):
            shift = rep % len(runs)
            for label, count, state in runs[shift:] + runs[:shift]:
                load = os.getloadavg()[0]
                if state == "cold":
                    with tempfile.TemporaryDirectory(dir=caches) as cold:
                        seconds = first_step(codes[label], roots[count], Path(cold))
                else:
                    seconds = first_step(codes[label], roots[count], warm[label, count])
                raw.setdefault(f"{label}|{state}|{count}", []).append({"seconds": seconds, "load": load})
                print(
                    f"[{rep + 1}/{repeats}] {label}, {state} manifest, {count:,} files: first step {seconds:.2f} s "
                    f"(load {load:.1f})",
                    flush=True,
                )
    return raw


def markdown(results: dict) -> list[str]:
    cell = lambda s, f: f"{s['median']:{f}} ({s['min']:{f}}-{s['max']:{f}})"  # noqa: E731
    lines = [
        f"{results['date']}, {results['machine']}, commit {results['commit']} with uncommitted changes in the "
        f"tree; load average before the runs: {results.get('load_range', '')}"
    ]
    if "rates" in results:
        lines += [
            "",
            "Epoch 2's samples/s (metrics.jsonl), 160x160 JPEGs to 32 px, a model that costs nothing, "
            f"{results['rate_repeats']} interleaved repeats, medians (min-max):",
            "",
            "| data | contender | samples/s | / the loop, per repeat | ahead in |",
            "| --- | --- | --- | --- | --- |",
        ]
        for key, stat in results["rates"].items():
            data, who = key.split("|")
            ratio = results["ratios"].get(key)
            ahead = results["ahead"].get(key)
            lines.append(
                f"| {data} | {who} | {cell(stat, '.0f')} | {cell(ratio, '.2f') if ratio else 'baseline'} | "
                f"{ahead or ''} |"
            )
    if "startup" in results:
        lines += [
            "",
            f"First step (s from process start), {results['startup_repeats']} interleaved repeats:",
            "",
            "| phalanx | manifest | 2,000 files | 100,000 files | 100,000 - 2,000, per repeat |",
            "| --- | --- | --- | --- | --- |",
        ]
        for key, stat in results["startup_difference"].items():
            label, state = key.split("|")
            small, large = results["startup"][f"{key}|2000"], results["startup"][f"{key}|100000"]
            lines.append(f"| {label} | {state} | {cell(small, '.2f')} | {cell(large, '.2f')} | {cell(stat, '.2f')} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--only", choices=("rates", "startup"))
    parser.add_argument(
        "--sets", nargs="+", default=["loader", "other", "loader.py"], choices=["loader", "other", "loader.py"]
    )
    parser.add_argument(
        "--threads-set",
        default="other",
        help="the set also run with torch's default threads (OMP_NUM_THREADS unset); 'none': no such runs",
    )
    parser.add_argument("--before", default="HEAD", help="the committed phalanx the first step is compared with")
    opts = parser.parse_args()
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    before = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", opts.before], capture_output=True, text=True, check=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "phalanx"], capture_output=True, text=True
    ).stdout.strip()
    results: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "commit": commit,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
    }
    results["provenance"] = {
        "date": time.strftime("%Y-%m-%d"),
        "commit": commit + (" + uncommitted changes" if dirty else ""),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
    }
    loads = []
    if opts.only in (None, "rates"):
        raw = rates(opts.repeats, opts.sets, None if opts.threads_set == "none" else opts.threads_set)
        results["rate_repeats"] = opts.repeats
        results["rates"] = {k: summary([r["rate"] for r in v]) for k, v in raw.items()}
        results["ratios"], results["ahead"] = {}, {}
        for key, runs in raw.items():
            data, who = key.split("|")
            if who != "hand-written loop":
                per = [a["rate"] / b["rate"] for a, b in zip(runs, raw[f"{data}|hand-written loop"])]
                results["ratios"][key] = summary(per)
                results["ahead"][key] = f"{sum(r > 1 for r in per)} of {len(per)}"
        results["rates_raw"] = raw
        loads += [r["load"] for v in raw.values() for r in v]
    if opts.only in (None, "startup"):
        raw = startup(opts.repeats, before)
        results["startup_repeats"] = opts.repeats
        results["startup"] = {k: summary([r["seconds"] for r in v]) for k, v in raw.items()}
        results["startup_difference"] = {}
        for key in raw:
            label, state, count = key.split("|")
            if count == "100000":
                small = raw[f"{label}|{state}|2000"]
                results["startup_difference"][f"{label}|{state}"] = summary(
                    [a["seconds"] - b["seconds"] for a, b in zip(raw[key], small)]
                )
        results["startup_raw"] = raw
        loads += [r["load"] for v in raw.values() for r in v]
    results["load_range"] = f"{min(loads):.1f}-{max(loads):.1f} (median {statistics.median(loads):.1f})"
    out = HERE / "results"
    name = "input_rate" + (f"-{opts.only}" if opts.only else "")
    (out / f"{name}.json").write_text(json.dumps(results, indent=2))
    (out / f"{name}.md").write_text("\n".join(markdown(results)) + "\n")
    print("\n".join(markdown(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

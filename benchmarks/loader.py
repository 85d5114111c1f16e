"""The input pipeline: decode throughput, time to first step and loader memory (run by hand).

    .venv/bin/python benchmarks/loader.py                      # everything, about 30 minutes on 2 cores
    .venv/bin/python benchmarks/loader.py --only throughput --repeats 7

Throughput: the same generated JPEG folders (small: 160x160 to 32 px; large: 600x500 to 224 px),
the same random 1,500 images, decode + resize + centre crop + normalise, batch 64, with 1 and 2
loader workers: phalanx's folder data set; torchvision's ImageFolder with v2 transforms (the PIL
path every peer ships); torchvision's decode_jpeg with v2 transforms; and phalanx's training
view with each augmentation recipe. Contenders are interleaved and repeated; medians with min-max.

End to end: training a model that costs nothing (AdaptiveAvgPool2d(8) + Linear) on small JPEG
folders (160x160, 3,000 and 6,000 images), one process, no loader workers, one thread, batch 64,
SGD: a hand-written loop (``decode_jpeg`` + ``v2.Resize((32, 32))`` + normalise + a step) against
``phalanx train`` with ``--augment none`` and with ``--no-fast-decode``; the same loop with
torchvision's ``v2.RandomCrop(32, padding=4)`` and ``v2.RandomHorizontalFlip()`` (on the uint8
image, before the float conversion, as its docs order them) against phalanx's default augmentation
(basic: the same pad-crop and flip); each a fresh process, samples/s of its second epoch (the first
warms up).

Startup: ``phalanx train --num-workers 2`` on folders of 10,000 and 100,000 small files, from process
start to the first optimizer step, and the private memory (USS) of each loader worker after 50
batches, for this phalanx and for the one before the input-pipeline work (``--before REV``).
Results: benchmarks/results/loader.{json,md}.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests" / "support"))
from phalanx_testdata import photo  # noqa: E402  (the same generated JPEGs as the tests)

DATA = HERE / ".data"
PYTHON = sys.executable
SETS = {"small": (160, 160, 32), "large": (600, 500, 224), "small-6000": (160, 160, 32)}
IMAGES_PER_CLASS, CLASSES, SAMPLE = 300, 10, 1500
PER_CLASS = {"small-6000": 600}  # the other sets: IMAGES_PER_CLASS


def jpeg_folder(name: str) -> Path:
    width, height, _ = SETS[name]
    root = DATA / f"jpeg-{name}"
    per_class = PER_CLASS.get(name, IMAGES_PER_CLASS)
    if not (root / "done").exists():
        for c in range(CLASSES):
            folder = root / "train" / f"class{c}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                (folder / f"{i:05d}.jpg").write_bytes(photo(width, height, c * per_class + i))
        (root / "done").write_text("")
    return root


def small_files_folder(count: int) -> Path:
    """``count`` tiny PNGs in 100 classes (the per-file costs, not the decoding, are measured)."""
    from PIL import Image

    root = DATA / f"files-{count}"
    if not (root / "done").exists():
        image = Image.new("RGB", (8, 8), (90, 120, 150))
        buffer = io.BytesIO()
        image.save(buffer, "PNG")
        for i in range(count):
            folder = root / "train" / f"class{i % 100:03d}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{i:07d}.png").write_bytes(buffer.getvalue())
        (root / "done").write_text("")
    return root


# --- throughput: each contender in a fresh process -----------------------------------------------

CONTENDER = r"""
import sys, time, torch, json
from torch.utils.data import DataLoader
name, root, size, workers, sample = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(1)
mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
if name.startswith("phalanx"):
    from phalanx.config import RunConfig
    from phalanx.data import build_datasets
    augment = name.split(" ", 1)[1] if " " in name else "none"
    data = build_datasets(RunConfig.flat(dataroot=root, image_size=size, augment=augment, normalize="imagenet",
                                    val_fraction=0.01, fast_decode=True), 3)
    dataset = data.train
    keyed = augment != "none"
else:
    from torchvision.transforms import v2
    prepare = [v2.Resize(size, antialias=True), v2.CenterCrop(size), v2.ToDtype(torch.float32, scale=True),
               v2.Normalize(mean, std)]
    if name == "torchvision ImageFolder":
        from torchvision.datasets import ImageFolder
        dataset = ImageFolder(root + "/train", transform=v2.Compose([v2.PILToTensor(), *prepare]))
    else:  # decode_jpeg
        from torchvision.datasets import ImageFolder
        from torchvision.io import decode_jpeg, read_file
        files = ImageFolder(root + "/train").samples
        class Jpeg(torch.utils.data.Dataset):
            transform = v2.Compose(prepare)
            def __len__(self): return len(files)
            def __getitem__(self, i): return self.transform(decode_jpeg(read_file(files[i][0]))), files[i][1]
        dataset = Jpeg()
    keyed = False
order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0))[:sample].tolist()
indices = [(1, i) for i in order] if keyed else order
loader = DataLoader(dataset, batch_size=64, sampler=indices, num_workers=workers)
started = time.perf_counter()
count = sum(len(labels) for _, labels in loader)
print(json.dumps({"images_per_s": count / (time.perf_counter() - started)}))
"""


def throughput(repeats: int, sets: list[str]) -> dict:
    names = [
        "phalanx",
        "torchvision ImageFolder",
        "torchvision decode_jpeg",
        "phalanx basic",
        "phalanx trivialaugment",
        "phalanx randaugment",
        "phalanx autoaugment",
    ]
    raw: dict = {}
    env = {**os.environ, "PYTHONPATH": str(REPO), "PHALANX_CACHE": str(DATA / "cache")}
    for data_set in sets:
        size = SETS[data_set][2]
        root = jpeg_folder(data_set)
        for workers in (1, 2):
            for rep in range(repeats):  # interleaved: each contender once, then again
                for name in names:
                    if name.startswith("phalanx ") and workers == 2:
                        continue  # recipes: images/s per worker
                    done = subprocess.run(
                        [PYTHON, "-c", CONTENDER, name, str(root), str(size), str(workers), str(SAMPLE)],
                        env=env,
                        capture_output=True,
                        text=True,
                        check=True,
                    )
                    value = json.loads(done.stdout.strip().splitlines()[-1])["images_per_s"]
                    raw.setdefault(f"{data_set}|{workers}|{name}", []).append(value)
                    print(
                        f"[{data_set} {workers} worker(s) {rep + 1}/{repeats}] {name}: {value:.0f} images/s", flush=True
                    )
    return raw


# --- end to end: the input path with a training step that costs nothing ---------------------------

NOTHING = """import torch
def model(num_classes, in_channels):
    return torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(8), torch.nn.Flatten(),
                               torch.nn.Linear(in_channels * 64, num_classes))
"""

HAND_LOOP = r"""
import sys, time, torch
from torch.utils.data import DataLoader, Dataset
from torchvision.datasets import ImageFolder
from torchvision.io import decode_jpeg, read_file
from torchvision.transforms import v2
torch.set_num_threads(1)
files = ImageFolder(sys.argv[1] + "/train").samples
augment = [v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip()] if sys.argv[2] == "pad-crop-flip" else []
prepare = v2.Compose([v2.Resize((32, 32), antialias=True), *augment, v2.ToDtype(torch.float32, scale=True),
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
print(count / (time.perf_counter() - started))
"""

# name: the hand-written loop's augmentation (a str), or phalanx's flags (a list)
END_TO_END = {
    "hand-written loop": "none",
    "phalanx --augment none": ["--augment", "none"],
    "phalanx --augment none --no-fast-decode": ["--augment", "none", "--no-fast-decode"],
    "hand-written loop, torchvision pad-crop + flip": "pad-crop-flip",
    "phalanx default (basic: pad-crop + flip)": [],
}
BASELINE = {"phalanx default (basic: pad-crop + flip)": "hand-written loop, torchvision pad-crop + flip"}
END_TO_END_SETS = ("small", "small-6000")


def end_to_end(repeats: int) -> dict:
    (DATA / "nothing_model.py").write_text(NOTHING)
    env = {
        **os.environ,
        "PYTHONPATH": f"{REPO}{os.pathsep}{DATA}",
        "PHALANX_CACHE": str(DATA / "cache"),
        "OMP_NUM_THREADS": "1",
    }
    raw: dict = {}
    roots = {name: jpeg_folder(name) for name in END_TO_END_SETS}
    names = list(END_TO_END)
    for rep in range(repeats):
        for data_set, root in roots.items():
            for name in names[rep % len(names) :] + names[: rep % len(names)]:  # the order rotates each repeat
                flags = END_TO_END[name]
                raw.setdefault(f"{data_set}|{name}", []).append(_end_to_end_rate(root, flags, env))
                print(
                    f"[end to end {rep + 1}/{repeats}] {data_set} {name}: {raw[f'{data_set}|{name}'][-1]:.0f} "
                    "samples/s",
                    flush=True,
                )
    return raw


def _end_to_end_rate(root: Path, flags: str | list[str], env: dict) -> float:
    """One fresh process's samples/s in its second epoch: the hand-written loop (``flags``: its
    augmentation) or phalanx train (``flags``: its options)."""
    import re

    if isinstance(flags, str):
        done = subprocess.run(
            [PYTHON, "-c", HAND_LOOP, str(root), flags], env=env, capture_output=True, text=True, check=True
        )
        return float(done.stdout.strip().splitlines()[-1])
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
                "--val-fraction",
                "0.01",
                "--checkpoints-dir",
                tmp,
                "--no-progress",
                *flags,
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    return float(re.search(r"epoch 2/2 .* ([\d,]+) samples/s", done.stdout).group(1).replace(",", ""))


# --- startup: time to first step, and loader workers' private memory ------------------------------


def uss_mb(pid: int) -> float:
    total = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(("Private_Clean:", "Private_Dirty:")):
            total += int(line.split()[1])
    return total / 1024


def first_step(pythonpath: Path, root: Path, cache: Path) -> dict:
    """Seconds from process start to the first optimizer step, then the loader workers' USS after
    50 more batches (the sampler touches 3,200 random samples of the list)."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "ck" / "bench" / "metrics.jsonl"
        env = {**os.environ, "PYTHONPATH": str(pythonpath), "PHALANX_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
        argv = [
            PYTHON,
            "-m",
            "phalanx.cli",
            "train",
            "--dataroot",
            str(root),
            "--num-workers",
            "2",
            "--epochs",
            "1",
            "--batch-size",
            "64",
            "--image-size",
            "8",
            "--checkpoints-dir",
            str(Path(tmp) / "ck"),
            "--name",
            "bench",
            "--log-every",
            "1",
            "--no-progress",
            "--val-fraction",
            "0.01",
        ]
        started = time.time()
        proc = subprocess.Popen(argv, env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            first = None
            while first is None or _steps(metrics) < 50:
                if proc.poll() is not None:
                    raise RuntimeError(f"phalanx exited {proc.returncode}: {proc.stderr.read()[-500:]}")
                if first is None and metrics.exists():
                    first = next((r["time"] for r in _records(metrics) if r["kind"] == "first_step"), None)
                time.sleep(0.05)
            children = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
            workers = [uss_mb(pid) for pid in children]
            return {"first_step_s": first - started, "worker_uss_mb": max(workers), "main_uss_mb": uss_mb(proc.pid)}
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)


def _records(metrics: Path) -> list[dict]:
    return [json.loads(line) for line in metrics.read_text().splitlines() if line.strip().endswith("}")]


def _steps(metrics: Path) -> int:
    return sum(r["kind"] == "train" for r in _records(metrics)) if metrics.exists() else 0


def startup(repeats: int, before: str) -> dict:
    old = DATA / f"phalanx-{before}"
    if not old.exists():
        old.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", before], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
    raw: dict = {}
    for count in (10_000, 100_000):
        root = small_files_folder(count)
        for rep in range(repeats):
            for label, path in (("before", old), ("after", REPO)):
                # A fresh manifest cache each time: the first run of a new folder, the worst case.
                with tempfile.TemporaryDirectory() as cache:
                    result = first_step(path, root, Path(cache))
                raw.setdefault(f"{count}|{label}", []).append(result)
                print(
                    f"[{count} files {rep + 1}/{repeats}] {label}: first step {result['first_step_s']:.1f} s, "
                    f"worker USS {result['worker_uss_mb']:.0f} MB",
                    flush=True,
                )
            with tempfile.TemporaryDirectory() as cache:  # after, with the manifest already built
                first_step(REPO, root, Path(cache))
                result = first_step(REPO, root, Path(cache))
            raw.setdefault(f"{count}|after, manifest cached", []).append(result)
    return raw


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def markdown(results: dict) -> str:
    def cell(s: dict, fmt: str) -> str:
        return f"{s['median']:{fmt}} ({s['min']:{fmt}}-{s['max']:{fmt}})"

    lines = [f"{results['date']}, {results['machine']}"]
    if "throughput" in results:
        lines += ["", "| images | workers | contender | images/s |", "| --- | --- | --- | --- |"]
        for key, stat in results["throughput"].items():
            data_set, workers, name = key.split("|")
            width, height, size = SETS[data_set]
            lines.append(f"| {width}x{height} -> {size} | {workers} | {name} | {cell(stat, '.0f')} |")
    if "end_to_end" in results:
        lines += [
            "",
            "| training on 160x160 JPEGs -> 32, nothing to compute | images | samples/s | "
            "/ its hand-written loop, per repeat |",
            "| --- | --- | --- | --- |",
        ]
        ratios = results.get("end_to_end_ratios", {})
        for key, stat in results["end_to_end"].items():
            data_set, name = key.split("|")
            images = CLASSES * PER_CLASS.get(data_set, IMAGES_PER_CLASS)
            ratio = ratios.get(key)
            lines.append(
                f"| {name} | {images:,} | {cell(stat, '.0f')} | {cell(ratio, '.2f') if ratio else 'baseline'} |"
            )
    if "startup" in results:
        lines += ["", "| files | phalanx | first step (s) | loader worker USS (MB) |", "| --- | --- | --- | --- |"]
        for key, stats in results["startup"].items():
            count, label = key.split("|")
            lines.append(
                f"| {int(count):,} | {label} | {cell(stats['first_step_s'], '.1f')} | "
                f"{cell(stats['worker_uss_mb'], '.0f')} |"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--only", choices=("throughput", "endtoend", "startup"))
    parser.add_argument("--before", default="0224ace", help="the phalanx to compare startup with")
    parser.add_argument(
        "--sets", nargs="+", default=list(SETS), choices=list(SETS), help="the folders of the throughput part"
    )
    opts = parser.parse_args()
    import platform

    results: dict = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
    }
    if opts.only in (None, "throughput"):
        raw_throughput = throughput(opts.repeats, opts.sets)
        results["throughput"] = {k: summary(v) for k, v in raw_throughput.items()}
        results["throughput_raw"] = raw_throughput
    if opts.only in (None, "endtoend"):
        raw_rates = end_to_end(opts.repeats)
        results["end_to_end"] = {k: summary(v) for k, v in raw_rates.items()}
        results["end_to_end_raw"] = raw_rates
        results["end_to_end_ratios"] = {  # each phalanx row over its loop's rate of the same repeat
            key: summary(
                [
                    a / b
                    for a, b in zip(
                        rates, raw_rates[f"{key.split('|')[0]}|{BASELINE.get(key.split('|')[1], 'hand-written loop')}"]
                    )
                ]
            )
            for key, rates in raw_rates.items()
            if key.split("|")[1].startswith("phalanx")
        }
    if opts.only in (None, "startup"):
        raw = startup(max(1, opts.repeats // 2), opts.before)
        results["startup"] = {k: {m: summary([r[m] for r in rs]) for m in rs[0]} for k, rs in raw.items()}
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    some_sets = opts.only == "throughput" and set(opts.sets) != set(SETS)
    suffix = (f"-{opts.only}" if opts.only else "") + ("-" + "-".join(opts.sets) if some_sets else "")
    (out / f"loader{suffix}.json").write_text(json.dumps(results, indent=2))
    (out / f"loader{suffix}.md").write_text(markdown(results))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Self-supervised pretraining: phalanx ``--task simclr`` against the same SimCLR written with Lightly,
and what the pretraining gives a classifier with few labels (run by hand; about 30 minutes on 2 cores).

    .venv/bin/python benchmarks/selfsupervised.py [--repeats 7] [--only speed|transfer]

Speed and kNN accuracy: the built-in digits as 32x32 RGB PNG folders (1,438 to train, 359 to
validate), the backbone phalanx's smallcnn without its last layer, a projection head Linear-BN-ReLU-
Linear (128-128-128), NT-Xent at temperature 0.5, SGD 0.06 (momentum 0.9, weight decay 5e-4, cosine),
batch 128 (2 x 64 under DDP), 10 epochs, one compute thread a process. The Lightly contender is a plain
loop (and a DDP loop under torchrun) with Lightly's SimCLRTransform, SimCLRProjectionHead, NTXentLoss
(``gather_distributed=True``) and its benchmarks' kNN (k 200, temperature 0.1). samples/s of the
epochs after the first; kNN accuracy after the last epoch.

Transfer: the digits with 10% of the training split labelled (144 images): a linear probe (frozen
backbone, 20 epochs) and a fine-tune (20 epochs) from the SimCLR backbone above and from a random
one; three seeds each. Results: benchmarks/results/selfsupervised.{json,md}.
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
EPOCHS, BATCH = 10, 128

LIGHTLY_LOOP = r'''
import json, os, sys, time, torch
import torch.distributed as dist
from torch import nn
from torchvision.datasets import ImageFolder
from lightly.loss import NTXentLoss
from lightly.models.modules import SimCLRProjectionHead
from lightly.transforms import SimCLRTransform
from lightly.utils.benchmarking import knn_predict
from phalanx.models import SmallCNN
root, epochs, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
distributed = "RANK" in os.environ
if distributed:
    dist.init_process_group("gloo")
rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
torch.set_num_threads(1)
torch.manual_seed(0)
backbone = SmallCNN(num_classes=10, in_channels=3)
backbone.classifier[3] = nn.Identity()
head = SimCLRProjectionHead(128, 128, 128)
model = nn.Sequential(backbone, head)
if distributed:
    model = nn.parallel.DistributedDataParallel(model)
transform = SimCLRTransform(input_size=32, gaussian_blur=0.0, min_scale=0.08)
train = ImageFolder(root + "/train", transform=transform)
sampler = torch.utils.data.DistributedSampler(train, shuffle=True, seed=0) if distributed else None
loader = torch.utils.data.DataLoader(train, batch_size=batch // world, shuffle=sampler is None, sampler=sampler,
                                     drop_last=True, num_workers=0)
criterion = NTXentLoss(temperature=0.5, gather_distributed=True)
optimizer = torch.optim.SGD(model.parameters(), lr=0.06, momentum=0.9, weight_decay=5e-4)
schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs)
rates = []
for epoch in range(epochs):
    if sampler is not None:
        sampler.set_epoch(epoch)
    started, count = time.perf_counter(), 0
    for (x0, x1), _ in loader:
        loss = criterion(model(x0), model(x1))
        optimizer.zero_grad(); loss.backward(); optimizer.step()
        count += len(x0) * world
    schedule.step()
    rates.append(count / (time.perf_counter() - started))
if rank == 0:
    from torchvision.transforms import v2
    plain = v2.Compose([v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True),
                        v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    def features(split):
        data = ImageFolder(root + "/" + split, transform=plain)
        xs, ys = zip(*[(x, y) for x, y in data])
        with torch.no_grad():
            return nn.functional.normalize(backbone.eval()(torch.stack(xs)), dim=1), torch.tensor(ys)
    bank, bank_labels = features("train")
    query, labels = features("val")
    predicted = knn_predict(query, bank.T, bank_labels, 10, 200, 0.1)[:, 0]
    print(json.dumps({"epoch_rates": rates,
                      "knn_acc": (predicted == labels).float().mean().item()}))
if distributed:
    dist.destroy_process_group()
'''


def after_first(epoch_rates: list[float]) -> float:
    """The median samples/s of the epochs after the first: one statistic, computed here for both
    contenders."""
    return statistics.median(epoch_rates[1:])


def digit_folders() -> Path:
    root = DATA / "digits-rgb"
    if not (root / "done").exists():
        sys.path.insert(0, str(REPO / "tests"))
        from PIL import Image

        from conftest import write_digit_pngs

        write_digit_pngs(root, val=True)
        for png in root.rglob("*.png"):
            Image.open(png).convert("RGB").resize((32, 32), Image.NEAREST).save(png)
        (root / "done").write_text("")
    return root


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PHALANX_CACHE": str(DATA / "cache")}


def phalanx_simclr(root: Path, work: Path, workers: int) -> dict:
    common = ["--task", "simclr", "--dataroot", str(root), "--image-size", "32", "--hidden-dim", "128",
              "--temperature", "0.5", "--blur", "0", "--normalize", "imagenet", "--epochs", str(EPOCHS), "--batch-size",
              str(BATCH // workers), "--num-workers", "0", "--checkpoints-dir", str(work), "--no-progress"]
    command = ["trainlaunch", *common, "--use-torchrun", f"--nproc-per-node {workers}"] if workers > 1 else \
        ["train", *common]
    done = subprocess.run([PYTHON, "-m", "phalanx.cli", *command], env=env(), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    rates = [float(r.replace(",", "")) for r in re.findall(r"([\d,]+) samples/s", done.stdout)]
    val = [json.loads(line) for line in (work / "experiment/metrics.jsonl").read_text().splitlines()
           if '"kind": "val"' in line][-1]
    return {"samples_per_s": after_first(rates), "knn_acc": val["knn_acc"]}


def lightly_simclr(root: Path, workers: int) -> dict:
    argv = [PYTHON, "-c", LIGHTLY_LOOP, str(root), str(EPOCHS), str(BATCH)]
    if workers > 1:
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as script:
            script.write(LIGHTLY_LOOP)
        argv = [PYTHON, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={workers}", script.name,
                str(root), str(EPOCHS), str(BATCH)]
    done = subprocess.run(argv, env=env(), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"samples_per_s": after_first(result["epoch_rates"]), "knn_acc": result["knn_acc"]}


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def speed(repeats: int) -> dict:
    root = digit_folders()
    raw: dict[str, list[dict]] = {}
    for rep in range(repeats):
        for name in ("Lightly loop", "phalanx --task simclr", "Lightly DDP loop, 2 workers", "phalanx DDP, 2 workers"):
            workers = 2 if "2 workers" in name else 1
            with tempfile.TemporaryDirectory() as tmp:
                result = lightly_simclr(root, workers) if name.startswith("Lightly") else \
                    phalanx_simclr(root, Path(tmp), workers)
            raw.setdefault(name, []).append(result)
            print(f"[{rep + 1}/{repeats}] {name}: {result['samples_per_s']:.0f} samples/s, kNN "
                  f"{100 * result['knn_acc']:.1f}%", flush=True)
    return raw


def transfer(seeds: int) -> dict:
    """Linear probe and fine-tune on 10% labels, from a SimCLR backbone and from a random one."""
    raw: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(seeds):
            pretrain = ["--task", "simclr", "--image-size", "16", "--epochs", "20", "--batch-size", "128", "--seed",
                        str(seed), "--checkpoints-dir", tmp, "--name", f"ssl{seed}", "--no-progress"]
            subprocess.run([PYTHON, "-m", "phalanx.cli", "train", *pretrain], env=env(), check=True, capture_output=True)
            for label, extra in (("linear probe, random backbone", ["--freeze-backbone"]),
                                 ("linear probe, SimCLR backbone", ["--freeze-backbone", "--weights",
                                                                    f"{tmp}/ssl{seed}/best.pt"]),
                                 ("fine-tune, random init", []),
                                 ("fine-tune, SimCLR init", ["--weights", f"{tmp}/ssl{seed}/best.pt"])):
                name = f"{label}-{seed}".replace(" ", "_").replace(",", "")
                argv = ["train", "--image-size", "16", "--epochs", "20", "--val-fraction", "0.9", "--batch-size", "16",
                        "--seed", str(seed), "--checkpoints-dir", tmp, "--name", name, "--no-progress", *extra]
                subprocess.run([PYTHON, "-m", "phalanx.cli", *argv], env=env(), check=True, capture_output=True)
                val = [json.loads(line) for line in Path(tmp, name, "metrics.jsonl").read_text().splitlines()
                       if '"kind": "val"' in line][-1]
                raw.setdefault(label, []).append(val["acc"])
                print(f"[seed {seed}] {label}: {100 * val['acc']:.1f}%", flush=True)
    return raw


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--only", choices=("speed", "transfer"))
    opts = parser.parse_args()
    results: dict = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} cores"}
    lines = [f"{results['date']}, {results['machine']}"]
    if opts.only in (None, "speed"):
        raw = speed(opts.repeats)
        base = {"phalanx --task simclr": "Lightly loop", "phalanx DDP, 2 workers": "Lightly DDP loop, 2 workers"}
        results["speed"] = {name: {key: summary([r[key] for r in runs]) for key in runs[0]} for name, runs in raw.items()}
        lines += ["", "| contender | samples/s | / Lightly, per repeat | kNN accuracy |", "| --- | --- | --- | --- |"]
        for name, stats in results["speed"].items():
            ratio = summary([a["samples_per_s"] / b["samples_per_s"] for a, b in zip(raw[name], raw[base[name]])]) \
                if name in base else None
            results["speed"][name]["ratio"] = ratio
            s, k = stats["samples_per_s"], stats["knn_acc"]
            lines.append(f"| {name} | {s['median']:.0f} ({s['min']:.0f}-{s['max']:.0f}) | "
                         + (f"{ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f})" if ratio else "baseline")
                         + f" | {100 * k['median']:.1f}% ({100 * k['min']:.1f}-{100 * k['max']:.1f}) |")
    if opts.only in (None, "transfer"):
        raw_t = transfer(opts.seeds)
        results["transfer"] = {name: summary(values) for name, values in raw_t.items()}
        lines += ["", "| 10% of the digits labelled (144 images), 20 epochs | validation accuracy, median (min-max) |",
                  "| --- | --- |"]
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

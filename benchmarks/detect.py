"""phalanx ``--task detect`` against the loop of torchvision's detection reference (run by hand;
about 25 minutes on 2 cores).

    .venv/bin/python benchmarks/detect.py [--repeats 7]

The same model (torchvision's ``fasterrcnn_mobilenet_v3_large_320_fpn``, from scratch, 4 categories
with the background, resized to 128 px inside the model: ``min_size = max_size = 128``, phalanx's
``--image-size 128``), the same scenes (96 of the built-in digits pasted on 64-pixel canvases, COCO
boxes; tests/support/phalanx_testdata.py), batch 4, SGD 0.01 (momentum 0.9, weight decay 1e-4), no
augmentation, 3 epochs, one compute thread, no loader workers. The reference is the training loop
of torchvision's ``references/detection/engine.py`` written out (the model's losses summed, backward,
step). images/s over the epochs after the first, together. Results: benchmarks/results/detect.{json,md}.
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
EPOCHS, BATCH, MODEL, SIZE = 3, 4, "fasterrcnn_mobilenet_v3_large_320_fpn", 128

REFERENCE = r"""
import json, sys, time, torch
from PIL import Image
import numpy as np
from torchvision.models import get_model
root, epochs, batch, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[5])
torch.set_num_threads(1)
coco = json.load(open(root + "/train/annotations.json"))
boxes = {i["id"]: [] for i in coco["images"]}
for a in coco["annotations"]:
    boxes[a["image_id"]].append(a)
class Scenes(torch.utils.data.Dataset):
    def __len__(self): return len(coco["images"])
    def __getitem__(self, i):
        info = coco["images"][i]
        image = torch.from_numpy(np.asarray(Image.open(root + "/train/images/" + info["file_name"]).convert("RGB")))
        found = boxes[info["id"]]
        xyxy = torch.tensor([[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in found)],
                            dtype=torch.float32).reshape(-1, 4)
        return image.permute(2, 0, 1).float() / 255, {"boxes": xyxy,
                                                       "labels": torch.tensor([a["category_id"] for a in found],
                                                                                dtype=torch.int64)}
torch.manual_seed(0)
model = get_model(sys.argv[4], weights=None, weights_backbone=None, num_classes=4, min_size=size,
                  max_size=size).train()
optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01, momentum=0.9,
                            weight_decay=1e-4)
loader = torch.utils.data.DataLoader(Scenes(), batch_size=batch, shuffle=True, num_workers=0,
                                     collate_fn=lambda b: tuple(zip(*b)))
rates = []
for epoch in range(epochs):
    started, count = time.perf_counter(), 0
    for images, targets in loader:  # references/detection/engine.py's train_one_epoch, without its logger
        losses = sum(loss for loss in model(list(images), list(targets)).values())
        optimizer.zero_grad(); losses.backward(); optimizer.step()
        count += len(images)
    rates.append(count / (time.perf_counter() - started))
print(json.dumps({"epoch_rates": rates}))
"""


def after_first(epoch_rates: list[float]) -> float:
    """images/s over the epochs after the first together (the same statistic for both contenders):
    every epoch has the same number of images, so that is their harmonic mean. The epochs differ in
    cost (epoch 3 runs about 1.6x faster than epoch 2 in both, as the detector learns and its
    sampled proposals change), so a median of two epochs or a best epoch would not compare like
    with like."""
    later = epoch_rates[1:]
    return len(later) / sum(1 / rate for rate in later)


def scenes() -> Path:
    root = DATA / "scenes"
    if not (root / "done").exists():
        sys.path.insert(0, str(REPO / "tests" / "support"))
        from phalanx_testdata import digit_scenes

        digit_scenes(root, {"train": 96, "val": 8})
        (root / "done").write_text("")
    return root


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PHALANX_CACHE": str(DATA / "cache")}


def phalanx(root: Path, work: Path) -> float:
    done = subprocess.run(
        [
            PYTHON,
            "-m",
            "phalanx.cli",
            "train",
            "--task",
            "detect",
            "--model",
            MODEL,
            "--dataroot",
            str(root),
            "--epochs",
            str(EPOCHS),
            "--image-size",
            str(SIZE),
            "--batch-size",
            str(BATCH),
            "--lr",
            "0.01",
            "--warmup-epochs",
            "0",
            "--lr-schedule",
            "constant",
            "--augment",
            "none",
            "--num-workers",
            "0",
            "--checkpoints-dir",
            str(work),
            "--no-progress",
        ],
        env=env(),
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return after_first([float(r.replace(",", "")) for r in re.findall(r"([\d,.]+) samples/s", done.stdout)])


def reference(root: Path) -> float:
    done = subprocess.run(
        [PYTHON, "-c", REFERENCE, str(root), str(EPOCHS), str(BATCH), MODEL, str(SIZE)],
        env=env(),
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return after_first(json.loads(done.stdout.strip().splitlines()[-1])["epoch_rates"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    opts = parser.parse_args()
    root = scenes()
    raw: dict[str, list[float]] = {"torchvision reference loop": [], "phalanx --task detect": []}
    for rep in range(opts.repeats):
        raw["torchvision reference loop"].append(reference(root))
        with tempfile.TemporaryDirectory() as tmp:
            raw["phalanx --task detect"].append(phalanx(root, Path(tmp)))
        print(
            f"[{rep + 1}/{opts.repeats}] reference {raw['torchvision reference loop'][-1]:.2f}, phalanx "
            f"{raw['phalanx --task detect'][-1]:.2f} images/s",
            flush=True,
        )
    ratios = [a / b for a, b in zip(raw["phalanx --task detect"], raw["torchvision reference loop"])]

    def cell(values: list[float], fmt: str) -> str:
        return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"

    lines = [
        f"{time.strftime('%Y-%m-%d')}, {platform.machine()}, {os.cpu_count()} cores; {MODEL}, 96 scenes of 64 px at {SIZE} px, "
        f"batch {BATCH}, {EPOCHS} epochs, {opts.repeats} interleaved repeats",
        "",
        "| contender | images/s | / reference, per repeat |",
        "| --- | --- | --- |",
        f"| torchvision reference loop | {cell(raw['torchvision reference loop'], '.2f')} | baseline |",
        f"| phalanx --task detect | {cell(raw['phalanx --task detect'], '.2f')} | {cell(ratios, '.3f')} |",
    ]
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / "detect.json").write_text(json.dumps({"raw": raw, "ratios": ratios}, indent=2))
    (out / "detect.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""phalanx ``--task deepliif`` beside DeepLIIF 1.2.7's own trainer on DeepLIIF's own model (run by hand).

    .venv/bin/python benchmarks/deepliif_model.py [--repeats 7] [--epochs 3] [--train 64]   # ~30 minutes

The same data (built-in digits as DeepLIIF-shaped samples: a stained, blurred input, 4 modalities
and a red/blue segmentation, 6 panels of 64 px, 64 to train, 20 to validate;
``tests/support/phalanx_testdata.deepliif_samples``),
the same model (DeepLIIF's defaults but for the size: ``resnet_9blocks`` translation generators,
``unet_64`` segmentation generators since ``unet_512`` needs 512 px, 4-layer PatchGANs, 16 filters,
BatchNorm, dropout, zero padding, vanilla/lsgan GAN losses, SmoothL1 and VGG19 x 100 with the same
random VGG19 file in both: ImageNet's is not here), batch 4, Adam 2e-4 (beta1 0.5), a constant
learning rate, no flips, one compute thread and no loader workers for both. DeepLIIF also computes
a VGG loss of the segmentation that its total leaves out; phalanx does not compute it.

Throughput as ``deepliif.py`` measures it (images/s between consecutive epoch ends after the first;
phalanx's includes its validation and checkpoints; its own training-only figure beside it).
Quality: the last epoch's networks of both, loaded into phalanx's networks (DeepLIIF's through
``--weights``' reader) and scored by the same code on the validation images: PSNR of each modality
(the mean), PSNR of the segmentation, and the mean absolute error of DeepLIIF's cell count
(``phalanx.tasks.deepliif.cells``) against the count of the true segmentation. Results:
benchmarks/results/deepliif_model.{json,md}.
"""

from __future__ import annotations

import argparse
import importlib.util
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
SIZE, NGF, BATCH = 64, 16, 4
_spec = importlib.util.spec_from_file_location("translate_benchmark", HERE / "deepliif.py")
translate_benchmark = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(translate_benchmark)


def samples(train: int, val: int = 20) -> Path:
    root = translate_benchmark.DATA / f"deepliif-model-{train}-{val}"
    if not (root / "done").exists():
        sys.path.insert(0, str(REPO / "tests" / "support"))
        from phalanx_testdata import deepliif_samples

        deepliif_samples(root, size=SIZE, per_split={"train": train, "val": val})
        (root / "done").write_text("")
    return root


def run_deepliif(python: str, data: Path, epochs: int, work: Path) -> dict:
    stubs, hub = translate_benchmark.stand_ins()
    env = {
        **os.environ,
        "PYTHONPATH": str(stubs),
        "TORCH_HOME": str(hub),
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    argv = [
        str(Path(python).parent / "deepliif"),
        "train",
        "--dataroot",
        str(data),
        "--name",
        "bench",
        "--checkpoints-dir",
        str(work),
        "--model",
        "DeepLIIF",
        "--modalities-no",
        "4",
        "--net-g",
        "resnet_9blocks",
        "--net-gs",
        "unet_64",
        "--ngf",
        str(NGF),
        "--ndf",
        str(NGF),
        "--preprocess",
        "none",
        "--no-flip",
        "--display-id",
        "0",
        "--no-html",
        "--gpu-ids",
        "-1",
        "--batch-size",
        str(BATCH),
        "--n-epochs",
        str(epochs - 1),
        "--n-epochs-decay",
        "0",
        "--num-threads",
        "0",
        "--save-epoch-freq",
        "1",
    ]  # else DeepLIIF writes latest_net_* after its first epoch only
    images = len(list((data / "train").glob("*.png")))
    rate, _ = translate_benchmark.epoch_rate(argv, env, work, r"^End of epoch", images)
    return {"images_per_s": rate, "training_only": rate, **score(work / "bench", data, hub)}


def run_phalanx(data: Path, epochs: int, work: Path, workers: int) -> dict:
    _, hub = translate_benchmark.stand_ins()
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "TORCH_HOME": str(hub),
        "PHALANX_CACHE": str(translate_benchmark.DATA / "cache"),
    }
    common = [
        "--task",
        "deepliif",
        "--dataroot",
        str(data),
        "--image-size",
        str(SIZE),
        "--net-g",
        "resnet_9blocks",
        "--net-gs",
        "unet_64",
        "--ngf",
        str(NGF),
        "--ndf",
        str(NGF),
        "--batch-size",
        str(BATCH // workers),
        "--augment",
        "none",
        "--lr-schedule",
        "constant",
        "--epochs",
        str(epochs),
        "--num-workers",
        "0",
        "--checkpoints-dir",
        str(work),
        "--no-progress",
    ]
    command = (
        ["trainlaunch", *common, "--use-torchrun", f"--nproc-per-node {workers}"] if workers > 1 else ["train", *common]
    )
    images = len(list((data / "train").glob("*.png")))
    rate, lines = translate_benchmark.epoch_rate(
        [PYTHON, "-m", "phalanx.cli", *command], env, work, r"^epoch \d+/\d+ ", images
    )
    own = [float(r.replace(",", "")) for r in re.findall(r"(\d[\d,]*(?:\.\d+)?) samples/s", "".join(lines))]
    return {
        "images_per_s": rate,
        "training_only": statistics.median(own[1:]),
        **score(work / "experiment" / "latest.pt", data, hub),
    }


SCORE = r"""
import json, sys, torch
from pathlib import Path
import numpy as np
from PIL import Image
from phalanx.config import RunConfig
from phalanx.records.pictures import pixels
from phalanx.tasks.deepliif.task import DeepLIIFTask
from phalanx.tasks.deepliif.cells import count
from phalanx.tasks.translate.image_metrics import psnr, ssim
torch.set_num_threads(1)
source, data, size, ngf = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
cfg = RunConfig.flat(task="deepliif", image_size=size, task_options={"net_g": "resnet_9blocks", "net_gs": "unet_64",
                     "ngf": ngf, "ndf": ngf, "lambda_feat": 0.0})
task = DeepLIIFTask(cfg)
info = {"channels": 3, "modalities": 4, "seg": True}
task.restore_info(info)
models = task.build_models(type("Data", (), {"info": info})())
if source.suffix == ".pt":
    saved = torch.load(source, map_location="cpu", weights_only=True)["models"]
    for name, model in models.items():
        model.load_state_dict(saved[name])
else:
    task.load_weights(models, str(source), None)
for model in models.values():
    model.eval()
psnr_mod = psnr_seg = count_error = n = 0
with torch.no_grad():
    for path in sorted((data / "val").glob("*.png")):
        image = torch.tensor(np.asarray(Image.open(path).convert("RGB")), dtype=torch.float32).permute(2, 0, 1) / 127.5 - 1
        panels = [image[:, :, k * size:(k + 1) * size] for k in range(6)]
        outputs = task.generate(models, panels[0][None])
        psnr_mod += sum(psnr((o.clamp(-1, 1) + 1) / 2, (p[None] + 1) / 2).item() for o, p in zip(outputs[:4], panels[1:5])) / 4
        psnr_seg += psnr((outputs[4].clamp(-1, 1) + 1) / 2, (panels[5][None] + 1) / 2).item()
        truth = count(pixels((panels[5] + 1) / 2), None, "10x")["num_total"]
        found = count(pixels((outputs[4][0] + 1) / 2), None, "10x")["num_total"]
        count_error += abs(found - truth)
        n += 1
print(json.dumps({"PSNR": psnr_mod / n, "seg_PSNR": psnr_seg / n, "count_error": count_error / n}))
"""


def score(source: Path, data: Path, hub: Path) -> dict:
    """The same scoring of either program's last networks, in phalanx's environment."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TORCH_HOME": str(hub)}
    done = subprocess.run(
        [PYTHON, "-c", SCORE, str(source), str(data), str(SIZE), str(NGF)], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--train", type=int, default=64)
    opts = parser.parse_args()
    python = translate_benchmark.deepliif_python()
    data = samples(opts.train)
    raw: dict[str, list[dict]] = {}
    names = ["DeepLIIF 1.2.7", "phalanx"]
    for rep in range(opts.repeats):  # interleaved, the order rotating
        for name in names[rep % 2 :] + names[: rep % 2]:
            with tempfile.TemporaryDirectory() as tmp:
                result = (
                    run_deepliif(python, data, opts.epochs, Path(tmp))
                    if name.startswith("DeepLIIF")
                    else run_phalanx(data, opts.epochs, Path(tmp), 1)
                )
            raw.setdefault(name, []).append(result)
            print(
                f"[{rep + 1}/{opts.repeats}] {name}: {result['images_per_s']:.2f} images/s, PSNR {result['PSNR']:.2f} "
                f"dB, seg PSNR {result['seg_PSNR']:.2f} dB, count error {result['count_error']:.2f}",
                flush=True,
            )
    base = raw["DeepLIIF 1.2.7"]
    summary = translate_benchmark.summary
    results = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "settings": {
            "size": SIZE,
            "ngf": NGF,
            "batch": BATCH,
            "train": opts.train,
            "epochs": opts.epochs,
            "repeats": opts.repeats,
        },
        "contenders": {name: {key: summary([r[key] for r in runs]) for key in runs[0]} for name, runs in raw.items()},
        "ratios": {
            name: summary([r["images_per_s"] / b["images_per_s"] for r, b in zip(runs, base)])
            for name, runs in raw.items()
        },
    }
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / "deepliif_model.json").write_text(json.dumps({**results, "raw": raw}, indent=2))

    def cell(stats: dict, digits: int) -> str:
        return f"{stats['median']:.{digits}f} ({stats['min']:.{digits}f}-{stats['max']:.{digits}f})"

    lines = [
        f"{results['date']}, {results['machine']}; {opts.epochs} epochs of {opts.train} samples, {SIZE} px, batch "
        f"{BATCH}, {opts.repeats} interleaved repeats",
        "",
        "| contender | images/s, epoch end to epoch end | / DeepLIIF, per repeat | images/s, training only | "
        "val PSNR, modalities (dB) | val PSNR, segmentation (dB) | cell count error |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, stats in results["contenders"].items():
        lines.append(
            f"| {name} | {cell(stats['images_per_s'], 2)} | {cell(results['ratios'][name], 2)} | "
            f"{cell(stats['training_only'], 2)} | {cell(stats['PSNR'], 2)} | {cell(stats['seg_PSNR'], 2)} | "
            f"{cell(stats['count_error'], 2)} |"
        )
    (out / "deepliif_model.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

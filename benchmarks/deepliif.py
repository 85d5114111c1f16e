"""phalanx ``--task translate`` beside DeepLIIF's own trainer (run by hand; about 10 minutes on 2 cores).

    .venv/bin/python benchmarks/deepliif.py [--repeats 7] [--epochs 4]

The same pairs (built-in digits, blurred and noisy -> clean, 64 px RGB, 800 to train, 200 to
validate; DIR/train/*.png of [input | target] panels, as DeepLIIF reads them), the same networks
(pix2pix's U-Net ``unet_64`` and 3-layer PatchGAN, 16 filters each, BatchNorm, dropout), batch 8,
Adam 2e-4 (beta1 0.5), a constant learning rate, the same epochs, on the CPU with one compute
thread and no loader workers for both. DeepLIIF's ``G_L1`` is SmoothL1 x 100, phalanx's (pix2pix's)
L1 x 100.

DeepLIIF 1.2.7 runs from PyPI in benchmarks/.venv-deepliif (installed --no-deps beside phalanx's
torch, with the packages it imports; stand-in modules for bioformats and javabridge, which need
Java and are never used here; a VGG19 file of random weights in a private torch hub cache, which
DeepLIIFExt builds and never uses). Throughput: images/s of every epoch after the first
between consecutive epoch ends, as each program's output says them, networks written each epoch
by both. DeepLIIF validates nothing; so the rows compared with it are phalanx without validation
(``--val-every`` beyond the run: the last epoch still validates, and the interval that ends with
it is left out), one process and 2 DDP workers (DeepLIIF's trainlaunch does not run on the CPU);
phalanx with its default validation (200 images every epoch) is a row of its own, with its own
training-only figure beside it. Quality: validation PSNR and SSIM of the last epoch's generator in
eval mode, computed by the same code (phalanx's) for both. Results:
benchmarks/results/deepliif.{json,md}.
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
import venv
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PYTHON = sys.executable
VENV = HERE / ".venv-deepliif"
DATA = HERE / ".data"
COMMON = {"size": 64, "ngf": 16, "ndf": 16, "batch": 8}


def deepliif_python() -> str:
    """DeepLIIF 1.2.7 in a venv of its own that takes torch from phalanx's (a .pth file)."""
    python = VENV / "bin" / "python"
    if not (VENV / "bin" / "deepliif").exists():
        venv.create(VENV, with_pip=True)
        purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
        site = subprocess.check_output([str(python), "-c", purelib], text=True).strip()
        ours = subprocess.check_output([PYTHON, "-c", purelib], text=True).strip()
        Path(site, "phalanx-torch.pth").write_text(ours + "\n")
        env = {**os.environ, "PIP_CONSTRAINT": str(REPO / "constraints.txt")}
        pip = [str(python), "-m", "pip", "install", "--quiet"]
        subprocess.run([*pip, "--no-deps", "deepliif==1.2.7"], check=True, env=env)  # its pins want torch 2.8
        subprocess.run(
            [*pip, "dominate", "scikit-image", "opencv-python-headless", "numba", "dask", "zarr<3", "imagecodecs"],
            check=True,
            env=env,
        )
    return str(python)


def stand_ins() -> tuple[Path, Path]:
    """Empty bioformats/javabridge modules (imported at start, unused), and a torch hub cache with a
    VGG19 of random weights (DeepLIIFExt builds a VGG loss it never uses; the real file is 548 MB)."""
    stubs = DATA / "deepliif-stubs"
    (stubs / "bioformats").mkdir(parents=True, exist_ok=True)
    for name in ("bioformats/__init__.py", "bioformats/omexml.py", "javabridge.py"):
        (stubs / name).touch()
    hub = DATA / "deepliif-torch-home"
    vgg = hub / "hub" / "checkpoints" / "vgg19-dcbb9e9d.pth"
    if not vgg.exists():
        vgg.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                PYTHON,
                "-c",
                f"import torch, torchvision; torch.save(torchvision.models.vgg19().state_dict(), {str(vgg)!r})",
            ],
            check=True,
        )
    return stubs, hub


def pairs() -> Path:
    """RGB pairs from the built-in digits: train/ and val/ of aligned [input | target] panels."""
    root = DATA / "translate-rgb"
    if not (root / "done").exists():
        sys.path.insert(0, str(REPO / "tests" / "support"))
        from phalanx_testdata import translation_pairs
        from PIL import Image

        translation_pairs(root, size=COMMON["size"], per_split={"train": 800, "val": 200})
        for png in root.rglob("*.png"):
            Image.open(png).convert("RGB").save(png)
        (root / "done").write_text("")
    return root


def run_deepliif(python: str, data: Path, epochs: int, work: Path) -> dict:
    stubs, hub = stand_ins()
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
        "DeepLIIFExt",
        "--modalities-no",
        "1",
        "--seg-gen",
        "False",
        "--net-g",
        "unet_64",
        "--net-d",
        "basic",
        "--ngf",
        str(COMMON["ngf"]),
        "--ndf",
        str(COMMON["ndf"]),
        "--preprocess",
        "none",
        "--no-flip",
        "--display-id",
        "0",
        "--no-html",
        "--gpu-ids",
        "-1",
        "--batch-size",
        str(COMMON["batch"]),
        "--n-epochs",
        str(epochs - 1),
        "--n-epochs-decay",
        "0",
        "--num-threads",
        "0",
        "--input-nc",
        "3",
        "--output-nc",
        "3",
        "--save-epoch-freq",
        "1",
    ]  # else DeepLIIF writes latest_net_* after its first epoch only
    images = len(list((data / "train").glob("*.png")))
    rate, _ = epoch_rate(argv, env, work, r"^End of epoch", images)
    # DeepLIIF validates nothing: its training-only rate is its wall-clock rate
    return {"images_per_s": rate, "training_only": rate, **score_deepliif(python, work / "bench", data)}


def epoch_rate(
    argv: list[str], env: dict, cwd: Path, epoch_end: str, images: int, last_left_out: bool = False
) -> tuple[float, list[str]]:
    """Training images per second between consecutive epoch ends, read off the program's output as it
    comes (the median over the epochs after the first; ``last_left_out``: not the last, which
    validates). The same clock for both contenders: DeepLIIF prints whole seconds, and phalanx's own
    figure leaves its validation and checkpoints out."""
    proc = subprocess.Popen(
        argv, env={**env, "PYTHONUNBUFFERED": "1"}, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    ends, lines = [], []
    for line in proc.stdout:
        lines.append(line)
        if re.match(epoch_end, line):
            ends.append(time.perf_counter())
    if proc.wait() != 0:
        raise RuntimeError("".join(lines[-40:]))
    rates = [images / (b - a) for a, b in zip(ends, ends[1:])]
    return statistics.median(rates[:-1] if last_left_out else rates), lines


SCORE_DEEPLIIF = r"""
import json, sys, torch
sys.path.insert(0, sys.argv[3])
from deepliif.models import networks
from phalanx.tasks.translate.image_metrics import psnr, ssim
torch.set_num_threads(1)
net = networks.define_G(3, 3, int(sys.argv[4]), "unet_64", "batch", use_dropout=True)
state = torch.load(sys.argv[1] + "/latest_net_G_1.pth", map_location="cpu", weights_only=True)
net.load_state_dict(state)
net.eval()
from pathlib import Path
from PIL import Image
import numpy as np
total_p = total_s = n = 0
with torch.no_grad():
    for path in sorted(Path(sys.argv[2]).glob("*.png")):
        pixels = torch.tensor(np.asarray(Image.open(path).convert("RGB")), dtype=torch.float32).permute(2, 0, 1)
        side = pixels.shape[1]
        a, b = pixels[:, :, :side] / 127.5 - 1, pixels[:, :, side:2 * side] / 127.5 - 1
        out = (net(a[None]).clamp(-1, 1) + 1) / 2
        total_p += psnr(out, ((b + 1) / 2)[None]).item(); total_s += ssim(out, ((b + 1) / 2)[None]).item(); n += 1
print(json.dumps({"PSNR": total_p / n, "SSIM": total_s / n}))
"""


def score_deepliif(python: str, run: Path, data: Path) -> dict:
    """DeepLIIF's last generator, rebuilt by DeepLIIF's own code, scored by phalanx's PSNR and SSIM."""
    stubs, hub = stand_ins()
    env = {**os.environ, "PYTHONPATH": f"{stubs}{os.pathsep}{REPO}", "TORCH_HOME": str(hub), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [python, "-c", SCORE_DEEPLIIF, str(run), str(data / "val"), str(REPO), str(COMMON["ngf"])],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_phalanx(data: Path, epochs: int, work: Path, workers: int, validate: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PHALANX_CACHE": str(DATA / "cache")}
    common = [
        "--task",
        "translate",
        "--dataroot",
        str(data),
        "--image-size",
        str(COMMON["size"]),
        "--generator",
        "unet_64",
        "--ngf",
        str(COMMON["ngf"]),
        "--ndf",
        str(COMMON["ndf"]),
        "--d-layers",
        "3",
        "--norm",
        "batch",
        "--batch-size",
        str(COMMON["batch"] // workers),
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
        *([] if validate else ["--val-every", str(10 * epochs)]),
    ]
    command = (
        ["trainlaunch", *common, "--use-torchrun", f"--nproc-per-node {workers}"] if workers > 1 else ["train", *common]
    )
    images = len(list((data / "train").glob("*.png")))
    rate, lines = epoch_rate(
        [PYTHON, "-m", "phalanx.cli", *command], env, work, r"^epoch \d+/\d+ ", images, last_left_out=not validate
    )
    own = [float(r.replace(",", "")) for r in re.findall(r"(\d[\d,]*(?:\.\d+)?) samples/s", "".join(lines))]
    val = [
        json.loads(line)
        for line in (work / "experiment" / "metrics.jsonl").read_text().splitlines()
        if '"kind": "val"' in line
    ][-1]
    return {"images_per_s": rate, "training_only": statistics.median(own[1:]), "PSNR": val["PSNR"], "SSIM": val["SSIM"]}


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--epochs", type=int, default=4)  # 2 intervals without validation
    opts = parser.parse_args()
    python = deepliif_python()
    data = pairs()
    raw: dict[str, list[dict]] = {}
    names = ["DeepLIIF 1.2.7", "phalanx", "phalanx, 2 DDP workers", "phalanx, validating every epoch"]
    for rep in range(opts.repeats):  # interleaved: each contender once, then again, the order rotating
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            with tempfile.TemporaryDirectory() as tmp:
                if name.startswith("DeepLIIF"):
                    result = run_deepliif(python, data, opts.epochs, Path(tmp))
                else:
                    result = run_phalanx(
                        data, opts.epochs, Path(tmp), 2 if "DDP" in name else 1, validate="validating" in name
                    )
            raw.setdefault(name, []).append(result)
            print(
                f"[{rep + 1}/{opts.repeats}] {name}: {result['images_per_s']:.1f} images/s, PSNR "
                f"{result['PSNR']:.2f} dB, SSIM {result['SSIM']:.4f}",
                flush=True,
            )
    base = raw["DeepLIIF 1.2.7"]
    results = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "settings": {**COMMON, "epochs": opts.epochs, "repeats": opts.repeats},
        "contenders": {name: {key: summary([r[key] for r in runs]) for key in runs[0]} for name, runs in raw.items()},
        "ratios": {
            name: summary([r["images_per_s"] / b["images_per_s"] for r, b in zip(runs, base)])
            for name, runs in raw.items()
        },
    }
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / "deepliif.json").write_text(json.dumps({**results, "raw": raw}, indent=2))
    lines = [
        f"{results['date']}, {results['machine']}; {opts.epochs} epochs of 800 pairs, 64 px, batch 8, "
        "phalanx validating the last epoch only unless said, "
        f"{opts.repeats} interleaved repeats",
        "",
        "| contender | images/s, epoch end to epoch end | / DeepLIIF, per repeat | images/s, training only | "
        "val PSNR (dB) | val SSIM |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name in names:
        stats = results["contenders"][name]
        ratio = results["ratios"][name]
        lines.append(
            f"| {name} | {stats['images_per_s']['median']:.1f} ({stats['images_per_s']['min']:.1f}-"
            f"{stats['images_per_s']['max']:.1f}) | {ratio['median']:.3f} ({ratio['min']:.3f}-{ratio['max']:.3f}) | "
            f"{stats['training_only']['median']:.1f} ({stats['training_only']['min']:.1f}-"
            f"{stats['training_only']['max']:.1f}) | "
            f"{stats['PSNR']['median']:.2f} ({stats['PSNR']['min']:.2f}-{stats['PSNR']['max']:.2f}) | "
            f"{stats['SSIM']['median']:.4f} ({stats['SSIM']['min']:.4f}-{stats['SSIM']['max']:.4f}) |"
        )
    (out / "deepliif.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

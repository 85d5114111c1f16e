"""``--task translate`` (pix2pix, DeepLIIF's job) on paired PNGs made from phalanx's built-in digits:
exact under DDP against a hand-written pix2pix loop, a translation that is learned, both layouts,
tiled prediction, evaluate and export, and one-line errors for bad pairs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import reference
import torch
from conftest import records, run_phalanx, snapshot_tree
from phalanx_testdata import translation_pairs
from PIL import Image

from phalanx.errors import PhalanxError

TINY = [
    "--task",
    "translate",
    "--image-size",
    16,
    "--generator",
    "unet_16",
    "--ngf",
    4,
    "--ndf",
    4,
    "--d-layers",
    2,
    "--no-progress",
]


def pngs(folder: Path) -> torch.Tensor:
    """A folder of aligned [input | target] PNGs as [-1, 1] tensors (N, 2, 1, H, H), read with PIL alone
    (scaled in float32, as a data set hands images over, then widened)."""
    panels = []
    for path in sorted(folder.glob("*.png")):
        pixels = (np.asarray(Image.open(path), dtype=np.float32) / np.float32(127.5) - np.float32(1)).astype(np.float64)
        side = pixels.shape[0]
        panels.append([pixels[:, i * side : (i + 1) * side] for i in range(pixels.shape[1] // side)])
    return torch.tensor(np.array(panels))[:, :, None]


@pytest.mark.slow
def test_float64_ddp_and_fsdp_equal_one_process_and_a_hand_written_pix2pix_loop(tmp_path, phalanx):
    from phalanx.checkpoint.sharded import load_whole
    from phalanx.tasks.translate.nets import build_discriminator, build_generator

    data = translation_pairs(tmp_path / "data", size=16, per_split={"train": 40, "val": 8})
    common = [
        *TINY,
        "--dataroot",
        data,
        "--norm",
        "instance",
        "--no-dropout",
        "--augment",
        "none",
        "--epochs",
        2,
        "--precision",
        "fp64",
        "--lr",
        1e-3,
        "--checkpoints-dir",
        tmp_path / "ck",
        "--log-every",
        1,
    ]
    # fsdp: every network sharded over the 2 workers, each block's activations recomputed in backward
    for strategy, more in (("ddp", []), ("fsdp", ["--activation-checkpointing"])):
        ddp = run_phalanx(
            "trainlaunch",
            "--name",
            strategy,
            "--strategy",
            strategy,
            "--batch-size",
            4,
            *common,
            *more,
            "--use-torchrun",
            "--nproc-per-node=2",
        )
        assert ddp.code == 0, ddp.err
    assert phalanx("train", "--name", "single", "--batch-size", 8, *common).code == 0
    pairs = pngs(data / "train")
    torch.manual_seed(0)
    generator = build_generator("unet_16", 1, 1, 4, "instance", False).double()
    discriminator = build_discriminator(2, 4, 2, "instance").double()
    expected_g, expected_d = reference.train_pix2pix(
        generator, discriminator, pairs[:, 0], pairs[:, 1], epochs=2, global_batch=8, lr=1e-3
    )
    for run in ("ddp", "fsdp", "single"):
        saved = load_whole(tmp_path / "ck" / run / "latest.pt", "--checkpoint")  # fsdp's: sharded
        assert reference.max_difference(saved["models"]["generator"], expected_g) < 1e-12
        assert reference.max_difference(saved["models"]["discriminator"], expected_d) < 1e-12
    for run in ("ddp", "fsdp"):  # validation (under fsdp, of the networks gathered whole) as one process's
        for a, b in zip(records(tmp_path / "ck" / run, "val"), records(tmp_path / "ck/single", "val"), strict=True):
            assert a["PSNR"] == pytest.approx(b["PSNR"], rel=1e-9) and a["SSIM"] == pytest.approx(b["SSIM"], rel=1e-9)


@pytest.mark.slow
def test_a_translation_that_can_be_learned_is_learned(tmp_path, phalanx):
    # Blurred, noisy digits -> clean ones. The identity (the input as the output) is the baseline.
    data = translation_pairs(tmp_path / "data", size=32, per_split={"train": 800, "val": 200})
    val = pngs(data / "val")
    inputs, targets = (val[:, 0] + 1) / 2, (val[:, 1] + 1) / 2
    baseline = (10 * torch.log10(1 / ((inputs - targets) ** 2).flatten(1).mean(1))).mean().item()
    result = phalanx(
        "train",
        "--task",
        "translate",
        "--dataroot",
        data,
        "--image-size",
        32,
        "--generator",
        "unet_32",
        "--ngf",
        8,
        "--ndf",
        8,
        "--batch-size",
        16,
        "--lr",
        1e-3,
        "--epochs",
        3,
        "--no-progress",
        "--checkpoints-dir",
        tmp_path / "ck",
    )
    assert result.code == 0, result.err
    psnr = [r["PSNR"] for r in records(tmp_path / "ck/experiment", "val")]
    assert max(psnr) > baseline + 3, (baseline, psnr)  # measured here: baseline 21.1 dB, learned 26.7 dB
    evaluated = phalanx("evaluate", "--checkpoint", tmp_path / "ck/experiment/best.pt", "--output", tmp_path / "e.json")
    assert evaluated.code == 0, evaluated.err
    import json

    assert json.loads((tmp_path / "e.json").read_text())["metrics"]["PSNR"] == pytest.approx(max(psnr), rel=1e-9)
    row = evaluated.out.splitlines()[-1].split()  # named as predict's folder for the target
    assert row[0] == "target1" and float(row[2]) == pytest.approx(max(psnr), abs=0.006), evaluated.out
    # --dataroot: a folder of pairs read as one split (no train/ needed)
    other = phalanx(
        "evaluate",
        "--checkpoint",
        tmp_path / "ck/experiment/best.pt",
        "--dataroot",
        data / "val",
        "--output",
        tmp_path / "o.json",
    )
    assert other.code == 0, other.err
    assert json.loads((tmp_path / "o.json").read_text())["metrics"]["PSNR"] == pytest.approx(max(psnr), rel=1e-9)


def test_the_plain_layout_trains_and_predict_translates_an_image_three_times_larger(tmp_path, phalanx):
    data = translation_pairs(tmp_path / "data", layout="plain", size=16, per_split={"train": 32, "val": 8}, targets=2)
    result = phalanx(
        "train", *TINY, "--dataroot", data, "--epochs", 1, "--batch-size", 8, "--checkpoints-dir", tmp_path / "ck"
    )
    assert result.code == 0, result.err
    assert "plain layout, 2 target(s)" in result.out
    saved = torch.load(tmp_path / "ck/experiment/latest.pt", weights_only=True)
    assert set(saved["models"]) == {"generator1", "generator2", "discriminator1", "discriminator2"}
    train = records(tmp_path / "ck/experiment", "train")
    assert {"G_GAN_1", "G_L1_2", "D_real_1", "D_fake_2"} <= train[-1].keys()
    big = (np.random.default_rng(0).random((48, 48)) * 255).astype(np.uint8)
    Image.fromarray(big, "L").save(tmp_path / "big.png")
    (tmp_path / "notes.png").write_text("not an image")
    predicted = phalanx(
        "predict",
        "--checkpoint",
        tmp_path / "ck/experiment/latest.pt",
        tmp_path / "big.png",
        tmp_path / "notes.png",
        "--output",
        tmp_path / "out",
        "--tile-overlap",
        4,
    )
    assert predicted.code == 0, predicted.err
    assert "not an image" in predicted.err
    for target in (1, 2):
        assert Image.open(tmp_path / "out" / f"target{target}" / "big.png").size == (48, 48)


def test_a_tiled_translation_equals_the_untiled_one(tmp_path):
    from phalanx.tasks.translate.tiling import tiled

    # A generator that maps each pixel on its own (no context): tiling must not change its output.
    generator = torch.nn.Sequential(torch.nn.Conv2d(3, 3, 1), torch.nn.Tanh()).double()
    image = torch.rand(1, 3, 96, 80, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        whole = generator(image)
        for overlap in (0, 8, 31):
            assert (tiled(generator, image, 32, overlap) - whole).abs().max() < 1e-5
        small = image[..., :20, :24]  # smaller than a tile: padded, then cropped back
        assert (tiled(generator, small, 32, 8) - generator(small)).abs().max() < 1e-5


def test_ssim_and_psnr_equal_a_direct_implementation(tmp_path):
    from phalanx.tasks.translate.image_metrics import psnr, ssim

    rng = np.random.default_rng(3)
    x = rng.random((2, 1, 24, 20))
    y = np.clip(x + rng.normal(0, 0.1, x.shape), 0, 1)
    # SSIM written out: Gaussian-weighted means, variances and covariance over every 11x11 window.
    coords = np.arange(11) - 5
    g = np.exp(-(coords**2) / (2 * 1.5**2))
    w = np.outer(g, g) / np.outer(g, g).sum()
    expected = []
    for a, b in zip(x[:, 0], y[:, 0]):
        values = []
        for i in range(a.shape[0] - 10):
            for j in range(a.shape[1] - 10):
                pa, pb = a[i : i + 11, j : j + 11], b[i : i + 11, j : j + 11]
                ma, mb = (w * pa).sum(), (w * pb).sum()
                va, vb = (w * pa * pa).sum() - ma**2, (w * pb * pb).sum() - mb**2
                cov = (w * pa * pb).sum() - ma * mb
                values.append(((2 * ma * mb + 1e-4) * (2 * cov + 9e-4)) / ((ma**2 + mb**2 + 1e-4) * (va + vb + 9e-4)))
        expected.append(np.mean(values))
    got = ssim(torch.tensor(x), torch.tensor(y)).numpy()
    assert np.allclose(got, expected, rtol=1e-10)
    mse = ((x - y) ** 2).reshape(2, -1).mean(1)
    assert np.allclose(psnr(torch.tensor(x), torch.tensor(y)).numpy(), 10 * np.log10(1 / mse), rtol=1e-12)


@pytest.mark.slow
def test_export_writes_the_generator_and_it_runs_without_phalanx(tmp_path, phalanx):
    data = translation_pairs(tmp_path / "data", size=16, per_split={"train": 16, "val": 4})
    assert (
        phalanx(
            "train", *TINY, "--dataroot", data, "--epochs", 1, "--batch-size", 8, "--checkpoints-dir", tmp_path / "ck"
        ).code
        == 0
    )
    exported = phalanx(
        "export",
        "--checkpoint",
        tmp_path / "ck/experiment/latest.pt",
        "--output",
        tmp_path / "g.pt2",
        "--format",
        "exported-program",
    )
    assert exported.code == 0, exported.err
    from phalanx.inference.model import load_trained

    images = torch.rand(3, 1, 16, 16) * 2 - 1
    expected = load_trained(str(tmp_path / "ck/experiment/latest.pt")).models["generator"](images)
    torch.save(images, tmp_path / "x.pt")
    code = (
        "import sys, torch; out = torch.export.load(sys.argv[1]).module()(torch.load(sys.argv[2])); "
        "torch.save(out, sys.argv[3]); assert 'phalanx' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code, tmp_path / "g.pt2", tmp_path / "x.pt", tmp_path / "y.pt"], check=True)
    assert (torch.load(tmp_path / "y.pt") - expected).abs().max() < 1e-5
    no_features = phalanx(
        "predict",
        "--checkpoint",
        tmp_path / "ck/experiment/latest.pt",
        data / "val",
        "--features",
        "--output",
        tmp_path / "f.npy",
    )
    assert no_features.code == 2 and "--task translate has no network that makes features" in no_features.err
    assert not (tmp_path / "f.npy").exists()


def _bad_pairs(root: Path) -> dict[str, Path]:
    cases = {}
    for case in ("missing", "sizes", "panels", "count", "aligned_ok"):
        translation_pairs(
            root / case,
            size=16,
            per_split={"train": 6, "val": 2},
            layout="plain" if case in ("missing", "sizes") else "aligned",
        )
        cases[case] = root / case
    (root / "missing/train/B/0002.png").unlink()
    Image.new("L", (20, 16)).save(root / "sizes/train/B/0003.png")
    Image.new("L", (40, 16)).save(root / "panels/train/0004.png")
    Image.new("L", (48, 16)).save(root / "count/train/0004.png")
    return cases


@pytest.mark.slow
@pytest.mark.parametrize(
    "case, words",
    [
        ("missing", "A/0002.png: has no partner B/0002.png"),
        ("sizes", "A/0003.png: is 16x16 but B/0003.png is 20x16"),
        ("panels", "0004.png: is 40x16: not square panels"),
        ("count", "0004.png: has 3 panels where 2 are expected"),
    ],
)
def test_bad_pairs_are_named_in_one_line_with_nothing_written_or_skipped_and_counted(tmp_path, case, words, phalanx):
    data = _bad_pairs(tmp_path / "data")[case]
    result = run_phalanx("train", *TINY, "--dataroot", data, "--epochs", 1, "--checkpoints-dir", tmp_path / "ck")
    assert result.code == 2, result.err
    assert result.err.count("\n") == 1 and result.err.startswith("phalanx: --dataroot: ") and words in result.err
    assert snapshot_tree(tmp_path / "ck") == {}
    skipped = phalanx(
        "train",
        *TINY,
        "--dataroot",
        data,
        "--epochs",
        1,
        "--batch-size",
        4,
        "--skip-broken",
        "--checkpoints-dir",
        tmp_path / "ck",
    )
    assert skipped.code == 0, skipped.err
    assert "1 sample(s) left out" in skipped.out


def test_the_discriminator_check_refuses_exactly_the_sizes_torch_cannot_run():
    from phalanx.tasks.deepliif.nets import discriminator
    from phalanx.tasks.translate.nets import check_discriminator, patch_discriminator

    for layers in range(1, 5):
        for size in range(4, 56):
            try:
                check_discriminator(layers, size)
                refused = False
            except PhalanxError:
                refused = True
            for build in (patch_discriminator, discriminator):  # pix2pix's, and DeepLIIF's
                try:
                    with torch.no_grad():
                        build(2, 1, layers, "batch").eval()(torch.zeros(1, 2, size, size))
                    runs = True
                except RuntimeError:
                    runs = False
                assert refused != runs, (layers, size, build.__name__)

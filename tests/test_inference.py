"""evaluate, predict and export from real checkpoints of short CPU trainings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import near_ties, records, run_phalanx, write_digit_pngs


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 2-epoch run on the built-in digits, with an EMA of its weights."""
    from phalanx.cli import main

    root = tmp_path_factory.mktemp("trained")
    assert main(["train", "--epochs", "2", "--ema-decay", "0.9", "--checkpoints-dir", str(root), "--no-progress"]) == 0
    return root / "experiment"


def test_evaluate_reproduces_the_validation_accuracy_training_recorded(trained, phalanx, tmp_path, monkeypatch):
    monkeypatch.chdir(trained)
    result = phalanx("evaluate", "--checkpoint", "latest.pt", "--output", tmp_path / "r.json")
    assert result.code == 0, result.err
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["checkpoint"] == str((trained / "latest.pt").resolve())  # absolute: the JSON is read elsewhere
    val = records(trained, "val")[-1]
    assert saved["top1"] == val["acc"] and saved["images"] == val["samples"] == 359
    assert saved["loss"] == pytest.approx(val["loss"], rel=1e-6)
    matrix = torch.tensor(saved["confusion_matrix"])
    assert matrix.sum() == 359 and matrix.trace().item() / 359 == saved["top1"]
    assert [row["images"] for row in saved["per_class"].values()] == matrix.sum(1).tolist()
    assert saved["top1"] <= saved["top5"] <= 1
    assert f"top-1 {100 * val['acc']:.2f}%" in result.out and "confusion (rows: true class" in result.out
    ema = phalanx("evaluate", "--checkpoint", trained / "latest.pt", "--ema", "--output", tmp_path / "e.json")
    assert ema.code == 0 and json.loads((tmp_path / "e.json").read_text())["top1"] == val["ema_acc"]


@pytest.mark.slow
def test_ddp_evaluate_counts_every_image_once_and_equals_one_process(trained, tmp_path):
    single = run_phalanx("evaluate", "--checkpoint", trained / "latest.pt", "--output", tmp_path / "one.json")
    assert single.code == 0, single.err
    # `-m phalanx`, as timm's and torchvision's scripts are launched (phalanx/__main__.py)
    ddp = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "-m",
            "phalanx",
            "evaluate",
            "--checkpoint",
            str(trained / "latest.pt"),
            "--output",
            str(tmp_path / "two.json"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert ddp.returncode == 0, ddp.stderr
    one, two = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("one", "two"))
    assert two["world_size"] == 2 and one["world_size"] == 1
    assert two["images"] == one["images"] == 359
    # Exact, but for near-ties of the two best logits (none, here), which other batches may flip.
    flips = sum(
        abs(a - b)
        for row_a, row_b in zip(one["confusion_matrix"], two["confusion_matrix"])
        for a, b in zip(row_a, row_b)
    )
    assert flips <= 2 * near_ties(trained / "latest.pt")
    assert ddp.stdout.count("top-1") == 1  # rank 0 reports


def test_evaluate_on_a_folder_maps_classes_by_name(phalanx, tmp_path):
    data = write_digit_pngs(tmp_path / "data", per_class=15)
    assert (
        phalanx(
            "train",
            "--dataroot",
            data,
            "--image-size",
            16,
            "--augment",
            "none",
            "--epochs",
            4,
            "--checkpoints-dir",
            tmp_path / "ck",
            "--no-progress",
        ).code
        == 0
    )
    test = tmp_path / "test"
    for digit in (3, 7):  # a test folder with two of the ten classes
        (test / f"digit{digit}").mkdir(parents=True)
        for image in sorted((data / "train" / f"digit{digit}").iterdir())[:5]:
            (test / f"digit{digit}" / image.name).write_bytes(image.read_bytes())
    result = phalanx(
        "evaluate",
        "--checkpoint",
        tmp_path / "ck/experiment/latest.pt",
        "--dataroot",
        test,
        "--output",
        tmp_path / "r.json",
    )
    assert result.code == 0, result.err
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["images"] == 10
    assert saved["per_class"]["digit3"]["images"] == 5 and saved["per_class"]["digit0"]["images"] == 0


def test_predict_writes_every_readable_image_and_skips_a_corrupt_one(trained, phalanx, tmp_path):
    folder = write_digit_pngs(tmp_path / "images", per_class=3) / "train"
    (folder / "digit3" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    result = phalanx(
        "predict",
        "--checkpoint",
        trained / "latest.pt",
        folder,
        "--output",
        tmp_path / "p.jsonl",
        "--top-k",
        3,
        "--batch-size",
        8,
    )
    assert result.code == 0, result.err
    assert "broken.png" in result.err and "skipped" in result.err and "30 image(s) predicted, 1 skipped" in result.out
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert len(rows) == 30 and all(len(r["top_k"]) == 3 and r["class"] == r["top_k"][0]["class"] for r in rows)
    right = sum(r["class"] == r["path"].split("/")[-2].removeprefix("digit") for r in rows)
    assert right >= 24  # 16x16 PNGs of the digits, prepared as validation prepares 8x8 ones
    csv = phalanx("predict", "--checkpoint", trained / "latest.pt", folder / "digit1", "--output", tmp_path / "p.csv")
    assert csv.code == 0 and (tmp_path / "p.csv").read_text().startswith("path,class,probability,top_k\n")
    # --output -: the same rows as JSON lines on stdout, for a pipe; what predict says goes to stderr
    piped = phalanx(
        "predict", "--checkpoint", trained / "latest.pt", folder, "--output", "-", "--top-k", 3, "--batch-size", 8
    )
    assert piped.code == 0 and [json.loads(line) for line in piped.out.splitlines()] == rows, piped.out[-500:]
    assert "30 image(s) predicted, 1 skipped; wrote stdout" in piped.err and not (tmp_path / "-").exists()


def features_and_their_reference(phalanx, checkpoint, folder, count: int, seed: int, module_of):
    """``predict --features`` of ``count`` random 8x8 grayscale PNGs written to ``folder``, and by
    hand: the input of the module ``module_of(model)`` picks, caught with a hook on an untouched
    model given the images as validation prepares them ([-1, 1])."""
    import numpy as np
    from PIL import Image

    from phalanx.inference.model import load_trained

    pixels = np.random.default_rng(seed).integers(0, 256, (count, 8, 8), dtype=np.uint8)
    for i, image in enumerate(pixels):
        Image.fromarray(image).save(folder / f"{i}.png")
    result = phalanx("predict", "--checkpoint", checkpoint, folder, "--features", "--output", folder / "features.npy")
    assert result.code == 0, result.err
    model = load_trained(str(checkpoint)).models["model"].eval()
    seen = []
    module_of(model).register_forward_hook(lambda module, args, out: seen.append(args[0]))
    with torch.no_grad():
        model((torch.from_numpy(pixels).float()[:, None] / 255 - 0.5) / 0.5)
    return np.load(folder / "features.npy"), seen[0].numpy()


def test_predict_features_are_the_input_of_the_classifiers_last_layer(trained, phalanx, tmp_path):
    import numpy as np

    def last_linear(model):
        return [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]

    predicted, expected = features_and_their_reference(phalanx, trained / "latest.pt", tmp_path, 5, 0, last_linear)
    names = (tmp_path / "features.txt").read_text().splitlines()
    assert [Path(n).name for n in names] == [f"{i}.png" for i in range(5)]
    assert np.allclose(predicted, expected, atol=1e-5)
    wrong = phalanx(
        "predict", "--checkpoint", trained / "latest.pt", tmp_path, "--features", "--output", tmp_path / "f.csv"
    )
    assert wrong.code == 2 and "must end in .npy" in wrong.err


def test_predict_features_of_a_probe_are_the_backbones_before_the_probes_norm(phalanx, tmp_path):
    import numpy as np

    from phalanx.models.weights import ProbeNorm

    assert (
        phalanx(
            "train", "--freeze-backbone", "--probe-norm", "--epochs", 1, "--checkpoints-dir", tmp_path, "--no-progress"
        ).code
        == 0
    )
    images = tmp_path / "images"
    images.mkdir()
    predicted, expected = features_and_their_reference(
        phalanx,
        tmp_path / "experiment/latest.pt",
        images,
        3,
        1,
        lambda model: next(m for m in model.modules() if isinstance(m, ProbeNorm)),
    )
    assert predicted.shape == (3, 128) and np.allclose(predicted, expected, atol=1e-5)


def test_the_probes_norm_takes_a_batch_of_one_row_and_features_of_any_leading_shape():
    from phalanx.models.weights import ProbeNorm

    norm = ProbeNorm(4).train()
    generator = torch.Generator().manual_seed(0)
    norm(torch.randn(8, 4, generator=generator) * 3 + 5)
    mean, var = norm.running_mean.clone(), norm.running_var.clone()
    one = torch.randn(1, 4, generator=generator)  # an epoch's last batch of one image, in training
    out = norm(one)
    assert torch.equal(norm.running_mean, mean) and torch.equal(norm.running_var, var)
    assert torch.allclose(out, (one - mean) / torch.sqrt(var + norm.eps))
    tokens = torch.randn(2, 3, 4, generator=generator)  # a head that sees (batch, tokens, features)
    norm.eval()
    assert torch.allclose(norm(tokens), norm(tokens.reshape(6, 4)).reshape(2, 3, 4))

"""Training recipes on real images: augmentation, normalisation, starting from weights, EMA, speed
options. Real training on CPU; exactness where it is promised."""

from __future__ import annotations

import math
import signal
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import USER_MODELS, gate, paused, records, release, run_phalanx, start_phalanx, write_digit_pngs

from phalanx.config import RunConfig
from phalanx.data import build_datasets

AUGMENTED = ["--augment", "basic", "--no-hflip", "--image-size", 16]


def recorded(folder: Path) -> dict[str, list[list[str]]]:
    """Per recording file: the ids of the (augmented) training inputs, one list per epoch part."""
    from test_resume import recorded_segments

    return recorded_segments(folder)


@pytest.mark.slow
def test_augmentation_is_seeded_per_sample_the_same_on_any_rank_and_new_each_epoch(tmp_path, phalanx, monkeypatch):
    common = [
        "--model",
        "phalanx_testmodels:recorder",
        *AUGMENTED,
        "--epochs",
        2,
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
    ]
    for name in ("a", "b"):
        monkeypatch.setenv("PHALANX_TEST_RECORD", str(tmp_path / f"rec-{name}"))
        assert phalanx("train", "--name", name, *common).code == 0
    ddp = run_phalanx(
        "trainlaunch",
        "--name",
        "ddp",
        *common,
        "--batch-size",
        16,
        "--use-torchrun",
        "--nproc_per_node 2",
        env={**USER_MODELS, "PHALANX_TEST_RECORD": str(tmp_path / "rec-ddp")},
    )
    assert ddp.code == 0, ddp.err
    (a,), (b,) = recorded(tmp_path / "rec-a").values(), recorded(tmp_path / "rec-b").values()
    assert a == b  # bitwise reproducible
    plain = set(_plain_ids())
    assert len(plain & set(a[0])) < 0.1 * len(a[0])  # augmented (1 in 25 pad-and-crop positions is no shift)
    assert len(set(a[0]) & set(a[1])) < 0.05 * len(a[0])  # a new augmentation each epoch
    ranks = list(recorded(tmp_path / "rec-ddp").values())
    assert not set(ranks[0][0]) & set(ranks[1][0])  # the ranks augment different samples
    for epoch in (0, 1):  # and together exactly what one process does: per-sample seeds
        assert Counter(ranks[0][epoch]) + Counter(ranks[1][epoch]) == Counter(a[epoch])


def _plain_ids():
    from phalanx_testmodels import sample_id

    train = build_datasets(RunConfig.flat(image_size=16, augment="none"), None).train
    return [sample_id(train[i][0]) for i in range(len(train))]


@pytest.mark.slow
def test_a_mid_epoch_resume_continues_the_same_augmented_stream(tmp_path, phalanx, monkeypatch):
    common = [
        "--model",
        "phalanx_testmodels:recorder",
        *AUGMENTED,
        "--epochs",
        2,
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
        "--log-every",
        1,
        "--mixup-alpha",
        0.4,
        "--random-erasing",
        0.5,
    ]
    cut = start_phalanx(
        "train",
        "--name",
        "cut",
        *common,
        env={"PHALANX_TEST_RECORD": str(tmp_path / "rec-cut"), **gate(tmp_path / "gate", 20)},
    )
    try:
        paused(tmp_path / "gate")  # in the 20th step of epoch 1 (of 45)
        cut.send_signal(signal.SIGTERM)
        release(tmp_path / "gate")
        assert cut.wait(timeout=60) == 143
    finally:
        cut.kill()
    monkeypatch.setenv("PHALANX_TEST_RECORD", str(tmp_path / "rec-straight"))
    assert phalanx("train", "--name", "straight", *common).code == 0
    monkeypatch.setenv("PHALANX_TEST_RECORD", str(tmp_path / "rec-cut"))
    assert phalanx("train", "--name", "cut", "--resume", "auto", *common).code == 0
    straight = next(iter(recorded(tmp_path / "rec-straight").values()))
    files = sorted((tmp_path / "rec-cut").iterdir(), key=lambda p: p.stat().st_mtime_ns)  # the cut process first
    first, second = (recorded(tmp_path / "rec-cut")[f.name] for f in files)
    assert first[0] + second[0] == straight[0] and second[1] == straight[1]
    w1, w2 = (torch.load(tmp_path / n / "latest.pt")["model"] for n in ("straight", "cut"))
    assert all(torch.equal(w1[k], w2[k]) for k in w1)


def test_dataset_normalisation_is_computed_once_saved_and_correct(phalanx, tmp_path):
    result = phalanx("train", "--normalize", "dataset", "--epochs", 1, "--checkpoints-dir", tmp_path, "--no-progress")
    assert result.code == 0, result.err
    from phalanx.data.sources import holdout_indices, load_digits

    images, _ = load_digits()
    train = images[holdout_indices(len(images), 0.2, 0)[0]]
    saved = torch.load(tmp_path / "experiment/latest.pt")["data"]  # what training resolved, for inference
    assert saved["mean"] == pytest.approx([train.mean().item()], abs=1e-5)
    assert saved["std"] == pytest.approx([train.std(unbiased=False).item()], abs=1e-5)
    plain = build_datasets(RunConfig.flat(normalize="dataset"), None).train
    stacked = torch.stack([plain[i][0] for i in range(len(plain))])
    assert abs(stacked.mean().item()) < 1e-4 and abs(stacked.std().item() - 1) < 1e-3
    resumed = phalanx(
        "train",
        "--normalize",
        "dataset",
        "--epochs",
        2,
        "--resume",
        "auto",
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
    )
    assert resumed.code == 0, resumed.err


def test_evaluation_crops_the_centre_and_never_squashes(tmp_path):
    from PIL import Image

    from phalanx.data import build_datasets

    folder = tmp_path / "data" / "train" / "bands"
    folder.mkdir(parents=True)
    for i in range(4):  # 40 x 20: red, green (the middle 20 columns), blue
        image = Image.new("RGB", (40, 20), (255, 0, 0))
        image.paste((0, 255, 0), (10, 0, 30, 20))
        image.paste((0, 0, 255), (30, 0, 40, 20))
        image.save(folder / f"{i}.png")
    (tmp_path / "data/train/other").mkdir()
    Image.new("RGB", (20, 20)).save(tmp_path / "data/train/other/0.png")
    data = build_datasets(
        RunConfig.flat(dataroot=str(tmp_path / "data"), image_size=16, normalize="none", val_fraction=0.4), None
    )
    image = data.train[0][0] if data.train[0][1] == 0 else data.train[1][0]
    assert image.shape == (3, 16, 16)
    # All green (a squash would keep red and blue bands at the sides; antialiasing blurs the edge a little).
    assert image[1].min() > 0.9 and image[0].max() < 0.1 and image[2].max() < 0.1


@pytest.mark.parametrize("crop_pct", [0.875, 1.0, 1.15])
def test_the_evaluation_crop_is_torchvisions_resize_and_centre_crop_padding_above_one(crop_pct):
    from torchvision.transforms import v2

    from phalanx.data.transforms import Pipeline, Prepare

    size = 40
    resize = Pipeline(size, "none", crop_pct, (0.0,), (1.0,)).evaluation_resize
    assert resize == {0.875: 45, 1.0: 40, 1.15: 34}[crop_pct]  # timm rounds down: floor(40 / 0.875) = 45
    images = torch.rand(3, 3, 30, 50, generator=torch.Generator().manual_seed(0))
    ours = Prepare(resize, size, (0.0,) * 3, (1.0,) * 3).geometry(images)
    theirs = v2.Compose([v2.Resize(resize, antialias=True), v2.CenterCrop(size)])(images)
    assert ours.shape == theirs.shape == (3, 3, size, size)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


def test_an_evaluation_crop_fraction_outside_its_range_is_one_line(phalanx, tmp_path):
    for value in ("8e-140", "0.4", "1.3"):
        result = phalanx("train", "--val-crop-pct", value, "--dry-run", "--checkpoints-dir", tmp_path)
        assert result.code == 2 and "--val-crop-pct: must be in [0.5, 1.25], or 0 for auto" in result.err, result.err
        assert len(result.err.strip().splitlines()) == 1


def test_fine_tuning_loads_the_backbone_replaces_the_head_and_freezes_bit_for_bit(phalanx, tmp_path):
    digits = write_digit_pngs(tmp_path / "ten", per_class=40)  # RGB PNGs of the ten digits
    # A model with BatchNorm: a frozen backbone keeps its running statistics too.
    common = [
        "--model",
        "phalanx_testmodels:batchnorm",
        "--image-size",
        16,
        "--augment",
        "none",
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
    ]
    assert phalanx("train", "--dataroot", digits, "--epochs", 4, "--name", "pretrained", *common).code == 0
    pretrained = torch.load(tmp_path / "pretrained/latest.pt")["model"]
    three = tmp_path / "three" / "train"  # new classes: the digits 0-2 under other names
    for digit in (0, 1, 2):
        (three / f"class{digit}").mkdir(parents=True)
        for image in sorted((digits / "train" / f"digit{digit}").iterdir()):
            (three / f"class{digit}" / image.name).write_bytes(image.read_bytes())
    result = phalanx(
        "train",
        "--dataroot",
        three.parent,
        "--weights",
        tmp_path / "pretrained/latest.pt",
        "--freeze-backbone",
        "--head-lr-mult",
        3,
        "--epochs",
        3,
        "--name",
        "tuned",
        *common,
    )
    assert result.code == 0, result.err
    assert (
        "7 tensors loaded, 2 replaced (trained on other classes, trained anew: net.5.weight 10x32 -> 3x32" in result.out
    )
    assert "backbone frozen, training net.5 only" in result.out
    tuned = torch.load(tmp_path / "tuned/latest.pt")
    assert any("running_mean" in key for key in tuned["model"])
    for key, value in tuned["model"].items():
        if key.startswith("net.5"):
            assert value.shape[0] == 3
        else:
            assert torch.equal(value, pretrained[key]), key  # frozen: bit for bit
    groups = tuned["optimizers"]["model"]["param_groups"]
    # 96 training images, 3 steps an epoch: the last step starts at progress 2 + 64/96 of 3 epochs.
    head_lr = 3 * 0.1 * 0.5 * (1 + math.cos(math.pi * (2 + 64 / 96) / 3))
    assert [g["lr_mult"] for g in groups] == [3] and groups[0]["lr"] == pytest.approx(head_lr)
    # the run's rate is said as --lr's, without the head's multiple (it showed 3x)
    assert records(tmp_path / "tuned", "train")[-1]["lr"] == pytest.approx(head_lr / 3)
    assert records(tmp_path / "tuned", "val")[-1]["acc"] > 0.45  # above chance (1/3) with the head alone


def test_a_head_trained_on_other_classes_of_the_same_number_starts_anew(phalanx, tmp_path):
    assert phalanx("train", "--epochs", 1, "--name", "digits", "--checkpoints-dir", tmp_path, "--no-progress").code == 0
    folder = write_digit_pngs(tmp_path / "data", per_class=5)  # ten classes too, but named digit0..digit9
    result = phalanx(
        "train",
        "--dataroot",
        folder,
        "--image-size",
        8,
        "--weights",
        tmp_path / "digits/latest.pt",
        "--epochs",
        1,
        "--name",
        "tuned",
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
    )
    assert result.code == 0, result.err
    assert (
        "6 tensors loaded, 2 replaced (trained on other classes, trained anew: classifier.3.weight 10x128" in result.out
    )
    # RGB images: the stem is of another shape, not "trained on other classes" (as it was said)
    from PIL import Image

    for path in folder.rglob("*.png"):
        Image.open(path).convert("RGB").save(path)
    rgb = phalanx(
        "train",
        "--dataroot",
        folder,
        "--image-size",
        8,
        "--weights",
        tmp_path / "digits/latest.pt",
        "--epochs",
        1,
        "--name",
        "rgb",
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
    )
    assert rgb.code == 0, rgb.err
    assert (
        "5 tensors loaded, 3 replaced (the head's for other classes, the rest of another shape, trained anew: "
        "features.0.weight 32x1x3x3 -> 32x3x3x3, classifier.3.weight" in rgb.out
    ), rgb.out


@pytest.mark.slow
def test_torchvision_weights_come_from_the_hub_cache_or_fail_in_one_line(phalanx, tmp_path, monkeypatch):
    import torchvision

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch-home"))
    missing = phalanx(
        "train", "--model", "resnet18", "--weights", "ResNet18_Weights.IMAGENET1K_V1", "--checkpoints-dir", tmp_path
    )
    assert missing.code == 2 and len(missing.err.strip().splitlines()) == 1
    cached = tmp_path / "torch-home/hub/checkpoints/resnet18-f37072fd.pth"
    assert f"put https://download.pytorch.org/models/resnet18-f37072fd.pth at {cached}" in missing.err
    cached.parent.mkdir(parents=True)
    torch.save(torchvision.models.resnet18(num_classes=1000).state_dict(), cached)  # stands in for the download
    result = phalanx(
        "train",
        "--model",
        "resnet18",
        "--weights",
        "ResNet18_Weights.IMAGENET1K_V1",
        "--epochs",
        1,
        "--batch-size",
        128,
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
    )
    assert result.code == 0, result.err
    assert "120 tensors loaded, 2 replaced (another shape, trained anew: fc.weight 1000x512 -> 10x512" in result.out
    assert torch.load(tmp_path / "experiment/latest.pt")["data"]["mean"] == [0.485, 0.456, 0.406]  # auto: imagenet


def test_mixing_and_erasing_change_the_images_the_model_sees(phalanx, tmp_path, monkeypatch):
    from phalanx_testmodels import sample_id

    def seen(name, *extra):
        monkeypatch.setenv("PHALANX_TEST_RECORD", str(tmp_path / f"record-{name}"))
        result = phalanx(
            "train",
            "--model",
            "phalanx_testmodels:recorder",
            "--name",
            name,
            "--epochs",
            1,
            "--augment",
            "none",
            "--image-size",
            16,
            "--val-fraction",
            0.9,
            "--checkpoints-dir",
            tmp_path,
            "--no-progress",
            *extra,
        )
        assert result.code == 0, result.err
        return [
            line[2:]
            for path in (tmp_path / f"record-{name}").iterdir()
            for line in path.read_text().splitlines()
            if line.startswith("T ")
        ]

    train = build_datasets(RunConfig.flat(image_size=16, augment="none", val_fraction=0.9), None).train
    images = {sample_id(train[i][0]) for i in range(len(train))}
    plain = seen("plain")
    assert len(plain) == len(train) and set(plain) <= images  # the check sees plain images...
    for recipe in (["--mixup-alpha", 0.2], ["--cutmix-alpha", 1.0], ["--random-erasing", 0.5]):
        changed = sum(i not in images for i in seen(recipe[0][2:], *recipe))
        assert changed > 0.3 * len(train), recipe  # ...and that each recipe changes most of them (erasing: p 0.5)


def test_label_smoothing_changes_the_loss_and_channels_last_reaches_the_model(phalanx, tmp_path, monkeypatch):
    common = ["--epochs", 1, "--checkpoints-dir", tmp_path, "--no-progress", "--log-every", 1]
    assert phalanx("train", "--name", "plain", *common).code == 0
    assert phalanx("train", "--name", "smooth", "--label-smoothing", 0.1, *common).code == 0
    plain, smooth = (records(tmp_path / n, "train")[0]["loss"] for n in ("plain", "smooth"))
    assert plain != smooth  # the same first batch and weights: only the smoothed targets differ
    monkeypatch.setenv("PHALANX_TEST_RECORD", str(tmp_path / "formats"))
    result = phalanx(
        "train",
        "--name",
        "cl",
        "--model",
        "phalanx_testmodels:format_probe",
        "--channels-last",
        "--dataset",
        "synthetic",
        "--synthetic-samples",
        64,
        "--image-size",
        8,
        *common,
    )  # RGB: 3 channels
    assert result.code == 0, result.err
    assert {p.read_text() for p in (tmp_path / "formats").iterdir()} == {"channels_last"}


def test_ema_is_evaluated_checkpointed_and_resumed_exactly(phalanx, tmp_path):
    common = ["--ema-decay", 0.9, "--lr-schedule", "step", "--checkpoints-dir", tmp_path, "--no-progress"]
    assert phalanx("train", "--name", "straight", "--epochs", 2, *common).code == 0
    assert phalanx("train", "--name", "split", "--epochs", 1, *common).code == 0
    assert phalanx("train", "--name", "split", "--epochs", 2, "--resume", "auto", *common).code == 0
    a, b = (torch.load(tmp_path / n / "latest.pt") for n in ("straight", "split"))
    assert all(torch.equal(a["ema"]["model"][k], b["ema"]["model"][k]) for k in a["ema"]["model"])
    assert not torch.equal(a["ema"]["model"]["classifier.3.weight"], a["model"]["classifier.3.weight"])
    val = records(tmp_path / "straight", "val")
    assert all(0.5 < r["ema_acc"] <= 1 for r in val)


def test_torchvisions_and_timms_own_checkpoints_give_their_weights(phalanx, tmp_path):
    # torchvision's reference scripts save {"model", "optimizer", "lr_scheduler", "epoch", "args" (an
    # argparse Namespace), "model_ema"}; timm's train.py {"state_dict", "state_dict_ema", ...}. Both
    # were refused (the Namespace is not plain data; "model" was not looked for).
    import argparse

    from phalanx.models import SmallCNN

    torch.manual_seed(3)
    weights = SmallCNN(num_classes=10, in_channels=1).state_dict()
    files = {
        "torchvision": {
            "model": weights,
            "model_ema": weights,
            "optimizer": {"state": {}},
            "epoch": 3,
            "args": argparse.Namespace(model="smallcnn", lr=0.1, data_path="/data"),
        },
        "timm": {"state_dict": weights, "state_dict_ema": weights, "epoch": 3, "arch": "smallcnn"},
    }
    said = {
        "torchvision": "(a torchvision reference checkpoint: its 'model'; its model_ema left out)",
        "timm": "(timm's checkpoint: its 'state_dict'; its state_dict_ema left out)",
    }
    for tool, content in files.items():
        torch.save(content, tmp_path / f"{tool}.pth")
        result = phalanx(
            "train",
            "--weights",
            tmp_path / f"{tool}.pth",
            "--max-steps",
            1,
            "--lr",
            1e-9,
            "--weight-decay",
            0,
            "--momentum",
            0,
            "--name",
            tool,
            "--checkpoints-dir",
            tmp_path,
            "--no-progress",
        )
        assert result.code == 0, result.err
        assert (
            f"phalanx: weights {tmp_path / tool}.pth {said[tool]}: {len(weights)} tensors loaded, 0 replaced"
            in result.out
        ), result.out
        trained = torch.load(tmp_path / tool / "latest.pt", weights_only=True)["models"]["model"]
        assert all(
            torch.allclose(trained[k].double(), v.double(), atol=1e-6)
            for k, v in weights.items()
            if "running" not in k and "num_batches" not in k
        )

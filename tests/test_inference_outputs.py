"""What ``evaluate``, ``predict`` and ``export`` write: a file phalanx wrote is replaced, any other only
with ``--overwrite``; images that share a name in different folders each keep their own output;
translate's tiles overlap by a quarter of the training size unless told otherwise. (Refusals, one
line each, are in test_bad_input.py's battery.)"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import snapshot_tree
from phalanx_testdata import digit_scenes, translation_pairs
from PIL import Image

TRANSLATOR = [
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
]
SEGMENTER = ["--task", "segment", "--model", "phalanx_testmodels:tiny_segmenter", "--image-size", 16]


def _train(root, *args) -> str:
    from phalanx.cli import main

    assert main(["train", *map(str, args), "--epochs", "1", "--no-progress", "--checkpoints-dir", str(root)]) == 0
    return str(root / "experiment" / "latest.pt")


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("classifier"))


@pytest.fixture(scope="module")
def translator(tmp_path_factory):
    root = tmp_path_factory.mktemp("translator")
    data = translation_pairs(root / "data", size=16, per_split={"train": 8, "val": 2})
    return _train(root / "ck", *TRANSLATOR, "--dataroot", data, "--batch-size", 8)


@pytest.fixture(scope="module")
def segmenter(tmp_path_factory):
    root = tmp_path_factory.mktemp("segmenter")
    data = digit_scenes(root / "data", {"train": 4, "val": 2}, size=32)
    return _train(root / "ck", *SEGMENTER, "--dataroot", data, "--batch-size", 4)


def _images(folder, names, size=(16, 16), seed=0):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for name in names:
        Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(folder / name)
    return folder


def test_a_file_phalanx_wrote_is_replaced_and_any_other_only_with_overwrite(classifier, phalanx, tmp_path):
    results = tmp_path / "results.json"
    for _ in range(2):  # the second evaluate replaces the first one's results
        done = phalanx("evaluate", "--checkpoint", classifier, "--output", results)
        assert done.code == 0, done.err
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": true}\n')
    refused = phalanx("evaluate", "--checkpoint", classifier, "--output", notes)
    assert refused.code == 2 and "pass --overwrite" in refused.err and notes.read_text() == '{"mine": true}\n'
    replaced = phalanx("evaluate", "--checkpoint", classifier, "--output", notes, "--overwrite")
    assert replaced.code == 0 and json.loads(notes.read_text())["task"] == "classify"
    images = _images(tmp_path / "images", ["a.png", "b.png"], size=(8, 8))
    for output in ("p.csv", "p.jsonl", "f.npy"):  # predict's own files, written twice
        for _ in range(2):
            again = phalanx(
                "predict",
                "--checkpoint",
                classifier,
                images,
                "--output",
                tmp_path / output,
                *(["--features"] if output.endswith(".npy") else []),
            )
            assert again.code == 0, again.err
    for _ in range(2):  # an export and its FILE.json, written twice
        exported = phalanx("export", "--checkpoint", classifier, "--output", tmp_path / "model.ts")
        assert exported.code == 0, exported.err


def test_images_that_share_a_name_in_other_folders_each_keep_their_own_output(translator, segmenter, phalanx, tmp_path):
    data = tmp_path / "data"
    for split in ("train", "val"):
        _images(data / split / "images", ["a.png", "b.png"], seed=len(split))
    given = [data / "train/images", data / "val/images"]
    expected = sorted(f"{split}/images/{name}" for split in ("train", "val") for name in ("a.png", "b.png"))
    for checkpoint, folders in ((segmenter, ("masks", "overlays")), (translator, ("target1",))):
        out = tmp_path / f"out-{folders[0]}"
        result = phalanx("predict", "--checkpoint", checkpoint, *given, "--output", out, "--no-progress")
        assert result.code == 0, result.err
        assert "4 image(s) predicted" in result.out
        for folder in folders:  # as many files as images predicted, each under its input's folders
            assert sorted(str(p.relative_to(out / folder)) for p in (out / folder).rglob("*.png")) == expected
    _images(data / "train/images", ["a.jpg"])  # a.jpg and a.png: both would be a.png
    before = snapshot_tree(tmp_path)
    clash = phalanx("predict", "--checkpoint", segmenter, data / "train/images", "--output", tmp_path / "clash")
    assert clash.code == 2 and len(clash.err.strip().splitlines()) == 1
    assert "would both be written as a.png" in clash.err and snapshot_tree(tmp_path) == before


def test_translate_tiles_overlap_a_quarter_of_the_training_size_and_panels_are_named(
    translator, phalanx, tmp_path, monkeypatch
):
    from phalanx.tasks.translate import inference as translate

    overlaps = []
    real = translate.tiled
    monkeypatch.setattr(
        translate, "tiled", lambda g, image, size, overlap: overlaps.append(overlap) or real(g, image, size, overlap)
    )
    _images(tmp_path / "in", ["big.png"], size=(40, 40))
    _images(tmp_path / "in", ["panel.png"], size=(16, 32))  # input | target, as the training data
    result = phalanx(
        "predict", "--checkpoint", translator, tmp_path / "in", "--output", tmp_path / "out", "--no-progress"
    )
    assert result.code == 0, result.err
    assert overlaps == [4, 4]  # a quarter of the 16 px tiles, not 15 of them (a tile every pixel)
    (warning,) = result.err.strip().splitlines()
    assert "1 image(s) are 2 square panels side by side" in warning and "panel.png" in warning
    overlaps.clear()
    clamped = phalanx(
        "predict",
        "--checkpoint",
        translator,
        tmp_path / "in/big.png",
        "--output",
        tmp_path / "out2",
        "--tile-overlap",
        16,
        "--no-progress",
    )
    assert clamped.code == 0, clamped.err
    assert overlaps == [8] and "--tile-overlap 16 is not smaller than the 16 px tiles" in clamped.err
    assert "using 8" in clamped.err

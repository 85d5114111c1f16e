"""``phalanx prepare-training-data`` against ``deepliif prepare-training-data`` itself (DeepLIIF
1.2.7's ``cli.py`` run unchanged as a process): the same joined images from DeepLIIF's raw layout,
integer for integer, a seeded validation split, and mistakes said in one line with nothing written or replaced."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

CLI = Path(__file__).with_name("deepliif_cli.py")
PANELS = ("IHC", "Hematoxylin", "DAPI", "Lap2", "Marker", "Seg")
# as is, scaled up, scaled down, halved (OpenCV then averages), one side up and one down
SIZES = {"a": (512, 512), "b": (300, 410), "c": (600, 700), "d": (1024, 1024), "e": (37, 900)}


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    """DeepLIIF's raw layout: three images of six panels each, of three sizes, random pixels (every
    interpolation weight shows), the Seg panel grayscale (as masks often are)."""
    folder = tmp_path_factory.mktemp("raw")
    rng = np.random.default_rng(0)
    for stem, (height, width) in SIZES.items():
        for panel in PANELS:
            pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
            image = Image.fromarray(pixels).convert("L") if panel == "Seg" else Image.fromarray(pixels)
            image.save(folder / f"{stem}_{panel}.png")
    return folder


@pytest.mark.slow  # deepliif's own command as a process
def test_the_joined_images_are_deepliifs(tmp_path, raw, phalanx):
    theirs = subprocess.run(
        [sys.executable, CLI, "prepare-training-data", "--input-dir", raw, "--output-dir", tmp_path / "theirs"]
        + ["--validation-ratio", "0"],  # DeepLIIF's split is unseeded: all in train/
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert theirs.returncode == 0, theirs.stderr[-2000:]
    ours = phalanx(
        "prepare-training-data", "--input-dir", raw, "--output-dir", tmp_path / "ours", "--validation-ratio", 0
    )
    assert ours.code == 0 and "wrote 5 images" in ours.out, ours.err
    for stem in SIZES:
        expected = np.asarray(Image.open(tmp_path / "theirs" / "train" / f"{stem}_IHC.png"))
        written = np.asarray(Image.open(tmp_path / "ours" / "train" / f"{stem}_IHC.png"))
        assert written.shape == expected.shape == (512, 512 * 6, 3)
        assert np.array_equal(written, expected), stem
    assert not list((tmp_path / "ours" / "val").iterdir())


def test_the_split_is_seeded_and_a_mistake_writes_nothing(tmp_path, raw, phalanx):
    splits = []
    for run in ("one", "two"):
        done = phalanx(
            "prepare-training-data", "--input-dir", raw, "--output-dir", tmp_path / run, "--validation-ratio", 0.34
        )
        assert done.code == 0 and "wrote 3 images" in done.out and "and 2 to" in done.out, done.out + done.err
        splits.append(sorted(p.name for p in (tmp_path / run / "val").iterdir()))
    assert splits[0] == splits[1] and len(splits[0]) == 2
    # a second run into the same folder replaces nothing
    before = (tmp_path / "one" / "val" / splits[0][0]).read_bytes()
    again = phalanx("prepare-training-data", "--input-dir", raw, "--output-dir", tmp_path / "one", "--size", 64)
    assert again.code == 2 and "exists: nothing written" in again.err, again.err
    assert (tmp_path / "one" / "val" / splits[0][0]).read_bytes() == before
    # a missing partner is named before anything is written
    partial = tmp_path / "partial"
    partial.mkdir()
    for file in raw.iterdir():
        if file.name != "b_Lap2.png":
            (partial / file.name).symlink_to(file)
    missing = phalanx("prepare-training-data", "--input-dir", partial, "--output-dir", tmp_path / "out")
    assert missing.code == 2 and "b_Lap2.png is missing" in missing.err, missing.err
    assert len(missing.err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
    (partial / "b_Lap2.png").write_bytes(b"not an image")
    broken = phalanx("prepare-training-data", "--input-dir", partial, "--output-dir", tmp_path / "out")
    assert broken.code == 2 and "cannot read" in broken.err and "b_Lap2.png" in broken.err, broken.err
    empty = phalanx("prepare-training-data", "--input-dir", tmp_path / "one", "--output-dir", tmp_path / "out2")
    assert empty.code == 2 and "no file whose name holds IHC" in empty.err, empty.err

"""A DeepLIIF model directory as ``--checkpoint``, against DeepLIIF 1.2.7's own ``deepliif test``
(its ``cli.py`` run unchanged as a process, ``tests/deepliif_cli.py``): every output image pixel
for pixel and the cell counts, at its tile size, on an image of several tiles with empty ones and
on one smaller than a tile; its released model's layout; the per-cell data against DeepLIIF's
``compute_cell_results`` on DeepLIIF's own outputs; and what a directory's ``train_opt.txt`` says
reaching a training's options."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import deepliif_reference as reference
import numpy as np
import pytest
from conftest import Result
from PIL import Image

# deepliif test and phalanx predict at 512 px, run as processes: about a minute on 2 cores
pytestmark = pytest.mark.slow
CLI = Path(__file__).with_name("deepliif_cli.py")
# deepliif test writes NAME_KEY.png; phalanx writes KEY/NAME.png. A directory without
# modalities_names gets DeepLIIF's input1, mod1.. names.
MODALITIES = ("mod1", "mod2", "mod3", "mod4")
SEGMENTATIONS = ("Seg", "SegOverlaid", "SegRefined")
RELEASED = dict(zip(MODALITIES, ("Hema", "DAPI", "Lap2", "Marker")))


def tissue(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Smooth colour noise: blobs a few pixels wide, as stained tissue has at this scale."""
    from scipy import ndimage

    noise = ndimage.gaussian_filter(rng.normal(size=(height, width, 3)), (4, 4, 0))
    return ((noise - noise.min()) / (noise.max() - noise.min()) * 255).astype(np.uint8)


@pytest.fixture(scope="module")
def predicted(tmp_path_factory):
    """One model directory (``deepliif_reference.model_directory``, ngf 4), two images predicted
    by ``deepliif test --tile-size 512 --seg-intermediate`` and by ``phalanx predict``; the same
    networks in the released model's layout predicted by phalanx with the first's ``seg_weights``."""
    root = tmp_path_factory.mktemp("deepliif-dir")
    rng = np.random.default_rng(0)
    (root / "images").mkdir()
    wide = tissue(rng, 600, 700)
    wide[60:, 150:] = (205, 200, 210)  # flat: tiles there are empty, and are painted the background
    Image.fromarray(wide).save(root / "images" / "wide.png")
    Image.fromarray(tissue(rng, 200, 300)).save(root / "images" / "small.png")  # one tile, scaled up
    reference.model_directory(root / "model")
    reference.released_layout(root / "model", root / "released")
    theirs = subprocess.run(
        [sys.executable, CLI, "test", "--input-dir", root / "images", "--output-dir", root / "theirs"]
        + ["--tile-size", "512", "--model-dir", root / "model", "--seg-intermediate"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert theirs.returncode == 0, theirs.stdout[-2000:] + theirs.stderr[-2000:]
    common = ["--tile-size", 512, "--seg-intermediate", "--no-progress", root / "images"]
    ours = run_phalanx("predict", "--checkpoint", root / "model", "--output", root / "ours", *common)
    assert ours.code == 0, ours.err
    weights = ",".join(str(w) for w in reference.options().seg_weights)
    released = run_phalanx(
        "predict",
        "--checkpoint",
        root / "released",
        "--output",
        root / "released-out",
        "--seg-weights",
        weights,
        *common,
    )
    assert released.code == 0, released.err
    rewritten = run_phalanx(
        "export", "--checkpoint", root / "model", "--format", "deepliif", "--output", root / "rewritten"
    )
    assert rewritten.code == 0, rewritten.err
    read_back = subprocess.run(
        [sys.executable, CLI, "test", "--input-dir", root / "images", "--output-dir", root / "read-back"]
        + ["--tile-size", "512", "--model-dir", root / "rewritten", "--filename-pattern", "small.png"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert read_back.returncode == 0, read_back.stdout[-2000:] + read_back.stderr[-2000:]
    return root, ours, released


def run_phalanx(*args) -> Result:
    """``phalanx ARGS`` in this process (torch imported once), its output captured."""
    import contextlib
    import io

    from phalanx.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return Result(code, out.getvalue(), err.getvalue())


def pixels(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


@pytest.mark.parametrize("image", ["wide", "small"])
def test_a_model_directory_predicts_what_deepliif_test_writes_pixel_for_pixel(predicted, image):
    root, ours, _ = predicted
    # deepliif test's names for each segmentation network's own output: mod0-input1_s, mod1-mod1_s..
    intermediate = {f"{name}_s": f"mod{k}-{name}_s" for k, name in enumerate(("input1", *MODALITIES))}
    for folder, key in {**{key: key for key in (*MODALITIES, *SEGMENTATIONS)}, **intermediate}.items():
        theirs = pixels(root / "theirs" / f"{image}_{key}.png")
        assert np.array_equal(pixels(root / "ours" / folder / f"{image}.png"), theirs), key
    counts = json.loads((root / "theirs" / f"{image}.json").read_text())
    row = next(r for r in json.loads((root / "ours" / "cells.json").read_text()) if r["image"] == f"{image}.png")
    if image == "wide":
        assert counts["num_total"] > 3, counts  # the networks draw cells: the counts compare something
    assert {key: row[key] for key in counts} == counts
    # the first line says where every setting came from: the file, or DeepLIIF's defaults
    said = ours.err.splitlines()[0]
    assert "is a DeepLIIF model directory (model DeepLIIF)" in said and "latest_net_*.pth" in said, said
    assert "from train_opt.txt: " in said and "ngf 4" in said and "seg_weights 0.25,0.15,0.25,0.1,0.25" in said, said


def test_the_released_models_layout_gives_the_same_networks_deepliifs_names_and_defaults(predicted):
    """The same networks as G1.pt.., G51.pt.. with an older train_opt.txt: DeepLIIF's names for
    them (Hema ... Marker) and its default colours for empty tiles; every other pixel as deepliif
    test's of the first layout (the same seg_weights given on the command line)."""
    root, _, released = predicted
    backgrounds = {"mod1": ((200, 200, 190), (201, 211, 208)), "mod2": ((20, 20, 30), (10, 10, 10))}
    backgrounds.update({"mod3": ((5, 5, 5), (0, 0, 0)), "mod4": ((12, 12, 12), (10, 10, 10))})
    for image in ("wide", "small"):
        for key, name in RELEASED.items():
            theirs = pixels(root / "theirs" / f"{image}_{key}.png")
            ours = pixels(root / "released-out" / name / f"{image}.png")
            painted, default = backgrounds[key]
            empty = (theirs == painted).all(-1)
            assert empty.any() == (image == "wide"), (image, key)  # the flat corner's tiles are empty
            assert (ours[empty] == default).all() and np.array_equal(ours[~empty], theirs[~empty]), (image, name)
        for key in SEGMENTATIONS:
            theirs = pixels(root / "theirs" / f"{image}_{key}.png")
            assert np.array_equal(pixels(root / "released-out" / key / f"{image}.png"), theirs), (image, key)
    said = released.err.splitlines()[0]
    assert "TorchScript G*.pt" in said and "modalities_no 4 (targets_no - 1" in said, said
    assert "modalities_names IHC,Hema,DAPI,Lap2,Marker" in said, said


def test_deepliif_test_reads_the_directory_phalanx_exports_and_predicts_what_it_did(predicted):
    """The first directory read by phalanx and written back (``export --format deepliif``: its
    networks traced again, its train_opt.txt rewritten), then read by ``deepliif test``: the same
    outputs as from the original directory."""
    root, _, _ = predicted
    opt = reference.modules().options.read_model_params(str(root / "rewritten" / "train_opt.txt"))
    assert opt["modalities_names"] == ["input1", *MODALITIES] and opt["ngf"] == 4, opt
    assert opt["background_colors"] == [(200, 200, 190), (20, 20, 30), (5, 5, 5), (12, 12, 12)], opt
    for key in (*MODALITIES, *SEGMENTATIONS):
        again = pixels(root / "read-back" / f"small_{key}.png")
        assert np.array_equal(again, pixels(root / "theirs" / f"small_{key}.png")), key
    counts = json.loads((root / "read-back" / "small.json").read_text())
    assert counts == json.loads((root / "theirs" / "small.json").read_text())


def test_each_cells_data_is_deepliifs_compute_cell_results_of_its_outputs(predicted):
    """Per-cell data (outline, position, size, class) in cells/NAME.json equals what DeepLIIF's
    ``compute_cell_results`` makes of the segmentation and of the marker as its slide reader
    passes it (the channels' maximum; none where no modality is named ...Marker)."""
    root, _, _ = predicted
    postprocessing = reference.postprocessing()
    for image in ("wide", "small"):
        seg = pixels(root / "theirs" / f"{image}_Seg.png").astype(np.int64)
        marker = pixels(root / "released-out" / "Marker" / f"{image}.png").max(-1).astype(np.int64)
        for out, given in (("ours", None), ("released-out", marker)):
            expected = postprocessing.compute_cell_results(seg, given, "40x")
            expected = json.loads(json.dumps(expected, default=lambda o: o.item() if hasattr(o, "item") else list(o)))
            written = json.loads((root / out / "cells" / f"{image}.json").read_text())
            assert written == expected, (image, out)
            if image == "wide":
                markers = [cell["marker"] for cell in expected["cells"]]
                assert len(markers) > 3 and (given is None) == (max(markers) == 0), markers


def test_bad_directories_are_named_in_one_line(tmp_path, predicted):
    root, _, _ = predicted
    model = tmp_path / "model"
    model.mkdir()
    for file in (root / "model").iterdir():
        if file.name != "latest_net_G3.pth" and file.name != "G3.pt":
            (model / file.name).symlink_to(file)
    missing = run_phalanx("predict", "--checkpoint", model, "--output", tmp_path / "out", root / "images")
    assert missing.code == 2 and "has no file for generator(s) G3" in missing.err, missing.err
    assert len(missing.err.strip().splitlines()) == 1 and "Traceback" not in missing.err, missing.err
    (model / "train_opt.txt").unlink()
    (model / "train_opt.txt").write_text("----------------- Options ---------------\n model: DeepLIIF\n ngf: [4\n")
    broken = run_phalanx("predict", "--checkpoint", model, "--output", tmp_path / "out", root / "images")
    assert broken.code == 2 and "train_opt.txt" in broken.err and "Traceback" not in broken.err, broken.err


def test_training_from_a_directory_takes_its_settings_and_says_so(tmp_path, predicted):
    """``phalanx train --weights DIR`` takes the networks' settings train_opt.txt gives where the
    command line leaves them out, and its plan (``--dry-run``) names them."""
    root, _, _ = predicted
    from phalanx_testdata import deepliif_samples

    data = tmp_path / "data"
    deepliif_samples(data, size=32, per_split={"train": 2, "val": 1})
    args = [
        "train",
        "--task",
        "deepliif",
        "--dataroot",
        data,
        "--weights",
        root / "model",
        "--lambda-feat",
        0,
        "--dry-run",
    ]
    preview = run_phalanx(*args, "--checkpoints-dir", tmp_path / "runs")
    assert preview.code == 0, preview.err
    assert "--ngf 4" in preview.out + preview.err and "--net-gs unet_512" in preview.out + preview.err, preview.out

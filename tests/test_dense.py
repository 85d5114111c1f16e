"""``--task detect`` and ``--task segment`` on scenes made from phalanx's built-in digits
(tests/support/phalanx_testdata.py: digits pasted on canvases, boxes and masks known): they learn,
their metrics are exact at any world size (COCO mAP against pycocotools run directly), and bad
annotations are one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import USER_MODELS, records, run_phalanx, snapshot_tree
from phalanx_testdata import digit_scenes

DETECTOR = ["--task", "detect", "--model", "phalanx_testmodels:tiny_detector", "--no-progress"]
SEGMENTER = ["--task", "segment", "--model", "phalanx_testmodels:tiny_segmenter", "--image-size", 64, "--no-progress"]


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    """160 training scenes, 41 validation scenes (an odd count: 2 ranks share it unevenly)."""
    return digit_scenes(tmp_path_factory.mktemp("scenes"), {"train": 160, "val": 41})


@pytest.fixture(scope="module")
def detector(scenes, tmp_path_factory):
    """A tiny detector trained 5 epochs, and the same one barely trained (the untrained baseline).
    Its best mAP50, measured at seeds 0 and 1 (2026-11-27): 0.45 and 0.40 (6 epochs: 0.49, 0.46)."""
    from phalanx.cli import main

    runs = tmp_path_factory.mktemp("detector")
    for name, lr, epochs in (("trained", 0.02, 5), ("untrained", 1e-9, 1)):  # in this process: no start-up to wait for
        assert (
            main(
                [
                    str(a)
                    for a in (
                        "train",
                        *DETECTOR,
                        "--dataroot",
                        scenes,
                        "--epochs",
                        epochs,
                        "--batch-size",
                        8,
                        "--lr",
                        lr,
                        "--checkpoints-dir",
                        runs,
                        "--name",
                        name,
                    )
                ]
            )
            == 0
        )
    return runs


@pytest.mark.slow
def test_a_detector_learns_far_above_an_untrained_one(detector):
    trained = records(detector / "trained", "val")
    untrained = records(detector / "untrained", "val")[-1]["mAP50"]
    assert max(r["mAP50"] for r in trained) > untrained + 0.2, (untrained, [r["mAP50"] for r in trained])
    train = records(detector / "trained", "train")
    assert {"loss_classifier", "loss_box_reg", "loss_objectness", "loss_rpn_box_reg"} <= train[-1].keys()
    assert train[-1]["loss"] < train[0]["loss"]


def _direct_coco(checkpoint, scenes) -> list[float]:
    """pycocotools run directly on the checkpoint's detections of every validation image."""
    import contextlib
    import io

    from PIL import Image
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    from phalanx.inference.model import load_trained

    model = load_trained(str(checkpoint)).models["detector"].eval()
    truth_file = scenes / "val/annotations.json"
    truth = json.loads(truth_file.read_text())
    results = []
    with torch.no_grad():
        for image in truth["images"]:
            pixels = (
                torch.tensor(
                    list(Image.open(scenes / "val/images" / image["file_name"]).getdata()), dtype=torch.float32
                )
                .view(image["height"], image["width"], 3)
                .permute(2, 0, 1)
                / 255
            )
            found = model([pixels])[0]
            for (x0, y0, x1, y1), score, label in zip(
                found["boxes"].tolist(), found["scores"].tolist(), found["labels"].tolist()
            ):
                results.append(
                    {"image_id": image["id"], "category_id": label, "bbox": [x0, y0, x1 - x0, y1 - y0], "score": score}
                )
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(str(truth_file))
        scored = COCOeval(coco, coco.loadRes(results), "bbox")
        scored.evaluate()
        scored.accumulate()
        scored.summarize()
    return [None if s < 0 else float(s) for s in scored.stats]  # -1: no ground truth of that size


@pytest.mark.slow
def test_evaluate_gives_one_map_at_any_world_size_equal_to_pycocotools_on_every_image(
    detector, scenes, tmp_path, phalanx
):
    best = detector / "trained/best.pt"
    one = phalanx("evaluate", "--checkpoint", best, "--output", tmp_path / "one.json")
    assert one.code == 0, one.err
    assert "COCO's summary (its AP, AP50, AP75 are training's val_mAP, val_mAP50, val_mAP75)" in one.out
    two = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            "-m",
            "phalanx.cli",
            "evaluate",
            "--checkpoint",
            str(best),
            "--output",
            str(tmp_path / "two.json"),
        ],
        env={**os.environ, **USER_MODELS, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert two.returncode == 0, two.stderr[-2000:]
    one_result, two_result = (json.loads((tmp_path / f).read_text()) for f in ("one.json", "two.json"))
    assert two_result["world_size"] == 2 and one_result["images"] == two_result["images"] == 41  # none twice
    assert one_result["coco"] == two_result["coco"]
    direct = _direct_coco(best, scenes)
    assert list(one_result["coco"].values()) == direct  # the same numbers, not merely close
    assert max(r["mAP"] for r in records(detector / "trained", "val")) == pytest.approx(direct[0], abs=1e-12)
    # --dataroot: a folder read as one split (DIR/val/ here, no train/ needed)
    (tmp_path / "other").mkdir()
    (tmp_path / "other/val").symlink_to(scenes / "val")
    other = phalanx(
        "evaluate", "--checkpoint", best, "--dataroot", tmp_path / "other", "--output", tmp_path / "other.json"
    )
    assert other.code == 0, other.err
    assert json.loads((tmp_path / "other.json").read_text())["coco"] == one_result["coco"]


@pytest.mark.slow
def test_detections_are_predicted_as_coco_json_and_the_detector_exports_as_torchscript(
    detector, scenes, tmp_path, phalanx
):
    import contextlib
    import io

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    # Images with their annotations.json: predict's JSON takes its image ids, and pycocotools scores it as it is.
    result = phalanx(
        "predict",
        "--checkpoint",
        detector / "trained/best.pt",
        scenes / "val/images",
        "--output",
        tmp_path / "d.json",
        "--score-threshold",
        0,
    )
    assert result.code == 0, result.err
    rows = json.loads((tmp_path / "d.json").read_text())
    assert rows and {"image_id", "file_name", "category_id", "category", "bbox", "score"} <= rows[0].keys()
    with contextlib.redirect_stdout(io.StringIO()):
        truth = COCO(str(scenes / "val/annotations.json"))
        scored = COCOeval(truth, truth.loadRes(str(tmp_path / "d.json")), "bbox")
        scored.evaluate()
        scored.accumulate()
        scored.summarize()
    best = max(r["mAP"] for r in records(detector / "trained", "val"))
    assert scored.stats[0] == pytest.approx(best, abs=0.01)  # validation's mAP, but for boxes rounded to 0.01 px
    assert {truth.imgs[r["image_id"]]["file_name"] for r in rows} == {r["file_name"] for r in rows}
    exported = phalanx("export", "--checkpoint", detector / "trained/best.pt", "--output", tmp_path / "det.ts")
    assert exported.code == 0, exported.err
    # Loaded in a fresh process exactly as its FILE.json says (import torchvision first; a tuple back).
    usage = json.loads((tmp_path / "det.ts.json").read_text())["usage"].replace("FILE", "sys.argv[1]")
    code = (
        f"import sys; {usage.replace('[image]', '[torch.rand(3, 64, 64)]')}; "
        "assert 'phalanx' not in sys.modules; print(sorted(detections[0]), losses)"
    )
    shown = subprocess.run([sys.executable, "-c", code, str(tmp_path / "det.ts")], capture_output=True, text=True)
    assert shown.returncode == 0 and "boxes" in shown.stdout, shown.stderr[-1000:]
    program = phalanx(
        "export",
        "--checkpoint",
        detector / "trained/best.pt",
        "--format",
        "exported-program",
        "--output",
        tmp_path / "det.pt2",
    )
    assert program.code == 2 and "exports as torchscript only" in program.err and not (tmp_path / "det.pt2").exists()


@pytest.mark.slow
def test_torchvisions_own_detector_and_segmenter_train_a_step(tmp_path, phalanx):
    small = digit_scenes(tmp_path / "data", {"train": 4, "val": 2})
    result = phalanx(
        "train",
        "--task",
        "detect",
        "--dataroot",
        small,
        "--epochs",
        1,
        "--batch-size",
        2,
        "--image-size",
        64,
        "--checkpoints-dir",
        tmp_path / "ck",
        "--name",
        "det",
        "--no-progress",
    )
    assert result.code == 0, result.err
    assert (
        torch.load(tmp_path / "ck/det/latest.pt", weights_only=True)["config"]["model"]
        == "fasterrcnn_mobilenet_v3_large_320_fpn"
    )
    result = phalanx(
        "train",
        "--task",
        "segment",
        "--dataroot",
        small,
        "--epochs",
        1,
        "--batch-size",
        2,
        "--image-size",
        64,
        "--checkpoints-dir",
        tmp_path / "ck",
        "--name",
        "seg",
        "--no-progress",
    )
    assert result.code == 0, result.err


@pytest.mark.slow
def test_a_coco_pretrained_detector_from_the_hub_cache_fine_tunes_on_new_categories(tmp_path, phalanx, monkeypatch):
    from torchvision.models import get_model, get_weight

    # "COCO weights" (91 categories) made here and put where torch's hub cache keeps them.
    name = "FasterRCNN_MobileNet_V3_Large_320_FPN_Weights.COCO_V1"
    torch.manual_seed(123)  # not the run's seed: weights that differ from the run's own initialisation
    coco = get_model("fasterrcnn_mobilenet_v3_large_320_fpn", weights=None, weights_backbone=None, num_classes=91)
    hub = tmp_path / "torch"
    monkeypatch.setenv("TORCH_HOME", str(hub))
    small = digit_scenes(tmp_path / "data", {"train": 4, "val": 2})
    missing = phalanx(
        "train", "--task", "detect", "--dataroot", small, "--weights", name, "--checkpoints-dir", tmp_path / "ck"
    )
    assert missing.code == 2 and "phalanx does not download" in missing.err
    (hub / "hub/checkpoints").mkdir(parents=True)
    torch.save(coco.state_dict(), hub / "hub/checkpoints" / os.path.basename(get_weight(name).url))
    result = phalanx(
        "train",
        "--task",
        "detect",
        "--dataroot",
        small,
        "--weights",
        name,
        "--image-size",
        64,
        "--epochs",
        1,
        "--batch-size",
        2,
        "--lr",
        1e-12,
        "--checkpoints-dir",
        tmp_path / "ck",
        "--no-progress",
    )  # a learning rate that leaves the loaded weights as they were
    assert result.code == 0, result.err
    # The box predictor is for 3 categories + background now: replaced, and said so.
    assert "replaced (another shape, trained anew" in result.out and "cls_score.weight 91x1024 -> 4x1024" in result.out
    saved = torch.load(tmp_path / "ck/experiment/latest.pt", weights_only=True)["models"]["detector"]
    # (parameters: BatchNorm's running statistics move in training whatever the learning rate)
    loaded = {k: v.detach() for k, v in coco.named_parameters() if not k.startswith("roi_heads.box_predictor.")}
    assert len(loaded) > 100 and all(torch.allclose(saved[k], v, atol=1e-6) for k, v in loaded.items())
    assert saved["roi_heads.box_predictor.cls_score.weight"].shape[0] == 4


@pytest.mark.slow
def test_a_segmenter_learns_and_its_miou_is_the_same_with_one_or_two_ranks(scenes, tmp_path, phalanx):
    # mIoU per epoch at seed 0 (2026-11-27): 0.24, 0.28, 0.35, 0.35, 0.36; the barely trained one 0.016.
    common = [*SEGMENTER, "--dataroot", scenes, "--batch-size", 8, "--lr", 0.05, "--checkpoints-dir", tmp_path]
    trained = phalanx("train", *common, "--epochs", 5, "--name", "trained")
    assert trained.code == 0, trained.err
    untrained = phalanx("train", *common, "--epochs", 1, "--lr", 1e-9, "--name", "untrained")
    assert untrained.code == 0, untrained.err
    miou = [r["mIoU"] for r in records(tmp_path / "trained", "val")]
    baseline = records(tmp_path / "untrained", "val")[-1]["mIoU"]
    assert max(miou) > baseline + 0.15, (baseline, miou)
    best = tmp_path / "trained/best.pt"
    one = phalanx("evaluate", "--checkpoint", best, "--output", tmp_path / "one.json")
    assert one.code == 0, one.err
    two = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            "-m",
            "phalanx.cli",
            "evaluate",
            "--checkpoint",
            str(best),
            "--output",
            str(tmp_path / "two.json"),
        ],
        env={**os.environ, **USER_MODELS, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert two.returncode == 0, two.stderr[-2000:]
    one_result, two_result = (json.loads((tmp_path / f).read_text()) for f in ("one.json", "two.json"))
    assert one_result["confusion_matrix"] == two_result["confusion_matrix"] and one_result["images"] == 41
    # evaluate says which pixels it scored (validation's, not predict's full-size masks)
    assert "centre-cropped" in one_result["scored_at"] and "scored on masks resized" in one.out
    assert one_result["metrics"]["mIoU"] == two_result["metrics"]["mIoU"] == pytest.approx(max(miou), abs=1e-12)
    other = phalanx(
        "evaluate", "--checkpoint", best, "--dataroot", scenes / "val", "--output", tmp_path / "other.json"
    )  # the split itself as --dataroot
    assert other.code == 0, other.err
    assert json.loads((tmp_path / "other.json").read_text())["metrics"]["mIoU"] == one_result["metrics"]["mIoU"]
    predicted = phalanx("predict", "--checkpoint", best, scenes / "val/images/0001.png", "--output", tmp_path / "out")
    assert predicted.code == 0, predicted.err
    assert (tmp_path / "out/masks/0001.png").is_file() and (tmp_path / "out/overlays/0001.png").is_file()


def _broken(root, case):
    from PIL import Image

    data = digit_scenes(root / case, {"train": 8, "val": 4})
    annotations = data / "train/annotations.json"
    coco = json.loads(annotations.read_text())
    if case == "box-outside":
        coco["annotations"][0]["bbox"] = [50, 50, 30, 30]
    elif case == "unknown-category":
        coco["annotations"][0]["category_id"] = 9
    elif case == "mask-size":
        Image.new("L", (32, 32)).save(data / "train/masks/0002.png")
    elif case == "mask-value":
        Image.new("L", (64, 64), 7).save(data / "train/masks/0002.png")
    annotations.write_text(json.dumps(coco))
    return data, coco["images"][0]["file_name"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "task, case, words",
    [
        ("detect", "box-outside", "box [50, 50, 30, 30] is not inside the 64x64 image"),
        ("detect", "unknown-category", "has category 9, which annotations.json does not declare"),
        ("segment", "mask-size", "0002.png: is 64x64 but masks/0002.png is 32x32"),
        ("segment", "mask-value", "masks/0002.png with class 7, beyond the 4 classes"),
    ],
)
def test_bad_annotations_are_one_line_naming_the_file_with_nothing_written_or_skipped(
    tmp_path, task, case, words, phalanx
):
    data, _ = _broken(tmp_path, case)
    options = [
        "--task",
        task,
        "--model",
        f"phalanx_testmodels:tiny_{'detector' if task == 'detect' else 'segmenter'}",
        "--dataroot",
        data,
        "--epochs",
        1,
        "--batch-size",
        4,
        "--image-size",
        64,
        "--no-progress",
        "--checkpoints-dir",
        tmp_path / "ck",
    ]
    if task == "segment":
        options += ["--num-classes", 4]
    result = run_phalanx("train", *options, env=USER_MODELS)
    assert result.code == 2, result.err
    assert result.err.count("\n") == 1 and words in result.err, result.err
    assert snapshot_tree(tmp_path / "ck") == {}
    skipped = phalanx("train", *options, "--skip-broken")
    assert skipped.code == 0, skipped.err
    assert "left out" in skipped.out


def test_a_detector_refuses_dataparallel_but_not_trainlaunchs_ddp_over_the_same_gpu_ids(scenes, tmp_path, phalanx):
    # The DDP example for detection (docs/tasks/detect.md) (trainlaunch --gpu-ids 0,1) was refused as DataParallel.
    common = [*DETECTOR, "--dataroot", scenes, "--gpu-ids", "0,1", "--dry-run", "--checkpoints-dir", tmp_path]
    refused = phalanx("train", *common)
    assert refused.code == 2 and "--task detect cannot train under DataParallel" in refused.err, refused.err
    launched = phalanx("trainlaunch", *common, "--use-torchrun", "--nproc_per_node 2")
    assert launched.code == 0 and "world size: 2" in launched.out and "DataParallel" not in launched.err, launched.err

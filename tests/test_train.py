"""End-to-end `phalanx train` on CPU: real data, real training, real files."""

from __future__ import annotations

import json
import math
import multiprocessing
import sys

import pytest
import torch
from conftest import run_phalanx, write_digit_pngs

from phalanx.checkpoint.rundir import read_metrics
from phalanx.config import RunConfig
from phalanx.models import SmallCNN


def _weights(path):
    return torch.load(path, weights_only=True)["model"]


def _assert_same_weights(a, b, atol=1e-6):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.allclose(a[key], b[key], atol=atol, rtol=0), key


@pytest.mark.slow
def test_builtin_digits_reach_95_percent_and_loss_falls(tmp_path):
    # A real process, as a user runs it: the README's main job.
    result = run_phalanx("train", "--checkpoints-dir", tmp_path, "--epochs", 5, "--no-progress")
    assert result.code == 0, result.err
    assert "val_acc" in result.out
    records = read_metrics(tmp_path / "experiment" / "metrics.jsonl")
    val = [r for r in records if r["kind"] == "val"]
    train = [r for r in records if r["kind"] == "train"]
    assert [r["epoch"] for r in val] == [1, 2, 3, 4, 5]
    assert val[-1]["acc"] >= 0.9  # measured 97-99%
    assert train[-1]["loss"] < 0.5 * train[0]["loss"]
    assert val[-1]["loss"] < val[0]["loss"]
    saved = RunConfig.from_json((tmp_path / "experiment" / "config.json").read_text())
    assert saved.schedule.epochs == 5 and saved.data.dataset == "digits"


@pytest.mark.slow
@pytest.mark.parametrize("with_val_dir", [False, True], ids=["holdout", "val-dir"])
def test_image_folder_of_png_files_reaches_95_percent(phalanx, tmp_path, with_val_dir):
    root = write_digit_pngs(tmp_path / "data", val=with_val_dir)
    # The default for folders is basic augmentation; a flipped digit is another digit: --no-hflip.
    # With a val/ folder, no augmentation (the faster path: no per-image random transforms).
    recipe = ["--augment", "none"] if with_val_dir else ["--no-hflip"]
    result = phalanx(
        "train",
        "--dataroot",
        root,
        "--checkpoints-dir",
        tmp_path / "ck",
        "--epochs",
        5,
        "--image-size",
        16,
        *recipe,
        "--no-progress",
    )
    assert result.code == 0, result.err
    assert ("from val/" in result.out) == with_val_dir
    val = [r for r in read_metrics(tmp_path / "ck/experiment/metrics.jsonl") if r["kind"] == "val"]
    assert val[-1]["acc"] >= 0.9  # measured 97-99%
    weights = torch.load(tmp_path / "ck/experiment/latest.pt")["model"]
    first_conv = next(v for v in weights.values() if v.dim() == 4)
    assert first_conv.shape[1] == 1  # grayscale PNGs train in one channel, not three copies of it


def test_image_folder_with_loader_worker_processes(phalanx, tmp_path):
    root = write_digit_pngs(tmp_path / "data", per_class=20)
    result = phalanx(
        "train", "--dataroot", root, "--num-workers", 2, "--epochs", 2, "--checkpoints-dir", tmp_path / "ck"
    )
    assert result.code == 0, result.err
    assert "2 loader workers" in result.out  # what the DataLoader was given, not the CPU default (none)
    # stopped as the run ends, not when garbage-collected during a later run (which then waited 20 s)
    assert multiprocessing.active_children() == []
    auto = phalanx("train", "--dataroot", root, "--epochs", 1, "--checkpoints-dir", tmp_path / "ck", "--name", "auto")
    assert auto.code == 0 and "0 loader workers" in auto.out  # on the CPU the compute threads take the cores
    assert [r["epoch"] for r in read_metrics(tmp_path / "ck/experiment/metrics.jsonl") if r["kind"] == "val"] == [1, 2]


@pytest.mark.slow
def test_resume_gives_the_same_weights_as_an_uninterrupted_run(phalanx, tmp_path):
    # A schedule that depends only on the epoch (warmup, then x0.1 each epoch) with momentum:
    # optimizer, scheduler and RNG state must all survive the checkpoint for this to hold.
    common = [
        "--lr-schedule",
        "step",
        "--lr-step-epochs",
        1,
        "--warmup-epochs",
        1,
        "--no-progress",
        "--seed",
        7,
        "--checkpoints-dir",
        tmp_path,
    ]
    assert phalanx("train", "--name", "straight", "--epochs", 3, *common).code == 0
    assert phalanx("train", "--name", "split", "--epochs", 2, *common).code == 0
    resumed = phalanx("train", "--name", "split", "--epochs", 3, "--resume", "auto", *common)
    assert resumed.code == 0, resumed.err
    assert "resumed from" in resumed.out
    _assert_same_weights(_weights(tmp_path / "straight/latest.pt"), _weights(tmp_path / "split/latest.pt"))
    epochs = [r["epoch"] for r in read_metrics(tmp_path / "split/metrics.jsonl") if r["kind"] == "val"]
    assert epochs == [1, 2, 3]


def test_checkpoint_loads_with_plain_torch_load_into_the_bare_model(phalanx, tmp_path):
    assert phalanx("train", "--checkpoints-dir", tmp_path, "--epochs", 1, "--save-epoch-freq", 1).code == 0
    run = tmp_path / "experiment"
    assert {p.name for p in run.glob("*.pt")} == {"latest.pt", "best.pt", "epoch_0001.pt"}
    state = torch.load(run / "latest.pt")  # torch's default weights_only=True: plain data only
    assert not any(k.startswith("module.") for k in state["model"])
    model = SmallCNN(num_classes=10, in_channels=1)
    model.load_state_dict(state["model"])
    assert state["epoch"] == 1 and state["config"]["epochs"] == 1
    assert {"optimizers", "scalers", "step", "position", "epoch_sums", "world_size", "task"} <= state.keys()
    assert state["task"] == "classify" and state["models"]["model"].keys() == state["model"].keys()
    assert not list(run.glob(".*tmp*")), "no temporary file is left behind"


def test_one_mean_and_std_normalise_every_channel_as_the_same_value_given_per_channel(phalanx, tmp_path):
    # The README's `--mean 0.5 --std 0.5` for a backbone's transfer, on RGB images: once refused
    # ("has 1 values for 3-channel images"), a newcomer's report.
    common = [
        "--dataset",
        "synthetic",
        "--synthetic-samples",
        40,
        "--image-size",
        8,
        "--max-steps",
        2,
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
    ]
    assert phalanx("train", "--name", "one", "--mean", 0.5, "--std", 0.5, *common).code == 0
    assert phalanx("train", "--name", "each", "--mean", "0.5,0.5,0.5", "--std", "0.5,0.5,0.5", *common).code == 0
    one, each = (torch.load(tmp_path / name / "latest.pt") for name in ("one", "each"))
    assert one["data"]["mean"] == one["data"]["std"] == [0.5] * 3 == each["data"]["mean"]
    assert all(torch.equal(one["model"][k], each["model"][k]) for k in each["model"])


def test_grad_accum_matches_one_big_batch(phalanx, tmp_path):
    # float64: the two sum a batch's gradient in another order, and nothing else (1e-12, on any CPU).
    common = [
        "--epochs",
        1,
        "--lr-schedule",
        "constant",
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
        "--model",
        "phalanx_testmodels:double",
    ]
    assert phalanx("train", "--name", "big", "--batch-size", 32, *common).code == 0
    assert phalanx("train", "--name", "accum", "--batch-size", 16, "--grad-accum", 2, *common).code == 0
    _assert_same_weights(_weights(tmp_path / "big/latest.pt"), _weights(tmp_path / "accum/latest.pt"), atol=1e-12)


def test_same_seed_same_weights_different_seed_different(phalanx, tmp_path):
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        assert phalanx("train", "--name", name, "--seed", seed, "--epochs", 1, "--checkpoints-dir", tmp_path).code == 0
    a, b, c = (_weights(tmp_path / n / "latest.pt") for n in "abc")
    _assert_same_weights(a, b, atol=0)
    assert not torch.equal(a["classifier.3.weight"], c["classifier.3.weight"])


def test_config_file_supplies_defaults_and_flags_override(phalanx, tmp_path):
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text("epochs: 1\nlr: 0.02\noptimizer: adamw\nbatch-size: 16\n")
    result = phalanx("train", "--config", cfg_file, "--lr", "0.03", "--checkpoints-dir", tmp_path / "ck")
    assert result.code == 0, result.err
    saved = json.loads((tmp_path / "ck/experiment/config.json").read_text())["config"]
    assert (saved["epochs"], saved["lr"], saved["optimizer"], saved["batch_size"]) == (1, 0.03, "adamw", 16)


@pytest.mark.slow
def test_user_model_function_and_torchvision_model(phalanx, tmp_path, monkeypatch):
    pkg = tmp_path / "mymodels"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "nets.py").write_text(
        "import torch.nn as nn\n"
        "def tiny(num_classes):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    result = phalanx("train", "--model", "mymodels.nets:tiny", "--epochs", 2, "--checkpoints-dir", tmp_path / "ck")
    assert result.code == 0, result.err
    assert set(_weights(tmp_path / "ck/experiment/latest.pt")) == {"1.weight", "1.bias"}

    result = phalanx(
        "train",
        "--model",
        "resnet18",
        "--epochs",
        1,
        "--name",
        "rn",
        "--batch-size",
        128,
        "--checkpoints-dir",
        tmp_path / "ck",
    )
    assert result.code == 0, result.err
    state = _weights(tmp_path / "ck/rn/latest.pt")
    assert state["fc.weight"].shape == (10, 512) and state["conv1.weight"].shape[1] == 3


# fp16 on this CPU trains about 50x slower than fp32 (phalanx warns): one epoch only.
@pytest.mark.slow
@pytest.mark.parametrize(
    "precision, dtype, epochs, accuracy", [("bf16", "torch.bfloat16", 3, 0.7), ("fp16", "torch.float16", 1, 0.3)]
)
def test_autocast_on_cpu_computes_in_the_asked_precision_and_trains(
    phalanx, tmp_path, monkeypatch, precision, dtype, epochs, accuracy
):
    monkeypatch.setenv("PHALANX_TEST_RECORD", str(tmp_path / "probe"))
    result = phalanx(
        "train",
        "--model",
        "phalanx_testmodels:dtype_probe",
        "--precision",
        precision,
        "--epochs",
        epochs,
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
    )
    assert result.code == 0, result.err
    assert [p.read_text() for p in (tmp_path / "probe").iterdir()] == [dtype]  # autocast was applied
    assert ("fp16 on the CPU" in result.out) == (precision == "fp16")
    val = [r for r in read_metrics(tmp_path / "experiment/metrics.jsonl") if r["kind"] == "val"]
    assert val[-1]["acc"] >= accuracy
    state = torch.load(tmp_path / "experiment/latest.pt")
    assert state["model"]["classifier.3.weight"].dtype == torch.float32  # master weights stay fp32
    assert not state["scalers"][
        "model"
    ]  # a GradScaler only on CUDA: CPU autocast has no fp16 gradient underflow to fix


def test_best_pt_is_the_epoch_with_the_best_validation_accuracy(phalanx, tmp_path, monkeypatch):
    monkeypatch.setenv("PHALANX_TEST_GOOD_EPOCHS", "2")  # the model predicts at random from epoch 3 on
    result = phalanx(
        "train",
        "--model",
        "phalanx_testmodels:degrades",
        "--epochs",
        4,
        "--save-epoch-freq",
        1,
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
    )
    assert result.code == 0, result.err
    accs = [r["acc"] for r in read_metrics(tmp_path / "experiment/metrics.jsonl") if r["kind"] == "val"]
    assert max(accs[:2]) > 0.5 > max(accs[2:])  # chance is 0.1: the random epochs are far below
    best_epoch = 1 + accs.index(max(accs))  # the first epoch that reached the best accuracy
    best, latest = torch.load(tmp_path / "experiment/best.pt"), torch.load(tmp_path / "experiment/latest.pt")
    assert best["epoch"] == best_epoch <= 2 and latest["epoch"] == 4 and best["best"]["value"] == max(accs)
    assert all(
        torch.equal(best["model"][k], torch.load(tmp_path / "experiment/epoch_0002.pt")["model"][k])
        for k in best["model"]
    )


def test_overwrite_replaces_a_previous_run(phalanx, tmp_path):
    assert phalanx("train", "--epochs", 2, "--checkpoints-dir", tmp_path).code == 0
    refused = phalanx("train", "--epochs", 1, "--checkpoints-dir", tmp_path)
    assert refused.code == 2 and "--resume auto" in refused.err
    assert phalanx("train", "--epochs", 1, "--overwrite", "--checkpoints-dir", tmp_path).code == 0
    epochs = [r["epoch"] for r in read_metrics(tmp_path / "experiment/metrics.jsonl") if r["kind"] == "val"]
    assert epochs == [1]


@pytest.mark.skipif(
    torch.cuda.device_count() < 2,
    reason="DataParallel needs two CUDA devices; this machine has "
    f"{torch.cuda.device_count()} (its one-GPU counterpart in test_cuda.py passed on an H100; "
    "this test has not run)",
)
def test_dataparallel_on_two_gpus(phalanx, tmp_path):
    result = phalanx(
        "train",
        "--gpu-ids",
        0,
        "--gpu-ids",
        1,
        "--epochs",
        3,
        "--batch-size",
        64,
        "--precision",
        "fp16",
        "--checkpoints-dir",
        tmp_path,
    )
    assert result.code == 0, result.err
    assert "DataParallel" in result.out
    assert not any(k.startswith("module.") for k in _weights(tmp_path / "experiment/latest.pt"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_one_gpu_with_amp(phalanx, tmp_path):
    for precision in ("bf16", "fp16"):
        result = phalanx(
            "train",
            "--gpu-ids",
            0,
            "--epochs",
            5,
            "--precision",
            precision,
            "--name",
            precision,
            "--checkpoints-dir",
            tmp_path,
        )
        assert result.code == 0, result.err
        val = [r for r in read_metrics(tmp_path / precision / "metrics.jsonl") if r["kind"] == "val"]
        assert val[-1]["acc"] >= 0.95


def test_help_does_not_import_torch():
    import subprocess

    code = "import sys; from phalanx.cli import main; main(['train', '--help']); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("False")
    assert "Examples:" in out and "phalanx train --gpu-ids 0,1" in out


def test_a_diverging_run_stops_at_the_first_non_finite_loss_in_one_line(phalanx, tmp_path):
    result = phalanx(
        "train", "--epochs", 3, "--lr", 1000, "--checkpoints-dir", tmp_path, "--log-every", 1, "--no-progress"
    )  # an absurd LR: the loss becomes inf or nan within steps
    assert result.code == 1 and len(result.err.strip().splitlines()) == 1, result.err
    assert "(epoch 1): training diverged, so it stopped; no checkpoint was saved yet. Lower --lr" in result.err
    assert not (tmp_path / "experiment/latest.pt").exists()  # nothing saved from the broken weights
    train = [r for r in read_metrics(tmp_path / "experiment/metrics.jsonl") if r["kind"] == "train"]
    assert train[-1]["epoch"] == 1 and not math.isfinite(train[-1]["loss"])  # the record that shows it
    # It stopped at that log step, the first with a non-finite loss, not at the epoch's end.
    assert [math.isfinite(r["loss"]) for r in train].count(False) == 1 and "the train loss became" in result.err
    assert "fp16" not in result.err


def test_a_run_diverging_in_fp16_is_told_where_fp16s_range_ends(phalanx, tmp_path):
    # Barlow Twins overflowed fp16 on an H100 while fp32 went on: the line names the range and bf16.
    result = phalanx(
        "train",
        "--epochs",
        1,
        "--lr",
        1000,
        "--precision",
        "fp16",
        "--checkpoints-dir",
        tmp_path,
        "--log-every",
        1,
        "--no-progress",
    )
    assert result.code == 1 and len(result.err.strip().splitlines()) <= 2, result.err  # with the CPU fp16 warning
    assert (
        "training diverged" in result.err and "fp16 overflows above 65504, where bf16 has float32's range" in result.err
    )

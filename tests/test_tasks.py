"""The task API with tasks that are not classifiers: the worked example of your own task
(examples/tasks/adversarial_autoencoder.py: two networks, two optimizers updated in turn) and a
loss over the global batch (tests/support/phalanx_testtasks.py), against hand-written loops.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
import reference
import torch
from conftest import REPO, records, run_phalanx, snapshot_tree

EXAMPLE = REPO / "examples" / "tasks"
AAE = "adversarial_autoencoder:AdversarialAutoencoder"
# The example's own folder first (as a user runs it), then the test tasks that extend it.
TASKS = {"PYTHONPATH": os.pathsep.join([str(EXAMPLE), str(REPO / "tests" / "support"), str(REPO)])}
TRAIN = 1438  # the built-in digits after the 20% hold-out


def state(path: Path) -> dict:
    return torch.load(path, weights_only=True)


def max_difference(a: dict, b: dict) -> float:
    return reference.max_difference(a, b)


def test_the_example_trains_from_its_own_folder_with_both_optimizers_checkpointed(tmp_path):
    result = run_phalanx(
        "train",
        "--task",
        AAE,
        "--epochs",
        2,
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
        "--log-every",
        20,
        cwd=EXAMPLE,
    )
    assert result.code == 0, result.err
    run = tmp_path / "experiment"
    train, val = records(run, "train"), records(run, "val")
    assert all({"G_GAN", "G_L1", "D_real", "D_fake"} <= r.keys() for r in train)
    assert all(set(r["lrs"]) == {"generator", "discriminator"} for r in train)
    assert [r["epoch"] for r in val] == [1, 2] and val[-1]["L1"] < val[0]["L1"]
    saved = state(run / "latest.pt")
    assert saved["task"] == AAE and set(saved["models"]) == set(saved["optimizers"]) == {"generator", "discriminator"}
    assert all(opt["state"] for opt in saved["optimizers"].values())  # Adam's moments, for both
    assert "epoch 2/2  train_G_GAN" in result.out and "val_L1" in result.out
    # evaluate's header (the checkpoint and its data) is evaluate's own: a user's task writes only its table.
    evaluated = run_phalanx("evaluate", "--checkpoint", run / "best.pt", cwd=EXAMPLE)
    assert evaluated.code == 0, evaluated.err
    header, table = evaluated.out.splitlines()[:2]
    assert header.startswith(f"{(run / 'best.pt').resolve()} on ") and table.startswith("L1 ")


@pytest.mark.slow
def test_the_example_resumes_mid_epoch_bitwise_with_both_optimizers_and_every_record(tmp_path, phalanx, monkeypatch):
    monkeypatch.chdir(EXAMPLE)
    common = ["--epochs", 2, "--log-every", 5, "--checkpoints-dir", tmp_path, "--no-progress"]
    assert phalanx("train", "--task", AAE, "--name", "straight", *common).code == 0
    monkeypatch.setenv("PHALANX_TEST_STOP_STEP", "30")  # SIGTERM in the 30th step of epoch 1 (of 45)
    cut = phalanx("train", "--task", "phalanx_testtasks:StoppingAutoencoder", "--name", "cut", *common)
    assert cut.code == 143, cut.err
    saved = state(tmp_path / "cut/latest.pt")
    assert saved["epoch"] == 0 and saved["position"] == 30 * 32
    monkeypatch.delenv("PHALANX_TEST_STOP_STEP")
    resumed = phalanx(
        "train", "--task", "phalanx_testtasks:StoppingAutoencoder", "--name", "cut", "--resume", "auto", *common
    )
    assert resumed.code == 0, resumed.err
    assert "resumed from" in resumed.out and "in epoch 1 at sample 960 of 1438" in resumed.out
    a, b = state(tmp_path / "straight/latest.pt"), state(tmp_path / "cut/latest.pt")
    for name in ("generator", "discriminator"):
        assert all(torch.equal(a["models"][name][k], b["models"][name][k]) for k in a["models"][name])
        moments = [
            (x["exp_avg"], y["exp_avg"])
            for x, y in zip(a["optimizers"][name]["state"].values(), b["optimizers"][name]["state"].values())
        ]
        assert moments and all(torch.equal(x, y) for x, y in moments)
    drop = (
        "time",
        "seconds",
        "samples_per_s",
        "step_data_s",
        "step_compute_s",
        "step_communication_s",
        "step_optimizer_s",
        "step_logging_s",
    )
    for kind in ("train", "val"):
        straight = [{k: v for k, v in r.items() if k not in drop} for r in records(tmp_path / "straight", kind)]
        again = [{k: v for k, v in r.items() if k not in drop} for r in records(tmp_path / "cut", kind)]
        assert straight == again


@pytest.mark.slow
def test_the_example_under_ddp_equals_one_process_and_a_hand_written_loop_in_float64(tmp_path, phalanx):
    from adversarial_autoencoder import discriminator, generator  # noqa: F401 (examples/tasks via conftest)

    common = [
        "--task",
        AAE,
        "--epochs",
        2,
        "--precision",
        "fp64",
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
        "--log-every",
        1,
    ]
    ddp = run_phalanx(
        "trainlaunch", "--name", "ddp", "--batch-size", 16, *common, "--use-torchrun", "--nproc-per-node=2", env=TASKS
    )
    assert ddp.code == 0, ddp.err
    single = phalanx("train", "--name", "single", "--batch-size", 32, *common)
    assert single.code == 0, single.err
    from phalanx.data import load_digits
    from phalanx.data.sources import holdout_indices

    images, _ = load_digits()
    train_index, _ = holdout_indices(len(images), 0.2, 0)
    torch.manual_seed(0)
    g, d = generator(16).double(), discriminator(16).double()
    expected_g, expected_d = reference.train_adversarial_autoencoder(
        g, d, (images[train_index] * 2 - 1).double(), epochs=2, global_batch=32, lr=1e-3
    )
    for run in ("ddp", "single"):
        saved = state(tmp_path / run / "latest.pt")
        assert max_difference(saved["models"]["generator"], expected_g) < 1e-12
        assert max_difference(saved["models"]["discriminator"], expected_d) < 1e-12
    # Each named loss is averaged over both ranks before it is logged: the logs agree too.
    for a, b in zip(records(tmp_path / "ddp", "train"), records(tmp_path / "single", "train")):
        assert all(a[k] == pytest.approx(b[k], rel=1e-9) for k in ("G_GAN", "G_L1", "D_real", "D_fake"))


@pytest.mark.slow
def test_named_losses_are_the_mean_over_both_ranks(tmp_path, phalanx):
    # Rank 1's data differ from rank 0's: a loss logged from rank 0 alone would not be the mean.
    common = [
        "--task",
        "phalanx_testtasks:GatherTask",
        "--epochs",
        1,
        "--log-every",
        1,
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
    ]
    ddp = run_phalanx(
        "trainlaunch", "--name", "ddp", "--batch-size", 8, *common, "--use-torchrun", "--nproc-per-node=2", env=TASKS
    )
    assert ddp.code == 0, ddp.err
    single = phalanx("train", "--name", "single", "--batch-size", 16, *common)
    assert single.code == 0, single.err
    logged = [
        (a["loss"], b["loss"])
        for a, b in zip(records(tmp_path / "ddp", "train"), records(tmp_path / "single", "train"))
    ]
    assert len(logged) == 5 and all(a == pytest.approx(b, rel=1e-12) for a, b in logged)
    # A loss module with a buffer beside the networks (DeepLIIF's GANLoss): DDP left it unwrapped,
    # the checkpoint holds its buffer.
    assert state(tmp_path / "ddp/latest.pt")["models"]["criterion"] == {
        "weight": torch.tensor(1.0, dtype=torch.float64)
    }


@pytest.mark.slow
@pytest.mark.parametrize("gather", ["true", "false"])
def test_all_gather_carries_the_gradient_of_the_global_loss_to_every_rank(tmp_path, gather, phalanx):
    from torch import nn

    common = [
        "--task",
        "phalanx_testtasks:GatherTask",
        "--task-option",
        f"gather={gather}",
        "--epochs",
        2,
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
    ]
    ddp = run_phalanx(
        "trainlaunch", "--name", "ddp", "--batch-size", 8, *common, "--use-torchrun", "--nproc-per-node=2", env=TASKS
    )
    assert ddp.code == 0, ddp.err
    single = phalanx("train", "--name", "single", "--batch-size", 16, *common)
    assert single.code == 0, single.err
    torch.manual_seed(0)
    encoder = nn.Linear(5, 6).double()
    points = torch.randn(96, 5, generator=torch.Generator().manual_seed(1234), dtype=torch.float64)[:80]
    expected = reference.train_global_batch_loss(encoder, points, epochs=2, global_batch=16, lr=0.5)
    ddp_weights = state(tmp_path / "ddp/latest.pt")["models"]["encoder"]
    single_weights = state(tmp_path / "single/latest.pt")["models"]["encoder"]
    assert max_difference(single_weights, expected) < 1e-12
    if gather == "true":  # the global batch's negatives, and their gradients, reach every rank
        assert max_difference(ddp_weights, expected) < 1e-12
    else:  # this rank's negatives only: another training (what gather=true is for)
        assert max_difference(ddp_weights, expected) > 1e-3


def test_task_state_is_checkpointed_and_a_mid_epoch_resume_is_bitwise(tmp_path, phalanx, monkeypatch):
    common = [
        "--task",
        "phalanx_testtasks:StoppingGatherTask",
        "--epochs",
        2,
        "--batch-size",
        16,
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
    ]
    assert phalanx("train", "--name", "straight", *common).code == 0
    monkeypatch.setenv("PHALANX_TEST_STOP_STEP", "3")
    assert phalanx("train", "--name", "cut", *common).code == 143
    assert state(tmp_path / "cut/latest.pt")["task_state"]["center"].abs().sum() > 0
    monkeypatch.delenv("PHALANX_TEST_STOP_STEP")
    assert phalanx("train", "--name", "cut", "--resume", "auto", *common).code == 0
    a, b = state(tmp_path / "straight/latest.pt"), state(tmp_path / "cut/latest.pt")
    assert torch.equal(a["task_state"]["center"], b["task_state"]["center"])
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


@pytest.mark.slow
def test_a_resume_from_2_workers_to_1_trains_each_sample_once_with_both_optimizers_on_schedule(
    tmp_path, phalanx, monkeypatch
):
    common = [
        "--task",
        "phalanx_testtasks:RecordingAutoencoder",
        "--epochs",
        2,
        "--batch-size",
        32,
        "--log-every",
        1,
        "--checkpoints-dir",
        tmp_path,
        "--name",
        "run",
        "--no-progress",
    ]
    cut = run_phalanx(
        "trainlaunch",
        *common,
        "--use-torchrun",
        "--nproc-per-node=2",
        env={
            **TASKS,
            "PHALANX_TEST_STOP_STEP": "10",
            "PHALANX_TEST_STOP_RANK": "1",
            "PHALANX_TEST_RECORD": str(tmp_path / "first"),
        },
    )
    assert cut.code == 143, cut.err
    saved = state(tmp_path / "run/latest.pt")
    assert saved["epoch"] == 0 and saved["position"] == 10 * 64 and saved["world_size"] == 2
    monkeypatch.setenv("PHALANX_TEST_RECORD", str(tmp_path / "second"))
    resumed = phalanx("train", *common, "--resume", "auto")
    assert resumed.code == 0, resumed.err
    seen: dict[int, Counter] = {1: Counter(), 2: Counter()}
    lrs = []
    for path in [*(tmp_path / "first").iterdir(), *(tmp_path / "second").iterdir()]:
        for line in path.read_text().splitlines():
            head, rest = line.split(" ", 1)
            if head.startswith("T"):
                seen[int(head[1:])][int(rest)] += 1
            else:
                values = dict(item.split("=") for item in rest.split())
                lrs.append((int(head[1:]), float(values["generator"]), float(values["discriminator"])))
    assert seen[1] == seen[2] == Counter(range(TRAIN))  # every sample once per epoch, across the resume
    assert all(g == d for _, g, d in lrs)  # both optimizers on the one schedule
    for record in records(tmp_path / "run", "train"):
        assert record["lrs"]["generator"] == record["lrs"]["discriminator"] == record["lr"]
    from test_resume import assert_lr_follows_the_schedule

    assert_lr_follows_the_schedule(tmp_path / "run", epochs=2, base_lr=1e-3)


def test_an_old_checkpoint_resumes_evaluates_predicts_and_exports(tmp_path, phalanx):
    """A format-2 checkpoint (before tasks; tests/fixtures/README.md): a classifier, to the bit."""
    fixture = REPO / "tests/fixtures/v2/latest.pt"
    run = tmp_path / "v2"
    run.mkdir()
    (run / "latest.pt").write_bytes(fixture.read_bytes())
    common = [
        "--model",
        "phalanx_testmodels:batchnorm",
        "--ema-decay",
        0.9,
        "--label-smoothing",
        0.1,
        "--batch-size",
        64,
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
    ]
    evaluated = phalanx("evaluate", "--checkpoint", run / "latest.pt")
    assert evaluated.code == 0, evaluated.err
    assert "top-1 31.48%" in evaluated.out  # what the old phalanx recorded for that epoch
    resumed = phalanx("train", "--name", "v2", "--epochs", 2, "--resume", "auto", *common)
    assert resumed.code == 0, resumed.err
    assert "resumed from" in resumed.out and "after epoch 1" in resumed.out
    # The same run by today's phalanx, in today's format, resumed alike. Its first epoch is the
    # fixture's to rounding only: the fixture was trained on another CPU, whose kernels may round
    # differently from this one's. So the fixture's tensors (weights, momentum, moving average) go
    # into today's checkpoint, and both resumes start from the same bits.
    assert phalanx("train", "--name", "today", "--epochs", 1, *common).code == 0
    old, today = state(fixture), state(tmp_path / "today/latest.pt")
    assert (today["epoch"], today["position"], today["step"]) == (old["epoch"], old["position"], old["step"])
    assert max((today["model"][k].float() - old["model"][k].float()).abs().max().item() for k in old["model"]) < 1e-3
    today["models"]["model"] = today["model"] = old["model"]
    today["optimizers"]["model"], today["ema"]["model"] = old["optimizer"], old["ema"]
    torch.save(today, tmp_path / "today/latest.pt")
    assert phalanx("train", "--name", "today", "--epochs", 2, "--resume", "auto", *common).code == 0
    a, b = state(tmp_path / "today/latest.pt"), state(run / "latest.pt")
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])  # the old run, continued exactly
    assert all(torch.equal(a["ema"]["model"][k], b["ema"]["model"][k]) for k in a["model"])
    momentum = zip(a["optimizers"]["model"]["state"].values(), b["optimizers"]["model"]["state"].values())
    assert all(torch.equal(x["momentum_buffer"], y["momentum_buffer"]) for x, y in momentum)
    from conftest import write_digit_pngs

    write_digit_pngs(tmp_path / "pngs", per_class=1)
    predicted = phalanx("predict", "--checkpoint", fixture, tmp_path / "pngs", "--output", tmp_path / "p.csv")
    assert predicted.code == 0, predicted.err
    assert len((tmp_path / "p.csv").read_text().splitlines()) == 11
    exported = phalanx(
        "export",
        "--checkpoint",
        os.path.relpath(fixture),
        "--output",
        tmp_path / "m.pt2",
        "--format",
        "exported-program",
    )  # a relative path: the metadata holds the absolute one
    assert exported.code == 0, exported.err
    assert (tmp_path / "m.pt2").stat().st_size > 0
    import json

    assert json.loads((tmp_path / "m.pt2.json").read_text())["checkpoint"] == str(Path(fixture).resolve())


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, option, words",
    [
        (["--task", "segmentation"], "--task", "unknown task 'segmentation'"),
        (["--task", "json:JSONDecoder"], "--task", "not a subclass of phalanx.tasks.Task"),
        (["--task", "phalanx_testtasks:Incomplete"], "--task", "does not define build_data"),
        (["--task", "phalanx_testtasks:GatherTask", "--task-option", "dims=3"], "--task-option", "no option 'dims'"),
        (["--task", "phalanx_testtasks:GatherTask", "--task-option", "dim=three"], "--task-option dim", "expected int"),
        (
            ["--task", "phalanx_testtasks:GatherTask", "--label-smoothing", "0.1"],
            "--label-smoothing",
            "is an option of --task classify",
        ),
        (["--best-metric", "L1"], "--best-metric", "metrics are loss, acc, top5"),
    ],
    ids=["unknown", "not-a-task", "incomplete", "unknown-option", "bad-value", "other-tasks-option", "best-metric"],
)
def test_bad_task_input_is_one_line_exit_2_and_nothing_written(tmp_path, args, option, words, phalanx):
    result = phalanx("train", *args, "--checkpoints-dir", tmp_path / "ck")
    assert result.code == 2, result.err
    line = result.err.strip()
    assert "\n" not in line and line.startswith(f"phalanx: {option}") and words in line, line
    assert snapshot_tree(tmp_path / "ck") == {}


@pytest.mark.slow
def test_a_task_that_raises_in_its_step_fails_in_one_line_with_its_traceback_in_the_rank_log(tmp_path):
    result = run_phalanx(
        "trainlaunch",
        "--task",
        "phalanx_testtasks:RaisesInStep",
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
        "--use-torchrun",
        "--nproc-per-node=2",
        env=TASKS,
    )
    assert result.code == 1
    assert "ValueError: the test task raised at step 2" in result.err and "Traceback" not in result.err
    assert "raise ValueError" in (tmp_path / "experiment/logs/rank1.log").read_text()

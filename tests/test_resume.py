"""Resume at any world size (real processes, CPU/gloo): the same samples, the same schedule.

A run preempted mid-epoch on 2 workers resumes in 1 process, and the other way round. Each epoch
must train every sample exactly once (a model records the ids of the samples it sees), and every
logged learning rate must be the documented schedule's at that point of training (tests/reference.py).
"""

from __future__ import annotations

import json
import math
import signal
from collections import Counter
from pathlib import Path

import pytest
import reference
import torch
import yaml
from conftest import USER_MODELS, gate, paused, records, release, run_phalanx, start_phalanx

from phalanx.config import from_mapping
from phalanx.records.snapshots import assemble, loads
from phalanx.visualize.plots import status_rows

TRAIN_SAMPLES = 1438  # the built-in digits after the 20% hold-out


def recorded_segments(folder: Path) -> dict[str, list[list[str]]]:
    """Per recording file (one process and rank): the runs of training sample ids between
    validations, i.e. that process's part of each epoch it trained."""
    found = {}
    for path in sorted(folder.iterdir()):
        segments, after_eval = [[]], False
        for line in path.read_text().splitlines():
            if line == "E":
                after_eval = True
            elif line.startswith("T "):
                if after_eval:
                    segments.append([])
                    after_eval = False
                segments[-1].append(line[2:])
        found[path.name] = segments
    return found


def all_train_ids() -> Counter:
    from phalanx_testmodels import sample_id

    from phalanx.config import RunConfig
    from phalanx.data import build_datasets

    train = build_datasets(RunConfig(), None).train
    return Counter(sample_id(train[i][0]) for i in range(len(train)))


def assert_lr_follows_the_schedule(
    run: Path, epochs: int, base_lr: float = 0.1, schedule: str = "cosine", from_epoch: int = 1
) -> None:
    """With --log-every 1, each train record is one step: its start is the previous record's end."""
    previous_end, checked = None, 0
    for record in records(run, "train"):
        epoch, end = record["epoch"], record["epoch_progress"]
        start = previous_end if previous_end is not None and previous_end >= epoch - 1 else epoch - 1.0
        previous_end = end
        if epoch >= from_epoch:
            expected = base_lr * reference.lr_factor(schedule, epochs, start, end)
            assert record["lr"] == pytest.approx(expected, rel=1e-9, abs=1e-15), (record, start)
            checked += 1
    assert checked > 20


@pytest.mark.slow
@pytest.mark.parametrize("before, after", [(2, 1), (1, 2)], ids=["2-workers-then-1", "1-then-2-workers"])
def test_a_resume_at_another_world_size_trains_each_sample_once_on_the_same_schedule(tmp_path, before, after):
    def command(world):
        return ["trainlaunch", "--use-torchrun", f"--nproc_per_node {world}"] if world > 1 else ["train"]

    common = [
        "--model",
        "phalanx_testmodels:recorder",
        "--epochs",
        3,
        "--batch-size",
        32,
        "--log-every",
        1,
        "--no-progress",
        "--checkpoints-dir",
        tmp_path,
        "--name",
        "run",
    ]
    run = tmp_path / "run"
    steps = 45 if before == 1 else 23  # per epoch
    cut = start_phalanx(
        *command(before),
        *common,
        env={"PHALANX_TEST_RECORD": str(tmp_path / "first"), **gate(tmp_path / "gate", steps + 8)},
    )
    try:
        paused(tmp_path / "gate", ranks=before)  # every rank in the 8th step of epoch 2
        cut.send_signal(signal.SIGTERM)
        release(tmp_path / "gate")
        _, err = cut.communicate(timeout=90)
    finally:
        cut.kill()
    assert cut.returncode == 143, err
    saved = torch.load(run / "latest.pt")
    assert saved["epoch"] == 1 and 0 < saved["position"] < TRAIN_SAMPLES and saved["world_size"] == before
    resumed = run_phalanx(
        *command(after),
        *common,
        "--resume",
        "auto",
        env={**USER_MODELS, "PHALANX_TEST_RECORD": str(tmp_path / "second")},
    )
    assert resumed.code == 0, resumed.err
    assert f"sample {saved['position']} of {TRAIN_SAMPLES}" in resumed.out
    assert (
        f"world size changed ({before} -> {after} processes): effective batch {32 * before} -> {32 * after}"
        in resumed.out
    )

    # Every epoch trained each sample once: counted by phalanx's records, and by the model itself.
    for epoch in (1, 2, 3):
        assert sum(r["samples"] for r in records(run, "train") if r["epoch"] == epoch) == TRAIN_SAMPLES
    first, second = recorded_segments(tmp_path / "first"), recorded_segments(tmp_path / "second")
    assert len(first) == before and len(second) == after
    everything = all_train_ids()
    epoch1 = Counter(i for segments in first.values() for i in segments[0])
    epoch2 = Counter(i for segments in first.values() for i in segments[1]) + Counter(
        i for segments in second.values() for i in segments[0]
    )
    epoch3 = Counter(i for segments in second.values() for i in segments[1])
    assert epoch1 == everything and epoch2 == everything and epoch3 == everything
    assert_lr_follows_the_schedule(run, epochs=3)
    assert [r["epoch"] for r in records(run, "val")] == [1, 2, 3]


@pytest.mark.slow
def test_two_workers_resumed_in_one_process_with_grad_accum_train_what_they_would_have(tmp_path, phalanx):
    # --batch-size and --grad-accum may change at a resume, as the world size may: 2 workers x 16
    # stopped at step 3 and resumed in one process x 16 x 2 keep the effective batch (32) and end
    # within 1e-12 of one process x 32 straight (float64, no BatchNorm). A newcomer could not: both
    # options were refused at a resume ("was trained with --grad-accum 1").
    common = [
        "--precision",
        "fp64",
        "--dataset",
        "synthetic",
        "--synthetic-samples",
        200,
        "--val-fraction",
        0.1,
        "--image-size",
        8,
        "--epochs",
        2,
        "--no-progress",
        "--checkpoints-dir",
        tmp_path,
    ]
    cut = run_phalanx(
        "trainlaunch",
        "--name",
        "cut",
        "--batch-size",
        16,
        "--max-steps",
        3,
        *common,
        "--use-torchrun",
        "--nproc-per-node=2",
    )
    assert cut.code == 0 and torch.load(tmp_path / "cut/latest.pt")["position"] == 3 * 32, cut.err
    resumed = phalanx("train", "--name", "cut", "--grad-accum", 2, "--resume", "auto", *common)
    assert resumed.code == 0, resumed.err
    assert "--batch-size 16" in resumed.out and "effective batch" not in resumed.out, resumed.out  # the run's own batch
    assert phalanx("train", "--name", "straight", "--batch-size", 32, *common).code == 0
    a, b = (torch.load(tmp_path / name / "latest.pt") for name in ("cut", "straight"))
    assert a["epoch"] == b["epoch"] == 2 and a["effective_batch"] == b["effective_batch"] == 32
    assert reference.max_difference(a["model"], b["model"]) < 1e-12
    again = phalanx(
        "train", "--name", "cut", "--resume", "auto", *common, "--epochs", 3
    )  # no --grad-accum: the run's 2
    assert again.code == 0 and "resumed from" in again.out and "effective batch" not in again.out, again.out
    assert "epoch 3/3" in again.out


def test_a_longer_cosine_schedule_at_resume_is_followed_and_said(tmp_path, phalanx):
    # The rule: the schedule's length is the current --epochs. Epochs 1-2 ran a 2-epoch cosine;
    # the resumed epochs 3-4 follow the 4-epoch cosine from where training is.
    common = ["--checkpoints-dir", tmp_path, "--log-every", 1, "--no-progress"]
    assert phalanx("train", "--epochs", 2, *common).code == 0
    resumed = phalanx("train", "--epochs", 4, "--resume", "auto", *common)
    assert resumed.code == 0, resumed.err
    assert "--epochs changed (2 -> 4): the cosine schedule now ends at epoch 4" in resumed.out
    run = tmp_path / "experiment"
    train = records(run, "train")
    first = [r for r in train if r["epoch"] <= 2]
    assert first[-1]["lr"] == pytest.approx(0.1 * reference.lr_factor("cosine", 2, 2 - 30 / 1438, 2.0))  # 30 left
    assert_lr_follows_the_schedule(run, epochs=4, from_epoch=3)


def test_a_checkpoint_given_by_path_never_continues_over_another_run(tmp_path, phalanx):
    # Found by a newcomer: a segment run's checkpoint resumed under a classifier's --name trained on
    # there, its latest.pt and history mixed with the classifier's best.pt.
    common = ["--max-steps", 2, "--checkpoints-dir", tmp_path, "--no-progress"]
    for name, seed in (("mine", 0), ("theirs", 1)):
        assert phalanx("train", "--name", name, "--seed", seed, *common).code == 0
    written = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    refused = phalanx(
        "train",
        "--name",
        "mine",
        "--resume",
        tmp_path / "theirs/latest.pt",
        "--max-steps",
        3,
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
    )
    assert refused.code == 2 and f"{tmp_path / 'mine'} holds another run than" in refused.err, refused.err
    assert f"continue from it there (its own run: --checkpoints-dir {tmp_path} --name theirs), or" in refused.err
    assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == written
    # Its own checkpoint by path, and another's into a new directory (a fork), go on as before.
    for name in ("mine", "fork"):
        source = tmp_path / ("mine" if name == "mine" else "theirs") / "latest.pt"
        assert (
            phalanx(
                "train",
                "--name",
                name,
                "--resume",
                source,
                "--max-steps",
                3,
                "--checkpoints-dir",
                tmp_path,
                "--no-progress",
            ).code
            == 0
        )
    assert (
        torch.load(tmp_path / "fork/latest.pt", weights_only=True)["run_id"]
        == torch.load(tmp_path / "theirs/latest.pt", weights_only=True)["run_id"]
    )


def test_a_resume_takes_what_its_command_line_leaves_out_from_the_run_it_continues(tmp_path, phalanx, monkeypatch):
    # The README: --resume needs no --task. A newcomer's translate run once resumed only with --task,
    # --generator, --dataroot and --image-size typed again (each refused as the default's conflict).
    common = ["--checkpoints-dir", tmp_path, "--no-progress"]
    own = ["--task", "simclr", "--image-size", 16, "--val-fraction", 0.9, "--projection-dim", 32, "--hidden-dim", 32]
    assert phalanx("train", *own, "--epochs", 1, *common).code == 0
    run = tmp_path / "experiment"
    before = json.loads((run / "config.json").read_text())["config"]
    resumed = phalanx("train", "--resume", "auto", "--epochs", 2, *common)
    assert resumed.code == 0, resumed.err
    assert (
        "phalanx: --resume: continuing with the run's own --task simclr, --val-fraction 0.9, --image-size 16, "
        "--projection-dim 32, --hidden-dim 32 (options not given here)"
    ) in resumed.out
    after = json.loads((run / "config.json").read_text())["config"]
    assert {**before, "epochs": 2} == {**after, "resume": None, "resumed_with": []}
    assert [r["epoch"] for r in records(run, "val")] == [1, 2]
    # --epochs too is the run's own: a resume that types nothing more ends where the run would.
    written = {path: path.read_bytes() for path in run.rglob("*") if path.is_file()}
    again = phalanx("train", "--resume", run / "latest.pt", *common)
    assert again.code == 0 and "nothing to do: " in again.out and "already has 2 epochs" in again.out, again.err
    assert {path: path.read_bytes() for path in run.rglob("*") if path.is_file()} == written  # nothing rewritten
    # A run that failed past its last checkpoint (its last record "failed"), restarted by torchrun: the
    # restart has nothing to train, and ends the run's records, so the dashboard no longer says failed.
    with (run / "metrics.jsonl").open("a") as log:
        log.write(json.dumps({"kind": "status", "state": "failed", "time": 1.0}) + "\n")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    restarted = phalanx("train", "--resume", run / "latest.pt", *common)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT")
    assert restarted.code == 0 and "has trained every epoch" in restarted.out, restarted.err
    assert [r["state"] for r in records(run, "status")][-1] == "restarted" and records(run, "end")[-1]["epoch"] == 2
    history = assemble(loads(path.read_bytes()) for path in sorted((run / "pickle").glob("segment_*.pkl")))
    assert dict(status_rows(history))["state"] == "finished" and history.records[-1]["kind"] == "end"
    # What is typed is still checked against the run, and another task takes nothing of it.
    for typed, flag in ((["--hidden-dim", 64], "--hidden-dim 32"), (["--task", "byol"], "--task 'simclr'")):
        refused = phalanx("train", "--resume", "auto", "--epochs", 3, *typed, *common)
        assert refused.code == 2 and f"was trained with {flag}" in refused.err, refused.err
        assert refused.out == ""  # refused before the run says anything
    # The data's folder is the run's too (translate's, as the newcomer's), printed without training.
    saved = from_mapping(
        {"task": "translate", "dataroot": str(tmp_path / "pairs"), "generator": "unet_32", "image_size": 32, "ngf": 8},
        source="test",
    )
    (tmp_path / "tr").mkdir()
    (tmp_path / "tr/config.json").write_text(saved.to_json())
    printed = phalanx("train", "--name", "tr", "--resume", "auto", "--ngf", 8, "--print-config", *common)
    assert printed.code == 0, printed.err
    resolved = yaml.safe_load(printed.out)
    assert {k: resolved[k] for k in ("task", "dataroot", "image_size")} == {
        "task": "translate",
        "dataroot": str(tmp_path / "pairs"),
        "image_size": 32,
    } and resolved["task_options"]["generator"] == "unet_32"
    # A task's option it does not use (DINO's --crop-scale) at its saved default, and your own task
    # (its dataset saved as it resolved), resume as they were: taken values are not the user's choice.
    # A --config that spells checkpoints-dir with a dash and gives a task mapping without its name
    # finds the run and keeps the run's task.
    for name, mapping in (
        ("dino", {"task": "dino", "image_size": 16}),
        ("own", {"task": "phalanx_testtasks:GatherTask"}),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(from_mapping(mapping, source="test").to_json())
        printed = phalanx("train", "--name", name, "--resume", "auto", "--print-config", *common)
        assert printed.code == 0 and yaml.safe_load(printed.out)["task"] == mapping["task"], printed.err
    (tmp_path / "run.yaml").write_text(f"checkpoints-dir: {tmp_path}\nname: tr\ntask:\n  ngf: 8\n")
    printed = phalanx("train", "--config", tmp_path / "run.yaml", "--resume", "auto", "--print-config")
    assert printed.code == 0 and yaml.safe_load(printed.out)["task_options"]["generator"] == "unet_32", printed.err


def test_a_resume_may_lower_the_learning_rate_and_the_schedule_goes_on_from_where_it_was(tmp_path, phalanx):
    # timm's and torchvision's resumes take a new --lr; phalanx refused it as another run's. So with
    # --clip-grad, the usual remedy of a run that diverges. --min-lr is a rate: the cosine ends at
    # 0.02 whatever --lr is (timm's, torchvision's), not at a fraction of it.
    common = ["--epochs", 2, "--log-every", 1, "--min-lr", 0.02, "--checkpoints-dir", tmp_path, "--no-progress"]
    assert phalanx("train", "--max-steps", 10, *common).code == 0
    lowered = phalanx("train", "--resume", "auto", "--lr", 0.05, "--clip-grad", 5, "--max-steps", 20, *common)
    assert lowered.code == 0, lowered.err
    assert "phalanx: --lr changed (0.1 -> 0.05): the schedule continues from this point at it" in lowered.out
    kept = phalanx("train", "--resume", "auto", "--max-steps", 21, *common)  # the run's own 0.05 now
    assert kept.code == 0 and "--lr changed" not in kept.out, kept.out
    assert "continuing with the run's own --lr 0.05, --clip-grad 5" in kept.out, kept.out  # clipping added, kept
    for record in records(tmp_path / "experiment", "train"):
        base = 0.1 if record["step"] <= 10 else 0.05
        start = (record["step"] - 1) * 32 / 1438  # the step's first sample, in epochs (45 steps an epoch)
        cosine = 0.5 * (1 + math.cos(math.pi * start / 2))
        assert record["lr"] == pytest.approx(0.02 + (base - 0.02) * cosine), record["step"]
    # --min-lr is the run's where none is typed, and may change too (a lower --lr needs a lower floor)
    own = phalanx("train", "--resume", "auto", "--dry-run", "--checkpoints-dir", tmp_path)
    assert own.code == 0 and "cosine schedule over 2 epochs to 0.02," in own.out, own.out + own.err
    floor = phalanx(
        "train", "--resume", "auto", "--lr", 0.01, "--min-lr", 0.001, "--dry-run", "--checkpoints-dir", tmp_path
    )
    assert (
        floor.code == 0
        and "learning rate: 0.01 (--lr 0.01, --scale-lr none), cosine schedule over 2 epochs to 0.001" in floor.out
    ), floor.out + floor.err
    # A resume takes an Adam run's typed rate where it equals the general default: Adam's default
    # rate (0.001) follows the optimizer, which the resume takes too (it resumed at 0.001).
    assert phalanx("train", "--name", "adam", "--optimizer", "adam", "--lr", 0.1, "--max-steps", 2, *common).code == 0
    adam = phalanx("train", "--name", "adam", "--resume", "auto", "--dry-run", *common)
    assert adam.code == 0 and "learning rate: 0.1 (--lr 0.1" in adam.out, adam.out


def test_a_fine_tune_resumed_without_its_weights_option_keeps_its_inputs_normalisation(tmp_path, phalanx):
    # --normalize auto with --weights of a phalanx checkpoint is that checkpoint's normalisation (here
    # the base run's [-1, 1]), recorded in the fine-tune's configuration: a fine-tune resumed without
    # typing --weights again once went on with other inputs (mean 0.449 -> 0.5), found in review. The
    # weights file is not read again (the checkpoint holds the network): it may be gone.
    common = ["--epochs", 2, "--checkpoints-dir", tmp_path, "--no-progress"]
    assert phalanx("train", "--name", "base", "--max-steps", 3, *common).code == 0
    assert (
        phalanx("train", "--name", "ft", "--weights", tmp_path / "base/latest.pt", "--max-steps", 3, *common).code == 0
    )
    (tmp_path / "base/latest.pt").unlink()
    resumed = phalanx("train", "--name", "ft", "--resume", "auto", "--max-steps", 6, *common)
    assert resumed.code == 0, resumed.err
    data = torch.load(tmp_path / "ft/latest.pt", weights_only=True)["data"]
    assert data["mean"] == pytest.approx([0.5])  # the base run's, as the fine-tune began with
    assert "inputs normalised as the checkpoint's were (mean 0.5, std 0.5)" not in resumed.out  # no file read
    assert torch.load(tmp_path / "ft/latest.pt", weights_only=True)["step"] == 6
    # and the resumed run's configuration still says where its weights came from
    recorded = json.loads((tmp_path / "ft" / "config.json").read_text())["config"]
    assert recorded["weights"] == str(tmp_path / "base/latest.pt"), recorded.get("weights")

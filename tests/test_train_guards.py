"""Guards at the start and in the loop of a run (issue 35): a run that diverges stops before its
weights are saved, a run that stopped before its first checkpoint does not hold its --name, and
DeepLIIF's `--remote True` is accepted as its guide writes it. The bad-input cases of the start-up
checks are in test_bad_input.py's battery."""

from __future__ import annotations

import os

import pytest
from conftest import records


def test_an_infinite_weight_after_the_first_step_stops_the_run_there(phalanx, tmp_path):
    # The loss of step 1 is finite and its gradient infinite: only a check of the weights sees the
    # run diverge at step 1 (a loss check sees nan one step later, at the next log step).
    result = phalanx(
        "train",
        "--model",
        "phalanx_testmodels:infinite_gradient",
        "--epochs",
        1,
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
    )
    assert result.code == 1 and len(result.err.strip().splitlines()) == 1, result.err
    assert "the weight model.zero became non-finite (inf or nan) at step 1 (epoch 1)" in result.err
    assert "no checkpoint was saved yet. Lower --lr" in result.err
    assert not list((tmp_path / "experiment").glob("*.pt"))
    assert records(tmp_path / "experiment", "train") == []  # stopped before the first log step


def test_a_non_finite_validation_never_becomes_best_pt(phalanx, tmp_path):
    # One step an epoch (the whole training split in one batch) at an absurd, finite --lr: the step's
    # loss and the weights stay finite, the model's outputs overflow to nan. Its accuracy is still
    # a number (argmax of nan), which once made it best.pt.
    result = phalanx(
        "train", "--lr", 1e30, "--batch-size", 2000, "--epochs", 2, "--checkpoints-dir", tmp_path, "--no-progress"
    )
    assert result.code == 1, result.err
    assert "the validation loss became nan after step 1 (epoch 1): training diverged" in result.err
    assert not list((tmp_path / "experiment").glob("*.pt"))


def test_a_run_that_diverged_before_its_first_checkpoint_is_replaced_by_the_same_name(phalanx, tmp_path):
    run = tmp_path / "experiment"
    diverged = phalanx("train", "--lr", 1e38, "--epochs", 1, "--checkpoints-dir", tmp_path, "--no-progress")
    assert diverged.code == 1 and "training diverged" in diverged.err
    assert (run / "metrics.jsonl").exists() and not list(run.glob("*.pt"))
    again = phalanx("train", "--epochs", 1, "--checkpoints-dir", tmp_path, "--no-progress")
    assert again.code == 0, again.err
    assert f"{run} held a run that stopped before its first checkpoint: a new run replaces it" in again.out
    assert (run / "latest.pt").exists()
    assert "failed" not in [r["state"] for r in records(run, "status")]  # the failed run's records are gone
    assert all(r["lr"] < 1 for r in records(run, "train"))


def test_a_run_still_training_before_its_first_checkpoint_is_not_replaced(phalanx, tmp_path):
    from phalanx.checkpoint.rundir import claimed

    run = tmp_path / "experiment"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    with claimed(run, True):  # what a live run's rank 0 holds
        refused = phalanx("train", "--epochs", 1, "--checkpoints-dir", tmp_path)
    assert refused.code == 2 and "--name: a run is training in" in refused.err, refused.err
    assert list(run.iterdir()) == [run / "metrics.jsonl"]


def test_deepliif_remote_true_is_accepted_and_says_what_copies_the_files(phalanx, tmp_path):
    from phalanx.config import RunConfig
    from phalanx.train.run import remote_notes

    # The guide's spelling, a value after the flag: --remote True (and False).
    alone = phalanx("train", "--remote", "True", "--epochs", 1, "--checkpoints-dir", tmp_path, "--no-progress")
    assert alone.code == 0, alone.err
    assert "--remote True: snapshots go to" in alone.out and "add --remote-transfer-cmd" in alone.out
    assert list((tmp_path / "experiment/pickle").glob("*.pkl"))
    off = phalanx("train", "--remote", "False", "--print-config")
    assert off.code == 0 and "remote: false" in off.out
    # With a transfer (test_remote.py: snapshots and checkpoints reach it) there is nothing to add.
    assert remote_notes(RunConfig.flat(remote=True, remote_transfer_cmd="json.dumps")) == []


# --- issue 36, "what a user writing their own task hit": a checkpoint that could not load back ---------


def test_a_value_no_checkpoint_can_load_back_is_refused_before_the_first_step_naming_it(phalanx, tmp_path):
    # A numpy scalar in TaskData.info once made every checkpoint unloadable (phalanx loads its own
    # with weights_only=True), found only at the resume; then at the first save, after an epoch.
    result = phalanx(
        "train",
        "--task",
        "phalanx_testtasks:NumpyInInfo",
        "--epochs",
        1,
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
    )
    assert result.code == 2 and len(result.err.strip().splitlines()) == 1, result.err
    assert "TaskData.info['scale'] is a numpy.float64 (0.5)" in result.err and "float(x)" in result.err
    assert not (tmp_path / "experiment").exists() and result.out == ""  # refused before anything was written


def test_resume_auto_never_starts_over_a_run_whose_checkpoints_do_not_load(phalanx, tmp_path):
    assert phalanx("train", "--epochs", 1, "--checkpoints-dir", tmp_path, "--no-progress").code == 0
    latest = tmp_path / "experiment/latest.pt"
    latest.write_bytes(b"not a checkpoint any more")
    history = (tmp_path / "experiment/metrics.jsonl").read_bytes()
    result = phalanx("train", "--epochs", 2, "--resume", "auto", "--checkpoints-dir", tmp_path, "--no-progress")
    assert result.code == 2, result.err
    assert result.err.strip().splitlines()[-1].startswith("phalanx: --resume: none of the 1 checkpoint(s)")
    assert latest.read_bytes() == b"not a checkpoint any more"  # nothing replaced, nothing retrained
    assert (tmp_path / "experiment/metrics.jsonl").read_bytes() == history


@pytest.mark.slow
def test_a_validation_sum_not_declared_in_empty_sums_is_one_line_naming_it(tmp_path):
    from conftest import REPO, run_phalanx

    tasks = {"PYTHONPATH": os.pathsep.join([str(REPO / "examples/tasks"), str(REPO / "tests/support"), str(REPO)])}
    result = run_phalanx(
        "train",
        "--task",
        "phalanx_testtasks:UndeclaredSum",
        "--epochs",
        1,
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
        env=tasks,
    )
    assert result.code == 1, result.err
    assert result.err.strip().splitlines()[-1] == (
        "phalanx: UndeclaredSum.validation_step returned 'PSNR_1', which its empty_sums() does not declare (L1, "
        "samples); declare every sum there (a rank with no validation sample still all-reduces it)"
    )
    assert "Traceback" not in result.err


def test_a_plain_training_split_trains_as_the_same_split_in_a_seeded_view(phalanx, tmp_path):
    # A tensor (or any Dataset indexed by int) as TaskData.train once failed in a loader worker:
    # "list indices must be integers or slices, not tuple". It trains, sample for sample as before.
    import torch

    common = ["--epochs", 1, "--checkpoints-dir", tmp_path, "--no-progress", "--log-every", 20]
    assert (
        phalanx("train", "--task", "adversarial_autoencoder:AdversarialAutoencoder", "--name", "view", *common).code
        == 0
    )
    plain = phalanx("train", "--task", "phalanx_testtasks:PlainTrainSplit", "--name", "plain", *common)
    assert plain.code == 0, plain.err
    view, plain = (torch.load(tmp_path / name / "latest.pt", weights_only=True)["models"] for name in ("view", "plain"))
    assert all(torch.equal(view[net][k], plain[net][k]) for net in view for k in view[net])


def test_metric_labels_label_a_tasks_axes_too():
    # They once labelled the status pane only; the axes needed an override of panes().
    from phalanx.config import from_mapping
    from phalanx.config.registry import task_class

    cls = task_class("adversarial_autoencoder:AdversarialAutoencoder")
    labelled = type("Labelled", (cls,), {"metric_labels": {"L1": "L1 error", "G_GAN": "generator GAN loss"}})
    task = labelled(from_mapping({"task": "adversarial_autoencoder:AdversarialAutoencoder"}, "test"))
    panes = {p["win"]: p for p in task.panes(task.declare(task.build_data(), {}))}
    assert panes["val_L1"]["ylabel"] == "L1 error" and panes["val_L1"]["title"] == "validation L1 error"
    assert panes["train_G_GAN"]["ylabel"] == "generator GAN loss" and panes["train_D_real"]["ylabel"] == "D_real"


def test_a_visuals_record_is_made_with_the_public_api_and_networks_in_eval_mode(phalanx, tmp_path):
    # The dashboard's picture helpers were importable from internal modules only (records, pictures).
    from phalanx.tasks import denormalize, images_item, png, strip  # noqa: F401  (the public names)
    from phalanx.visualize import LocalSource

    result = phalanx(
        "train",
        "--task",
        "phalanx_testtasks:EvalModeVisuals",
        "--epochs",
        1,
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
    )
    assert result.code == 0, result.err
    history = LocalSource(tmp_path / "experiment/pickle").history(warn=False)
    images = [r for r in history.records if r["kind"] == "images"]
    assert len(images) == 1 and images[0]["items"][0]["caption"].endswith("in eval mode: True")


def test_a_declared_loss_the_step_does_not_return_is_one_line_at_the_first_step(phalanx, tmp_path):
    result = phalanx(
        "train",
        "--task",
        "phalanx_testtasks:UndeclaredLoss",
        "--epochs",
        1,
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
    )
    assert result.code == 2 and len(result.err.strip().splitlines()) == 1, result.err
    assert result.err.startswith(
        "phalanx: UndeclaredLoss.training_step returned ['D_fake', 'D_real', 'G_GAN', "
        "'G_L1'] without G_total: it returns a dict with every name of"
    )
    assert not tmp_path.joinpath("experiment").exists()  # bad input (the task's), found at step 1: nothing left


def test_every_validation_metric_gets_a_pane_and_can_pick_best_pt(phalanx, tmp_path):
    # The metrics with panes once defaulted to the best metric alone: PSNR_1 was logged with no pane,
    # and --best-metric PSNR_1 was refused.
    from phalanx.config import from_mapping
    from phalanx.config.registry import task_class
    from phalanx.train.best import Best

    task = task_class("phalanx_testtasks:PerTargetMetric")(
        from_mapping({"task": "phalanx_testtasks:PerTargetMetric"}, "test")
    )
    declared = task.declare(task.build_data(), {})
    assert {"val_L1", "val_PSNR_1"} <= {p["win"] for p in task.panes(declared)}
    assert Best(declared, "PSNR_1").name == "PSNR_1"


def float_options() -> list[tuple[str, str]]:
    """(task, flag) for every float option: the general ones once, each built-in task's own."""
    import dataclasses

    from phalanx.config import FIELDS
    from phalanx.config import registry as tasks
    from phalanx.config.fields import flag

    found = [
        ("classify", flag(name))
        for name, f in FIELDS.items()
        if f.metadata["cli"] and f.type in ("float", "float | None")
    ]
    found += [
        (info.name, flag(f.name))
        for info in tasks.BUILTIN.values()
        for f in dataclasses.fields(info.options)
        if f.type in ("float", "float | None")
    ]
    return found


def test_every_float_option_of_every_task_refuses_nan_and_inf_in_one_line(phalanx):
    # config._validate once re-implemented the field checks without finiteness: --momentum nan
    # --weight-decay inf --print-config exited 0 (issue 36).
    options = float_options()
    assert len(options) >= 20 and ("classify", "--momentum") in options and ("translate", "--lambda-l1") in options
    for task, option in options:
        for value in ("nan", "inf", "-inf"):
            result = phalanx("train", "--task", task, option, value, "--print-config")
            lines = result.err.strip().splitlines()
            assert result.code == 2 and len(lines) == 1 and option in lines[0], (task, option, value, result.err)
            assert result.out == ""


def test_val_every_validates_every_nth_and_the_last_epoch_and_trains_the_same(phalanx, tmp_path):
    common = ["--epochs", 3, "--checkpoints-dir", tmp_path, "--no-progress", "--val-fraction", 0.5]
    every = phalanx("train", "--name", "every", *common)
    sparse = phalanx("train", "--name", "sparse", "--val-every", 2, *common)
    assert every.code == 0 and sparse.code == 0, sparse.err
    assert "epoch 1/3" in sparse.out and "(not validated: --val-every)" in sparse.out.splitlines()[1]
    assert [r["epoch"] for r in records(tmp_path / "sparse", "val")] == [2, 3]  # the last epoch always
    import torch

    # Validation draws nothing from training's random streams: the weights are the same bit for bit.
    a, b = (
        torch.load(tmp_path / name / "latest.pt", weights_only=True)["models"]["model"] for name in ("every", "sparse")
    )
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert torch.load(tmp_path / "sparse" / "best.pt", weights_only=True)["epoch"] in (2, 3)


@pytest.mark.parametrize("workers", [0, 1])
def test_a_data_set_that_raises_stopiteration_fails_the_run_instead_of_cutting_its_epoch_short(
    phalanx, tmp_path, workers
):
    # A DataLoader takes a StopIteration from a data set (in its process or a worker's) for its own
    # end: without a check the epoch ends after one batch of six, saved as if whole.
    result = phalanx(
        "train",
        "--task",
        "phalanx_testtasks:DataEndsEarly",
        "--epochs",
        1,
        "--val-fraction",
        0.9,
        "--num-workers",
        workers,
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
    )
    assert result.code == 1, result.err
    assert result.err.strip() == (
        "phalanx: the training data ended after 1 of the 6 batches planned for epoch 1: a "
        "StopIteration raised inside the data set's __getitem__ ends a DataLoader"
    ), result.err
    assert not (tmp_path / "experiment/latest.pt").exists() and not records(tmp_path / "experiment", "val")


@pytest.mark.parametrize("workers", [0, 1])
def test_validation_data_that_raises_stopiteration_fails_the_run_instead_of_validating_fewer_images(
    phalanx, tmp_path, monkeypatch, workers
):
    # Without a check, validation ends after one batch of 32 and its metrics are over 32 images.
    monkeypatch.setenv("ENDS_EARLY", "val")
    result = phalanx(
        "train",
        "--task",
        "phalanx_testtasks:DataEndsEarly",
        "--epochs",
        1,
        "--val-fraction",
        0.9,
        "--num-workers",
        workers,
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
    )
    assert result.code == 1, result.err
    assert result.err.strip() == (
        "phalanx: the validation data ended after 1 of the 51 batches: a StopIteration "
        "raised inside the data set's __getitem__ ends a DataLoader"
    ), result.err
    assert not records(tmp_path / "experiment", "val")


def test_evaluation_data_that_raises_stopiteration_fails_instead_of_scoring_fewer_images(
    phalanx, tmp_path, monkeypatch
):
    monkeypatch.setenv("ENDS_EARLY", "none")
    assert (
        phalanx(
            "train",
            "--task",
            "phalanx_testtasks:DataEndsEarly",
            "--epochs",
            1,
            "--val-fraction",
            0.9,
            "--checkpoints-dir",
            tmp_path,
            "--no-progress",
        ).code
        == 0
    )
    monkeypatch.setenv("ENDS_EARLY", "val")
    result = phalanx("evaluate", "--checkpoint", tmp_path / "experiment/latest.pt", "--output", tmp_path / "e.json")
    assert result.code == 1, result.err
    assert result.err.strip() == (
        "phalanx: the evaluation data ended after 1 of the 51 batches: a StopIteration "
        "raised inside the data set's __getitem__ ends a DataLoader"
    ), result.err
    assert not result.out and not (tmp_path / "e.json").exists()


def test_the_step_time_breakdown_says_a_step_waits_for_its_data(phalanx, tmp_path):
    # 32 images of 20 ms each per step against a small CNN's step on 8x8 digits: the wait dominates.
    result = phalanx(
        "train",
        "--task",
        "phalanx_testtasks:SlowData",
        "--epochs",
        1,
        "--val-fraction",
        0.9,
        "--log-every",
        1,
        "--num-workers",
        0,
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
    )
    assert result.code == 0, result.err
    train = records(tmp_path / "experiment", "train")
    parts = ("step_data_s", "step_compute_s", "step_communication_s", "step_optimizer_s", "step_logging_s")
    assert len(train) == 6 and all(all(r[p] >= 0 for p in parts) for r in train)
    assert all(r["step_communication_s"] == 0 for r in train)  # one process waits for no other
    full = train[1:-1]  # the first step also warms up; the last holds 20 images
    assert all(r["step_data_s"] >= 0.64 for r in full)  # at least a step's 32 sleeps of 20 ms
    assert all(r["step_data_s"] > r["step_compute_s"] + r["step_optimizer_s"] for r in full)
    # The parts make up the steps' time (logging is counted one window late: the run's sums agree).
    measured, elapsed = sum(r[p] for r in train for p in parts), sum(r["seconds"] for r in train)
    assert abs(measured - elapsed) < 0.15 * elapsed, (measured, elapsed)
    line = next(line for line in result.out.splitlines() if line.startswith("phalanx: time per step: data "))
    assert int(line.split("data ")[1].split("%")[0]) >= 50, line


def test_a_last_batch_of_one_image_for_batchnorm1d_is_refused_before_anything_is_written(phalanx, tmp_path):
    # 81 training images in batches of 8: BYOL's projector (BatchNorm1d) once failed at the last step
    # of epoch 1 ("Expected more than 1 value per channel"), an epoch's work lost.
    common = [
        "--task",
        "byol",
        "--dataset",
        "synthetic",
        "--synthetic-samples",
        90,
        "--val-fraction",
        0.1,
        "--image-size",
        16,
        "--checkpoints-dir",
        tmp_path / "ck",
        "--no-progress",
    ]
    for command in (["train"], ["train", "--dry-run"]):
        refused = phalanx(*command, "--batch-size", 8, *common)
        assert refused.code == 2 and refused.out == "" and refused.err.count("\n") == 1, refused
        assert refused.err.startswith(
            "phalanx: --batch-size: 8 leaves one image for the last training batch of every "
            "epoch (81 training images), and BatchNorm1d (projector.1) cannot train on one"
        )
        assert refused.err.rstrip().endswith("leaves at least two: 7, say")
    assert not (tmp_path / "ck").exists()
    assert phalanx("train", "--dry-run", "--batch-size", 7, *common).code == 0  # 81 = 11 x 7 + 4
    # Two ranks of 20: the last global batch holds one image (the other rank a padding sample); with
    # --sync-bn, BatchNorm over both ranks' rows sees that one image alone too.
    for sync in ([], ["--sync-bn"]):
        ddp = phalanx(
            "trainlaunch", "--dry-run", "--batch-size", 20, *sync, *common, "--use-torchrun", "--nproc-per-node 2"
        )
        assert ddp.code == 2 and "20 leaves one image on a rank" in ddp.err and "over 2 ranks" in ddp.err, ddp.err
    # A resume at another world size cuts the rest of its first epoch elsewhere: one step of 6 in one
    # process, then 2 ranks of 6 take the 75 images left in 6 batches of 12 and one of 3 (ranks 2 and 1).
    # Every whole epoch of 81 is fine (6 x 12 + 9); that first one is refused, before anything is written.
    assert phalanx("train", "--batch-size", 6, "--max-steps", 1, *common).code == 0
    run = tmp_path / "ck/experiment"
    written = {path: path.read_bytes() for path in run.rglob("*") if path.is_file()}
    for dry in (["--dry-run"], []):
        resumed = phalanx(
            "trainlaunch", *dry, "--resume", "auto", "--max-steps", 0, *common, "--use-torchrun", "--nproc-per-node 2"
        )
        # (each worker of a real launch refuses it: a line a rank, the first to stop naming why)
        assert resumed.code == 2 and (
            "--batch-size: 6 leaves one image on a rank for the last training batch of the "
            "epoch this resume continues (75 of 81 training images left over 2 ranks), and "
            "BatchNorm1d (projector.1) cannot train on one; resume in a number of processes "
            "that leaves at least two: 1, say" in resumed.err
        ), resumed.err
    assert {path: path.read_bytes() for path in run.rglob("*") if path.is_file()} == written
    # (the run's batch size is its own: a resume at another is refused, so the rest cannot be cut otherwise)
    # DataParallel cuts every batch over its GPUs (a batch of 3 over 2: 2 and 1). This machine has no
    # GPU: the dry run plans DataParallel over GPUs 0 and 1 all the same (a real run needs them).
    dp = phalanx("train", "--dry-run", "--gpu-ids", "0,1", "--batch-size", 3, *common, "--name", "dp")
    assert (
        dp.code == 2
        and dp.out == ""
        and dp.err
        == (
            "phalanx: --batch-size: 3 leaves one image on a GPU for a training batch (DataParallel splits each over 2 "
            "GPUs; 81 training images), and BatchNorm1d (projector.1) cannot train on one; choose a --batch-size that "
            "leaves at least two: 7, say\n"
        )
    ), dp.err  # 4 to 6 leave a last batch of 1 or 3 (1 and 2 rows to a GPU)
    assert phalanx("train", "--dry-run", "--gpu-ids", "0,1", "--batch-size", 7, *common, "--name", "dp").code == 0


def test_a_single_row_refusal_names_what_can_change_under_dataparallel_and_after_a_resume():
    # (DataParallel itself needs GPUs: the check is called as a run on two GPUs calls it)
    from torch import nn

    from phalanx.config import RunConfig
    from phalanx.errors import PhalanxError
    from phalanx.train.single_rows import refuse_single_rows

    head = {"projector": nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))}
    cfg = RunConfig.flat(batch_size=4)
    refuse_single_rows(cfg, 84, head, 1, replicas=2)  # 21 batches of 4: 2 rows a GPU
    with pytest.raises(
        PhalanxError,
        match=r"^--batch-size: 3 leaves one image on a GPU .* choose a --batch-size that leaves at least "
        r"two: 4, say$",
    ):
        refuse_single_rows(RunConfig.flat(batch_size=3), 84, head, 1, replicas=2)  # 2 and 1 in every batch
    # Resumed at sample 3, the 81 left end in a batch of 1: the batch size is the run's, the GPUs can change
    with pytest.raises(PhalanxError, match=r"on a GPU .* resume on another number of GPUs \(--gpu-ids\)"):
        refuse_single_rows(cfg, 84, head, 1, start=3, replicas=2)
    with pytest.raises(PhalanxError, match=r"resume in a number of processes that leaves at least two: 1, say$"):
        refuse_single_rows(cfg, 84, head, 2, start=2)  # 82 left over 2 ranks of 4: a last batch of 2, one a rank
    refuse_single_rows(cfg, 84, {"plain": nn.Linear(2, 2)}, 1, start=3, replicas=2)  # no BatchNorm1d: nothing to refuse


def test_dataparallels_smallest_piece_is_the_smallest_chunk_of_its_scatter():
    import torch

    from phalanx.train.single_rows import smallest_chunk

    for rows in range(1, 60):
        for replicas in range(1, 9):
            pieces = torch.arange(rows).chunk(replicas)  # what DataParallel's scatter does to a batch
            assert smallest_chunk(rows, replicas) == min(len(piece) for piece in pieces), (rows, replicas)


def test_the_smallest_share_is_the_smallest_micro_batch_of_the_plan():
    import torch

    from phalanx.data.sampling import plan_epoch, smallest_share

    for total in range(1, 40):
        for batch in range(1, 6):
            for world in range(1, 4):
                for accumulate in (1, 3):
                    for start in {0, batch, total // 2}:  # a resume's first epoch: the rest from ``start``
                        if start >= total:
                            continue
                        plans = [
                            plan_epoch(torch.arange(total), start, batch, world, rank, accumulate)
                            for rank in range(world)
                        ]
                        assert smallest_share(total - start, batch, world) == min(
                            len(m.indices) for plan in plans for m in plan
                        )

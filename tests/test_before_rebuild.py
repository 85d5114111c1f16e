"""Runs written by phalanx before its modules moved into packages (tests/fixtures/before-rebuild):
checkpoints and snapshots are plain data, so a move of code must not change what loads. Each is
resumed, evaluated, predicted with, consolidated or plotted by today's code."""

from __future__ import annotations

import shutil

import pytest
import torch
from conftest import REPO, records

FIXTURES = REPO / "tests" / "fixtures" / "before-rebuild"


@pytest.fixture
def runs(tmp_path):
    shutil.copytree(FIXTURES, tmp_path / "ck", ignore=shutil.ignore_patterns("README.md"))
    return tmp_path / "ck"


@pytest.mark.slow
def test_a_classifier_stopped_mid_epoch_resumes_evaluates_and_plots(runs, phalanx):
    from phalanx.visualize import LocalSource

    assert [r["step"] for r in records(runs / "classify", "train")] == [8]  # logged where it stopped
    resumed = phalanx("train", "--checkpoints-dir", runs, "--name", "classify", "--resume", "auto", "--no-progress")
    assert resumed.code == 0, resumed.err
    assert f"resumed from {runs / 'classify/latest.pt'} in epoch 1 at sample 512 of 1438" in resumed.out
    steps = [r["step"] for r in records(runs / "classify", "train")]
    assert steps[0] == 8 and steps == sorted(set(steps)) and steps[-1] == 46  # 23 steps an epoch, continued
    evaluated = phalanx("evaluate", "--checkpoint", runs / "classify", "--ema", "--no-progress")
    assert evaluated.code == 0 and "acc" in evaluated.out, evaluated.err
    history = LocalSource(runs / "classify/pickle").history(warn=False)
    assert [r["step"] for r in history.records if r["kind"] == "train"][-1] == 46


@pytest.mark.slow
def test_a_momentum_queue_resumes_and_a_sharded_checkpoint_consolidates(runs, phalanx, tmp_path):
    queue = torch.load(runs / "moco/latest.pt", weights_only=True)["task_state"]
    resumed = phalanx("train", "--checkpoints-dir", runs, "--name", "moco", "--resume", "auto", "--no-progress")
    assert resumed.code == 0 and "resumed from" in resumed.out, resumed.err
    assert queue and torch.load(runs / "moco/latest.pt", weights_only=True)["step"] > 6
    whole = phalanx("consolidate", "--checkpoint", runs / "fsdp/latest.pt", "--output", tmp_path / "whole.pt")
    assert whole.code == 0, whole.err
    state = torch.load(tmp_path / "whole.pt", weights_only=True)
    assert (state["step"], sorted(state["models"])) == (4, ["model"])
    assert phalanx("evaluate", "--checkpoint", tmp_path / "whole.pt", "--no-progress").code == 0


def test_a_translation_checkpoint_predicts(runs, phalanx, tmp_path):
    from PIL import Image

    (tmp_path / "in").mkdir()
    Image.new("L", (16, 16), 128).save(tmp_path / "in/a.png")
    predicted = phalanx(
        "predict",
        "--checkpoint",
        runs / "translate/latest.pt",
        tmp_path / "in",
        "--output",
        tmp_path / "out",
        "--no-progress",
    )
    assert predicted.code == 0, predicted.err
    assert [p.name for p in (tmp_path / "out").rglob("*.png")]


def test_a_task_written_before_the_rebuild_imports_what_it_imported():
    """The names the docs gave task authors before the package moved into folders still import."""
    from phalanx.data import SeededView, load_digits  # noqa: F401
    from phalanx.data.inputs import InputImages, output_names  # noqa: F401
    from phalanx.data.sources import holdout_indices  # noqa: F401
    from phalanx.errors import PhalanxError
    from phalanx.fields import option
    from phalanx.tasks import Inference, Predictor, Task, TaskData, denormalize, images_item, png, strip  # noqa: F401
    from phalanx.tasks import PhalanxError as exported_error
    from phalanx.tasks import option as exported_option

    assert option is exported_option and PhalanxError is exported_error

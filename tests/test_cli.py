"""The command line as people type it: help, dry runs, printed configurations, user modules."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from conftest import snapshot_tree

from phalanx.checkpoint.rundir import read_metrics
from phalanx.config import RunConfig

PHALANX = Path(sys.executable).with_name("phalanx")  # the console script, as a user runs it


def test_bare_phalanx_prints_its_help_as_help(phalanx):
    result = phalanx()
    assert result.code == 0 and result.err == ""
    assert result.out.startswith("Usage: phalanx") and "\n  train " in result.out and "\\n" not in result.out


def test_each_commands_help_is_grouped_and_says_what_the_option_means_there(phalanx):
    train, launch = phalanx("train", "--help").out, phalanx("trainlaunch", "--help").out
    for heading in (
        "Run options:",
        "Data options:",
        "Model options:",
        "Optimisation options:",
        "Devices and processes options:",
        "Output options:",
        "Remote storage options:",
    ):
        assert heading in train and heading in launch
    flat_train, flat_launch = " ".join(train.split()), " ".join(launch.split())
    assert "DataParallel" in flat_train and "Batch size per worker" in flat_launch
    assert "repeat for DataParallel" not in flat_launch and "the batch all its GPUs share" not in flat_launch
    assert "local rank r trains on the r-th id" in flat_launch


def test_gpu_ids_take_a_comma_list_as_well_as_repeated_flags():
    from phalanx.cli import main

    assert RunConfig.flat(gpu_ids="0,1").devices.gpu_ids == (0, 1) == RunConfig.flat(gpu_ids=[0, 1]).devices.gpu_ids
    for args in (["--gpu-ids", "0,1"], ["--gpu-ids", "0", "--gpu-ids", "1"], ["--gpu-ids", "0,1", "--gpu-ids", "2"]):
        assert main(["trainlaunch", "--dry-run", *args]) == 0
    assert main(["trainlaunch", "--dry-run", "--gpu-ids", "0,x"]) == 2


def test_train_dry_run_plans_without_writing_and_warns_about_absent_gpus(phalanx, tmp_path):
    result = phalanx(
        "train", "--dry-run", "--gpu-ids", "0,1", "--batch-size", 64, "--image-size", 32, "--checkpoints-dir", tmp_path
    )
    assert result.code == 0, result.err
    assert "DataParallel over cuda:0, cuda:1" in result.out
    assert "batch size: 64 per process, 64 effective" in result.out
    assert "learning rate: 0.1" in result.out and "23 optimizer steps per epoch" in result.out
    assert "data: built-in digits (1438 train / 359 val, 32x32)" in result.out  # not "8x8"
    assert f"run dir: {tmp_path / 'experiment'}: a new run" in result.out
    assert "launcher: none (one process)" in result.out
    if not torch.cuda.is_available():
        assert "warning: --gpu-ids: GPU 0 asked for, but CUDA is not available here" in result.out
    assert list(tmp_path.iterdir()) == []
    linear = phalanx(
        "train",
        "--dry-run",
        "--gpu-ids",
        "0,1",
        "--scale-lr",
        "linear",
        "--checkpoints-dir",
        tmp_path,
        "--clip-grad",
        0.5,
        "--clip-mode",
        "value",
        "--augment",
        "randaugment",
        "--no-hflip",
    )
    assert "learning rate: 0.2" in linear.out and "; gradients clipped to 0.5 (each element)" in linear.out
    assert "clipped" not in result.out
    # the policy named (the line said "random crop" alone)
    assert "(1438 train / 359 val, 8x8), augment randaugment: random crop + RandAugment\n" in linear.out


def test_dry_run_says_what_would_happen_to_an_existing_run(phalanx, tmp_path):
    first = phalanx("train", "--max-steps", 3, "--sync-bn", "--checkpoints-dir", tmp_path, "--no-progress")
    assert first.code == 0, first.err
    # --sync-bn in one process changes nothing, and is said so (a newcomer's run was silent about it)
    assert "phalanx: warning: --sync-bn normalises over the rows of several processes" in first.out + first.err
    before = snapshot_tree(tmp_path)
    # The plan is printed, and the dry run exits as the real run would: a pre-check in a job script
    # that passed on exit 0 let the job fail (a newcomer's finding).
    taken = phalanx("train", "--dry-run", "--checkpoints-dir", tmp_path)
    assert taken.code == 2 and "a real run would stop here: --name:" in taken.out
    assert taken.err.startswith("phalanx: --name: ") and taken.err.count("\n") == 1, taken.err
    resumed = phalanx("train", "--dry-run", "--resume", "auto", "--checkpoints-dir", tmp_path)
    assert resumed.code == 0 and "latest.pt (in epoch 1 at sample 96, step 3)" in resumed.out  # not "epoch 0"
    stopping = phalanx("train", "--dry-run", "--resume", "auto", "--max-steps", 5, "--checkpoints-dir", tmp_path)
    assert "45 optimizer steps per epoch; stops at optimizer step 5 (--max-steps)" in stopping.out
    assert "--max-steps" not in resumed.out
    # --weights tried against --model as the run would load them (a dry run passed, the run refused)
    trained = tmp_path / "experiment/latest.pt"
    with warnings.catch_warnings(record=True) as warned:  # in process: torch's warnings are not on stderr
        warnings.simplefilter("always")
        weighed = phalanx("train", "--dry-run", "--name", "ft", "--weights", trained, "--checkpoints-dir", tmp_path)
    assert weighed.code == 0 and f"weights {trained}: 8 tensors loaded, 0 replaced" in weighed.out, weighed.err
    assert not [w for w in warned if "meta" in str(w.message)]  # torch's, of copies into meta tensors: said 8 times
    other = phalanx(
        "train", "--dry-run", "--name", "ft", "--weights", trained, "--model", "resnet18", "--checkpoints-dir", tmp_path
    )
    assert other.code == 2 and other.err.startswith("phalanx: --weights: no tensor in "), other.err
    assert snapshot_tree(tmp_path) == before


@pytest.mark.parametrize("command", ["train", "trainlaunch"])
def test_print_config_writes_yaml_that_config_reads_back(phalanx, tmp_path, command):
    args = ["--lr", "0.03", "--gpu-ids", "0,1", "--optimizer", "adamw", "--name", "x y", "--pickle-dir", "p"]
    printed = phalanx(command, "--print-config", *args)
    assert printed.code == 0, printed.err
    (tmp_path / "run.yaml").write_text(printed.out)
    again = phalanx(command, "--print-config", "--config", tmp_path / "run.yaml")
    assert again.out == printed.out
    import yaml

    assert RunConfig.flat(**yaml.safe_load(printed.out)) == RunConfig.flat(
        lr=0.03, gpu_ids=(0, 1), optimizer="adamw", name="x y", pickle_dir="p"
    )


@pytest.mark.slow
def test_train_finds_user_modules_in_the_current_directory_as_trainlaunch_does(tmp_path):
    (tmp_path / "mymodel.py").write_text(
        "import torch.nn as nn\n"
        "def make(num_classes):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))\n"
    )
    (tmp_path / "mysave.py").write_text(
        "def save(path):\n    with open('saved.txt', 'a') as fh:\n        fh.write(path + '\\n')\n"
    )
    args = ["--model", "mymodel:make", "--remote-transfer-cmd", "mysave.save", "--epochs", 1, "--no-progress"]
    for command in (
        ["train", "--name", "single"],
        ["trainlaunch", "--name", "ddp", "--use-torchrun", "--nproc_per_node 1"],
    ):
        result = subprocess.run(
            [str(PHALANX), *command, *map(str, args)], cwd=tmp_path, capture_output=True, text=True, timeout=240
        )
        assert result.returncode == 0, result.stderr
    saved = (tmp_path / "saved.txt").read_text().split()
    assert {"checkpoints/single/latest.pt", "checkpoints/ddp/latest.pt"} <= set(saved)
    assert [r["epoch"] for r in read_metrics(tmp_path / "checkpoints/single/metrics.jsonl") if r["kind"] == "val"] == [
        1
    ]


def test_a_dry_run_allocates_no_network_and_no_generated_images_too_large_for_memory(phalanx, tmp_path):
    # Both used to be allocated for real: a fuzzed dry run took 24 GB and the OOM killer.
    huge = phalanx(
        "train",
        "--dry-run",
        "--task",
        "simclr",
        "--hidden-dim",
        1000000,
        "--projection-dim",
        1000000,
        "--checkpoints-dir",
        tmp_path,
    )
    assert huge.code == 0 and "network projector: Sequential, 1,000,131,000,000 parameters" in huge.out
    large = phalanx("train", "--dry-run", "--image-size", 3000, "--checkpoints-dir", tmp_path)
    assert large.code == 2 and large.err.startswith("phalanx: --image-size: the built-in digits at 3000 px")
    # Synthetic data is bounded by the machine's memory: a million images at 512 px (3 TiB) is refused.
    synthetic = phalanx(
        "train",
        "--dry-run",
        "--dataset",
        "synthetic",
        "--synthetic-samples",
        1000000,
        "--image-size",
        512,
        "--checkpoints-dir",
        tmp_path,
    )
    assert synthetic.code == 2 and synthetic.err.startswith(
        "phalanx: --synthetic-samples: synthetic data (1000000 images at 512 px) would take 2930 GiB in memory"
    )
    assert list(tmp_path.iterdir()) == []


def test_task_option_beats_a_config_files_key_and_a_files_false_flag_is_named_by_its_line(phalanx, tmp_path):
    # Found in review: a file's flat `temperature: 0.3` after its task_options beat a typed
    # --task-option (the later key won); a file's `gather: false` was named as --no-gather, unlocated.
    import yaml

    (tmp_path / "c.yaml").write_text("task: simclr\ntask_options: {projection_dim: 32}\ntemperature: 0.3\n")
    printed = phalanx("train", "--config", tmp_path / "c.yaml", "--task-option", "temperature=0.2", "--print-config")
    assert printed.code == 0, printed.err
    assert yaml.safe_load(printed.out)["task_options"]["temperature"] == 0.2
    (tmp_path / "g.yaml").write_text("task: byol\ngather: false\n")
    refused = phalanx("train", "--config", tmp_path / "g.yaml", "--print-config")
    assert refused.code == 2 and refused.err.strip() == (
        f"phalanx: --config {tmp_path / 'g.yaml'}, line 2: gather: is an option of --task simclr, barlowtwins "
        "or vicreg; this run's task is byol"
    ), refused.err


def test_flags_of_timm_torchvision_and_lightning_are_answered_with_phalanxs_name_for_them(phalanx):
    # click's own suggestion guesses from the letters ("--amp": did you mean --name?); where the
    # command has the thing under another name, the line names it, and only there.
    cases = [
        ("train", ["--amp"], "No such option '--amp': phalanx's is --precision bf16 (or fp16"),
        ("train", ["--gradient_clip_val", "1"], "No such option '--gradient_clip_val': phalanx's is --clip-grad MAX"),
        ("trainlaunch", ["-b", "8"], "No such option '-b': phalanx's is --batch-size"),
        ("train", ["--test-only"], "No such option '--test-only': phalanx's is phalanx evaluate --checkpoint PATH"),
        ("train", ["--precision", "bf16-mixed"], "--precision: 'bf16-mixed' is phalanx's bf16 (one of fp32"),
        ("train", ["--precision=16-mixed"], "--precision: '16-mixed' is phalanx's fp16 (one of fp32"),
        ("evaluate", ["--test-only"], "No such option '--test-only'."),  # evaluate is what it asks for
        ("evaluate", ["--amp"], "No such option '--amp'. Did you mean '--ema'?"),  # evaluate has no --precision
        # --label-smoothing is classify's: no answer for segment's run, nor a guess at it
        ("train", ["--task", "segment", "--smoothing", "0.1"], "No such option '--smoothing'."),
        # DINO's and Lightly's names, for the task that has the option (the default task has none)
        (
            "train",
            ["--task", "dino", "--use_bn_in_head"],
            "No such option '--use_bn_in_head': phalanx's is --head-norm",
        ),
        (
            "train",
            ["--task", "moco", "--memory-bank-size", "8"],
            "No such option '--memory-bank-size': phalanx's is --queue-size",
        ),
        # click's guess, less other tasks' options (DINO's --warmup-teacher-temp is no answer for classify)
        ("train", ["--momentum-teacher", "0.9"], "No such option '--momentum-teacher'. Did you mean '--momentum'?"),
        ("scale", ["--gan-mod", "x"], "No such option '--gan-mod'."),  # --gan-mode is DeepLIIF's
        (
            "train",
            ["--task", "deepliif", "--gan-mod", "x"],
            "No such option '--gan-mod'. (Did you mean one of: '--gan-mode', '--gan-mode-s'?)",
        ),
        # torchrun's and Lightning's process counts: where this command takes them
        ("scale", ["--nodes", "-1"], "No such option '--nodes': phalanx scale's world sizes are --workers"),
        (
            "trainlaunch",
            ["--nnodes", "2"],
            "No such option '--nnodes': it is torchrun's: give it inside --use-torchrun",
        ),
        (
            "train",
            ["--num_nodes", "2"],
            "No such option '--num_nodes': several processes or nodes are phalanx trainlaunch's",
        ),
    ]
    for command, args, line in cases:
        result = phalanx(command, *args)
        lines = result.err.strip().splitlines()
        assert result.code == 2 and len(lines) == 1 and lines[0].startswith(f"phalanx: {line}"), (command, args, lines)
        assert result.out == ""

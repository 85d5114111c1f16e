"""What a new user hit (the issues that report a fresh clone tried as a new user would): each
item as a test that failed before its fix."""

from __future__ import annotations

import shutil

import pytest
import yaml
from conftest import USER_MODELS, records, run_phalanx, snapshot_tree, write_digit_pngs

from phalanx.visualize import LocalSource


def test_the_validation_images_pane_shows_every_class_of_a_val_folder(tmp_path, phalanx):
    root = write_digit_pngs(tmp_path / "data", per_class=8, val=True)  # val/ sorted by class: digit0 first
    assert (
        phalanx(
            "train",
            "--dataroot",
            root,
            "--epochs",
            1,
            "--augment",
            "none",
            "--checkpoints-dir",
            tmp_path / "ck",
            "--no-progress",
        ).code
        == 0
    )
    history = LocalSource(tmp_path / "ck/experiment/pickle").history(warn=False)
    shown = [item["label"] for item in [r for r in history.records if r["kind"] == "images"][-1]["items"]]
    assert len(shown) == 16 and set(shown) == {f"digit{d}" for d in range(10)}


@pytest.mark.slow
def test_a_relative_dataroot_is_recorded_absolute_and_a_missing_one_is_named(tmp_path, phalanx, monkeypatch):
    write_digit_pngs(tmp_path / "digits", per_class=10)
    (tmp_path / "work").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    trained = phalanx("train", "--dataroot", "../digits", "--epochs", 1, "--no-hflip", "--no-progress")
    assert trained.code == 0, trained.err
    checkpoint = tmp_path / "work/checkpoints/experiment/best.pt"
    monkeypatch.chdir(tmp_path / "elsewhere")
    evaluated = phalanx("evaluate", "--checkpoint", checkpoint)
    assert evaluated.code == 0, evaluated.err
    shutil.move(tmp_path / "digits", tmp_path / "moved")
    missing = phalanx("evaluate", "--checkpoint", checkpoint)
    assert missing.code == 2 and missing.err.count("\n") == 1
    assert f"recorded in the checkpoint as {tmp_path / 'digits'}" in missing.err and "pass --dataroot" in missing.err


def test_export_refuses_an_extension_it_does_not_write(tmp_path, phalanx):
    assert phalanx("train", "--epochs", 1, "--checkpoints-dir", tmp_path / "ck", "--no-progress").code == 0
    before = snapshot_tree(tmp_path)
    result = phalanx("export", "--checkpoint", tmp_path / "ck/experiment/latest.pt", "--output", tmp_path / "m.onnx")
    assert result.code == 2 and result.err.count("\n") == 1
    assert "--output: --format torchscript writes" in result.err and "does not write ONNX" in result.err
    assert snapshot_tree(tmp_path) == before


@pytest.mark.slow
def test_trainlaunch_dry_run_checks_the_data_and_the_run_directory(tmp_path):
    (tmp_path / "notrain").mkdir()
    bad = run_phalanx("trainlaunch", "--dataroot", tmp_path / "notrain", "--dry-run", "--checkpoints-dir", tmp_path)
    assert bad.code == 2 and "no train/ folder" in bad.err
    assert run_phalanx("train", "--epochs", 1, "--checkpoints-dir", tmp_path, "--no-progress").code == 0
    taken = run_phalanx("trainlaunch", "--dry-run", "--checkpoints-dir", tmp_path)
    assert taken.code == 2 and "a real run would stop here: --name:" in taken.out and "already holds a run" in taken.out
    assert taken.err.startswith("phalanx: --name: ") and "already holds a run" in taken.err
    assert "data: built-in digits" in taken.out and "network model: SmallCNN" in taken.out


def test_predict_names_what_is_not_an_image_and_fails_when_nothing_was_predicted(tmp_path, phalanx):
    assert phalanx("train", "--epochs", 1, "--checkpoints-dir", tmp_path / "ck", "--no-progress").code == 0
    (tmp_path / "notes.png").write_text("these are my notes")
    result = phalanx(
        "predict",
        "--checkpoint",
        tmp_path / "ck/experiment/latest.pt",
        tmp_path / "notes.png",
        "--output",
        tmp_path / "p.csv",
    )
    assert result.code == 1
    assert f"skipped {tmp_path / 'notes.png'}: not an image" in result.err and "BytesIO" not in result.err
    assert "no image could be predicted" in result.err and not (tmp_path / "p.csv").exists()


def test_a_checkpoint_that_is_not_one_is_said_to_be_what_it_is(tmp_path, phalanx):
    (tmp_path / "notes.txt").write_text("remember the milk\n")
    result = phalanx("evaluate", "--checkpoint", tmp_path / "notes.txt")
    assert result.code == 2 and "a text file, not a torch checkpoint" in result.err and "(101)" not in result.err


def test_resume_auto_with_no_checkpoint_says_it_starts_a_new_run(tmp_path, phalanx):
    result = phalanx(
        "train",
        "--name",
        "exprimentt",
        "--resume",
        "auto",
        "--epochs",
        1,
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
    )
    assert result.code == 0
    assert f"--resume auto: no checkpoint in {tmp_path / 'exprimentt'}: starting a new run" in result.out


def test_flips_are_said_and_warned_about_when_the_classes_look_like_digits(tmp_path, phalanx):
    root = write_digit_pngs(tmp_path / "data", per_class=4)
    result = phalanx("train", "--dataroot", root, "--epochs", 1, "--checkpoints-dir", tmp_path, "--no-progress")
    assert result.code == 0
    assert "augment basic: random crop + horizontal flip (--no-hflip where a flip changes the label" in result.out
    assert "look like digits or letters" in result.out
    quiet = phalanx(
        "train",
        "--dataroot",
        root,
        "--epochs",
        1,
        "--no-hflip",
        "--name",
        "b",
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
    )
    assert "look like digits" not in quiet.out and "horizontal flip" not in quiet.out


def test_a_torchvision_classifier_gets_its_reference_learning_rate_for_the_batch(tmp_path, phalanx):
    plan = phalanx("train", "--model", "resnet18", "--dry-run", "--checkpoints-dir", tmp_path)
    assert plan.code == 0 and "learning rate: 0.0125 (--lr 0.0125" in plan.out and ", 1 warmup" in plan.out
    bigger = phalanx("train", "--model", "resnet18", "--batch-size", 128, "--print-config")
    assert "lr: 0.05\n" in bigger.out
    chosen = phalanx("train", "--model", "resnet18", "--lr", 0.1, "--print-config")
    assert "lr: 0.1\n" in chosen.out and "warmup_epochs: 0.0\n" in chosen.out
    # Adam and AdamW without --lr: torch's 0.001, not the SGD rate of the task (nor of the classifier);
    # a task whose own optimizer is Adam keeps its rate (pix2pix's 0.0002), and --lr wins.
    for args, lr in (
        (["--optimizer", "adamw"], 0.001),
        (["--model", "resnet18", "--optimizer", "adam"], 0.001),
        (["--task", "translate", "--optimizer", "adamw"], 0.0002),
        (["--optimizer", "adam", "--lr", 0.01], 0.01),
        (["--task", "simclr", "--optimizer", "sgd"], 0.06),
        (["--task", "phalanx_testtasks:AdamWithoutRate"], 0.001),
        (["--task", "phalanx_testtasks:GatherTask", "--optimizer", "adam"], 0.001),
    ):
        printed = phalanx("train", *args, "--print-config")
        assert printed.code == 0 and yaml.safe_load(printed.out)["lr"] == lr, (args, printed.out, printed.err)


@pytest.mark.slow
def test_without_a_terminal_an_epoch_prints_a_progress_line_every_few_seconds(tmp_path):
    result = run_phalanx(
        "train",
        "--model",
        "phalanx_testmodels:slow",
        "--epochs",
        1,
        "--log-interval",
        0.5,
        "--checkpoints-dir",
        tmp_path,
        env={**USER_MODELS, "PHALANX_TEST_DELAY": "0.05"},
    )
    assert result.code == 0, result.err
    lines = [line for line in result.err.splitlines() if line.startswith("epoch 1/1: ")]
    assert lines and all("micro-batches" in line and "samples/s" in line for line in lines)  # 45 steps: 2+ s


def test_use_torchrun_on_train_points_to_trainlaunch(phalanx):
    result = phalanx("train", "--use-torchrun", "--nproc_per_node 2")
    assert result.code == 2 and "--use-torchrun is an option of `phalanx trainlaunch`" in result.err


def test_config_file_errors_name_the_file_the_line_and_the_key(tmp_path, phalanx):
    (tmp_path / "run.yaml").write_text("lr: 0.1\nepochs: three\n")
    result = phalanx("train", "--config", tmp_path / "run.yaml")
    assert result.code == 2 and f"--config {tmp_path / 'run.yaml'}, line 2: epochs: expected int" in result.err
    (tmp_path / "broken.yaml").write_text("lr: 0.1\nepochs: [1,\nname: x\n")
    result = phalanx("train", "--config", tmp_path / "broken.yaml")
    assert result.code == 2 and "broken.yaml: line 4: does not parse" in result.err  # where PyYAML stops
    flag_wins = phalanx("train", "--config", tmp_path / "run.yaml", "--epochs", 1, "--print-config")
    assert flag_wins.code == 0  # the bad value was overridden
    # A task: section without its name: one line (it raised KeyError), and --task typed keeps the section.
    (tmp_path / "section.yaml").write_text("task:\n  ngf: 32\n")
    result = phalanx("train", "--config", tmp_path / "section.yaml", "--dry-run")
    assert result.code == 2 and len(result.err.splitlines()) == 1, result.err
    assert f"--config {tmp_path / 'section.yaml'}, line 2: ngf: is an option of --task translate" in result.err
    result = phalanx("train", "--config", tmp_path / "section.yaml", "--task", "translate", "--print-config")
    assert result.code == 0 and "ngf: 32" in result.out, result.err
    # A key of the task: section, misspelt or with a bad value: the file, the key's line and the key
    # (they named the flag alone).
    (tmp_path / "typo.yaml").write_text("epochs: 1\ntask:\n  name: translate\n  ngff: 32\n")
    result = phalanx("train", "--config", tmp_path / "typo.yaml", "--dry-run")
    assert result.code == 2 and len(result.err.splitlines()) == 1, result.err
    assert (
        result.err.startswith(f"phalanx: --config {tmp_path / 'typo.yaml'}, line 4: ngff: ")
        and "did you mean ngf?" in result.err
    ), result.err
    (tmp_path / "value.json").write_text('{"epochs": 1,\n "task": {"name": "translate",\n  "ngf": "x"}}\n')
    result = phalanx("train", "--config", tmp_path / "value.json", "--dry-run")
    assert result.code == 2 and f"--config {tmp_path / 'value.json'}, line 3: ngf: expected int" in result.err, (
        result.err
    )


def test_the_last_window_of_an_epoch_is_never_a_spike_of_a_few_samples(tmp_path, phalanx):
    assert phalanx("train", "--epochs", 2, "--log-every", 20, "--checkpoints-dir", tmp_path, "--no-progress").code == 0
    train = records(tmp_path / "experiment", "train")
    # 45 steps an epoch: logs at steps 20 and 45 (not 40 and 45: a window of 5), then 60, 80 and 90.
    assert [round(r["epoch_progress"] * 1438) for r in train] == [640, 1438, 1918, 2558, 2876]
    assert all(r["samples"] >= 9 * 32 for r in train)  # at least half a window (the last batch is 30)


def test_visualize_port_has_a_help_text():
    from phalanx.cli import cli

    port = next(p for p in cli.commands["visualize"].params if p.name == "port")
    assert port.help and "visdom" in port.help


# --- issue 35: what a new user hit in a fresh clone -----------------------------------------------------


def test_the_readmes_example_task_commands_each_name_their_own_run():
    # Run in order, the second once failed: "already holds a run" (all used the default --name).
    from conftest import REPO

    readme = (REPO / "README.md").read_text()
    block = readme.split("cd examples/tasks\n", 1)[1].split("```", 1)[0]
    commands = [
        line
        for line in block.splitlines()
        if line.startswith("phalanx train") or line.startswith("phalanx trainlaunch")
    ]
    names = [line.split("--name ", 1)[1].split()[0] if "--name " in line else "experiment" for line in commands]
    assert len(commands) == 3 and len(set(names)) == 3, names


def test_help_shows_the_named_tasks_defaults_and_only_its_options(phalanx):
    translate = phalanx("train", "--task", "translate", "--help").out
    classify = phalanx("train", "--help").out

    def default(page: str, flag: str) -> str:
        entry = page.split(f"  {flag} ", 1)[1].split("\n  --", 1)[0]
        return " ".join(entry.split()).split("[default: ", 1)[1].split("]", 1)[0]

    assert [default(translate, f) for f in ("--batch-size", "--lr", "--optimizer", "--image-size")] == [
        "1",
        "0.0002",
        "adam",
        "256",
    ]
    assert [default(classify, f) for f in ("--batch-size", "--lr", "--optimizer", "--image-size")] == [
        "32",
        "0.1",
        "sgd",
        "0",
    ]
    assert "Defaults shown for --task translate" in translate
    assert "Segmentation (--task segment) options" in classify and "(--task segment)" not in translate
    assert "--ngf" in translate  # its own options stay
    # An option a task shares with another (SimCLR declared --temperature first) is the named task's
    # own: under its heading, with its default and words. A newcomer's `--task moco --help` once listed
    # --queue-size alone; `--task vicreg` hid its 2048-wide projector.
    from phalanx.config import registry as tasks
    from phalanx.config.fields import flag

    for name, info in tasks.BUILTIN.items():
        page = phalanx("train", "--task", name, "--help").out
        section = page.split(f"{info.heading} options:\n", 1)[1].split("\n\n", 1)[0]
        for option, (value, _) in tasks.own_options(name).items():
            entry = next(
                line for line in ("\n" + section).split("\n  --") if line and line.split()[0] == flag(option)[2:]
            )
            assert (
                f"[default: {str(value).lower()}" in " ".join(entry.split()).lower()
                or value is None
                or isinstance(value, (bool, tuple))
            ), (name, option)
    bogus = phalanx("train", "--task", "SimCLR", "--help")  # refused as a run is, not the general page
    assert (
        bogus.code == 2
        and bogus.out == ""
        and bogus.err.startswith("phalanx: --task: unknown task 'SimCLR' (did you mean simclr?)")
    ), bogus
    moco = phalanx("train", "--task", "moco", "--help").out
    assert default(moco, "--temperature") == "0.1" and "InfoNCE loss against the queue" in moco
    assert (
        "Also --task" not in moco
        and default(phalanx("train", "--task", "vicreg", "--help").out, "--projection-dim") == "2048"
    )


def test_a_translate_run_records_its_own_networks_and_refuses_model(phalanx, tmp_path):
    printed = phalanx("train", "--task", "translate", "--print-config")
    assert printed.code == 0 and "\nmodel: pix2pix\n" in printed.out
    (tmp_path / "run.yaml").write_text(printed.out)  # what --print-config wrote reads back
    assert phalanx("train", "--config", tmp_path / "run.yaml", "--print-config").out == printed.out
    refused = phalanx("train", "--task", "translate", "--model", "resnet18", "--print-config")
    assert refused.code == 2 and refused.err.startswith("phalanx: --model: --task translate does not use it")


def test_inference_help_speaks_for_every_task(phalanx):
    # Each page's opening paragraph (before the options) once spoke of classifiers alone.
    evaluate, predict, export = (
        phalanx(c, "--help").out.split("options:")[0] for c in ("evaluate", "predict", "export")
    )
    assert "Accuracy (top-1" not in evaluate and "PSNR" in evaluate and "mIoU" in evaluate
    assert "most likely classes" not in predict and "masks" in predict
    assert "logits" not in export and "generators" in export


def test_help_lists_your_own_tasks_options_and_leaves_the_built_in_ones_out(phalanx):
    page = phalanx("train", "--task", "adversarial_autoencoder:AdversarialAutoencoder", "--help").out
    assert "Your task (--task adversarial_autoencoder:AdversarialAutoencoder) options" in page
    entry = " ".join(page.split("--task-option width=VALUE", 1)[1].split())
    assert entry.startswith("Channels of the first layer of both networks. [default: 16]")
    assert "(--task translate) options" not in page and "--ngf" not in page


def test_your_tasks_options_are_recorded_typed(phalanx):
    printed = phalanx(
        "train",
        "--task",
        "adversarial_autoencoder:AdversarialAutoencoder",
        "--task-option",
        "width=32",
        "--print-config",
    )
    assert printed.code == 0 and "task_options: {width: 32, lambda_l1: 10.0}" in printed.out  # once {width: '32'}


def test_a_validation_or_valid_folder_validates_as_val_does_and_training_trains(tmp_path, phalanx):
    # timm's train.py finds val/, validation/ and valid/ (the first there), and train/ or training/;
    # phalanx took val/ alone and held 20% of train/ out beside an ignored validation/ folder (a timm
    # user's report).
    root = write_digit_pngs(tmp_path / "data", per_class=2, val=True)
    for name in ("validation", "valid"):
        (root / ("val" if name == "validation" else "validation")).rename(root / name)
        plan = phalanx("train", "--dataroot", root, "--dry-run", "--checkpoints-dir", tmp_path / "ck")
        assert plan.code == 0 and f"(20 train / 20 val from {name}/, 10 classes" in plan.out, plan.out
    (root / "val").mkdir()  # val/ beside it is the one read, as before (here empty: refused as before)
    plan = phalanx("train", "--dataroot", root, "--dry-run", "--checkpoints-dir", tmp_path / "ck")
    assert plan.code == 2 and f"{root / 'val'} has no class folders" in plan.err, plan.err
    # evaluate --dataroot SPLIT: a split whose classes are named valid and invalid is read as itself
    from phalanx.data.layout import evaluation_dir

    (root / "val").rmdir()
    split = root / "valid"
    assert evaluation_dir(root) == split and evaluation_dir(split) == split
    (split / "valid").mkdir()
    assert evaluation_dir(split) == split  # no train/ beside it: not a data root
    (split / "valid").rmdir()
    (root / "train").rename(root / "training")  # timm's other name for it
    plan = phalanx("train", "--dataroot", root, "--dry-run", "--checkpoints-dir", tmp_path / "ck")
    assert plan.code == 0 and "(20 train / 20 val from valid/, 10 classes" in plan.out, plan.out


def test_a_timm_style_config_file_names_every_unknown_key_at_once_with_phalanxs_names(tmp_path, phalanx):
    # A timm user's YAML took four runs to fix, one key each, 'opt' answered with "did you mean dropout?".
    config = tmp_path / "timm.yaml"
    config.write_text("data_dir: /data\nimg_size: 32\nopt: adamw\nepochs: 2\nlearning_rat: 0.1\n")
    result = phalanx("train", "--config", config, "--checkpoints-dir", tmp_path)
    assert result.code == 2 and result.err.strip() == (
        f"phalanx: --config {config}, line 1: unknown option 'data_dir' (phalanx's is dataroot); line 2: unknown "
        "option 'img_size' (phalanx's is image_size); line 3: unknown option 'opt' (phalanx's is optimizer: "
        "sgd|adam|adamw); line 5: unknown option 'learning_rat'"
    ), result.err
    assert list(tmp_path.iterdir()) == [config]


# --- issue 64: a newcomer in a fresh clone, and writing a task of their own from the docs ------------


def test_a_run_directory_is_its_best_checkpoint_else_its_latest_in_every_command(tmp_path, phalanx):
    # "is a directory, not a checkpoint file": a user who trained --name a expects its best.pt.
    assert (
        phalanx("train", "--epochs", 1, "--checkpoints-dir", tmp_path / "ck", "--name", "a", "--no-progress").code == 0
    )
    run = tmp_path / "ck/a"
    evaluated = phalanx("evaluate", "--checkpoint", run, "--no-progress")  # --no-progress: as train's, predict's
    assert evaluated.code == 0, evaluated.err
    assert (
        evaluated.err.splitlines()[0] == f"phalanx: --checkpoint {run} is a run directory: using its best.pt (its "
        "best validation so far)"
    )
    assert evaluated.out.startswith(f"{(run / 'best.pt').resolve()} on ")
    (tmp_path / "imgs").mkdir()
    write_digit_pngs(tmp_path / "digits", per_class=1)
    predicted = phalanx("predict", "--checkpoint", run, tmp_path / "digits", "--output", tmp_path / "p.csv")
    assert predicted.code == 0 and "using its best.pt" in predicted.err.splitlines()[0], predicted.err
    (run / "best.pt").unlink()
    exported = phalanx("export", "--checkpoint", run, "--output", tmp_path / "m.ts")
    assert exported.code == 0 and "using its latest.pt (it has no best.pt yet)" in exported.err.splitlines()[0]
    consolidated = phalanx("consolidate", "--checkpoint", run, "--output", tmp_path / "whole.pt")
    assert consolidated.code == 0 and "using its latest.pt" in consolidated.err.splitlines()[0], consolidated.err
    (tmp_path / "empty").mkdir()
    refused = phalanx("evaluate", "--checkpoint", tmp_path / "empty")
    assert (
        refused.code == 2
        and refused.err
        == f"phalanx: --checkpoint: {tmp_path / 'empty'} is a directory without "
        "best.pt or latest.pt (a run directory holds them, or a DeepLIIF model directory "
        "(train_opt.txt and its networks' files)); give a checkpoint file or such a directory\n"
    )


def test_predict_keeps_an_output_folder_and_its_input_folders_apart(tmp_path, phalanx):
    # deepliif's outputs written among its inputs were read back as inputs by the next predict: 14
    # images "predicted" from 2, 88 files in the folder. Refused before the checkpoint is read.
    write_digit_pngs(tmp_path / "imgs", per_class=1)
    before = snapshot_tree(tmp_path)
    for inputs, output, words in [
        (tmp_path / "imgs", tmp_path / "imgs/out", "is inside the input folder"),
        (tmp_path / "imgs", tmp_path / "imgs", "is inside the input folder"),
        (tmp_path / "imgs/train/digit3", tmp_path / "imgs", "is inside the output folder"),
    ]:
        result = phalanx("predict", "--checkpoint", tmp_path / "nowhere.pt", inputs, "--output", output)
        assert result.code == 2 and len(result.err.splitlines()) == 1 and words in result.err, result.err
        assert result.err.startswith("phalanx: --output: ")
    assert snapshot_tree(tmp_path) == before
    from phalanx.inference.outputs import check_apart

    check_apart((str(tmp_path / "imgs"),), tmp_path / "out")  # beside it: fine
    check_apart((str(tmp_path / "imgs/train/digit3/0003.png"),), tmp_path / "imgs/train/digit1")  # a file apart


@pytest.mark.parametrize(
    "task, words",
    [
        (
            "NoPrimary",
            "NoPrimary.primary_model is 'model', a network build_models did not make (generator, discriminator)",
        ),
        ("NoBestMetric", "NoBestMetric.best_metric is ('loss', 'min'), but its validation metrics are L1: declare"),
        (
            "FloatSums",
            "FloatSums.empty_sums() returned {'L1': 0.0, 'samples': 0.0}; it returns a dict of name -> zero tensor",
        ),
    ],
)
def test_a_tasks_declarations_are_checked_against_what_it_built_before_the_first_step(tmp_path, phalanx, task, words):
    # Each trained a whole epoch, then failed with a KeyError ('loss', 'model') and a traceback.
    for command in (["train"], ["train", "--dry-run"]):
        result = phalanx(*command, "--task", f"phalanx_testtasks:{task}", "--checkpoints-dir", tmp_path)
        assert result.code == 2 and result.err == f"phalanx: {words}" + result.err[len(words) + 9 :], result.err
        assert len(result.err.splitlines()) == 1 and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "task, words",
    [
        (
            "BackwardWithoutManual",
            "BackwardWithoutManual.training_step called ctx.backward, which only a task with "
            "manual_optimization = True calls",
        ),
        (
            "MissingOptimizer",
            "--task: MissingOptimizer has no optimizer 'discriminator' (its param_groups made generator)",
        ),
        (
            "ExtraLoss",
            "ExtraLoss.training_step returned 'G_total', which ExtraLoss.loss_names (G_GAN, G_L1, D_real, "
            "D_fake) does not declare, so it would never be logged",
        ),
    ],
)
def test_a_task_refused_at_its_first_step_leaves_nothing_behind(tmp_path, phalanx, task, words):
    # Both exited 2 and left config.json, metrics.jsonl and pickle/, where exit 2 writes nothing; the
    # first never named manual_optimization. An undeclared loss was dropped without a word.
    result = phalanx(
        "train", "--task", f"phalanx_testtasks:{task}", "--checkpoints-dir", tmp_path / "ck", "--no-progress"
    )
    assert result.code == 2 and len(result.err.splitlines()) == 1 and words in result.err, result.err
    assert not (tmp_path / "ck").exists()  # the folders the run made are gone too
    (tmp_path / "ck/experiment/logs").mkdir(parents=True)  # a failed run's logs before: they stay
    assert (
        phalanx(
            "train", "--task", f"phalanx_testtasks:{task}", "--checkpoints-dir", tmp_path / "ck", "--no-progress"
        ).code
        == 2
    )
    assert [p.name for p in (tmp_path / "ck/experiment").iterdir()] == ["logs"]


def test_a_required_option_a_nan_at_step_1_and_a_misspelt_task_class_are_one_line(tmp_path, phalanx):
    missing = phalanx("train", "--task", "phalanx_testtasks:NeedsDataroot", "--checkpoints-dir", tmp_path)
    assert (
        missing.err == "phalanx: --dataroot: is required by --task phalanx_testtasks:NeedsDataroot (its `requires`)\n"
        and missing.code == 2
    )  # was a TypeError about NoneType, exit 1
    nan = phalanx("train", "--task", "phalanx_testtasks:NanFromTheData", "--checkpoints-dir", tmp_path, "--no-progress")
    assert nan.code == 1 and nan.err.splitlines()[-1] == (
        "phalanx: the train loss is non-finite (inf or nan) at step 1, before any update: the data or the model "
        "gave it, not the learning rate; look for inf or nan in the inputs and targets (a division by zero, log(0) "
        "in the loss, an image that did not decode)"
    ), nan.err  # was "Lower --lr ... or add --warmup-epochs"
    typo = phalanx("train", "--task", "phalanx_testtasks:StopingAutoencoder", "--dry-run")
    assert typo.code == 2 and typo.err.startswith(
        "phalanx: --task: module 'phalanx_testtasks' has no class "
        "'StopingAutoencoder' (did you mean StoppingAutoencoder"
    ), typo.err
    far = phalanx("train", "--task", "adversarial_autoencoder:Generator", "--dry-run")
    assert far.err.endswith("has no class 'Generator'; its tasks: AdversarialAutoencoder\n"), far.err


def test_export_of_your_own_task_carries_its_preprocessing(tmp_path, phalanx):
    # FILE.json held the network's name and format alone, where the docs say preprocessing goes.
    import json

    assert (
        phalanx(
            "train",
            "--task",
            "adversarial_autoencoder:AdversarialAutoencoder",
            "--epochs",
            1,
            "--checkpoints-dir",
            tmp_path,
            "--no-progress",
        ).code
        == 0
    )
    assert phalanx("export", "--checkpoint", tmp_path / "experiment", "--output", tmp_path / "g.ts").code == 0
    meta = json.loads((tmp_path / "g.ts.json").read_text())
    assert (meta["channels"], meta["image_size"], meta["mean"], meta["std"]) == (1, 8, [0.5], [0.5])
    assert meta["scale"] == "pixels / 255, then (x - mean) / std" and meta["network"] == "generator"


def test_deepliif_checks_its_data_before_vggs_weights_and_help_says_resnet_nblocks(tmp_path, phalanx, monkeypatch):
    # A missing folder, a file, an empty folder or --image-size 33 were all answered with the VGG19 line.
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty-hub"))
    (tmp_path / "empty").mkdir()
    for args, words in [
        (["--dataroot", tmp_path / "nope"], "is not a directory"),
        (["--dataroot", tmp_path / "empty"], "has no train/ folder"),
    ]:
        result = phalanx("train", "--task", "deepliif", *args, "--dry-run")
        assert result.code == 2 and words in result.err and "VGG" not in result.err, result.err
    shown = phalanx("train", "--task", "deepliif", "--help").out
    assert "resnet_Nblocks, a ResNet of N residual blocks" in " ".join(shown.split())  # resnet_99blocks trains
    from phalanx.errors import PhalanxError
    from phalanx.tasks.translate.nets import check_generator

    check_generator("resnet_3blocks", 32, "--net-g")
    with pytest.raises(PhalanxError, match="unet_N .* or resnet_Nblocks"):
        check_generator("resnet3", 32, "--net-g")


def test_an_inference_named_by_a_string_that_leads_nowhere_is_one_line_before_training(tmp_path, phalanx):
    # Resolved only at evaluate or predict time, a bad name was "a bug in phalanx" after the training.
    from phalanx.errors import PhalanxError
    from phalanx.tasks import Inference, Task
    from phalanx.tasks.inference import inference_class

    for named, words in [
        (".inference:Nope", "a name relative to"),
        ("json:loads", "not a subclass of"),
        ("no_such_module_here:X", "which does not import \\(ModuleNotFoundError"),
    ]:
        task = type("Named", (Task,), {"Inference": named, "__module__": "toplevel"})
        with pytest.raises(PhalanxError, match=f"Named.Inference is '{named}'.*{words}"):
            inference_class(task)
    assert inference_class(type("Named", (Task,), {"Inference": Inference})) is Inference
    assert inference_class(type("Named", (Task,), {"Inference": "phalanx.tasks.inference:Inference"})) is Inference

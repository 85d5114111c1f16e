"""Bad input to the three commands: exit code 2, one line naming the option, no traceback, nothing
written or changed. Plus a property test that throws random option values at the parser."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from conftest import run_phalanx, snapshot_tree, write_digit_pngs
from phalanx_testdata import translation_pairs


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A directory with the broken inputs the cases refer to, and one finished run."""
    root = tmp_path_factory.mktemp("world")
    environment = pytest.MonkeyPatch()
    environment.setenv("TORCH_HOME", str(tmp_path_factory.mktemp("torch-home")))  # an empty hub cache
    (root / "empty").mkdir()
    (root / "noclass/train").mkdir(parents=True)
    write_digit_pngs(root / "emptyclass", per_class=2)
    (root / "emptyclass/train/digit0x").mkdir()
    write_digit_pngs(root / "corrupt", per_class=2)
    (root / "corrupt/train/digit3/broken.png").write_bytes(b"\x89PNG\r\n\x1a\n this is not an image")
    shutil.copytree(root / "corrupt/train/digit2", root / "oneclass/train/digit3")
    for digit in (1, 2):  # class folders at the root, as torchvision's ImageFolder takes them
        shutil.copytree(root / f"corrupt/train/digit{digit}", root / f"flat/digit{digit}")
    (root / "bad.yaml").write_text("epochs: [1, 2\n")
    translation_pairs(root / "pairs", size=16, per_split={"train": 4, "val": 2})
    (root / "unknown.yaml").write_text("epochs: 1\nlearning_rate: 0.1\n")
    (root / "list.json").write_text("[1, 2]")
    (root / "garbage.pt").write_bytes(b"not a checkpoint at all")
    (root / "garbage_pickles").mkdir()
    for i in (1, 2):
        (root / "garbage_pickles" / f"segment_00000{i}.pkl").write_bytes(os.urandom(64))
    (root / "hostile_pickles").mkdir()
    (root / "hostile_pickles" / "segment_000001.pkl").write_bytes(
        b"cos\nsystem\n(S'touch " + str(root / "pwned").encode() + b"'\ntR."
    )
    result = run_phalanx("train", "--epochs", 1, "--checkpoints-dir", root / "ck", "--name", "done")
    assert result.code == 0, result.err
    done = root / "ck" / "done" / "latest.pt"
    (root / "truncated.pt").write_bytes(done.read_bytes()[:5000])
    torch.save({"weights": torch.ones(2)}, root / "foreign.pt")
    state = torch.load(done)
    state["config"]["model"] = "resnet18"  # a checkpoint whose weights do not fit its model
    torch.save(state, root / "mismatched.pt")
    (root / "link.pt").symlink_to(done)  # the checkpoint by another name
    (root / "notes.csv").write_text("a,b\n1,2\n")  # a CSV that predict did not write
    (root / "images").mkdir()
    yield root
    environment.undo()


CASES = [
    # (id, args, option named in the message, words the message must hold)
    ("gpu-dup", ["--gpu-ids", "0", "--gpu-ids", "0"], "--gpu-ids", "twice"),
    ("gpu-mixed", ["--gpu-ids", "-1", "--gpu-ids", "0"], "--gpu-ids", "cannot be mixed"),
    ("gpu-negative", ["--gpu-ids", "-3"], "--gpu-ids", ">= 0"),
    ("dp-batch", ["--gpu-ids", "0", "--gpu-ids", "1", "--batch-size", "1"], "--batch-size", "DataParallel"),
    ("dataroot-missing", ["--dataroot", "{w}/nope"], "--dataroot", "not a directory"),
    ("dataroot-empty", ["--dataroot", "{w}/empty"], "--dataroot", "no train/ folder"),
    (
        "dataroot-a-split",
        ["--dataroot", "{w}/corrupt/train"],
        "--dataroot",
        "/corrupt/train/train/<class>/<images> (did you mean --dataroot ",
    ),
    (
        "dataroot-class-folders",
        ["--dataroot", "{w}/flat"],
        "--dataroot",
        "(its folders digit1, digit2 would be the classes of",
    ),
    ("nul-in-a-value", ["--dataroot=a\x00b"], "--dataroot", "holds a NUL character"),
    ("no-class-folders", ["--dataroot", "{w}/noclass"], "--dataroot", "no class folders"),
    ("class-without-images", ["--dataroot", "{w}/emptyclass"], "--dataroot", "digit0x has no images"),
    (
        "user-task-unread-option",
        ["--task", "phalanx_testtasks:GatherTask", "--image-size", "64"],
        "--image-size",
        "GatherTask does not read it (the general options a task reads are its `reads`: none)",
    ),
    (
        "user-task-unread-model",
        ["--task", "phalanx_testtasks:GatherTask", "--model", "resnet18"],
        "--model",
        "GatherTask does not read it",
    ),
    (
        "user-task-builtin-flag",
        ["--task", "phalanx_testtasks:GatherTask", "--ngf", "8"],
        "--ngf",
        "is an option of --task translate, deepliif, deepliif-ext, sdg, deepliif-kd or cyclegan; this run's task is "
        "phalanx_testtasks:GatherTask; your task's own options go in "
        "--task-option ngf=VALUE",
    ),
    ("translate-model", ["--task", "translate", "--model", "resnet18"], "--model", "--task translate does not use it"),
    # unet_16, as --generator's own error suggests at 16 px, with the default 3-layer PatchGAN: torch
    # failed in the first step, the run directory made
    (
        "discriminator-too-deep",
        ["--task", "translate", "--dataroot", "{w}/pairs", "--image-size", "16", "--generator", "unet_16"],
        "--d-layers",
        "leaving 2 pixel(s) of the 3 its last layers need "
        "(--image-size 16); use --d-layers 2, or a larger --image-size",
    ),
    # 0, each image's own size: torch failed in the first step, the run directory made
    (
        "translate-image-size-zero",
        ["--task", "translate", "--dataroot", "{w}/pairs", "--image-size", "0"],
        "--image-size",
        "--task translate resizes every image to one size; 0 (each image's own) cannot be: give --image-size N",
    ),
    (
        "deepliif-image-size-zero",
        ["--task", "deepliif", "--dataroot", "{w}/pairs", "--image-size", "0", "--lambda-feat", "0"],
        "--image-size",
        "--task deepliif resizes every image to one size",
    ),
    (
        "segment-image-size-zero",
        ["--task", "segment", "--dataroot", "{w}/empty", "--image-size", "0"],
        "--image-size",
        "--task segment resizes every image to one size",
    ),
    ("one-class", ["--dataroot", "{w}/oneclass"], "--dataroot", "one class (digit3); a classifier needs two"),
    ("ssl-no-train-folder", ["--task", "simclr", "--dataroot", "{w}/empty"], "--dataroot", "class folders optional"),
    ("unreadable-image", ["--dataroot", "{w}/corrupt"], "--dataroot", "broken.png"),
    ("mnist-not-there", ["--dataset", "mnist", "--dataroot", "{w}/empty"], "--dataroot", "--download"),
    ("dataset-needs-dataroot", ["--dataset", "cifar10"], "--dataroot", "required"),
    ("unknown-model", ["--model", "resnet19"], "--model", "resnet18"),
    (
        "model-module-missing",
        ["--model", "no_such_pkg.nets:make"],
        "--model",
        "cannot import module 'no_such_pkg.nets' (ModuleNotFoundError: No module named 'no_such_pkg'); phalanx looks "
        "in the current directory",
    ),
    ("model-function-missing", ["--model", "json:no_such_function"], "--model", "no function"),
    ("model-function-fails", ["--model", "json:dumps"], "--model", "TypeError"),
    ("model-not-a-module", ["--model", "os:getcwd"], "--model", "not a torch.nn.Module"),
    ("epochs-zero", ["--epochs", "0"], "--epochs", "positive"),
    ("batch-negative", ["--batch-size", "-4"], "--batch-size", "positive"),
    ("lr-zero", ["--lr", "0"], "--lr", "positive"),
    ("val-fraction", ["--val-fraction", "1.5"], "--val-fraction", "must be in (0, 1) (got 1.5)"),
    ("config-does-not-parse", ["--config", "{w}/bad.yaml"], "--config", "does not parse"),
    (
        "config-unknown-option",
        ["--config", "{w}/unknown.yaml"],
        "--config",
        "unknown.yaml, line 2: unknown option 'learning_rate'",
    ),
    ("config-not-a-mapping", ["--config", "{w}/list.json"], "--config", "mapping"),
    ("config-missing", ["--config", "{w}/nope.yaml"], "--config", "cannot read"),
    ("run-dir-taken", ["--name", "done"], "--name", "already holds a run"),
    ("resume-other-run", ["--name", "done", "--resume", "auto", "--momentum", "0.5"], "--momentum", "trained with"),
    ("resume-missing", ["--resume", "{w}/nope.pt"], "--resume", "does not exist"),
    ("resume-corrupt", ["--resume", "{w}/garbage.pt"], "--resume", "garbage.pt"),
    ("resume-and-overwrite", ["--resume", "auto", "--overwrite"], "--overwrite", "conflicts"),
    ("bad-choice", ["--optimizer", "lamb"], "--optimizer", "lamb"),
    ("not-a-number", ["--epochs", "ten"], "--epochs", "ten"),
    ("unknown-flag", ["--learning-rate", "0.1"], "--learning-rate", "No such option"),
    ("transfer-cmd-missing", ["--remote-transfer-cmd", "no_such_mod.upload"], "--remote-transfer-cmd", "cannot import"),
    ("transfer-cmd-no-function", ["--remote-transfer-cmd", "json.no_such"], "--remote-transfer-cmd", "no function"),
    ("transfer-cmd-not-dotted", ["--remote-transfer-cmd", "upload"], "--remote-transfer-cmd", "module.function"),
    ("transfer-not-s3", ["--remote-transfer", "http://bucket/x"], "--remote-transfer", "s3://"),
    ("snapshot-every-negative", ["--snapshot-every", "-1"], "--snapshot-every", "negative"),
    ("num-classes-too-few", ["--num-classes", "5"], "--num-classes", "fewer than the 10 classes"),
    ("weights-missing", ["--weights", "{w}/nope.pt"], "--weights", "does not exist"),
    ("weights-foreign", ["--weights", "{w}/garbage.pt"], "--weights", "does not load as weights"),
    (
        "weights-name-not-cached",
        ["--weights", "ResNet18_Weights.IMAGENET1K_V1", "--model", "resnet18"],
        "--weights",
        "phalanx does not download",
    ),
    ("mean-without-std", ["--mean", "0.5"], "--mean", "--std"),
    (
        "mean-of-two-channels-for-one",
        ["--mean", "0.5,0.5", "--std", "0.5,0.5"],
        "--mean",
        "has 2 values for 1-channel images",
    ),
    (
        "no-gather-of-byol",
        ["--task", "byol", "--no-gather"],
        "--no-gather",  # the flag typed, not --gather
        "is an option of --task simclr, barlowtwins or vicreg; this run's task is byol",
    ),
    (
        "task-option-and-its-flag",
        ["--task", "simclr", "--temperature", "0.3", "--task-option", "temperature=0.2"],
        "--task-option",
        "temperature is given twice, here and as --temperature; give one",
    ),
    ("crop-scale-zero", ["--crop-scale", "0"], "--crop-scale", "(0, 1]"),
    ("ema-decay-one", ["--ema-decay", "1"], "--ema-decay", "[0, 1)"),
    ("num-workers-word", ["--num-workers", "many"], "--num-workers", "'auto'"),
    (
        "checkpoints-dir-is-a-file",
        ["--checkpoints-dir", "{w}/bad.yaml"],
        "--checkpoints-dir",
        "is a file, not a directory",
    ),
    ("checkpoints-dir-in-proc", ["--checkpoints-dir", "/proc/x"], "--checkpoints-dir", "cannot write /proc/x"),
    (
        "image-size-beyond-memory",
        ["--dataroot", "{w}/corrupt", "--image-size", "100000"],
        "--image-size",
        "a batch of 32 image(s) at 100000 px would take at least",
    ),
    ("lr-inf", ["--lr", "inf"], "--lr", "finite"),
    ("momentum-nan", ["--momentum", "nan", "--weight-decay", "inf", "--print-config"], "--momentum", "finite"),
    ("warmup-inf", ["--warmup-epochs", "inf", "--print-config"], "--warmup-epochs", "finite"),
    ("clip-grad-negative", ["--clip-grad", "-1"], "--clip-grad", "must not be negative"),
    ("clip-grad-nan", ["--clip-grad", "nan"], "--clip-grad", "finite"),
    ("nesterov-with-adam", ["--nesterov", "--optimizer", "adam"], "--nesterov", "is SGD's; --optimizer adam has none"),
    ("nesterov-without-momentum", ["--nesterov", "--momentum", "0"], "--nesterov", "with a momentum"),
    ("min-lr-above-lr", ["--min-lr", "0.5"], "--min-lr", "0.5 is not below --lr 0.1"),
    ("min-lr-without-cosine", ["--min-lr", "0.01", "--lr-schedule", "linear"], "--min-lr", "linear has no floor"),
    (
        "vit-at-another-size",
        ["--model", "vit_b_16", "--image-size", "32"],
        "--image-size",
        "--model vit_b_16 is built for 224 px images and takes no other size (this run's are 32 px)",
    ),
    ("probe-norm-without-a-frozen-backbone", ["--probe-norm"], "--probe-norm", "needs --freeze-backbone"),
    (
        "sync-bn-with-a-frozen-backbone",
        ["--freeze-backbone", "--sync-bn"],
        "--sync-bn",
        "nothing of theirs to synchronise",
    ),
    ("local-crops-above-global", ["--task", "swav", "--local-scale", "0.5"], "--local-scale", "at most --global-scale"),
    (
        "local-crop-larger-than-image",
        ["--task", "dino", "--image-size", "16", "--local-size", "40"],
        "--local-size",
        "larger than the images' 16 px",
    ),
    ("crop-scale-to-dino", ["--task", "dino", "--crop-scale", "0.3"], "--crop-scale", "does not use it"),
]
if not torch.cuda.is_available():
    CASES.append(("gpu-without-cuda", ["--gpu-ids", "0"], "--gpu-ids", "CUDA is not available"))
else:
    CASES.append(("gpu-beyond-count", ["--gpu-ids", str(torch.cuda.device_count())], "--gpu-ids", "does not exist"))
CASES = [("train", *case) for case in CASES]
CASES += [
    ("trainlaunch", *case)
    for case in [
        (
            "torchrun-unclosed-quote",
            ["--use-torchrun", '--nproc_per_node "2'],
            "--use-torchrun",
            "No closing quotation",
        ),
        (
            "torchrun-unknown-option",
            ["--use-torchrun", "--nproc_per_node 2 --gpus 2"],
            "--use-torchrun",
            "unrecognized",
        ),
        ("torchrun-bad-value", ["--use-torchrun", "--nproc_per_node two"], "--use-torchrun", "torchrun says"),
        ("torchrun-script", ["--use-torchrun", "--nproc_per_node 2 train.py"], "--use-torchrun", "options only"),
        ("torchrun-module", ["--use-torchrun", "-m evil"], "--use-torchrun", "options only"),
        ("nccl-on-cpu", ["--backend", "nccl"], "--backend", "nccl needs GPUs"),
        (
            "sync-bn-compiled-on-cpu",
            ["--sync-bn", "--compile", "--use-torchrun", "--nproc_per_node 2"],
            "--compile",
            "not built yet",
        ),
        (
            "sync-bn-fsdp-on-cpu",
            ["--sync-bn", "--strategy", "fsdp", "--use-torchrun", "--nproc_per_node 2"],
            "--strategy",
            "not built yet",
        ),
        ("launch-epochs-zero", ["--epochs", "0", "--use-torchrun", "--nproc_per_node 2"], "--epochs", "positive"),
        ("launch-run-dir-taken", ["--name", "done", "--use-torchrun", "--nproc_per_node 2"], "--name", "already holds"),
        ("dist-timeout-zero", ["--dist-timeout", "0"], "--dist-timeout", "positive"),
        ("torchrun-no-workers", ["--use-torchrun", "--nproc_per_node=0"], "--use-torchrun", "at least 1"),
        ("torchrun-no-nodes", ["--use-torchrun", "--nnodes 0"], "--use-torchrun", "--nnodes"),
        ("launch-image-size-beyond-memory", ["--image-size", "100000"], "--image-size", "GiB"),
        ("launch-checkpoints-dir-is-a-file", ["--checkpoints-dir", "{w}/bad.yaml"], "--checkpoints-dir", "is a file"),
        # refused by both workers alike: said once, as `train` says it (a newcomer got a line per rank)
        (
            "launch-dataroot-missing",
            ["--dataroot", "{w}/nope", "--use-torchrun", "--nproc_per_node 2"],
            "--dataroot",
            "nope is not a directory",
        ),
    ]
]
INFERENCE = [
    ("checkpoint-missing", ["--checkpoint", "{w}/nope.pt"], "--checkpoint", "does not exist"),
    ("checkpoint-truncated", ["--checkpoint", "{w}/truncated.pt"], "--checkpoint", "truncated"),
    ("checkpoint-foreign", ["--checkpoint", "{w}/foreign.pt"], "--checkpoint", "not a phalanx checkpoint"),
    ("checkpoint-other-model", ["--checkpoint", "{w}/mismatched.pt"], "--checkpoint", "does not fit model"),
    ("no-ema", ["--checkpoint", "{w}/ck/done/latest.pt", "--ema"], "--ema", "without --ema-decay"),
    ("checkpoint-json", ["--checkpoint", "{w}/list.json"], "--checkpoint", "a JSON file, not a torch checkpoint"),
    ("checkpoint-text", ["--checkpoint", "{w}/bad.yaml"], "--checkpoint", "a text file, not a torch checkpoint"),
]
CASES += [
    ("evaluate", *case)
    for case in INFERENCE
    + [
        ("no-checkpoint", [], "--checkpoint", "Missing option"),
        # typed without its option, as other tools take it: the option to write
        (
            "checkpoint-as-argument",
            ["{w}/ck/done/latest.pt"],
            "--checkpoint",
            "the checkpoint is given as an option: --checkpoint /",
        ),
        (
            "eval-knn-k-of-a-classifier",
            ["--checkpoint", "{w}/ck/done/latest.pt", "--knn-k", "5"],
            "--knn-k",
            "--task classify (this checkpoint's) does not read it",
        ),
        (
            "eval-dataroot-missing",
            ["--checkpoint", "{w}/ck/done/latest.pt", "--dataroot", "{w}/nope"],
            "--dataroot",
            "not a directory",
        ),
        (
            "eval-output-is-checkpoint",
            ["--checkpoint", "{w}/ck/done/latest.pt", "--output", "{w}/ck/done/latest.pt"],
            "--output",
            "is the checkpoint itself (--checkpoint); write a results JSON elsewhere",
        ),
        (
            "eval-output-links-to-checkpoint",
            ["--checkpoint", "{w}/ck/done/latest.pt", "--output", "{w}/link.pt", "--overwrite"],
            "--output",
            "is the checkpoint itself",
        ),
        (
            "eval-output-not-ours",
            ["--checkpoint", "{w}/ck/done/latest.pt", "--output", "{w}/list.json"],
            "--output",
            "is not a results JSON phalanx wrote; pass --overwrite",
        ),
        (
            "eval-output-folder-missing",
            ["--checkpoint", "{w}/ck/done/latest.pt", "--output", "{w}/nope/r.json"],
            "--output",
            "/nope does not exist",
        ),
        (
            "eval-batch-negative",
            ["--checkpoint", "{w}/ck/done/latest.pt", "--batch-size", "-1"],
            "--batch-size",
            "at least 0",
        ),
    ]
]
CASES += (
    [("predict", case[0], case[1] + ["{w}/empty", "--output", "{w}/p.csv"], *case[2:]) for case in INFERENCE]
    + [
        (
            "predict",
            "predict-no-images",
            ["--checkpoint", "{w}/ck/done/latest.pt", "{w}/images", "--output", "{w}/p.csv"],
            "IMAGES",
            "no image files",
        ),
        (
            "predict",
            "predict-bad-output",
            ["--checkpoint", "{w}/ck/done/latest.pt", "{w}/images", "--output", "{w}/p.txt"],
            "--output",
            ".csv or .jsonl",
        ),
    ]
    + [
        (
            "predict",
            name,
            ["--checkpoint", "{w}/ck/done/latest.pt", "{w}/corrupt", "--output", "{w}/p.csv", *args],
            *rest,
        )
        for name, args, *rest in [
            ("predict-top-k-zero", ["--top-k", "0"], "--top-k", "at least 1"),
            ("predict-batch-zero", ["--batch-size", "0"], "--batch-size", "at least 1"),
            ("predict-score-above-one", ["--score-threshold", "2"], "--score-threshold", "between 0 and 1"),
            # A detector's option on a classifier's checkpoint: refused as train refuses another task's option.
            (
                "predict-another-tasks-option",
                ["--score-threshold", "0.5"],
                "--score-threshold",
                "--task classify's predict does not read it",
            ),
            (
                "predict-top-k-with-features",
                ["--features", "--top-k", "3"],
                "--top-k",
                "predict --features does not read it",
            ),
            (
                "predict-features-to-stdout",
                ["--features", "--output", "-"],
                "--output",
                "- (stdout) takes a table of predictions",
            ),
            ("predict-tile-overlap-negative", ["--tile-overlap", "-5"], "--tile-overlap", "at least 0"),
            ("predict-tile-overlap-word", ["--tile-overlap", "wide"], "--tile-overlap", "pixels or auto"),
            (
                "predict-output-not-ours",
                ["--output", "{w}/notes.csv"],
                "--output",
                "is not a predictions file phalanx wrote",
            ),
            ("predict-output-folder-missing", ["--output", "{w}/nope/p.csv"], "--output", "/nope does not exist"),
        ]
    ]
)
CASES += [("export", case[0], case[1] + ["--output", "{w}/m.ts"], *case[2:]) for case in INFERENCE] + [
    (
        "export",
        "export-bad-format",
        ["--checkpoint", "{w}/ck/done/latest.pt", "--format", "onnx", "--output", "{w}/m"],
        "--format",
        "onnx",
    ),
    (
        "export",
        "export-output-is-checkpoint",
        ["--checkpoint", "{w}/ck/done/latest.pt", "--output", "{w}/ck/done/latest.pt"],
        "--output",
        "is the checkpoint itself (--checkpoint); write an export elsewhere",
    ),
    (
        "export",
        "export-output-not-ours",
        ["--checkpoint", "{w}/ck/done/latest.pt", "--output", "{w}/foreign.pt"],
        "--output",
        "is not an export phalanx wrote; pass --overwrite",
    ),
    (
        "export",
        "export-output-folder-missing",
        ["--checkpoint", "{w}/ck/done/latest.pt", "--output", "{w}/nope/m.ts"],
        "--output",
        "/nope does not exist",
    ),
    (
        "export",
        "export-deepliif-of-a-classifier",
        ["--checkpoint", "{w}/ck/done/latest.pt", "--format", "deepliif", "--output", "{w}/dl"],
        "--format",
        "writes --task deepliif's networks; this checkpoint's task is classify",
    ),
]
CASES += [
    (
        "trainlaunch",
        "fsdp-sharded-upload",
        ["--strategy", "fsdp", "--remote-transfer", "s3://bucket/runs"],
        "--fsdp-checkpoints",
        "uploading sharded checkpoints is not built yet",
    )
]
CASES += [
    ("consolidate", *case)
    for case in [
        (
            "consolidate-missing",
            ["--checkpoint", "{w}/nope.pt", "--output", "{w}/whole.pt"],
            "--checkpoint",
            "does not exist",
        ),
        (
            "consolidate-garbage",
            ["--checkpoint", "{w}/garbage.pt", "--output", "{w}/whole.pt"],
            "--checkpoint",
            "not a torch checkpoint",
        ),
        (
            "consolidate-output-exists",
            ["--checkpoint", "{w}/ck/done/latest.pt", "--output", "{w}/ck/done/latest.pt"],
            "--output",
            "exists; give a new file name",
        ),
        (
            "consolidate-output-folder-missing",
            ["--checkpoint", "{w}/ck/done/latest.pt", "--output", "{w}/nope/w.pt"],
            "--output",
            "/nope does not exist",
        ),
    ]
]
CASES += [
    ("prepare-training-data", *case)
    for case in [
        (
            "prepare-no-folder",
            ["--input-dir", "{w}/nope", "--output-dir", "{w}/prep"],
            "--input-dir",
            "is not a folder",
        ),
        (
            "prepare-no-ihc",
            ["--input-dir", "{w}/empty", "--output-dir", "{w}/prep"],
            "--input-dir",
            "no file whose name holds IHC",
        ),
        (
            "prepare-ratio",
            ["--input-dir", "{w}/empty", "--output-dir", "{w}/prep", "--validation-ratio", "1.5"],
            "--validation-ratio",
            "a fraction from 0 to 1",
        ),
        (
            "prepare-size",
            ["--input-dir", "{w}/empty", "--output-dir", "{w}/prep", "--size", "0"],
            "--size",
            "a positive number of pixels",
        ),
    ]
]
CASES += [
    ("scale", *case)
    for case in [
        ("scale-workers-zero", ["--workers", "0"], "--workers", "1 or more"),
        ("scale-workers-word", ["--workers", "two"], "--workers", "expected world sizes"),
        (
            "scale-strong-uneven",
            ["--workers", "2", "--scaling", "strong", "--batch-size", "15"],
            "--workers",
            "strong scaling splits --batch-size 15 over 2 workers",
        ),
        ("scale-steps-zero", ["--steps", "0"], "--steps", "1 or more"),
        ("scale-repeats-zero", ["--repeats", "0"], "--steps", "--repeats are 1 or more"),
        (
            "scale-pickle-dir-taken",
            ["--scale-pickle-dir", "{w}/ck/done/pickle"],
            "--scale-pickle-dir",
            "holds snapshots already",
        ),
    ]
]
CASES += [
    ("visualize", *case)
    for case in [
        ("pickle-dir-missing", ["--pickle_dir", "{w}/nope", "--once"], "--pickle-dir", "does not exist"),
        (
            "pickle-dir-file",
            ["--pickle_dir", "{w}/bad.yaml", "--once"],
            "--pickle-dir",
            "is a file, not a folder of snapshots",
        ),
        (
            "pickle-dir-file-live",
            ["--pickle-dir", "{w}/list.json"],
            "--pickle-dir",
            "is a file, not a folder of snapshots",
        ),
        (
            "pickle-dir-garbage",
            ["--pickle-dir", "{w}/garbage_pickles", "--once"],
            "--pickle-dir",
            "no complete snapshot",
        ),
        (
            "pickle-dir-hostile",
            ["--pickle-dir", "{w}/hostile_pickles", "--once"],
            "--pickle-dir",
            "refers to os.system",
        ),
        ("pickle-dir-empty", ["--pickle-dir", "{w}/empty", "--once"], "--pickle-dir", "no complete snapshot"),
        ("pickle-dir-not-s3", ["--pickle-dir", "s3:///prefix", "--once"], "--pickle-dir", "s3://bucket"),
        ("port-zero", ["--pickle-dir", "{w}/empty", "--port", "0"], "--port", "0"),
        ("interval-zero", ["--pickle-dir", "{w}/empty", "--interval", "0"], "--interval", "0"),
        ("no-pickle-dir", ["--once"], "--pickle-dir", "Missing option"),
    ]
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "command, args, option, words", [c[:1] + c[2:] for c in CASES], ids=[f"{c[0]}:{c[1]}" for c in CASES]
)
def test_bad_input_is_one_line_and_writes_nothing(phalanx, world, command, args, option, words):
    before, threads = snapshot_tree(world), os.environ.get("OMP_NUM_THREADS")
    extra = ["--checkpoints-dir", world / "ck"] if command in ("train", "trainlaunch") else []
    result = phalanx(command, *extra, *[a.format(w=world) for a in args])
    # Called in process: a launch once left OMP_NUM_THREADS=1 behind, and the suite's later processes
    # computed with one thread (a resume then differed from the straight run in process, bit for bit).
    assert os.environ.get("OMP_NUM_THREADS") == threads
    lines = result.err.strip().splitlines()
    assert result.code == 2, result.err
    assert len(lines) == 1, result.err
    assert lines[0].startswith("phalanx: ")
    assert option in lines[0] and words in lines[0], lines[0]
    assert "Traceback" not in result.err + result.out
    assert result.out == ""
    assert snapshot_tree(world) == before
    assert not (world / "pwned").exists()


def test_every_command_has_bad_input_cases():
    from phalanx.cli import cli

    per_command = {name: sum(case[0] == name for case in CASES) for name in cli.commands}
    assert all(count >= 3 for count in per_command.values()), per_command  # a new command needs its own


@pytest.mark.slow
def test_bad_input_in_a_real_process_has_no_traceback(world):
    result = run_phalanx("train", "--dataroot", world / "corrupt", "--checkpoints-dir", world / "ck2")
    assert result.code == 2
    assert result.err.strip().count("\n") == 0 and "broken.png" in result.err
    assert not (world / "ck2").exists()

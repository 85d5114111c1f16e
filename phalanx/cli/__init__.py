"""The command line package: the commands (this module), their options generated from the
configuration's fields (``options``) and the commands beside training (``tools``). The only
package that imports click; it may import everything below it.

The ``phalanx`` command line.

Each command is thin: it turns flags into a ``RunConfig`` (or a command's options dataclass) and
calls a plain function. ``main`` is the one place where exceptions become exit codes and one-line
messages. Heavy modules (torch, visdom) are imported inside the commands so ``phalanx --help``
stays instant.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click
from click.core import ParameterSource

from ..config import habits
from ..config.inference import EvaluateOptions, ExportOptions, PredictOptions
from ..errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, PhalanxError
from .options import Command, Option, build_config, build_options, dataclass_options, echo_config, training_options
from .tools import consolidate, prepare_training_data, scale


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="phalanx", message="phalanx %(version)s")
def cli() -> None:
    """Train PyTorch image models on a CPU, one GPU, many GPUs or many machines."""


TRAIN_EXAMPLES = """\b
Examples:
  phalanx train                                   # built-in digits, CPU, offline
  phalanx train --dataroot ./flowers --model resnet18 --epochs 20
  phalanx train --gpu-ids 0 --precision bf16      # one GPU
  phalanx train --gpu-ids 0,1 --batch-size 128    # DataParallel: 128 shared by two GPUs
  phalanx train --config run.yaml --lr 0.1        # file defaults, flag overrides
  phalanx train --name exp1 --resume auto         # continue the latest checkpoint
  phalanx train --gpu-ids 0,1 --dry-run           # show devices, batch, LR, data; run nothing
"""


def plan_options(func: Callable) -> Callable:
    """``--dry-run`` and ``--print-config``, shared by the training commands."""
    func = click.option(
        "--print-config",
        is_flag=True,
        cls=Option,
        help="Print the resolved configuration as YAML (what --config reads back), then exit.",
    )(func)
    return click.option(
        "--dry-run",
        is_flag=True,
        cls=Option,
        help="Print what would run (devices, batch sizes, learning rate, data, run directory), then exit.",
    )(func)


@cli.command(cls=Command, epilog=TRAIN_EXAMPLES)
@training_options("train")
@plan_options
@click.pass_context
def train(ctx: click.Context, dry_run: bool, print_config: bool, **values: Any) -> None:
    """Train in this process (CPU, one GPU, or DataParallel over several).

    Started by a launcher that sets RANK/WORLD_SIZE/MASTER_ADDR (torchrun, SLURM, Kubernetes), it
    joins that process group and trains as one DistributedDataParallel worker.
    """
    cfg = build_config(ctx, values)
    if print_config:
        return echo_config(cfg)
    if dry_run:
        from ..train.run import describe_run  # imports torch

        lines, stop = describe_run(cfg)
        click.echo("\n".join(lines))
        if stop is not None:
            raise stop  # the plan printed, the dry run exits as the real run would
        return
    from ..train.run import train_run  # imports torch

    train_run(cfg)


TRAINLAUNCH_EXAMPLES = """\b
Examples:
  phalanx trainlaunch --use-torchrun "--nproc_per_node 2"      # two CPU workers (gloo)
  phalanx trainlaunch --gpu-ids 0,1 --use-torchrun "--nproc_per_node 2"   # two GPUs (NCCL)
  phalanx trainlaunch --gpu-ids 0,1 --use-torchrun "-t 3 --log_dir logs --nproc_per_node 2"
  phalanx trainlaunch --gpu-ids 0,1 --dry-run                 # show what would run
  # node 0 and node 1 of a two-node run (same command on each node):
  phalanx trainlaunch --gpu-ids 0 --use-torchrun "--nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint node0:29400 --rdzv-id job1"
  # restart failed workers up to 3 times; each restart resumes from the latest checkpoint:
  phalanx trainlaunch --use-torchrun "--nproc_per_node 2 --max-restarts 3"
"""


@cli.command(cls=Command, epilog=TRAINLAUNCH_EXAMPLES)
@training_options("trainlaunch")
@click.option(
    "--use-torchrun",
    "use_torchrun",
    metavar="OPTIONS",
    cls=Option,
    help="torchrun's own options as one string, spelled as torchrun spells them "
    "(default: one node, one worker per GPU id, or one CPU worker).",
)
@plan_options
@click.pass_context
def trainlaunch(ctx: click.Context, use_torchrun: str | None, dry_run: bool, print_config: bool, **values: Any) -> None:
    """Train with DistributedDataParallel: torchrun starts one worker per GPU id (or CPU workers).

    Local rank r trains on cuda:GPU_IDS[r]; --batch-size is per worker. Only global rank 0 writes
    checkpoints, metrics and snapshots.
    """
    cfg = build_config(ctx, values)
    if print_config:
        return echo_config(cfg)
    from ..launch.torchrun import launch  # imports torch

    launch(cfg, use_torchrun, dry_run=dry_run)


VISUALIZE_EXAMPLES = """\b
Examples:
  phalanx visualize --pickle_dir checkpoints/experiment/pickle      # prints the page's URL
  phalanx visualize --pickle-dir checkpoints                        # every run in there, compared
  phalanx visualize --pickle-dir runs/a/pickle --pickle-dir runs/b/pickle   # two runs, compared
  phalanx visualize --pickle-dir s3://bucket/runs/experiment/pickle --s3-endpoint-url http://minio:9000
  phalanx visualize --pickle_dir DIR --server http://visdom-host --port 8097 --once   # replay, exit
"""


@cli.command(cls=Command, epilog=VISUALIZE_EXAMPLES)
@click.option(
    "--pickle-dir",
    "pickle_dir",
    required=True,
    multiple=True,
    metavar="DIR|s3://BUCKET/PREFIX",
    help="The snapshots of a run (<checkpoints-dir>/<name>/pickle), local or on S3; or a folder of "
    "runs (<checkpoints-dir>). Repeat to compare runs.",
)
@click.option(
    "--server",
    default="http://localhost",
    show_default=True,
    help="Visdom server; on this machine one is started (and stopped) if none answers.",
)
@click.option(
    "--port",
    default=8097,
    show_default=True,
    type=click.IntRange(1, 65535),
    help="Port of the visdom server (the one --server names, or the one started here).",
)
@click.option(
    "--interval",
    default=2.0,
    show_default=True,
    type=click.FloatRange(min=0.05),
    help="Seconds between looks for new snapshots.",
)
@click.option("--once", is_flag=True, help="Plot everything there is into a running server, then exit.")
@click.option("--env", default=None, help="Visdom environment of a single run (default: phalanx-<name>-<run id>).")
@click.option("--s3-endpoint-url", default=None, metavar="URL", help="S3-compatible endpoint for s3:// dirs.")
@click.option(
    "--listen-all",
    is_flag=True,
    help="Let a visdom server started here listen on every "
    "interface (default: 127.0.0.1 only; visdom has no login by default).",
)
@click.option("--visdom-log", default=None, metavar="FILE", help="Log of a visdom server started here.")
def visualize(**values: Any) -> None:
    """Watch runs live in visdom, from their pickled snapshots (on any machine that reads them):
    status, losses, accuracy, learning rate, throughput, confusion matrix, per-class accuracy and
    validation images with predictions; several runs compared.

    Never imports torch and never runs code from a snapshot: only plain data is unpickled.
    """
    from ..visualize import VisualizeOptions  # imports visdom lazily
    from ..visualize import visualize as run_visualize

    run_visualize(VisualizeOptions(**values))


EVALUATE_EXAMPLES = """\b
Examples:
  phalanx evaluate --checkpoint checkpoints/experiment/best.pt           # the run's validation split
  phalanx evaluate --checkpoint best.pt --dataroot ./test --output results.json
  torchrun --nproc-per-node 2 -m phalanx.cli evaluate --checkpoint best.pt   # DDP: each image counted once
"""


@cli.command(cls=Command, epilog=EVALUATE_EXAMPLES)
@dataclass_options(EvaluateOptions)
def evaluate(**values: Any) -> None:
    """A checkpoint's validation metrics, as its task computes them in training (accuracy and a
    confusion matrix, PSNR and SSIM, COCO mAP, mIoU, kNN accuracy: each task its own).

    With no data option it evaluates the run's own validation split and reproduces what training
    recorded. Started by torchrun (or SLURM, MPI) it shares the data between ranks.
    """
    from ..inference.evaluate import evaluate as run_evaluate  # imports torch

    run_evaluate(build_options(EvaluateOptions, values))


PREDICT_EXAMPLES = """\b
Examples:
  phalanx predict --checkpoint best.pt photos/ --output preds.csv
  phalanx predict --checkpoint best.pt a.jpg b.png --output preds.jsonl --top-k 3
"""


@cli.command(cls=Command, epilog=PREDICT_EXAMPLES)
@dataclass_options(PredictOptions)
@click.argument("images", nargs=-1, required=True, metavar="IMAGES_OR_DIRS...")
def predict(images: tuple[str, ...], **values: Any) -> None:
    """What a checkpoint's task makes of images (files, or folders searched recursively): classes,
    translated images, boxes, masks or features, each task its own, with images prepared as the
    run's validation prepared them. Unreadable images are reported and skipped."""
    from ..inference.predict import predict as run_predict  # imports torch

    context = click.get_current_context()
    typed = frozenset(name for name in values if context.get_parameter_source(name) == ParameterSource.COMMANDLINE)
    run_predict(images, build_options(PredictOptions, values), typed)


EXPORT_EXAMPLES = """\b
Examples:
  phalanx export --checkpoint best.pt --format torchscript --output model.ts      # torch.jit.load
  phalanx export --checkpoint best.pt --format exported-program --output model.pt2  # torch.export.load
"""


@cli.command(cls=Command, epilog=EXPORT_EXAMPLES)
@dataclass_options(ExportOptions)
def export(**values: Any) -> None:
    """Files that run without phalanx: the checkpoint's networks (a classifier, generators, a
    backbone, a detector, a segmenter: the task says which), with how to prepare inputs and read
    outputs written beside each (FILE.json)."""
    from ..inference.export import export as run_export  # imports torch

    run_export(build_options(ExportOptions, values))


for _command in (scale, consolidate, prepare_training_data):  # the tools beside training (tools)
    cli.add_command(_command)


def say_error(message: str) -> None:
    """One line, whatever the user typed: control characters in echoed values are escaped."""
    line = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in message)
    click.echo(f"phalanx: {line}", err=True)


def main(argv: list[str] | None = None) -> int:
    """``phalanx ARGS`` in this process (a script, a notebook, the tests): the exit code, and the
    caller's signal mask as it was (a failed run holds SIGTERM and SIGINT until its process exits)."""
    from ..distributed.failures import restore_signal_mask, signal_mask

    mask = signal_mask()
    try:
        return _main(argv)
    finally:
        restore_signal_mask(mask)


def _main(argv: list[str] | None = None) -> int:
    """Runs the CLI and maps failures to documented exit codes."""
    args = sys.argv[1:] if argv is None else list(argv)
    for before, arg in zip(["", *args], args):  # open() and os calls raise ValueError on one, deep inside
        if "\x00" in str(arg):
            where = (
                str(arg).split("=")[0]
                if str(arg).startswith("-")
                else before
                if before.startswith("-")
                else "an argument"
            )
            say_error(f"{where}: holds a NUL character, which no option value or file name can")
            return EXIT_BAD_INPUT
    try:
        cli.main(args=args, prog_name="phalanx", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.NoArgsIsHelpError as exc:  # bare `phalanx`: the help, as --help shows it
        click.echo(exc.ctx.get_help() if exc.ctx else cli.get_help(click.Context(cli)))
        return 0
    except click.exceptions.NoSuchOption as exc:
        command = (exc.ctx.command.name or "") if exc.ctx else ""  # (click's Command.name is optional; ours are named)
        if exc.option_name.replace("_", "-") == "--use-torchrun" and command != "trainlaunch":
            say_error(
                f"--use-torchrun is an option of `phalanx trainlaunch` (DDP through torchrun), not of "
                f'`phalanx {command}`: phalanx trainlaunch ... --use-torchrun "--nproc_per_node 2"'
            )
        else:
            params = exc.ctx.command.params if exc.ctx else []
            known = [spelling for param in params for spelling in param.opts + param.secondary_opts]
            relevant = click.exceptions.NoSuchOption(
                exc.option_name, possibilities=habits.for_the_task(list(exc.possibilities or []), args), ctx=exc.ctx
            )
            say_error(
                habits.option_hint(exc.option_name, known, command, args)
                or habits.launch_hint(exc.option_name, command)
                or relevant.format_message()
            )
        return exc.exit_code
    except click.ClickException as exc:
        named = isinstance(exc, click.BadParameter) and exc.param is not None and exc.param.name == "precision"
        say_error((named and habits.precision_hint(args)) or habits.checkpoint_hint(exc, args) or exc.format_message())
        return exc.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt):
        say_error("interrupted")
        return EXIT_INTERRUPTED
    except PhalanxError as exc:
        say_error(str(exc))
        return exc.exit_code
    except Exception as exc:  # a bug in phalanx: still one line, the traceback in a file
        return _internal_error(exc)
    return 0


def _internal_error(exc: Exception) -> int:
    import tempfile
    from pathlib import Path

    from ..distributed.failures import summarize, write_traceback

    log = write_traceback(Path(tempfile.gettempdir()) / "phalanx-error.log", exc, "phalanx")
    say_error(f"internal error: {summarize(exc)}" + (f"; traceback in {log}" if log else ""))
    return EXIT_FAILED


def entry() -> None:
    """The ``phalanx`` console script: a failed run's stop signals stay held until it exits."""
    code = _main()
    if "torch" in sys.modules:  # a run, a launch or an evaluation: see phalanx.distributed.processes
        from ..distributed.processes import exit_process

        exit_process(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()

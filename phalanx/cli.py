"""The ``phalanx`` command line: the only module that imports click.

Each command is thin: it turns flags into a ``RunConfig`` and calls a plain function. ``main``
is the one place where exceptions become exit codes and one-line messages. Heavy modules (torch,
visdom) are imported inside the commands so ``phalanx --help`` stays instant.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import click
from click.core import ParameterSource

from . import config as config_mod
from .config import FIELDS, RunConfig, flag
from .errors import EXIT_INTERRUPTED, PhalanxError

_CLICK_TYPES = {"int": click.INT, "float": click.FLOAT, "str": click.STRING, "str | None": click.STRING}


class _Command(click.Command):
    """Accepts ``--batch_size`` as well as ``--batch-size``, as torchrun and DeepLIIF users type."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        known = {name for param in self.params for name in param.opts if name.startswith("--")}
        normalised = []
        for arg in args:
            head, eq, tail = arg.partition("=")
            dashed = head.replace("_", "-")
            if head.startswith("--") and head not in known and dashed in known:
                arg = dashed + eq + tail
            normalised.append(arg)
        return super().parse_args(ctx, normalised)


def training_options(func: Callable) -> Callable:
    """Decorate a command with one click option per ``RunConfig`` field, plus ``--config``."""
    for f in reversed(list(FIELDS.values())):
        meta, default = f.metadata, RunConfig.__dataclass_fields__[f.name]
        default_value = default.default_factory() if callable(default.default_factory) else default.default
        kwargs: dict[str, Any] = {"help": meta["help"], "default": default_value, "show_default": True}
        if meta["metavar"]:
            kwargs["metavar"] = meta["metavar"]
        if f.type == "bool":
            decls = [f"{flag(f.name)}/--no-{flag(f.name)[2:]}"]
        elif f.name == "gpu_ids":
            decls, kwargs["multiple"], kwargs["type"] = [flag(f.name)], True, click.INT
            kwargs["show_default"] = False
        else:
            decls = [flag(f.name)]
            kwargs["type"] = click.Choice(meta["choices"]) if meta["choices"] else _CLICK_TYPES[f.type]
        func = click.option(*decls, f.name, **kwargs)(func)
    return click.option("--config", "config_file", metavar="FILE", type=click.STRING,
                        help="YAML or JSON file of option defaults; flags override it.")(func)


def build_config(ctx: click.Context, values: dict[str, Any]) -> RunConfig:
    """Defaults < ``--config FILE`` < flags typed on the command line."""
    merged: dict[str, Any] = {}
    if values.get("config_file"):
        merged.update(config_mod.load_config_file(values["config_file"]))
    for name in FIELDS:
        if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None):
            merged[name] = values[name]
    return config_mod.from_mapping(merged, source="--config")


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="phalanx", message="phalanx %(version)s")
def cli() -> None:
    """Train PyTorch image models on a CPU, one GPU, many GPUs or many machines."""


TRAIN_EXAMPLES = """\b
Examples:
  phalanx train                                   # built-in digits, CPU, offline
  phalanx train --dataroot ./flowers --model resnet18 --epochs 20
  phalanx train --gpu-ids 0 --precision bf16      # one GPU
  phalanx train --gpu-ids 0 --gpu-ids 1 --batch-size 128   # DataParallel
  phalanx train --config run.yaml --lr 0.1        # file defaults, flag overrides
  phalanx train --name exp1 --resume auto         # continue the latest checkpoint
"""


@cli.command(cls=_Command, epilog=TRAIN_EXAMPLES)
@training_options
@click.pass_context
def train(ctx: click.Context, **values: Any) -> None:
    """Train in this process (CPU, one GPU, or DataParallel over several).

    Started by a launcher that sets RANK/WORLD_SIZE/MASTER_ADDR (torchrun, SLURM, Kubernetes), it
    joins that process group and trains as one DistributedDataParallel worker.
    """
    cfg = build_config(ctx, values)
    from .run import train_run  # imports torch

    train_run(cfg)


TRAINLAUNCH_EXAMPLES = """\b
Examples:
  phalanx trainlaunch --use-torchrun "--nproc_per_node 2"      # two CPU workers (gloo)
  phalanx trainlaunch --gpu-ids 0 --gpu-ids 1 --use-torchrun "--nproc_per_node 2"
  phalanx trainlaunch --gpu-ids 0 --gpu-ids 1 --use-torchrun "-t 3 --log_dir logs --nproc_per_node 2"
  phalanx trainlaunch --gpu-ids 0 --gpu-ids 1 --dry-run       # show what would run
  # node 0 and node 1 of a two-node run (same command on each node):
  phalanx trainlaunch --gpu-ids 0 --use-torchrun "--nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint node0:29400 --rdzv-id job1"
  # restart failed workers up to 3 times; each restart resumes from the latest checkpoint:
  phalanx trainlaunch --use-torchrun "--nproc_per_node 2 --max-restarts 3"
"""


@cli.command(cls=_Command, epilog=TRAINLAUNCH_EXAMPLES)
@training_options
@click.option("--use-torchrun", "use_torchrun", metavar="OPTIONS",
              help="torchrun's own options as one string, spelled as torchrun spells them "
                   "(default: one node, one worker per GPU id, or one CPU worker).")
@click.option("--dry-run", is_flag=True, help="Print the torchrun arguments, world size, devices, batch "
              "sizes and learning rate, then exit.")
@click.pass_context
def trainlaunch(ctx: click.Context, use_torchrun: str | None, dry_run: bool, **values: Any) -> None:
    """Train with DistributedDataParallel: torchrun starts one worker per GPU id (or CPU workers).

    Local rank r trains on cuda:GPU_IDS[r]; --batch-size is per worker. Only global rank 0 writes
    checkpoints, metrics and snapshots.
    """
    cfg = build_config(ctx, values)
    from .launch import launch  # imports torch

    launch(cfg, use_torchrun, dry_run=dry_run)


VISUALIZE_EXAMPLES = """\b
Examples:
  phalanx visualize --pickle_dir checkpoints/experiment/pickle      # then open http://localhost:8097
  phalanx visualize --pickle-dir s3://bucket/runs/experiment/pickle --s3-endpoint-url http://minio:9000
  phalanx visualize --pickle_dir DIR --server http://visdom-host --port 8097 --once   # replay, exit
"""


@cli.command(cls=_Command, epilog=VISUALIZE_EXAMPLES)
@click.option("--pickle-dir", "pickle_dir", required=True, metavar="DIR|s3://BUCKET/PREFIX",
              help="The snapshots of one run (<checkpoints-dir>/<name>/pickle), local or on S3.")
@click.option("--server", default="http://localhost", show_default=True,
              help="Visdom server; on this machine one is started (and stopped) if none answers.")
@click.option("--port", default=8097, show_default=True, type=click.IntRange(1, 65535))
@click.option("--interval", default=2.0, show_default=True, type=click.FloatRange(min=0.05),
              help="Seconds between looks for new snapshots.")
@click.option("--once", is_flag=True, help="Plot everything there is into a running server, then exit.")
@click.option("--env", default=None, help="Visdom environment (default: phalanx-<name>-<run id>).")
@click.option("--s3-endpoint-url", default=None, metavar="URL", help="S3-compatible endpoint for s3:// dirs.")
@click.option("--listen-all", is_flag=True, help="Let a visdom server started here listen on every "
              "interface (default: 127.0.0.1 only; visdom has no login by default).")
@click.option("--visdom-log", default=None, metavar="FILE", help="Log of a visdom server started here.")
def visualize(**values: Any) -> None:
    """Plot a run's losses live in visdom, from its pickled snapshots (any machine that reads them).

    Never imports torch and never runs code from a snapshot: only plain data is unpickled.
    """
    from .visualize import VisualizeOptions, visualize as run_visualize  # imports visdom lazily

    run_visualize(VisualizeOptions(**values))


def say_error(message: str) -> None:
    """One line, whatever the user typed: control characters in echoed values are escaped."""
    line = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in message)
    click.echo(f"phalanx: {line}", err=True)


def main(argv: list[str] | None = None) -> int:
    """Console entry point: runs the CLI and maps failures to documented exit codes."""
    try:
        cli.main(args=argv, prog_name="phalanx", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        say_error(exc.format_message())
        return exc.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt):
        say_error("interrupted")
        return EXIT_INTERRUPTED
    except PhalanxError as exc:
        say_error(str(exc))
        return exc.exit_code
    return 0


def entry() -> None:
    """The ``phalanx`` console script."""
    code = main()
    if "phalanx.parallel" in sys.modules:  # a run happened in this process
        from .parallel import exit_process

        exit_process(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()

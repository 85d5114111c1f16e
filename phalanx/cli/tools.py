"""The commands beside training: ``phalanx scale`` (a scaling analysis of a run configuration),
``phalanx consolidate`` (one file of a sharded checkpoint) and ``phalanx prepare-training-data``
(another tool's raw layout made into training data). ``cli`` adds them to its group."""

from __future__ import annotations

from typing import Any

import click

from ..config import registry
from ..errors import PhalanxError
from .options import Command, Option, build_config, training_options

SCALE_EXAMPLES = """\b
Examples:
  phalanx scale --model resnet18 --dataroot data/ --workers 1,2          # CPU workers
  phalanx scale --gpu-ids 0,1,2,3 --workers 1,2,4 --scaling weak --output scale.json
  phalanx scale --workers 1,2 --dry-run                                # what it would run
"""


@click.command(cls=Command, epilog=SCALE_EXAMPLES)
@training_options("trainlaunch")
@click.option(
    "--workers",
    default="auto",
    show_default=True,
    metavar="N[,N...]",
    cls=Option,
    help="World sizes to measure (1 is always measured): DDP workers through torchrun on this machine, "
    "or srun steps when run from a SLURM batch script. auto: 1, 2, 4, ... up to the allocation's tasks "
    "under SLURM, else up to the --gpu-ids, else 1,2.",
)
@click.option(
    "--scaling",
    type=click.Choice(["weak", "strong", "both"]),
    default="both",
    show_default=True,
    cls=Option,
    help="weak: --batch-size per worker at every world size; strong: --batch-size is the global batch, "
    "split over the workers.",
)
@click.option(
    "--steps",
    default=30,
    show_default=True,
    type=int,
    metavar="N",
    cls=Option,
    help="Optimizer steps measured at each point, after the warm-up.",
)
@click.option(
    "--warmup-steps",
    default=10,
    show_default=True,
    type=int,
    metavar="N",
    cls=Option,
    help="Steps run before the measurement at each point (first batches, allocations).",
)
@click.option(
    "--repeats",
    default=1,
    show_default=True,
    type=int,
    metavar="N",
    cls=Option,
    help="Run every point N times, interleaved, and take each point's median rate (noisy machines).",
)
@click.option("--output", default=None, metavar="FILE", cls=Option, help="Also write the points as JSON.")
@click.option(
    "--scale-pickle-dir",
    "scale_pickle_dir",
    default=None,
    metavar="DIR",
    cls=Option,
    help="Also write a snapshot there for `phalanx visualize --pickle-dir DIR` (a table window).",
)
@click.option("--dry-run", is_flag=True, cls=Option, help="Print what would run, then exit.")
@click.pass_context
def scale(
    ctx: click.Context,
    workers: str,
    scaling: str,
    steps: int,
    warmup_steps: int,
    repeats: int,
    output: str | None,
    scale_pickle_dir: str | None,
    dry_run: bool,
    **values: Any,
) -> None:
    """A scaling analysis of your run configuration: samples/s, speedup, parallel efficiency and
    where a step's time goes at each world size, for weak and strong scaling.

    Each point trains a few steps in a scratch directory, removed afterwards: nothing of the run
    directory of a real training is written (with --resume, its recorded configuration is the one
    measured).
    """
    cfg = build_config(ctx, values)
    try:
        sizes = [] if workers == "auto" else [int(w) for w in workers.split(",")]
    except ValueError:
        raise PhalanxError(f"expected world sizes such as 1,2,4 (got {workers!r})", "--workers") from None
    from ..launch.scale import SCALINGS  # imports torch
    from ..launch.scale import scale as run_scale

    run_scale(
        cfg,
        sizes,
        list(SCALINGS) if scaling == "both" else [scaling],
        steps,
        warmup_steps,
        output,
        scale_pickle_dir,
        dry_run,
        click.echo,
        repeats,
    )


CONSOLIDATE_EXAMPLES = """\b
Examples:
  phalanx consolidate --checkpoint checkpoints/big/latest.pt --output big.pt
"""


@click.command(cls=Command, epilog=CONSOLIDATE_EXAMPLES)
@click.option(
    "--checkpoint",
    required=True,
    metavar="FILE",
    cls=Option,
    help="A checkpoint of --fsdp-checkpoints sharded (the file that names its shards), or its run "
    "directory (its best.pt, else its latest.pt).",
)
@click.option(
    "--output",
    required=True,
    metavar="FILE",
    cls=Option,
    help="The one file to write (atomically), as a whole checkpoint: torch.load opens it, and it "
    "resumes, evaluates, predicts and exports as any other.",
)
def consolidate(checkpoint: str, output: str) -> None:
    """One file from a sharded checkpoint: every network and optimizer state read whole in this
    process (it must fit its memory)."""
    from pathlib import Path

    from ..checkpoint.sharded import consolidate as run_consolidate  # imports torch

    state = run_consolidate(Path(checkpoint), Path(output))
    click.echo(f"{output}: {', '.join(state['models'])} whole, epoch {state['epoch']}, step {state['step']}")


PREPARING = {name: info for name, info in registry.builtin().items() if info.prepares}
FIRST_PREPARING = next(iter(PREPARING), "")
PREPARE_EXAMPLES = f"""\b
Examples:
  phalanx prepare-training-data --input-dir raw/ --output-dir data/
  phalanx train --task {FIRST_PREPARING} --dataroot data/
"""


@click.command(
    "prepare-training-data",
    cls=Command,
    epilog=PREPARE_EXAMPLES,
    help="Another tool's raw images made into a task's training data, with a seeded validation split. "
    + " ".join(f"--task {name}: {info.prepares_words}." for name, info in PREPARING.items()),
)
@click.option("--input-dir", required=True, metavar="DIR", cls=Option, help="The raw images, laid out as --task says.")
@click.option(
    "--output-dir",
    required=True,
    metavar="DIR",
    cls=Option,
    help="Where DIR/train/ and DIR/val/ get the prepared images; an existing file is never replaced.",
)
@click.option(
    "--validation-ratio",
    default=0.2,
    show_default=True,
    type=float,
    metavar="F",
    cls=Option,
    help="The fraction of the images held out in DIR/val/: round(F x images), chosen by --seed.",
)
@click.option(
    "--seed", default=0, show_default=True, type=int, metavar="N", cls=Option, help="Chooses the held-out images."
)
@click.option(
    "--size",
    default=512,
    show_default=True,
    type=int,
    metavar="PIXELS",
    cls=Option,
    help="Each image resized to PIXELS x PIXELS, as the other tool resizes it.",
)
@click.option(
    "--task",
    default=FIRST_PREPARING,
    show_default=True,
    type=click.Choice(list(PREPARING)),
    cls=Option,
    help="Whose raw layout.",
)
def prepare_training_data(
    input_dir: str, output_dir: str, validation_ratio: float, seed: int, size: int, task: str
) -> None:
    prepare = registry.named_function(PREPARING[task].prepares)
    click.echo(f"phalanx: {prepare(input_dir, output_dir, validation_ratio, seed, size)}")

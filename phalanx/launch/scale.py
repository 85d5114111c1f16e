"""``phalanx scale``: a scaling analysis of the user's own run configuration.

For each scaling (weak: the batch per worker fixed; strong: the global batch fixed) and each world
size, the configuration trains for a fixed number of steps in DDP workers that torchrun starts on
this machine, or, run from the batch script of a SLURM allocation, that srun starts as a step of its
tasks (1 worker: one plain process, as on one device), in a scratch directory removed afterwards
(nothing of a real run directory is written, its config.json read with --resume; under SLURM it lies
in the checkpoints directory, which the nodes share). The rate of each point is its own measurement:
samples over seconds of the steps after the warm-up, from the run's ``train`` records (with
``--repeats``, interleaved, the median); speedup is a rate over the 1-worker rate of the same
scaling, efficiency the speedup over the workers. The step-time breakdown (data, compute,
communication, optimizer, logging) comes from the same records; what a step takes beyond the
1-worker step of weak scaling (the same work per worker) is communication and contention for the
machine, of which the breakdown's communication is the part measured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..checkpoint.rundir import read_metrics
from ..config import RunConfig
from ..distributed.cluster import slurm_tasks, slurm_tasks_per_node, srun_placement
from ..distributed.devices import cpu_threads_per_worker
from ..errors import EXIT_BAD_INPUT, PhalanxError, RunFailed
from ..records import STEP_PARTS
from ..records import STEP_TIME_KEYS as STEP_KEYS
from ..records.snapshots import holds_snapshots
from ..system.atomic import atomic_write

SCALINGS = ("weak", "strong")


@dataclass(frozen=True)
class Point:
    scaling: str
    workers: int
    batch: int  # per worker
    rate: float = 0.0  # samples/s of every worker together, after the warm-up
    step_s: float = 0.0  # seconds a step, mean over ranks
    parts: dict[str, float] | None = (
        None  # seconds a step in each part (data, compute, communication, optimizer, logging)
    )

    @property
    def global_batch(self) -> int:
        return self.batch * self.workers


def auto_workers(cfg: RunConfig, env: Mapping[str, str]) -> list[int]:
    """``--workers auto``: 1, 2, 4, ... up to the SLURM allocation's tasks, else up to the GPU ids,
    else 1 and 2 (CPU workers on this machine)."""
    most = slurm_tasks(env) or (2 if cfg.devices.uses_cpu else len(cfg.devices.gpu_ids))
    sizes, size = [], 1
    while size < most:
        sizes.append(size)
        size *= 2
    return sizes + [most]


def plan(
    cfg: RunConfig, workers: list[int], scalings: list[str], env: Mapping[str, str], auto: bool = False
) -> list[Point]:
    """The points to run, checked before any runs: a strong scaling's global batch (the 1-worker
    batch, --batch-size) must split evenly over each world size (``auto`` sizes that it does not
    split are left out of strong scaling instead)."""
    if not workers or any(w < 1 for w in workers):
        raise PhalanxError(f"world sizes are 1 or more (got {','.join(map(str, workers))})", "--workers")
    tasks = slurm_tasks(env)
    if tasks is not None and max(workers) > tasks:
        raise PhalanxError(
            f"{max(workers)} workers but this SLURM allocation has {tasks} task(s) (SLURM_NTASKS); "
            "ask sbatch for more (--ntasks) or measure fewer",
            "--workers",
        )
    per_node = slurm_tasks_per_node(env) if tasks is not None else None
    if per_node and not cfg.devices.uses_cpu and min(max(workers), per_node) > len(cfg.devices.gpu_ids):
        raise PhalanxError(
            f"{min(max(workers), per_node)} tasks on a node but {len(cfg.devices.gpu_ids)} --gpu-ids; "
            "a task takes gpu_ids[its local rank]: give one id per task of a node",
            "--gpu-ids",
        )
    if tasks is None and not cfg.devices.uses_cpu and max(workers) > len(cfg.devices.gpu_ids):
        raise PhalanxError(
            f"{max(workers)} workers but {len(cfg.devices.gpu_ids)} --gpu-ids; give one id per worker", "--workers"
        )
    sizes = sorted(set(workers) | {1})  # every speedup is over the 1-worker rate
    points = []
    for scaling in scalings:
        for w in sizes:
            if scaling == "strong" and cfg.optim.batch_size % w and auto:
                continue
            if scaling == "strong" and cfg.optim.batch_size % w:
                raise PhalanxError(
                    f"strong scaling splits --batch-size {cfg.optim.batch_size} over {w} workers: give a "
                    "batch size that each world size divides",
                    "--workers",
                )
            points.append(Point(scaling, w, cfg.optim.batch_size if scaling == "weak" else cfg.optim.batch_size // w))
    return points


def describe(
    cfg: RunConfig, points: list[Point], steps: int, warmup: int, repeats: int, env: Mapping[str, str]
) -> list[str]:
    """``--dry-run``: what would run."""
    tasks = slurm_tasks(env)
    where = (
        "on this machine (1 worker: one process; more: DDP workers through torchrun), in a scratch directory"
        if tasks is None
        else f"in SLURM job {env['SLURM_JOB_ID']} ({tasks} tasks; 1 worker: one process; "
        f"more: srun steps of its tasks), in a scratch directory under {cfg.checkpoints_dir}"
    )
    lines = [
        f"phalanx scale: {len(points)} points x {repeats} repeat(s), each {warmup} warm-up + {steps} measured "
        f"steps, {where} (nothing of {cfg.run_dir} is touched)"
    ]
    for p in points:
        lines.append(
            f"  {p.scaling} scaling, {p.workers} worker{'s' if p.workers > 1 else ''}: --batch-size {p.batch} "
            f"per worker (global {p.global_batch})"
        )
    return lines


def run_point(cfg: RunConfig, point: Point, steps: int, warmup: int, scratch: Path, slurm: bool = False) -> Point:
    """Train one point and measure it from its records."""
    name = f"{point.scaling}-{point.workers}"
    # A record every step (the warm-up's end is a record's end wherever epochs end), epochs enough
    # for every step, no validation: what is timed is training alone. Each point on its own GPUs
    # (under SLURM the ids are each node's: a task takes gpu_ids[its local rank]).
    plain = point.workers == 1 and cfg.devices.strategy != "fsdp"  # fsdp shards over DDP workers, even one
    ids = cfg.devices.gpu_ids
    gpus = {} if cfg.devices.uses_cpu else {"gpu_ids": ids[:1] if plain else ids if slurm else ids[: point.workers]}
    run = cfg.replace(
        checkpoints_dir=str(scratch),
        name=name,
        batch_size=point.batch,
        max_steps=warmup + steps,
        epochs=10**6,
        log_every=1,
        val_every=10**9,
        save_epoch_freq=0,
        progress=False,
        resume=None,
        overwrite=False,
        pickle_dir=None,
        remote_transfer=None,
        remote_transfer_cmd=None,
        **gpus,
    )
    env = dict(os.environ)
    # 1 worker: a plain process, as the user would train on one device (its speedup over that
    # includes what going distributed costs); more: DDP workers started by torchrun, or an srun
    # step of the allocation's tasks (each worker takes its threads from its node's tasks)
    if cfg.devices.uses_cpu and not (slurm and not plain):
        env["OMP_NUM_THREADS"] = str(cpu_threads_per_worker(point.workers))
    if plain:
        launcher = [sys.executable]
    elif slurm:
        launcher = [
            "srun",
            *srun_placement(point.workers, slurm_tasks_per_node(env)),
            "--kill-on-bad-exit=1",
            sys.executable,
        ]
    else:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={point.workers}"]
    try:
        done = subprocess.run(
            [*launcher, "-m", "phalanx.launch.worker", run.to_json(indent=None)],
            env=env,
            capture_output=True,
            text=True,
        )
    except FileNotFoundError:  # no srun on this node's PATH
        raise PhalanxError(f"{launcher[0]} was not found on this node's PATH", "--workers") from None
    if done.returncode != 0:
        said = [line for line in done.stderr.splitlines() if line.startswith("phalanx:")]
        last = said[-1].removeprefix("phalanx: ") if said else (done.stderr.strip().splitlines() or ["no output"])[-1]
        if done.returncode == EXIT_BAD_INPUT:  # the configuration itself: the run's own words
            raise PhalanxError(f"{name}: {last}", "--config")
        raise RunFailed(f"{name}: the run failed (exit code {done.returncode}): {last}")
    return measure(point, read_metrics(scratch / name / "metrics.jsonl"), warmup)


def measure(point: Point, records: list[dict[str, Any]], warmup: int) -> Point:
    """The point's rate and breakdown from its ``train`` records after the warm-up (each record
    covers the steps since the one before; the first counted starts where the warm-up ends)."""
    train = [r for r in records if r.get("kind") == "train"]
    windows = [r for r in train if r["step"] > warmup]
    seconds = sum(r["seconds"] for r in windows)
    if not windows or seconds <= 0 or not any(r["step"] == warmup for r in train):
        raise RunFailed(f"{point.scaling}-{point.workers}: no steps were measured after the warm-up")
    formed = {r.get("world_size", point.workers) for r in windows}
    if formed != {point.workers}:  # a launcher that started separate processes, not one group
        raise RunFailed(
            f"{point.scaling}-{point.workers}: the workers formed a group of "
            f"{', '.join(map(str, sorted(formed)))}, not {point.workers}"
        )
    count = sum(r["step"] - prev for r, prev in zip(windows, [warmup] + [w["step"] for w in windows]))
    parts = {
        key.removeprefix("step_").removesuffix("_s"): sum(
            r.get(key, 0.0) * (r["step"] - prev) for r, prev in zip(windows, [warmup] + [w["step"] for w in windows])
        )
        / count
        for key in STEP_KEYS
    }
    return Point(
        point.scaling, point.workers, point.batch, sum(r["samples"] for r in windows) / seconds, seconds / count, parts
    )


def speedup(point: Point, points: list[Point]) -> tuple[float, float]:
    """A point's rate over its scaling's 1-worker rate, and that over its workers (efficiency)."""
    base = next(p for p in points if p.scaling == point.scaling and p.workers == 1)
    ratio = point.rate / base.rate
    return ratio, ratio / point.workers


def table(points: list[Point]) -> list[str]:
    """One row a point: rate, speedup and efficiency over the same scaling's 1 worker, breakdown."""
    lines = ["scaling  workers  batch/worker  samples/s  speedup  efficiency  step (s)  " + "  ".join(STEP_PARTS)]
    for p in points:
        ratio, efficiency = speedup(p, points)
        shares = "  ".join(f"{100 * (p.parts or {}).get(k, 0.0) / p.step_s:>{len(k) - 1}.0f}%" for k in STEP_PARTS)
        lines.append(
            f"{p.scaling:<7}  {p.workers:>7}  {p.batch:>12}  {p.rate:>9.1f}  {ratio:>6.2f}x  "
            f"{100 * efficiency:>9.0f}%  {p.step_s:>8.4f}  {shares}"
        )
    return lines


# Efficiency above this is not more workers' doing (a little above 1 can be: caches): said so.
IMPLAUSIBLE = 1.2


def verdict(points: list[Point]) -> str:
    """The largest world size of weak scaling (else strong) in one line."""
    scaling = "weak" if any(p.scaling == "weak" for p in points) else "strong"
    ours = [p for p in points if p.scaling == scaling]
    base, top = ours[0], max(ours, key=lambda p: p.workers)
    ratio, efficiency = speedup(top, points)
    line = f"{top.workers} workers ({scaling} scaling): {ratio:.2f}x, {100 * efficiency:.0f}% efficient"
    if top.workers > 1:
        line += f"; communication {100 * (top.parts or {}).get('communication', 0.0) / top.step_s:.0f}% of a step"
    if scaling == "weak" and top.workers > 1:
        beyond = max(0.0, top.step_s - base.step_s) / top.step_s
        line += f"; {100 * beyond:.0f}% of a step beyond 1 worker's (communication, contention)"
    if efficiency > IMPLAUSIBLE:  # a newcomer's loaded machine gave 712%
        line += (
            "; above 100% efficient, the 1-worker point ran slow (a loaded machine?): --repeats 3 interleaves "
            "the points and takes each one's median"
        )
    return line


def rows(points: list[Point]) -> list[list[str]]:
    """The dashboard's table: a row a point, then the verdict."""
    found = []
    for p in points:
        ratio, efficiency = speedup(p, points)
        shares = ", ".join(f"{k} {100 * v / p.step_s:.0f}%" for k, v in (p.parts or {}).items())
        found.append(
            [
                f"{p.scaling}, {p.workers} worker{'s' if p.workers > 1 else ''} x {p.batch}",
                f"{p.rate:.1f} samples/s, {ratio:.2f}x, {100 * efficiency:.0f}% efficient; "
                f"step {p.step_s:.4f} s ({shares})",
            ]
        )
    return found + [["verdict", verdict(points)]]


def write_snapshot(cfg: RunConfig, points: list[Point], directory: Path) -> None:
    """A snapshot ``phalanx visualize --pickle-dir DIR`` shows as a table window."""
    from ..records.snapshots import SnapshotWriter
    from ..records.windows import window
    from ..train.outputs import new_run_id

    panes = [window("scale", "table", "phalanx scale: samples/s, speedup, efficiency, step")]
    writer = SnapshotWriter(
        directory=directory,
        run_id=new_run_id(),
        options={**cfg.to_dict(), "name": f"{cfg.name}-scale"},
        every_seconds=0.0,
        on_written=lambda path: None,
        write_file=lambda path, data: atomic_write(path, lambda fh: fh.write(data)),
    )
    writer.start([{"kind": "panes", "panes": panes, "best": {}}, {"kind": "table", "epoch": 0, "rows": rows(points)}])


def median_point(runs: list[Point]) -> Point:
    """The repeat of median rate (its step time and breakdown with it)."""
    return sorted(runs, key=lambda p: p.rate)[(len(runs) - 1) // 2]


def scale(
    cfg: RunConfig,
    workers: list[int],
    scalings: list[str],
    steps: int,
    warmup: int,
    output: str | None,
    pickle_dir: str | None,
    dry_run: bool,
    say: Callable[[str], None],
    repeats: int = 1,
) -> list[Point]:
    if steps < 1 or warmup < 1 or repeats < 1:
        raise PhalanxError("--steps, --warmup-steps and --repeats are 1 or more", "--steps")
    env = dict(os.environ)
    points = plan(cfg, workers or auto_workers(cfg, env), scalings, env, auto=not workers)
    slurm = slurm_tasks(env) is not None
    for given, flag in ((output, "--output"), (pickle_dir, "--scale-pickle-dir")):
        if given and not Path(given).resolve().parent.is_dir():  # said now, not after every point ran
            raise PhalanxError(f"{Path(given).resolve().parent} does not exist", flag)
    if pickle_dir and holds_snapshots(Path(pickle_dir)):  # a run's snapshots: never written over
        raise PhalanxError(f"{pickle_dir} holds snapshots already; give a new or empty folder", "--scale-pickle-dir")
    if dry_run:
        for line in describe(cfg, points, steps, warmup, repeats, env):
            say(line)
        return points
    runs: dict[int, list[Point]] = {index: [] for index in range(len(points))}
    if slurm:  # every node reads and writes the scratch: the checkpoints directory, which they share
        Path(cfg.checkpoints_dir).mkdir(parents=True, exist_ok=True)
    how = "srun" if slurm else "torchrun"
    with tempfile.TemporaryDirectory(
        prefix=".phalanx-scale-" if slurm else "phalanx-scale-", dir=cfg.checkpoints_dir if slurm else None
    ) as scratch:
        if slurm:  # a job killed by the scheduler leaves it: said where it is
            say(f"phalanx scale: scratch directory {scratch} (removed at the end)")
        for repeat in range(repeats):  # interleaved: a slow minute of the machine hits every point alike
            for index, point in enumerate(points):
                runs[index].append(run_point(cfg, point, steps, warmup, Path(scratch) / str(repeat), slurm))
                started = "one process" if point.workers == 1 and cfg.devices.strategy != "fsdp" else how
                say(
                    f"phalanx scale: {point.scaling} {point.workers} worker(s) ({started}): "
                    f"{runs[index][-1].rate:.1f} samples/s"
                )
    measured = [median_point(found) for found in runs.values()]
    for line in table(measured):
        say(line)
    say(f"phalanx scale: {verdict(measured)}")
    if pickle_dir:
        write_snapshot(cfg, measured, Path(pickle_dir))
    if output:
        text = json.dumps(
            {
                "config": cfg.to_dict(),
                "steps": steps,
                "warmup_steps": warmup,
                "repeats": repeats,
                "points": [asdict(p) for p in measured],
                "verdict": verdict(measured),
                "runs": [[asdict(p) for p in found] for found in runs.values()],
            },
            indent=1,
        )
        atomic_write(Path(output), lambda fh: fh.write(text.encode()))
    return measured

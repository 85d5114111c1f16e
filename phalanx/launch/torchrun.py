"""``phalanx trainlaunch``: DistributedDataParallel through torchrun, in process, with no shell.

The ``--use-torchrun`` string is split once (shlex) and checked with torchrun's own parser before
any process starts. Workers run ``python -m phalanx.launch.worker CONFIG_JSON``: the run configuration
travels as one argv element, never re-quoted. Each worker picks ``cuda:gpu_ids[local_rank]``;
CUDA_VISIBLE_DEVICES is never touched.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from dataclasses import dataclass
from typing import NoReturn

# torch's C++ side logs every failed connection attempt of a rendezvous to stderr (dozens of lines
# and stack frames before torchrun gives up); the launcher reports a failure itself, in one line.
# Read when torch loads, so set here, and taken back before the workers start (they inherit it).
_QUIET_CPP_LOG = "TORCH_CPP_LOG_LEVEL" not in os.environ
if _QUIET_CPP_LOG:
    os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"

from ..checkpoint import rundir  # noqa: E402  (imports torch)
from ..config import RunConfig  # noqa: E402
from ..distributed.devices import plan_report, plan_run  # noqa: E402
from ..distributed.failures import cause_line, innermost, summarize  # noqa: E402
from ..errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_TERMINATED, PhalanxError, RunFailed  # noqa: E402

OPTION = "--use-torchrun"
WORKER_MODULE = "phalanx.launch.worker"
MEANINGFUL = (EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_TERMINATED)  # worker exits passed on as ours


@dataclass
class LaunchPlan:
    torchrun_argv: list[str]  # what torchrun receives, worker module and config included
    torchrun_options: list[str]  # the user's options alone
    nproc_per_node: int
    nnodes: tuple[int, int]
    args: argparse.Namespace  # torchrun's parsed arguments

    @property
    def picks_port(self) -> bool:
        """One node, and no port, endpoint or --standalone named: the rendezvous takes a free port of this
        machine (torch 2.14's torchrun does so itself; 2.11's, the GPU image's, listened on 29500, and a
        second run on the machine failed with EADDRINUSE: two runs at once there, 2026-11-27)."""
        named = any(
            option.startswith(("--master", "--rdzv-endpoint", "--rdzv_endpoint", "--standalone"))
            for option in self.torchrun_options
        )
        return (
            self.nnodes[1] == 1
            and self.args.rdzv_backend == "static"
            and not self.args.rdzv_endpoint
            and not self.args.standalone
            and not named
            and "PET_MASTER_PORT" not in os.environ
        )

    @property
    def rank_may_change(self) -> bool:
        """torchrun's c10d rendezvous on several nodes: a node may take another rank in a later round
        (after a restart, or a node lost or added)."""
        return self.nnodes[1] > 1 and self.args.rdzv_backend == "c10d"

    @property
    def world_size(self) -> str:
        low, high = self.nnodes
        return (
            str(low * self.nproc_per_node)
            if low == high
            else f"{low * self.nproc_per_node}..{high * self.nproc_per_node}"
        )


def _torchrun_parser() -> argparse.ArgumentParser:
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()

    def refuse(message: str) -> NoReturn:  # argparse would print usage and exit 2
        raise PhalanxError(f"torchrun says: {message}", OPTION)

    parser.error = refuse  # type: ignore[method-assign]  # (replacing a method is the point)
    return parser


def default_torchrun_options(cfg: RunConfig) -> list[str]:
    """Without ``--use-torchrun``: one node, one worker per GPU id, or one CPU worker."""
    return ["--nproc-per-node", str(1 if cfg.devices.uses_cpu else len(cfg.devices.gpu_ids))]


def plan_launch(cfg: RunConfig, torchrun_options: str | None) -> LaunchPlan:
    """Everything checked before a process starts: the torchrun string, workers vs GPU ids."""
    from torch.distributed.run import determine_local_world_size, parse_min_max_nnodes

    try:
        options = shlex.split(torchrun_options) if torchrun_options is not None else default_torchrun_options(cfg)
    except ValueError as exc:  # "No closing quotation"
        raise PhalanxError(f"cannot split {torchrun_options!r}: {exc}", OPTION) from None
    if any(not opt.startswith("-") for opt in options[:1]) or "-m" in options or "--module" in options:
        raise PhalanxError("holds torchrun's options only; phalanx adds the worker program itself", OPTION)
    argv = [*options, "-m", WORKER_MODULE, cfg.to_json(indent=None)]
    try:
        args = _torchrun_parser().parse_args(argv)
    except SystemExit:  # -h/--help: argparse printed torchrun's help and wants to exit
        raise PhalanxError("asks for torchrun's help; see `python -m torch.distributed.run --help`", OPTION) from None
    if args.training_script != WORKER_MODULE:
        raise PhalanxError(f"unexpected argument {args.training_script!r}; pass torchrun options only", OPTION)
    try:
        nproc = determine_local_world_size(args.nproc_per_node)
        nnodes = parse_min_max_nnodes(args.nnodes)
    except ValueError as exc:
        raise PhalanxError(f"torchrun says: {exc}", OPTION) from None
    _check_counts(nproc, nnodes)
    if not cfg.devices.uses_cpu and nproc > len(cfg.devices.gpu_ids):
        raise PhalanxError(
            f"{nproc} workers per node but only {len(cfg.devices.gpu_ids)} --gpu-ids; give one "
            "--gpu-ids per worker, or lower --nproc-per-node",
            OPTION,
        )
    return LaunchPlan(argv, options, nproc, nnodes, args)


def _check_counts(nproc: int, nnodes: tuple[int, int]) -> None:
    """Counts torchrun's parser takes but its agent fails on later (an AssertionError, after the
    run directory was checked): at least one worker, on at least one node."""
    if nproc < 1:
        raise PhalanxError(f"--nproc-per-node must be at least 1 (got {nproc})", OPTION)
    low, high = nnodes
    if low < 1 or high < low:
        raise PhalanxError(f"--nnodes must be N or MIN:MAX with 1 <= MIN <= MAX (got {low}:{high})", OPTION)


def describe(cfg: RunConfig, plan: LaunchPlan, train_samples: int | None = None) -> list[str]:
    """The ``--dry-run`` report: the plan each local worker will make (``devices.plan_run``), its
    batch and learning-rate lines those of ``train --dry-run``."""
    from ..distributed.cluster import Placement, launcher_name

    world = plan.nnodes[1] * plan.nproc_per_node
    workers = [
        plan_run(cfg, Placement("torchrun", r, r, world, plan.nproc_per_node, "", 0))
        for r in range(plan.nproc_per_node)
    ]
    nodes = f"{plan.nnodes[0]}{'' if plan.nnodes[0] == plan.nnodes[1] else '..' + str(plan.nnodes[1])}"
    lines = [
        f"torchrun {shlex.join(plan.torchrun_argv)}",
        f"world size: {plan.world_size} ({plan.nproc_per_node} per node x nodes {nodes}), backend {workers[0].backend}",
    ]
    if plan.picks_port:
        lines.append(
            "rendezvous: on this machine, at a free port taken at launch (torchrun's --master-port to choose one)"
        )
    lines += [f"local rank {r}: {worker.device}" for r, worker in enumerate(workers)]
    return (
        lines
        + plan_report(cfg, workers[0], train_samples)
        + [
            f"this node: started by {launcher_name(os.environ, workers_of_its_own=True)}; trainlaunch starts "
            "torchrun's workers here, each with torchrun's variables"
        ]
    )


def launch(cfg: RunConfig, torchrun_options: str | None, dry_run: bool = False) -> int:
    """Run torchrun in this process; a failed worker becomes a one-line error and our exit code."""
    from ..distributed.devices import check_gpu_ids, missing_gpus

    plan = plan_launch(cfg, torchrun_options)
    if dry_run:  # a plan is most useful before the job reaches its GPUs: warn, do not refuse
        from ..tasks.base import dataset_size
        from ..train.run import describe_checks

        # (memory per rank at the fewest nodes: the most each rank holds)
        data, checked, stop = describe_checks(cfg, plan.nnodes[0] * plan.nproc_per_node)
        print("\n".join(describe(cfg, plan, dataset_size(data.train)) + checked), flush=True)
        missing = missing_gpus(cfg.devices.gpu_ids)
        if missing:
            print(f"phalanx: warning: --gpu-ids: {missing} (a real run refuses this)", file=sys.stderr)
        if stop is not None:
            raise stop  # the plan printed, the dry run exits as the real run would
        return 0
    check_gpu_ids(cfg.devices.gpu_ids)
    from ..train.memory_plan import check_batch_memory

    check_batch_memory(cfg)  # before a worker starts, as train checks it
    if plan.nnodes[1] == 1:
        # A taken run directory or a bad --resume fails here, before any worker starts. With
        # several nodes on a shared disk, node 0's rank 0 may already have created the run;
        # the workers then check it together, before a barrier.
        rundir.plan(cfg)
    run_workers(cfg, plan)
    return 0


def run_workers(cfg: RunConfig, plan: LaunchPlan) -> None:
    """torchrun's agent in this process, its workers' failures as one-line errors."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import run

    from ..distributed.devices import cpu_threads_per_worker
    from .rendezvous import launch_environment, on_a_free_port

    # torchrun logs each worker failure at length; phalanx reports it in one line below.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    if _QUIET_CPP_LOG:
        os.environ.pop("TORCH_CPP_LOG_LEVEL", None)
    if plan.picks_port:
        on_a_free_port(plan.args)
    try:
        threads = cpu_threads_per_worker(plan.nproc_per_node) if cfg.devices.uses_cpu else None
        with launch_environment(threads, plan.rank_may_change):
            run(plan.args)
    except ChildFailedError as exc:
        raise _worker_failures(exc) from None
    except SignalException as exc:
        import signal

        raise RunFailed(
            f"stopped by {exc.sigval.name}; every worker was stopped",
            exit_code=EXIT_INTERRUPTED if exc.sigval == signal.SIGINT else EXIT_TERMINATED,
        ) from None
    except Exception as exc:  # the agent itself: rendezvous, store, anything torchrun raises
        raise RunFailed(_agent_failure(exc, plan), OPTION) from None


_AGENT_FAILURES = {
    "RendezvousConnectionError": "cannot connect to the rendezvous store",
    "RendezvousTimeoutError": "not every node joined the rendezvous in time",
    "RendezvousClosedError": "the rendezvous was closed (another node ended the run)",
    "DistNetworkError": "cannot connect to the rendezvous store",
    "DistStoreError": "the rendezvous store timed out",
}


def _agent_failure(exc: Exception, plan: LaunchPlan) -> str:
    """One line for a failure of torchrun's agent, with how to fail sooner where it waited: its
    rendezvous timeouts default to minutes (read_timeout 60 s, join_timeout 600 s)."""
    what = _AGENT_FAILURES.get(type(exc).__name__)
    if what is None:
        return f"torchrun failed: {summarize(exc)}{'' if cause_line(innermost(exc)) else _raised_at(innermost(exc))}"
    root = innermost(exc)
    detail = f" ({type(root).__name__}: {cause_line(root)})" if cause_line(root) else ""
    if "EADDRINUSE" in detail:  # the store's port: waiting longer would not help
        where = (
            f"port {plan.args.master_port or 29500}" if plan.args.rdzv_backend == "static" else plan.args.rdzv_endpoint
        )
        return (
            f"rendezvous failed: {where} is in use on this machine (another run's?); give torchrun another "
            "--master-port (or --rdzv-endpoint), or leave both out on one node for a free port"
        )
    if plan.args.rdzv_backend == "static":
        hint = "--rdzv-conf timeout=SECONDS"
    else:
        hint = "--rdzv-conf read_timeout=SECONDS (connecting) or join_timeout=SECONDS (waiting for nodes)"
    return f"rendezvous failed: {what}{detail}; to wait less, give torchrun {hint}"


def _raised_at(exc: BaseException) -> str:
    """Where an error without a message (a bare AssertionError of torch's) was raised."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    return f" at {frames[-1].filename.split('site-packages/')[-1]}:{frames[-1].lineno}" if frames else ""


def _worker_failures(exc) -> RunFailed:
    """One line per failed rank: ranks that only lost their peers first, the root cause last
    (it is also the error raised, so its exit code is the launcher's)."""

    def secondary(failure) -> bool:  # failed because another rank did
        stopped_by_torchrun = failure.exitcode == -15 and not failure.message.startswith("lost")
        return stopped_by_torchrun or first_line(failure.message).startswith(
            ("lost its peers", "a collective timed out")
        )

    def when(failure) -> int:
        message = failure.message
        extra = message.get("extraInfo", {}) if isinstance(message, dict) else {}
        return int(extra.get("time_ns", failure.timestamp * 10**9))

    *others, (rank, failure) = sorted(exc.failures.items(), key=lambda item: (not secondary(item[1]), -when(item[1])))
    code = failure.exitcode if failure.exitcode in MEANINGFUL else EXIT_FAILED  # bad input, a signal: kept
    # Every rank refused the same input: one line, as `train`'s. A rank torchrun stopped before it
    # got as far (a slower one, on a busy machine) refused nothing else.
    if code == EXIT_BAD_INPUT and all(
        (o.exitcode, first_line(o.message)) == (failure.exitcode, first_line(failure.message))
        or o.exitcode == -15
        and secondary(o)
        for _, o in others
    ):
        return RunFailed(first_line(failure.message), exit_code=code)
    for other_rank, other in others:
        said = "stopped by torchrun after another rank failed" if other.exitcode == -15 else first_line(other.message)
        print(f"phalanx: rank {other_rank} (local rank {other.local_rank}): {said}", file=sys.stderr, flush=True)
    return RunFailed(
        f"rank {rank} (local rank {failure.local_rank}) failed with exit code {failure.exitcode}: "
        f"{first_line(failure.message)}",
        exit_code=code,
    )


def first_line(message: object) -> str:
    """torchrun hands over the worker's error file: a string, or ``{"message": ...}``."""
    while isinstance(message, dict):
        message = message.get("message", "")
    lines = [line for line in str(message).splitlines() if line.strip()]
    return lines[0] if lines else "no error message (see the worker's output above)"

"""Which launcher started this process, and where it sits in the process group.

torchrun's variables win when present; then Open MPI's (``mpirun``); then SLURM's, for a task that
``srun`` started (a batch script itself is no task: it has no step); then a bare
``RANK``/``WORLD_SIZE`` (a Kubernetes operator, or any launcher that sets torch's variables).
Standard library only: ``--dry-run`` reports it without loading torch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import PhalanxError

ENVIRONMENT = "environment"


@dataclass(frozen=True)
class Placement:
    launcher: str  # torchrun, slurm, mpi, env (RANK/WORLD_SIZE: Kubernetes-style)
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    master_addr: str
    master_port: int

    def describe(self) -> str:
        return (
            f"{self.launcher}: rank {self.rank} of {self.world_size} (local rank {self.local_rank} of "
            f"{self.local_world_size}), rendezvous at {self.master_addr}:{self.master_port}"
        )


def placement_from(env: Mapping[str, str]) -> Placement | None:
    """The process group this process belongs to, or None when it runs alone."""
    if "RANK" in env and "WORLD_SIZE" in env:
        return _from_torch(env, "torchrun" if "TORCHELASTIC_RUN_ID" in env else "env")
    if "OMPI_COMM_WORLD_RANK" in env:
        return _from_mpi(env)
    if "SLURM_STEP_ID" in env and "SLURM_PROCID" in env:
        return _from_slurm(env)
    return None


def launcher_name(env: Mapping[str, str], workers_of_its_own: bool = False) -> str:
    """For --dry-run: what started this process, even where it forms no group. ``workers_of_its_own``:
    trainlaunch's, which starts torchrun's workers whatever started it (not "one process")."""
    placement = placement_from(env)
    if placement is not None:
        return placement.describe()
    job = f"a SLURM job, {env['SLURM_JOB_ID']}, but not an srun task" if "SLURM_JOB_ID" in env else ""
    if workers_of_its_own:
        return f"no scheduler ({job})" if job else "no scheduler"
    return f"none ({job}: one process)" if job else "none (one process)"


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    value = env.get(name)
    if value is None and default is not None:
        return default
    try:
        return int(str(value))
    except ValueError:
        raise PhalanxError(f"{name}={value!r} is not an integer", ENVIRONMENT) from None


def _master(env: Mapping[str, str], how: str) -> tuple[str, int]:
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        if var not in env:
            raise PhalanxError(
                f"{how}: {var} is not set; export MASTER_ADDR (the host of rank 0) and MASTER_PORT "
                "(a free port there) for every process",
                ENVIRONMENT,
            )
    return env["MASTER_ADDR"], _int(env, "MASTER_PORT")


def _checked(placement: Placement) -> Placement:
    if not 0 <= placement.rank < placement.world_size:
        raise PhalanxError(
            f"rank {placement.rank} is outside world size {placement.world_size} ({placement.launcher})", ENVIRONMENT
        )
    return placement


def _from_torch(env: Mapping[str, str], launcher: str) -> Placement:
    addr, port = _master(env, "RANK and WORLD_SIZE are set")
    # A pod or a machine per rank sets no LOCAL_*: it is the only worker on its node.
    return _checked(
        Placement(
            launcher,
            _int(env, "RANK"),
            _int(env, "LOCAL_RANK", 0),
            _int(env, "WORLD_SIZE"),
            _int(env, "LOCAL_WORLD_SIZE", 1),
            addr,
            port,
        )
    )


def _from_mpi(env: Mapping[str, str]) -> Placement:
    addr, port = _master(env, "started by mpirun (Open MPI)")
    return _checked(
        Placement(
            "mpi",
            _int(env, "OMPI_COMM_WORLD_RANK"),
            _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0),
            _int(env, "OMPI_COMM_WORLD_SIZE"),
            _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1),
            addr,
            port,
        )
    )


STEP_PORT_STRIDE = 7919  # a prime, coprime with 20000: steps 0..19999 of one job get distinct ports


def _from_slurm(env: Mapping[str, str]) -> Placement:
    nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
    addr = env.get("MASTER_ADDR") or first_host(nodes)
    # The port unless given: every task of a step derives the same one. Step 0 keeps the job's
    # (15000 + job id); later steps of the job (phalanx scale's world sizes, each a rendezvous) move
    # by a large prime stride, so they meet neither the job's earlier steps nor neighbouring jobs.
    port = (
        _int(env, "MASTER_PORT")
        if "MASTER_PORT" in env
        else 15000 + (_int(env, "SLURM_JOB_ID") + STEP_PORT_STRIDE * _int(env, "SLURM_STEP_ID", 0)) % 20000
    )
    world = _int(env, "SLURM_STEP_NUM_TASKS", _int(env, "SLURM_NTASKS", 1))
    local_world = tasks_on_node(
        env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or "1", _int(env, "SLURM_NODEID", 0)
    )
    return _checked(
        Placement("slurm", _int(env, "SLURM_PROCID"), _int(env, "SLURM_LOCALID", 0), world, local_world, addr, port)
    )


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: ``gpu[07-09,12],cpu3`` -> ``gpu07`` (as ``scontrol show
    hostnames`` would list it first)."""
    match = re.match(r"([^,\[]*)(?:\[([^\]]*)\])?", nodelist.strip())
    if not match or not match.group(1) and not match.group(2):
        raise PhalanxError(f"cannot read a host from SLURM's node list {nodelist!r}; set MASTER_ADDR", ENVIRONMENT)
    prefix, ranges = match.group(1), match.group(2)
    if ranges is None:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def tasks_on_node(spec: str, node: int) -> int:
    """``SLURM_STEP_TASKS_PER_NODE`` (``2(x3),1``) -> the tasks on node number ``node``."""
    counts = []
    for part in spec.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            return 1
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts[node] if node < len(counts) else counts[-1]


# --- an allocation's batch script (phalanx scale runs its world sizes as srun steps) --------------


def slurm_tasks(env: Mapping[str, str]) -> int | None:
    """The tasks of the SLURM allocation whose batch script runs this (not an srun task), or None."""
    if "SLURM_JOB_ID" not in env or "SLURM_STEP_ID" in env:
        return None
    if "SLURM_NTASKS" not in env:  # sbatch sets it only when asked for tasks
        raise PhalanxError(
            "this SLURM allocation names no tasks (SLURM_NTASKS is not set): give sbatch --ntasks or "
            "--ntasks-per-node, one task per worker to measure",
            "--workers",
        )
    try:
        return max(1, int(env["SLURM_NTASKS"]))
    except ValueError:
        raise PhalanxError(f"SLURM_NTASKS is {env['SLURM_NTASKS']!r}, not a number of tasks", "--workers") from None


def slurm_tasks_per_node(env: Mapping[str, str]) -> int | None:
    """The allocation's tasks on its first node (``SLURM_TASKS_PER_NODE``, ``4(x2)``), or None."""
    spec = env.get("SLURM_TASKS_PER_NODE")
    return tasks_on_node(spec, 0) if spec else None


def srun_placement(workers: int, per_node: int | None) -> list[str]:
    """srun's options for a step of ``workers`` tasks packed onto as few nodes as the allocation's
    tasks per node allow (srun alone would spread them over every node of the allocation, and a
    2-worker step would measure the network between nodes, not going distributed)."""
    if not per_node:
        return [f"--ntasks={workers}"]
    return [f"--ntasks={workers}", f"--nodes={-(-workers // per_node)}", f"--ntasks-per-node={min(workers, per_node)}"]

"""The cores this process may run on: its CPU affinity (``taskset``'s, SLURM's CPU binding, a pinned
test worker's) and its CPU quota (a container's ``--cpus``, a Kubernetes CPU limit: the cgroup's
``cpu.max`` or ``cpu.cfs_quota_us``, the smallest on the way up its hierarchy, rounded up), not the
machine's count. On a 128-core node a job given 8 cores that sized its threads or process pools by
``os.cpu_count()`` would run 16 of them on each."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

READ_LIMIT = 4 * 1024 * 1024  # /proc/self/mountinfo: a few KB in a container, hundreds on a busy node


def available_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        cores = len(os.sched_getaffinity(0)) or 1
    else:
        cores = os.cpu_count() or 1  # macOS, Windows: no affinity to read
    quota = cpu_quota()
    return max(1, min(cores, math.ceil(quota))) if quota else cores


def cpu_quota() -> float | None:
    """The cores' worth of CPU time this process's cgroups allow (cgroup v2 or v1), or None."""
    try:
        limits = [_quota(directory) for directory in _cpu_cgroup_directories()]
    except (OSError, ValueError, IndexError):  # no /proc, an unexpected format: no quota seen
        return None
    quotas = [limit for limit in limits if limit]
    return min(quotas) if quotas else None


def _read(path: str | Path) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read(READ_LIMIT)


def _cpu_cgroup_directories() -> list[Path]:
    """The directories of this process's CPU cgroup and of each cgroup above it, to the mount."""
    memberships = {}  # "" (cgroup v2) or "cpu" (v1) -> the process's cgroup path
    for line in _read("/proc/self/cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            memberships[controller] = path
    directories = []
    for line in _read("/proc/self/mountinfo").splitlines():
        fields = [_unescape(field) for field in line.split()]
        if "-" not in fields or len(fields) < fields.index("-") + 4:
            continue  # not a mount line
        kind, options = fields[fields.index("-") + 1], fields[-1].split(",")
        mounted = "" if kind == "cgroup2" else "cpu" if kind == "cgroup" and "cpu" in options else None
        if mounted is None or mounted not in memberships:
            continue
        root, mount, path = fields[3].rstrip("/"), Path(fields[4]), memberships[mounted]
        # a container sees its own cgroup as the mount's root
        inner = path[len(root) :] if path == root or path.startswith(root + "/") else path
        leaf = mount / inner.lstrip("/")
        directories += [leaf, *[p for p in leaf.parents if p == mount or mount in p.parents]]
    return directories


def _unescape(field: str) -> str:
    """mountinfo's octal escapes (a space is \\040)."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field)


def _quota(directory: Path) -> float | None:
    """One cgroup's quota in cores, if it sets one."""
    if (directory / "cpu.max").exists():  # v2: "max 100000" or "150000 100000"
        quota, period = _read(directory / "cpu.max").split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    if (directory / "cpu.cfs_quota_us").exists():  # v1: -1 for none
        quota_us = int(_read(directory / "cpu.cfs_quota_us"))
        return quota_us / int(_read(directory / "cpu.cfs_period_us")) if quota_us > 0 else None
    return None

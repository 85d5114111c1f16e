"""The cores this process may run on: its CPU affinity (``taskset``'s, SLURM's CPU binding, a pinned
test worker's), not the machine's count (a CPU quota without an affinity is not seen). On a 128-core node a job given 8
cores that sized its threads or process pools by ``os.cpu_count()`` would run 16 of them on each."""

from __future__ import annotations

import os


def available_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1  # macOS, Windows: no affinity to read

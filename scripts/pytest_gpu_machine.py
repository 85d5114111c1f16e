"""pytest plugin for the suite on a many-core GPU machine (scripts/gpu_suite.sh), not for CI.

Each pytest-xdist worker is pinned to cores of its own (PIN_CORES_EACH, default 2: the cores of the
machine the suite's time limits were set on), so phalanx's threads per worker (cores / local workers,
read from the affinity) are what they are there. Each failure's report is appended to
$FAILURES_LOG as it happens: a run stopped at its time limit keeps the reports xdist prints only at
the end.
"""

import os

_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw") and hasattr(os, "sched_setaffinity"):
    _each = int(os.environ.get("PIN_CORES_EACH", "2"))
    _cores = sorted(os.sched_getaffinity(0))
    _first = int(_WORKER[2:]) * _each
    os.sched_setaffinity(0, {_cores[(_first + i) % len(_cores)] for i in range(_each)})


def pytest_runtest_logreport(report):
    log = os.environ.get("FAILURES_LOG")
    if report.failed and log and (_WORKER or "PYTEST_XDIST_WORKER" not in os.environ):
        with open(log, "a") as fh:
            fh.write(f"==== {report.nodeid} ({report.when})\n{report.longreprtext[-4000:]}\n")

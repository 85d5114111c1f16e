"""How long a command takes to end once its work is done (~4 min on 2 cores).

    .venv/bin/python benchmarks/exit_latency.py                         # this checkout
    .venv/bin/python benchmarks/exit_latency.py --repo /tmp/before      # another checkout's phalanx, same runs

Three commands a user and the test suite run often (`train --max-steps 2`, `trainlaunch` with 2
workers, `evaluate`), as real processes, 7 interleaved repeats. For each: the wall time, and the
time from the last line the command printed to the process's exit (its work was done by then). With
several --repo the checkouts run interleaved, each repeat in a rotating order.
Results: benchmarks/results/exit_latency.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import write_results

REPO = Path(__file__).resolve().parents[1]


def commands(run_dir: Path) -> dict[str, list[str]]:
    train = ["--epochs", "1", "--max-steps", "2", "--checkpoints-dir", str(run_dir), "--no-progress"]
    return {
        "train": ["train", "--name", "one", *train],
        "trainlaunch, 2 workers": ["trainlaunch", "--name", "two", *train, "--use-torchrun", "--nproc-per-node 2"],
        "evaluate": ["evaluate", "--checkpoint", str(run_dir / "one/latest.pt"), "--output", str(run_dir / "e.json")],
    }


def timed(argv: list[str], repo: Path) -> tuple[float, float]:
    """(wall seconds, seconds from the last line printed to the exit)."""
    env = {**os.environ, "PYTHONPATH": str(repo), "PYTHONUNBUFFERED": "1"}
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "phalanx.cli", *argv],
        cwd=repo,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    last = started
    for _ in process.stdout:
        last = time.perf_counter()
    code = process.wait()
    ended = time.perf_counter()
    if code != 0:
        raise SystemExit(f"{argv[0]} failed with exit code {code}")
    return ended - started, ended - last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", action="append", type=Path, help="a phalanx checkout (repeatable; default: this one)")
    parser.add_argument("--repeats", type=int, default=7)
    opts = parser.parse_args()
    repos = [path.resolve() for path in opts.repo or [REPO]]
    labels = {
        repo: subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        or str(repo)
        for repo in repos
    }  # each checkout's commit
    figures: dict[str, dict[str, list]] = {}
    for repeat in range(opts.repeats):
        order = repos[repeat % len(repos) :] + repos[: repeat % len(repos)]
        for repo in order:
            with tempfile.TemporaryDirectory() as tmp:
                for name, argv in commands(Path(tmp)).items():
                    wall, tail = timed(argv, repo)
                    key = f"{labels[repo]}|{name}"
                    figures.setdefault(key, {"wall": [], "tail": []})
                    figures[key]["wall"].append(wall)
                    figures[key]["tail"].append(tail)
                    print(
                        f"[{repeat + 1}/{opts.repeats}] {labels[repo]} {name}: {wall:.2f} s, {tail:.2f} s after the last line",
                        flush=True,
                    )
    lines = [
        f"{time.strftime('%Y-%m-%d')}, {platform.machine()}, {os.cpu_count()} cores, "
        f"{platform.python_version()}; {opts.repeats} interleaved repeats, medians (ranges)",
        "",
        "| checkout (commit) | command | wall (s) | last line to exit (s) |",
        "| --- | --- | --- | --- |",
    ]
    for key, values in figures.items():
        repo, name = key.split("|")
        wall, tail = values["wall"], values["tail"]
        lines.append(
            f"| {repo} | {name} | {statistics.median(wall):.2f} ({min(wall):.2f}-{max(wall):.2f}) | "
            f"{statistics.median(tail):.2f} ({min(tail):.2f}-{max(tail):.2f}) |"
        )
    write_results("exit_latency", figures, lines)


if __name__ == "__main__":
    main()

"""When the first optimizer step ends: phalanx against the hand-written loop, alone (~6 min on 2 cores).

    .venv/bin/python benchmarks/first_step.py                 # 7 interleaved repeats, smallcnn
    .venv/bin/python benchmarks/first_step.py --profile       # and where phalanx's extra time goes

The same contenders, data and clock as benchmarks/run.py (seconds from process start to the end of
the first optimizer step; phalanx's from its `first_step` record), 1 process and 2 DDP workers, the
order rotating each repeat. Each repeat gives one difference (phalanx minus the hand-written loop run
next to it). ``--profile`` adds one `python -X importtime` run of each single-process contender:
the modules phalanx imports beyond the hand-written loop's (in the whole run), with their own
import time.
Results: benchmarks/results/first_step.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import write_results
from run import HERE, REPO, contenders, run_measured, summarise

PAIRS = {
    "1 process": ("hand-written, 1 process", "phalanx train"),
    "2 DDP workers": ("hand-written DDP, 2 workers", "phalanx trainlaunch, 2 workers"),
}


def import_times(argv: list[str], env: dict[str, str]) -> dict[str, float]:
    """Each module's own import time (ms) in one run of ``argv``."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            **os.environ,
            **env,
            "BENCH_RESULT": str(Path(tmp) / "r.json"),
            "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO)]),
        }
        done = subprocess.run(
            [argv[0], "-X", "importtime", *argv[1:]], cwd=tmp, env=env, capture_output=True, text=True, check=True
        )
    own = {}
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "self [us]" not in line:
            self_us, _, name = line[len("import time:") :].split("|")
            own[name.strip()] = int(self_us) / 1000
    return own


def extra_imports(runs: dict) -> list[tuple[str, float]]:
    """What phalanx imports that the hand-written loop does not, grouped by top-level package."""
    hand, ours = (import_times(*runs[name]) for name in PAIRS["1 process"])
    groups: dict[str, float] = {}
    for name, ms in ours.items():
        if name not in hand:
            top = name if name.startswith("phalanx") else name.split(".")[0]
            groups[top] = groups.get(top, 0.0) + ms
    return sorted(groups.items(), key=lambda item: -item[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--profile", action="store_true")
    opts = parser.parse_args()
    runs = contenders("smallcnn", None)
    names = [name for pair in PAIRS.values() for name in pair]
    raw: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(opts.repeats):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:  # the order rotates: no contender always goes first
            raw[name].append(run_measured(*runs[name])["first_step_s"])
            print(f"[{rep + 1}/{opts.repeats}] {name}: first step {raw[name][-1]:.2f} s", flush=True)
    results = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "first_step_s": {n: summarise(v) for n, v in raw.items()},
        "difference_s": {
            label: summarise([b - a for a, b in zip(raw[hand], raw[ours])]) for label, (hand, ours) in PAIRS.items()
        },
        "raw": raw,
    }
    if opts.profile:
        results["extra_imports_ms"] = extra_imports(runs)
    lines = [
        f"{results['date']}, {results['machine']}; smallcnn, benchmarks/run.py's settings, "
        f"{opts.repeats} interleaved repeats",
        "",
        "| world | hand-written (s) | phalanx (s) | phalanx - hand, per repeat (s) |",
        "| --- | --- | --- | --- |",
    ]
    cell = lambda s: f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"  # noqa: E731
    for label, (hand, ours) in PAIRS.items():
        lines.append(
            f"| {label} | {cell(results['first_step_s'][hand])} | {cell(results['first_step_s'][ours])} | "
            f"{cell(results['difference_s'][label])} |"
        )
    if opts.profile:
        total = sum(ms for _, ms in results["extra_imports_ms"])
        lines += [
            "",
            f"Imported by phalanx train, not by the hand-written loop, over the whole run (own import "
            f"time, one run): {total:.0f} ms, of which:",
            "",
        ]
        lines += [f"- {name}: {ms:.1f} ms" for name, ms in results["extra_imports_ms"][:12]]
    write_results("first_step", results, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())

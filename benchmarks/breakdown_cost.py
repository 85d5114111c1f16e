"""What the step-time breakdown costs: phalanx with it (as shipped) and without it (its clock reads,
collective timers and gradient hooks replaced by nothing, benchmarks/breakdown_off/sitecustomize.py).

    .venv/bin/python benchmarks/breakdown_cost.py --repeats 7      # about 10 minutes on 2 cores

The same runs as benchmarks/run.py's phalanx contenders (synthetic 32 px, SGD, fresh processes):
smallcnn in one process and in 2 DDP workers (its steps are the shortest: what a fixed cost per step
weighs most in), resnet18 in one process. On and off alternate within each repeat, the order
swapping every repeat; the ratio off/on is taken within a repeat. Results:
benchmarks/results/breakdown_cost.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from run import contenders, run_measured  # noqa: E402

CASES = (("smallcnn", "phalanx train"), ("smallcnn", "phalanx trainlaunch, 2 workers"), ("resnet18", "phalanx train"))
OFF = {"BENCH_PYTHONPATH": str(HERE / "breakdown_off")}


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    opts = parser.parse_args()
    # The "off" patch must have applied (a failing sitecustomize is only a warning on stderr).
    probe = subprocess.run(
        [sys.executable, "-c", "from phalanx.train.step_times import StepTimes; print(StepTimes.lap.__name__)"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([OFF["BENCH_PYTHONPATH"], str(HERE.parent)])},
    )
    if probe.stdout.strip() != "<lambda>":
        sys.exit(f"breakdown_cost.py: the off patch did not apply: {probe.stderr.strip()[-500:]}")
    raw: dict[str, dict[str, list[float]]] = {f"{m}, {c}": {"on": [], "off": []} for m, c in CASES}
    for rep in range(opts.repeats):
        for model, case in CASES:
            argv, env = contenders(model, None)[case]
            order = ("on", "off") if rep % 2 == 0 else ("off", "on")
            for variant in order:
                rate = run_measured(argv, {**env, **(OFF if variant == "off" else {})})["samples_per_s"]
                raw[f"{model}, {case}"][variant].append(rate)
                print(
                    f"[{rep + 1}/{opts.repeats}] {model}, {case}, breakdown {variant}: {rate:.0f} samples/s", flush=True
                )
    lines = [
        f"{time.strftime('%Y-%m-%d')}, {opts.repeats} repeats, samples/s median (min-max)",
        "",
        "| run | breakdown on | breakdown off | off / on, per repeat |",
        "| --- | --- | --- | --- |",
    ]
    results = {"raw": raw, "ratios": {}}
    for name, runs in raw.items():
        on, off = summary(runs["on"]), summary(runs["off"])
        ratio = summary([b / a for a, b in zip(runs["on"], runs["off"])])
        results["ratios"][name] = ratio
        lines.append(
            f"| {name} | {on['median']:.0f} ({on['min']:.0f}-{on['max']:.0f}) | {off['median']:.0f} "
            f"({off['min']:.0f}-{off['max']:.0f}) | {ratio['median']:.3f} ({ratio['min']:.3f}-{ratio['max']:.3f}) |"
        )
    out = HERE / "results"
    (out / "breakdown_cost.json").write_text(json.dumps(results, indent=1))
    (out / "breakdown_cost.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

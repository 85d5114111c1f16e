"""How far float32 DDP lands from one process, and from honest regroupings of the same batches
(run by hand; about 17 minutes on 2 cores).

    .venv/bin/python benchmarks/float32_rounding.py

For each per-worker batch B, momentum and schedule: one epoch of the built-in digits (smallcnn,
LR 0.1) as 2 DDP workers x B, one process x 2B, one process x B with 2 accumulated micro-batches,
and one process x 2B with another thread count. The last two change only the order in which the
batch's gradient is summed, as DDP does. Each row is repeated with ATen's CPU kernels forced to
another instruction set (``ATEN_CPU_CAPABILITY``), which changes vector widths and blocking as
another CPU would. Also the short run the tests use (a 10% training split, 11 steps).
Results: benchmarks/results/float32.{json,md}.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PYTHON = sys.executable
CAPABILITIES = ("avx512", "avx2", "default")
SETTINGS = [(0, "constant"), (0, "cosine"), (0.9, "constant"), (0.9, "cosine")]


def phalanx(args: list[str], env: dict[str, str]) -> None:
    subprocess.run([PYTHON, "-m", "phalanx.cli", *args], env=env, check=True, capture_output=True)


def differences(
    workdir: Path, batch: int, momentum: float, schedule: str, capability: str, extra: list[str]
) -> dict[str, float]:
    import torch

    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "ATEN_CPU_CAPABILITY": capability,
        "PHALANX_CACHE": str(workdir / "cache"),
    }
    run = workdir / f"{capability}-{batch}-{momentum}-{schedule}-{len(extra)}"
    common = [
        "--epochs",
        "1",
        "--momentum",
        str(momentum),
        "--lr-schedule",
        schedule,
        "--checkpoints-dir",
        str(run),
        "--no-progress",
        *extra,
    ]
    phalanx(
        ["trainlaunch", "--name", "ddp", "--batch-size", str(batch), *common, "--use-torchrun", "--nproc-per-node=2"],
        env,
    )
    phalanx(["train", "--name", "single", "--batch-size", str(2 * batch), *common], env)
    phalanx(["train", "--name", "accum", "--batch-size", str(batch), "--grad-accum", "2", *common], env)
    phalanx(["train", "--name", "threads", "--batch-size", str(2 * batch), *common], {**env, "OMP_NUM_THREADS": "1"})

    def weights(name: str) -> dict:
        return torch.load(run / name / "latest.pt", weights_only=True)["model"]

    single = weights("single")
    return {
        name: max((weights(name)[k].double() - single[k].double()).abs().max().item() for k in single)
        for name in ("ddp", "accum", "threads")
    }


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def main() -> int:
    rows = []
    with tempfile.TemporaryDirectory(prefix="phalanx-f32-") as tmp:
        for capability in CAPABILITIES:
            for label, batches, extra in (
                ("one epoch", (8, 16, 32), []),
                ("11 steps (the test)", (8,), ["--val-fraction", "0.9"]),
            ):
                for batch in batches:
                    for momentum, schedule in SETTINGS:
                        found = differences(Path(tmp), batch, momentum, schedule, capability, extra)
                        rows.append(
                            {
                                "kernels": capability,
                                "run": label,
                                "batch": batch,
                                "momentum": momentum,
                                "schedule": schedule,
                                **found,
                            }
                        )
                        print(json.dumps(rows[-1]), flush=True)
    results = HERE / "results"
    results.mkdir(exist_ok=True)
    meta = {"cpu": cpu_name(), "cores": os.cpu_count(), "python": platform.python_version()}
    (results / "float32.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    lines = [
        f"{meta['cpu']}, {meta['cores']} cores, Python {meta['python']}",
        "",
        "| kernels | run | B | momentum | schedule | DDP 2xB vs 1x2B | B x2 accumulated vs 2B | 2B, 1 thread vs 2B |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {r['kernels']} | {r['run']} | {r['batch']} | {r['momentum']} | {r['schedule']} | {r['ddp']:.2g} | "
        f"{r['accum']:.2g} | {r['threads']:.2g} |"
        for r in rows
    ]
    (results / "float32.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

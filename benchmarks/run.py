"""phalanx side by side with a hand-written PyTorch loop and with PyTorch Lightning.

    .venv/bin/python benchmarks/run.py              # after scripts/setup.sh; ~40 min on 2 cores
    .venv/bin/python benchmarks/run.py --repeats 7 --models smallcnn

Every contender trains the same model on the same in-memory synthetic 32x32 RGB data with the same
per-process batch, optimizer (SGD, momentum 0.9) and number of steps, as a fresh process. Runs are
interleaved (A B C ... A B C ...) and repeated; the report gives medians and min-max, because these
machines are noisy. Lightning is installed into benchmarks/.venv-lightning (sharing this torch
build), never into phalanx's environment. Results: benchmarks/results/latest.{json,md}.

Each contender is compared with the hand-written loop of the same repeat (the runs next to each
other in time), so a repeat gives one ratio; the report gives the ratios' median and min-max, and
calls a lead or a lag only when every repeat agrees: otherwise it is parity. The speed options
(--channels-last, --compile) run against the hand-written loop with the same option.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import pty
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import venv
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PYTHON = sys.executable
LIGHTNING_VENV = HERE / ".venv-lightning"
SETTINGS = {  # model: (per-process batch, steps, warm-up steps); warm-up is a multiple of --log-every
    "smallcnn": (64, 120, 20),
    "resnet18": (32, 80, 20),
}
VAL_FRACTION = 0.02


def lightning_python() -> str:
    """A separate venv with Lightning; torch comes from phalanx's venv through a .pth file, so
    both run the very same torch build and pip does not download a second one."""
    python = LIGHTNING_VENV / "bin" / "python"
    if not python.exists():
        venv.create(LIGHTNING_VENV, with_pip=True)
        site = subprocess.check_output(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
        ours = subprocess.check_output(
            [PYTHON, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
        Path(site, "phalanx-torch.pth").write_text(ours + "\n")
        env = {**os.environ, "PIP_CONSTRAINT": str(REPO / "constraints.txt")}
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "lightning"], check=True, env=env)
    return str(python)


def synthetic_samples(train: int) -> int:
    """--synthetic-samples that leaves exactly ``train`` training samples after the hold-out."""
    total = train
    while total - max(1, round(total * VAL_FRACTION)) != train:
        total += 1
    return total


def run_measured(argv: list[str], env: dict[str, str], stderr=None) -> dict:
    """Run one contender as a fresh process: wall time, peak RSS (largest process), its report."""
    with tempfile.TemporaryDirectory() as tmp:
        result_file = Path(tmp) / "result.json"
        # BENCH_PYTHONPATH: a folder put first on the contender's path (breakdown_cost.py's "off" patch).
        first = [env["BENCH_PYTHONPATH"]] if env.get("BENCH_PYTHONPATH") else []
        env = {
            **os.environ,
            **env,
            "BENCH_RESULT": str(result_file),
            "PYTHONPATH": os.pathsep.join([*first, str(HERE), str(REPO)]),
        }
        started_wall, started = time.time(), time.perf_counter()
        proc = subprocess.Popen(
            argv, cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=stderr if stderr is not None else subprocess.PIPE
        )
        errors: list[bytes] = []
        drain = threading.Thread(target=lambda: proc.stderr and errors.append(proc.stderr.read()), daemon=True)
        drain.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        drain.join(timeout=5)
        if proc.returncode != 0:
            tail = b"".join(errors).decode(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"{' '.join(argv[:5])} ... exited {proc.returncode}: {tail}")
        if result_file.exists():
            report = json.loads(result_file.read_text())
        else:  # phalanx: read what it logged
            report = phalanx_report(Path(tmp) / "ck" / "bench" / "metrics.jsonl", env["BENCH_WARMUP"])
        return {
            "wall_s": wall,
            "rss_mb": usage.ru_maxrss / 1024,
            "samples_per_s": report["samples"] / report["seconds"],
            "first_step_s": report["first_step_time"] - started_wall,
        }


def phalanx_report(metrics: Path, warmup: str) -> dict:
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    steady = [r for r in records if r["kind"] == "train" and r["step"] > int(warmup)]
    first = next(r for r in records if r["kind"] == "first_step")
    return {
        "samples": sum(r["samples"] for r in steady),
        "seconds": sum(r["seconds"] for r in steady),
        "first_step_time": first["time"],
    }


def contenders(model: str, lightning: str | None) -> dict[str, tuple[list[str], dict[str, str]]]:
    batch, steps, warmup = SETTINGS[model]
    args = [model, str(batch), str(steps), str(warmup)]

    def phalanx(command: str, world: int, *extra: str) -> list[str]:
        argv = [
            PYTHON,
            "-m",
            "phalanx.cli",
            command,
            "--dataset",
            "synthetic",
            "--model",
            model,
            "--synthetic-samples",
            str(synthetic_samples(steps * batch * world)),
            "--val-fraction",
            str(VAL_FRACTION),
            "--batch-size",
            str(batch),
            "--epochs",
            "1",
            "--lr",
            "0.01",
            "--lr-schedule",
            "constant",
            "--checkpoints-dir",
            "ck",
            "--name",
            "bench",
            "--log-every",
            "10",
            "--no-progress",
            *extra,
        ]
        return argv + (["--use-torchrun", f"--nproc_per_node {world}"] if command == "trainlaunch" else [])

    env = {"BENCH_WARMUP": str(warmup)}
    runs = {
        "hand-written, 1 process": ([PYTHON, str(HERE / "handwritten.py"), *args], env),
        "phalanx train": (phalanx("train", 1), env),
        "hand-written, 1 process, channels-last": (
            [PYTHON, str(HERE / "handwritten.py"), *args],
            {**env, "BENCH_CHANNELS_LAST": "1"},
        ),
        "phalanx train --channels-last": (phalanx("train", 1, "--channels-last"), env),
        "hand-written, 1 process, compile": (
            [PYTHON, str(HERE / "handwritten.py"), *args],
            {**env, "BENCH_COMPILE": "1"},
        ),
        "phalanx train --compile": (phalanx("train", 1, "--compile"), env),
        "hand-written DDP, 2 workers": (
            [PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(HERE / "handwritten.py"), *args],
            env,
        ),
        "phalanx trainlaunch, 2 workers": (phalanx("trainlaunch", 2), env),
    }
    if lightning:
        runs["Lightning, 1 device"] = ([lightning, str(HERE / "lightning_bench.py"), *args, "1"], env)
        runs["Lightning DDP, 2 devices"] = ([lightning, str(HERE / "lightning_bench.py"), *args, "2"], env)
    return runs


def run_with_tty_stderr(argv: list[str], env: dict[str, str]) -> dict:
    """The progress bar draws only on a terminal: give the process one."""
    master, slave = pty.openpty()
    reader = threading.Thread(target=lambda: _drain_fd(master), daemon=True)
    reader.start()
    try:
        return run_measured(argv, env, stderr=slave)
    finally:
        os.close(slave)


def _drain_fd(fd: int) -> None:
    try:
        while os.read(fd, 65536):
            pass
    except OSError:
        pass


def help_startup(repeats: int = 15) -> list[float]:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run([str(Path(PYTHON).parent / "phalanx"), "--help"], check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - started)
    return times


def summarise(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--models", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--no-lightning", action="store_true")
    opts = parser.parse_args()
    lightning = None if opts.no_lightning else lightning_python()
    raw: dict[str, dict[str, list[dict]]] = {}
    for model in opts.models:
        runs = contenders(model, lightning)
        raw[model] = {name: [] for name in runs}
        for rep in range(opts.repeats):  # interleaved: A B C ... then again
            for name, (argv, env) in runs.items():
                raw[model][name].append(run_measured(argv, env))
                print(
                    f"[{model} {rep + 1}/{opts.repeats}] {name}: {raw[model][name][-1]['samples_per_s']:.0f} samples/s",
                    flush=True,
                )
    # The cost of phalanx's extras, side by side in one run: progress bar and snapshot writing.
    extras: dict[str, list[dict]] = {
        k: [] for k in ("bar off", "bar on (tty)", "snapshots at epoch end only", "snapshot every 10 steps")
    }
    argv, env = contenders("smallcnn", None)["phalanx train"]
    for _ in range(opts.repeats):
        extras["bar off"].append(run_with_tty_stderr(argv, env))
        extras["bar on (tty)"].append(
            run_with_tty_stderr([a if a != "--no-progress" else "--progress" for a in argv], env)
        )
        extras["snapshots at epoch end only"].append(run_measured(argv + ["--snapshot-every", "1e9"], env))
        extras["snapshot every 10 steps"].append(run_measured(argv + ["--snapshot-every", "0"], env))
    results = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "versions": versions(lightning),
        "settings": SETTINGS,
        "runs": {
            m: {n: {k: summarise([r[k] for r in rs]) for k in rs[0]} for n, rs in c.items()} for m, c in raw.items()
        },
        "ratios": {m: {n: summarise(ratios(c, n)) for n in c} for m, c in raw.items()},
        "extras": {n: {k: summarise([r[k] for r in rs]) for k in rs[0]} for n, rs in extras.items()},
        "help_startup_s": summarise(help_startup()),
    }
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / "latest.json").write_text(json.dumps(results, indent=2))
    (out / "latest.md").write_text(markdown(results))
    print(markdown(results))
    return 0


def baseline(name: str) -> str:
    """The hand-written contender a run is compared with: same world size, same speed option."""
    option = ", channels-last" if "channels-last" in name else ", compile" if "compile" in name else ""
    if "2 workers" in name or "2 devices" in name:
        return "hand-written DDP, 2 workers"
    return f"hand-written, 1 process{option}"


def ratios(runs: dict[str, list[dict]], name: str) -> list[float]:
    """This contender's samples/s over its baseline's, repeat by repeat (interleaved runs)."""
    base = runs[baseline(name)]
    return [r["samples_per_s"] / b["samples_per_s"] for r, b in zip(runs[name], base)]


def verdict(stat: dict) -> str:
    if stat["min"] > 1.0:
        return "lead"
    if stat["max"] < 1.0:
        return "behind"
    return "parity"


def versions(lightning: str | None) -> dict[str, str]:
    code = "import torch, torchvision; print(torch.__version__, torchvision.__version__)"
    torch_v, tv_v = subprocess.check_output([PYTHON, "-c", code], text=True).split()
    found = {"torch": torch_v, "torchvision": tv_v}
    if lightning:
        found["lightning"] = subprocess.check_output(
            [lightning, "-c", "import lightning; print(lightning.__version__)"], text=True
        ).strip()
    return found


def markdown(results: dict) -> str:
    def cell(stat: dict, fmt: str) -> str:
        return f"{stat['median']:{fmt}} ({stat['min']:{fmt}}-{stat['max']:{fmt}})"

    lines = [
        f"{results['date']}, {results['machine']}, " + ", ".join(f"{k} {v}" for k, v in results["versions"].items()),
        "",
        "| model | contender | samples/s | / hand-written, per repeat | verdict | first step (s) | wall (s) | "
        "peak RSS (MB) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for model, runs in results["runs"].items():
        for name, stats in runs.items():
            ratio = results["ratios"][model][name]
            compared = ("baseline", "") if baseline(name) == name else (cell(ratio, ".3f"), verdict(ratio))
            lines.append(
                f"| {model} | {name} | {cell(stats['samples_per_s'], '.0f')} | {compared[0]} | {compared[1]} | "
                f"{cell(stats['first_step_s'], '.2f')} | {cell(stats['wall_s'], '.1f')} | "
                f"{cell(stats['rss_mb'], '.0f')} |"
            )
    lines += ["", "| phalanx train, smallcnn | samples/s | wall (s) |", "| --- | --- | --- |"]
    for name, stats in results["extras"].items():
        lines.append(f"| {name} | {cell(stats['samples_per_s'], '.0f')} | {cell(stats['wall_s'], '.1f')} |")
    help_s = results["help_startup_s"]
    lines += [
        "",
        f"`phalanx --help`: {help_s['median'] * 1000:.0f} ms median ({help_s['min'] * 1000:.0f}-"
        f"{help_s['max'] * 1000:.0f} ms, {help_s['n']} runs)",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())

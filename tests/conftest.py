"""Shared helpers: run the real CLI in this process or as a real subprocess, and make data."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# tests/support holds model factories the tests hand to phalanx as --model phalanx_testmodels:NAME,
# in subprocesses (USER_MODELS) and in this process.
USER_MODELS = {"PYTHONPATH": os.pathsep.join([str(REPO / "tests" / "support"), str(REPO)])}
sys.path.insert(0, str(REPO / "tests" / "support"))
sys.path.insert(0, str(REPO / "examples" / "tasks"))  # the worked example of your own task


@pytest.fixture(scope="session", autouse=True)
def phalanx_cache(tmp_path_factory):
    """Folder manifests go to a cache of the test session's own, not the user's ~/.cache."""
    folder = tmp_path_factory.mktemp("phalanx-cache")
    os.environ["PHALANX_CACHE"] = str(folder)
    yield folder


@pytest.fixture(autouse=True)
def working_directory(tmp_path_factory, monkeypatch):
    """Each test runs in an empty directory of its own: a test that leaves out --checkpoints-dir (or
    any output path) writes there, never into the checkout where a user's own runs live (the README's
    main job writes checkpoints/experiment there before the suite runs)."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


def _checkout_files() -> set[str]:
    return {str(p.relative_to(REPO)) for top in ("checkpoints", "runs") for p in (REPO / top).rglob("*")} | {
        p.name for p in REPO.iterdir()
    }


@pytest.fixture(scope="session", autouse=True)
def checkout_left_as_found():
    """The suite writes nothing into the checkout (it once trained into the main job's run directory)."""
    before = _checkout_files()
    yield
    added = sorted(_checkout_files() - before - {".pytest_cache"})
    assert not added, f"the test suite wrote into the checkout: {added[:10]}"


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def phalanx(capsys):
    """Call ``phalanx ARGS`` in this process (fast: torch is imported once per test session)."""
    from phalanx.cli import main

    def call(*args: str) -> Result:
        capsys.readouterr()
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return call


def run_phalanx(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 300) -> Result:
    """Run ``python -m phalanx.cli ARGS`` as a real process."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "phalanx.cli", *map(str, args)],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def start_phalanx(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.Popen:
    """Start ``python -m phalanx.cli ARGS`` in the background (text pipes for its output)."""
    return subprocess.Popen(
        [sys.executable, "-m", "phalanx.cli", *map(str, args)],
        cwd=cwd,
        text=True,
        env={**os.environ, **USER_MODELS, "PYTHONUNBUFFERED": "1", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def processes_with(marker: str) -> list[int]:
    """PIDs whose command line mentions marker (a unique run name is in every worker's argv)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def records(run_dir: Path, kind: str) -> list[dict]:
    from phalanx.checkpoint.rundir import read_metrics

    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == kind]


def snapshot_tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under root with its size and mtime: 'nothing written' means this is unchanged."""
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def write_digit_pngs(root: Path, per_class: int | None = None, val: bool = False) -> Path:
    """An ImageFolder tree of real PNG files made from the built-in digits (upscaled to 16x16)."""
    from PIL import Image

    from phalanx.data import load_digits

    images, labels = load_digits()
    order = list(range(len(labels)))
    splits = {"train": [i for i in order if i % 5], "val": order[::5]} if val else {"train": order}
    for split, indices in splits.items():
        counts: dict[int, int] = {}
        for i in indices:
            label = int(labels[i])
            if per_class is not None and counts.get(label, 0) >= per_class:
                continue
            counts[label] = counts.get(label, 0) + 1
            folder = root / split / f"digit{label}"
            folder.mkdir(parents=True, exist_ok=True)
            pixels = (images[i, 0] * 255).round().byte().numpy()
            Image.fromarray(pixels, mode="L").resize((16, 16), Image.NEAREST).save(folder / f"{i:04d}.png")
    return root


def gate(folder: Path, step: int) -> dict[str, str]:
    """The environment that pauses a test model at its ``step``-th training forward (per process)
    until ``release(folder)``: tests/support/phalanx_testmodels.py's ``gate``."""
    return {"PHALANX_TEST_GATE": str(folder), "PHALANX_TEST_GATE_STEP": str(step)}


def paused(folder: Path, ranks: int = 1, timeout: float = 180) -> None:
    wait_until(
        lambda: all((folder / f"paused-rank{r}").exists() for r in range(ranks)),
        timeout,
        f"{ranks} process(es) to pause at the gate",
    )


def release(folder: Path) -> None:
    (folder / "go").touch()


def near_ties(checkpoint: Path, margin: float = 1e-4) -> int:
    """How many validation images of a digits checkpoint have their two best logits within ``margin``:
    where two correct computations (other batches, other thread counts) may pick another class."""
    import torch

    from phalanx.inference.model import load_trained

    trained = load_trained(str(checkpoint))
    val = type(trained.task)(trained.config).build_data().val
    with torch.no_grad():
        top = trained.models["model"](torch.stack([image for image, _ in val])).topk(2, dim=1).values
    return int(((top[:, 0] - top[:, 1]) < margin).sum())


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(predicate, timeout: float = 120.0, what: str = "a condition") -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="session")
def visdom_server(tmp_path_factory):
    """A real visdom server on 127.0.0.1 (its page assets installed offline by scripts/setup.sh)."""
    import urllib.request

    from phalanx.visualize.assets import missing_assets

    assert not missing_assets(), "run: python -m phalanx.visualize.assets (scripts/setup.sh does)"
    port = free_port()
    workdir = tmp_path_factory.mktemp("visdom")
    log = open(workdir / "visdom.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "visdom.server", "-port", str(port), "-bind_local", "-env_path", str(workdir / "envs")],
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    def up() -> bool:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1).status == 200
        except OSError:
            return False

    wait_until(up, 60, "the visdom server")
    yield port
    proc.terminate()
    proc.wait(timeout=10)
    log.close()

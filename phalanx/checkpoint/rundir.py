"""The run directory ``<checkpoints-dir>/<name>/``: its guard, saved configuration and metrics log.

Deciding (``plan``) is separate from writing (``create``) so that every check, data and model
included, runs before the first byte is written.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import checkpoint
from ..config import RunConfig, from_mapping
from ..config.fields import flag
from ..errors import PhalanxError, RunFailed
from ..system.atomic import atomic_write_text

CONFIG, METRICS = "config.json", "metrics.jsonl"


@dataclass
class Resume:
    path: Path
    state: dict[str, Any]


def holds_a_run(run_dir: Path) -> bool:
    return (run_dir / CONFIG).exists() or (run_dir / METRICS).exists() or any(run_dir.glob("*.pt"))


def failed_before_a_checkpoint(run_dir: Path) -> bool:
    """A run that stopped (diverged, out of memory, killed) before its first checkpoint: nothing to
    resume and no weights to lose, so a new run replaces it without --overwrite. Never one that is
    still running (its rank 0 holds the directory's lock)."""
    return holds_a_run(run_dir) and not any(run_dir.glob("*.pt")) and not _locked(run_dir)


REPLACED_NOTE = (
    "held a run that stopped before its first checkpoint: a new run replaces it (its config.json "
    "and metrics.jsonl start anew; logs/ keeps its tracebacks)"
)


@contextlib.contextmanager
def claimed(run_dir: Path, claim: bool) -> Iterator[None]:
    """While the run lives, its rank 0 holds a lock on the run directory (flock on the directory
    itself: no file is added); the kernel drops it when the process dies, however it dies."""
    if not claim:
        yield
        return
    fd = os.open(run_dir, os.O_RDONLY)
    try:
        # Not taken: --overwrite of a live run (refused nowhere, as before), or a file system
        # without locks (a run there is unguarded, as before).
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)


def _locked(run_dir: Path) -> bool:
    try:
        fd = os.open(run_dir, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    except OSError:  # a file system without locks: nothing tells a live run, as before locks
        return False
    finally:
        os.close(fd)  # drops the probe's lock


def plan(cfg: RunConfig) -> Resume | None:
    """Check the run directory against the options; return the checkpoint to resume, if any."""
    run_dir = cfg.run_dir
    check_creatable(run_dir, cfg.name)
    if cfg.resume is None:
        if holds_a_run(run_dir) and not cfg.overwrite and not failed_before_a_checkpoint(run_dir):
            if not any(run_dir.glob("*.pt")):  # so it is locked: its run is training
                raise PhalanxError(
                    f"a run is training in {run_dir} (no checkpoint yet); wait for it to end, or choose another --name",
                    "--name",
                )
            raise PhalanxError(
                f"{run_dir} already holds a run; pass --resume auto to continue it, "
                "--overwrite to replace it, or choose another --name",
                "--name",
            )
        return None
    if cfg.resume == "auto":
        found = checkpoint.load_latest_valid(run_dir)
        if found is None and checkpoint.candidates(run_dir):  # never train over a run's history anew
            raise PhalanxError(
                f"none of the {len(checkpoint.candidates(run_dir))} checkpoint(s) in {run_dir} loads "
                "(the warnings above say why); nothing was changed: move them aside to start a new "
                "run, or pass --overwrite",
                "--resume",
            )
        if found is None:  # nothing saved yet: the same command starts the run (preemptible jobs)
            return None
        resume = Resume(*found)
    else:
        resume = Resume(Path(cfg.resume), checkpoint.load(Path(cfg.resume)))
        if not cfg.overwrite:
            _check_not_another_run(run_dir, resume)
    _check_same_run(cfg, resume)
    return resume


def _check_not_another_run(run_dir: Path, resume: Resume) -> None:
    """A checkpoint given by path continues its own run, or starts a new directory from it: never
    over another run (whose history and best.pt would be mixed with this one's)."""
    if not holds_a_run(run_dir) or failed_before_a_checkpoint(run_dir):
        return
    own = checkpoint.load_latest_valid(run_dir)
    if own is not None and own[1].get("run_id") == resume.state.get("run_id"):
        return
    own_dir = resume.path.resolve().parent
    where = (
        f" (its own run: --checkpoints-dir {own_dir.parent} --name {own_dir.name})"
        if (own_dir / "config.json").is_file()
        else ""
    )
    raise PhalanxError(
        f"{run_dir} holds another run than {resume.path}'s; choose another --name to continue "
        f"from it there{where}, or --overwrite to replace that run",
        "--name",
    )


def check_creatable(run_dir: Path, name: str) -> None:
    """The run directory is, or can be made, a writable directory; checked without writing, so bad
    input writes nothing. The nearest existing folder decides: a file on the way, a read-only or
    size-less filesystem (/proc, /sys: root may "write" there, yet nothing can be created)."""
    if "\0" in str(run_dir):  # no file system takes it (Path.exists says False, mkdir raises)
        raise PhalanxError(f"{str(run_dir)!r} holds a NUL byte", "--name" if "\0" in name else "--checkpoints-dir")
    existing = run_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    option = "--name" if existing == run_dir else "--checkpoints-dir"
    if not existing.is_dir():
        raise PhalanxError(f"{existing} is a file, not a directory; choose another {option}", option)
    where = "" if existing == run_dir else f" (in {existing})"
    try:
        fs = os.statvfs(existing)
    except OSError as exc:
        raise PhalanxError(f"cannot use {run_dir}{where}: {exc.strerror}", option) from None
    if fs.f_flag & os.ST_RDONLY or fs.f_blocks == 0 or not os.access(existing, os.W_OK | os.X_OK):
        raise PhalanxError(
            f"cannot write {run_dir}{where}: a read-only or special filesystem, or no "
            "permission; choose a writable --checkpoints-dir",
            option,
        )


def _check_same_run(cfg: RunConfig, resume: Resume) -> None:
    raw = resume.state.get("config", {})
    try:  # an older phalanx's configuration, read as this one reads it (task options included)
        saved = from_mapping(raw, source=str(resume.path)).identity()
    except PhalanxError:
        saved = raw
    for name, value in cfg.identity().items():
        if name == "task_options":
            saved_options = saved.get(name) or {}
            for key, mine in value.items():
                if key in saved_options and saved_options[key] != mine:
                    _differs(resume, key, saved_options[key], mine)
        elif name in saved and saved[name] != value:
            _differs(resume, name, saved[name], value)


def _differs(resume: Resume, name: str, saved: Any, mine: Any) -> None:
    raise PhalanxError(
        f"{resume.path} was trained with {flag(name)} {saved!r}, this run asks for {mine!r}; use "
        "the same value or start a new --name",
        flag(name),
    )


def create(cfg: RunConfig, resume: Resume | None) -> list[Path]:
    """Make the run directory (global rank 0 only); clear a replaced run; save the configuration.
    Returns the folders it made (``remove_refused`` takes them away again)."""
    run_dir = cfg.run_dir
    made = [folder for folder in (run_dir, *run_dir.parents) if not folder.exists()]
    run_dir.mkdir(parents=True, exist_ok=True)
    for stale in run_dir.glob(".*.tmp-*"):  # a writer killed mid-write left its temporary behind
        stale.unlink(missing_ok=True)
    if cfg.overwrite or resume is None and not any(run_dir.glob("*.pt")):  # a replaced run, or one that failed early
        for path in [run_dir / CONFIG, run_dir / METRICS, *run_dir.glob("*.pt")]:
            path.unlink(missing_ok=True)
    # Records past the checkpoint (or all, when a restart found none) would be repeated.
    trim_metrics(run_dir / METRICS, resume.state["epoch"] if resume else 0, resume.state["step"] if resume else 0)
    atomic_write_text(run_dir / CONFIG, cfg.to_json())
    return made


def remove_refused(cfg: RunConfig, made: list[Path]) -> None:
    """A new run refused as bad input once it started (a task's mistake that only its first step
    shows) leaves nothing, as a refusal before the start does: its configuration, metrics log and
    snapshots go, and the folders ``create`` made, where they are left empty (logs/ of an earlier
    run stays). Never once a checkpoint is written."""
    from ..records.snapshots import remove_history

    run_dir = cfg.run_dir
    if any(run_dir.glob("*.pt")):
        return
    remove_history(cfg.snapshot_dir)
    for path in (run_dir / CONFIG, run_dir / METRICS):
        path.unlink(missing_ok=True)
    for folder in made:  # the deepest first
        with contextlib.suppress(OSError):
            folder.rmdir()


def trim_metrics(path: Path, last_epoch: int, last_step: int) -> None:
    """Drop records after the checkpoint, so a resumed run repeats none in its history: train
    records past its step (it may be mid-epoch), others past its completed epochs."""
    if not path.exists():
        return
    kept = [
        r
        for r in read_metrics(path)
        if (r.get("step", 0) <= last_step if r.get("kind") == "train" else r.get("epoch", 0) <= last_epoch)
    ]
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Records of a metrics log; a torn last line (a kill mid-append) is skipped."""
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


class MetricsLog:
    """Machine-readable metrics, one JSON object a line; written by global rank 0 only."""

    def __init__(self, run_dir: Path, enabled: bool):
        self.path = run_dir / METRICS
        self.enabled = enabled

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        try:
            with open(self.path, "a") as fh:
                fh.write(json.dumps(record) + "\n")
        except OSError as exc:  # a torn last line is skipped by readers; the rest stays intact
            raise RunFailed(f"cannot append to {self.path} ({exc.strerror or exc})") from None

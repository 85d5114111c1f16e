"""The run directory ``<checkpoints-dir>/<name>/``: its guard, saved configuration and metrics log.

Deciding (``plan``) is separate from writing (``create``) so that every check, data and model
included, runs before the first byte is written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import checkpoint
from .atomic import atomic_write_text
from .config import RunConfig, from_mapping
from .fields import flag
from .errors import PhalanxError, RunFailed

CONFIG, METRICS = "config.json", "metrics.jsonl"


@dataclass
class Resume:
    path: Path
    state: dict[str, Any]


def holds_a_run(run_dir: Path) -> bool:
    return (run_dir / CONFIG).exists() or (run_dir / METRICS).exists() or any(run_dir.glob("*.pt"))


def plan(cfg: RunConfig) -> Resume | None:
    """Check the run directory against the options; return the checkpoint to resume, if any."""
    run_dir = cfg.run_dir
    if cfg.resume is None:
        if holds_a_run(run_dir) and not cfg.overwrite:
            raise PhalanxError(f"{run_dir} already holds a run; pass --resume auto to continue it, "
                               "--overwrite to replace it, or choose another --name", "--name")
        return None
    if cfg.resume == "auto":
        found = checkpoint.load_latest_valid(run_dir)
        if found is None:  # nothing saved yet: the same command starts the run (preemptible jobs)
            return None
        resume = Resume(*found)
    else:
        resume = Resume(Path(cfg.resume), checkpoint.load(Path(cfg.resume)))
    _check_same_run(cfg, resume)
    return resume


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
    raise PhalanxError(f"{resume.path} was trained with {flag(name)} {saved!r}, this run asks for {mine!r}; use "
                       "the same value or start a new --name", flag(name))


def create(cfg: RunConfig, resume: Resume | None) -> None:
    """Make the run directory (global rank 0 only); clear a replaced run; save the configuration."""
    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    for stale in run_dir.glob(".*.tmp-*"):  # a writer killed mid-write left its temporary behind
        stale.unlink(missing_ok=True)
    if cfg.overwrite:
        for path in [run_dir / CONFIG, run_dir / METRICS, *run_dir.glob("*.pt")]:
            path.unlink(missing_ok=True)
    # Records past the checkpoint (or all, when a restart found none) would be repeated.
    trim_metrics(run_dir / METRICS, resume.state["epoch"] if resume else 0, resume.state["step"] if resume else 0)
    atomic_write_text(run_dir / CONFIG, cfg.to_json())


def trim_metrics(path: Path, last_epoch: int, last_step: int) -> None:
    """Drop records after the checkpoint, so a resumed run repeats none in its history: train
    records past its step (it may be mid-epoch), others past its completed epochs."""
    if not path.exists():
        return
    kept = [r for r in read_metrics(path)
            if (r.get("step", 0) <= last_step if r.get("kind") == "train" else r.get("epoch", 0) <= last_epoch)]
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

"""Checkpoint files: full training state, written atomically, loadable with plain ``torch.load``.

A checkpoint is a dict of tensors and plain Python data (no pickled classes), so
``torch.load(path)`` with its default ``weights_only=True`` opens it outside phalanx too.
The model's state has no DataParallel/DDP ``module.`` prefix: it loads into the bare model.

Format 2 records progress as a global position (``epoch`` completed, ``position`` samples of the
next epoch consumed over all ranks) and holds no random state: every stream is re-derived from
the seed and the position, so the same checkpoint resumes the same way at any world size.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import torch

from .atomic import atomic_write
from .errors import PhalanxError

FORMAT = "phalanx-checkpoint"
VERSION = 2
LATEST, BEST = "latest.pt", "best.pt"


def epoch_name(epoch: int) -> str:
    return f"epoch_{epoch:04d}.pt"


def save(paths: list[Path], state: dict[str, Any]) -> None:
    """Serialise once, then write each path atomically (latest, best, and epoch copies)."""
    buffer = io.BytesIO()
    torch.save({"format": FORMAT, "version": VERSION, **state}, buffer)
    data = buffer.getbuffer()
    for path in paths:
        atomic_write(path, lambda fh: fh.write(data))


def load(path: Path, option: str = "--resume") -> dict[str, Any]:
    """Load and check a checkpoint; a truncated or foreign file is one clear error naming it."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise PhalanxError(f"checkpoint {path} does not exist", option) from None
    except Exception as exc:  # truncated zip, garbage bytes, a pickle with classes in it
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PhalanxError(f"checkpoint {path} is unreadable or corrupt ({first[:160]})", option) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise PhalanxError(f"{path} is not a phalanx checkpoint", option)
    if state.get("version", 0) > VERSION:
        raise PhalanxError(f"{path} was written by a newer phalanx (format {state['version']})", option)
    return _upgrade(path, state)


def _upgrade(path: Path, state: dict[str, Any]) -> dict[str, Any]:
    """Format 1 (phalanx 0.1) counted batches per rank in a sample order of its own: a mid-epoch
    checkpoint cannot continue that order, so its epoch starts over (said in a warning)."""
    if state.get("version", 1) >= 2:
        return state
    if state.get("resume_batch"):
        print(f"phalanx: warning: {path} was saved mid-epoch by phalanx 0.1; epoch {state['epoch'] + 1} "
              "starts over", file=sys.stderr, flush=True)
    return {**state, "position": 0, "epoch_sums": [0.0, 0.0], "version": VERSION}


def candidates(run_dir: Path) -> list[Path]:
    """Checkpoints in a run directory, newest first: latest.pt, then epoch_NNNN.pt descending."""
    found = [run_dir / LATEST] if (run_dir / LATEST).is_file() else []
    return found + sorted(run_dir.glob("epoch_*.pt"), reverse=True)


def load_latest_valid(run_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads; a corrupt one is skipped with a warning, not fatal."""
    for path in candidates(run_dir):
        try:
            return path, load(path)
        except PhalanxError as exc:
            print(f"phalanx: warning: skipping {exc.message}", file=sys.stderr, flush=True)
    return None

"""Checkpoint files: full training state, written atomically, loadable with plain ``torch.load``.

A checkpoint is a dict of tensors and plain Python data (no pickled classes), so
``torch.load(path)`` with its default ``weights_only=True`` opens it outside phalanx too.
The model's state has no DataParallel/DDP ``module.`` prefix: it loads into the bare model.
"""

from __future__ import annotations

import io
import random
import sys
from pathlib import Path
from typing import Any

import torch

from .atomic import atomic_write
from .errors import PhalanxError

FORMAT = "phalanx-checkpoint"
VERSION = 1
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
    return state


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


def capture_rng() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])

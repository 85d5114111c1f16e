"""The checkpoint package: the files (this module: the format, saving, loading), the background
writer (``writer``), sharded checkpoints (``sharded``) and run directories (``rundir``). May import
distributed, data, records, the configuration and the base modules.

Checkpoint files: full training state, written atomically, loadable with plain ``torch.load``.

A checkpoint is a dict of tensors and plain Python data (no pickled classes), so
``torch.load(path)`` with its default ``weights_only=True`` opens it outside phalanx too.
The model's state has no DataParallel/DDP ``module.`` prefix: it loads into the bare model.

Format 2 records progress as a global position (``epoch`` completed, ``position`` samples of the
next epoch consumed over all ranks) and holds no random state: every stream is re-derived from
the seed and the position, so the same checkpoint resumes the same way at any world size.

Format 3 holds any task: its name (``task``), each network (``models``), each optimizer and grad
scaler by name, the moving averages by network, the task's own state (``task_state``) and the best
validation metric so far (``best``); ``model`` is the task's primary network, as before. Formats 1
and 2 (classification only) load as format 3.

Format 4 adds sharded checkpoints (``sharded``): the networks and optimizer states in a
directory of shards the file names under ``sharded`` (relative to the file's folder), the primary
network's name under ``primary``. A whole checkpoint is format 3's.
"""

from __future__ import annotations

import collections
import io
import sys
from pathlib import Path
from typing import Any

import torch

from ..config.registry import DEFAULT as FORMAT_2_TASK  # formats 1 and 2 named no task: they held the default one
from ..errors import PhalanxError, RunFailed
from ..system.atomic import atomic_write

FORMAT = "phalanx-checkpoint"
VERSION = 4  # the newest this phalanx reads
WHOLE_VERSION = 3  # a checkpoint that holds its networks: older phalanx versions read it too
LATEST, BEST = "latest.pt", "best.pt"


def epoch_name(epoch: int) -> str:
    return f"epoch_{epoch:04d}.pt"


# What torch.load(weights_only=True) reads back besides tensors and containers: anything else in a
# checkpoint (a numpy scalar, a Path) would make every checkpoint of the run unloadable.
PLAIN = (str, int, float, bool, type(None), torch.dtype, torch.device, torch.Size)


def check_loadable(value: Any, where: str = "checkpoint", error: type[PhalanxError] = RunFailed) -> None:
    """Refuse a value that phalanx could not load back from a checkpoint, naming its key and type
    (``error``: bad input before the run starts, a failure at a save)."""
    if isinstance(value, torch.Tensor) or type(value) in PLAIN:  # exact types: numpy.float64 is a float
        return
    if isinstance(value, dict):
        for key, item in value.items():
            check_loadable(key, f"{where}, a key,", error)
            check_loadable(item, f"{where}[{key!r}]", error)
        return
    if type(value) in (list, tuple, set):
        for index, item in enumerate(value):
            check_loadable(item, f"{where}[{index}]", error)
        return
    kind = f"{type(value).__module__}.{type(value).__qualname__}".removeprefix("builtins.")
    raise error(
        f"{where} is a {kind} ({str(value)[:40]}); a checkpoint holds tensors and plain Python data "
        "(str, int, float, bool, None, lists, dicts) only, as torch.load(weights_only=True) reads them "
        "back: convert it (float(x), str(path), x.tolist())"
    )


SOURCES = {"data": "TaskData.info", "task_state": "the task's state_dict()"}  # where a user's values come from


def save(paths: list[Path], state: dict[str, Any]) -> None:
    """Serialise once, then write each path atomically (latest, best, and epoch copies)."""
    write(paths, serialise(state))


def serialise(state: dict[str, Any]) -> memoryview:
    """A checkpoint's bytes: a copy of the state as it is now (training may go on changing it)."""
    for key, item in state.items():
        check_loadable(item, SOURCES.get(key, f"checkpoint[{key!r}]"))
    buffer = io.BytesIO()
    # Tensors are written from the CPU: a checkpoint of a CUDA run then opens with plain
    # torch.load on a machine without a GPU (CUDA tensors would need map_location there).
    version = VERSION if state.get("sharded") else WHOLE_VERSION
    torch.save(_on_cpu({"format": FORMAT, "version": version, **state}), buffer)
    return buffer.getbuffer()


def write(paths: list[Path], data: memoryview) -> None:
    for path in paths:
        atomic_write(path, lambda fh: fh.write(data))


def _on_cpu(value: Any, copies: dict[int, torch.Tensor] | None = None) -> Any:
    """The same structure with every tensor on the CPU. CPU tensors are not copied, and a CUDA
    tensor held twice (``model`` is also in ``models``) is copied once, so it is stored once."""
    copies = {} if copies is None else copies
    if isinstance(value, torch.Tensor):
        if value.device.type == "cpu":
            return value
        if id(value) not in copies:
            copies[id(value)] = value.cpu()
        return copies[id(value)]
    if isinstance(value, dict):
        moved = {key: _on_cpu(item, copies) for key, item in value.items()}
        if type(value) is not dict:  # a module's state dict: an OrderedDict with _metadata (versions)
            moved = collections.OrderedDict(moved)
            if hasattr(value, "_metadata"):
                moved._metadata = value._metadata  # type: ignore[attr-defined]  # torch's; OrderedDict's types lack it
        return moved
    if type(value) in (list, tuple):
        return type(value)(_on_cpu(item, copies) for item in value)
    return value


def load(path: Path, option: str = "--resume") -> dict[str, Any]:
    """Load and check a checkpoint; a truncated or foreign file is one clear error naming it."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise PhalanxError(f"checkpoint {path} does not exist", option) from None
    except IsADirectoryError:
        raise PhalanxError(f"{path} is a directory, not a checkpoint file", option) from None
    except Exception as exc:  # truncated zip, garbage bytes, a pickle with classes in it
        raise PhalanxError(f"checkpoint {path} is unreadable: {unloadable(path, exc)}", option) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise PhalanxError(f"{path} is not a phalanx checkpoint", option)
    if state.get("version", 0) > VERSION:
        raise PhalanxError(f"{path} was written by a newer phalanx (format {state['version']})", option)
    if state.get("sharded"):
        shards = path.parent / state["sharded"]
        if not (shards / ".metadata").is_file():
            raise PhalanxError(
                f"checkpoint {path} names shards {shards} that are not there (a sharded checkpoint is "
                "the file and that directory: copy both)",
                option,
            )
        return {**state, "sharded": str(shards)}
    return _upgrade(path, state)


def unloadable(path: Path, exc: Exception) -> str:
    """What a file that torch.load refused is, in words (not torch's error number)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(512)
    except OSError as err:
        return f"cannot be read ({err.strerror})"
    message, lowered = str(exc), str(exc).lower()
    if not head:
        return "the file is empty"
    # "Unsupported operand": a byte no pickle has (text, JSON): not a pickle at all
    if "unsupported operand" not in lowered and ("weights_only" in lowered or "unsupported global" in lowered):
        return (
            "it holds Python objects other than tensors and plain data (another program's pickle); phalanx "
            "loads checkpoints with weights_only=True and runs nothing in them"
        )
    if head.startswith(b"PK\x03\x04"):
        if "central directory" in message:
            return "the file is truncated (a torch zip archive without its end: the write was cut short)"
        return f"a zip archive that is not a torch file ({cause(message)})"
    if head[:1] == b"\x80":
        return "a Python pickle, not a torch checkpoint"
    if all(32 <= b < 127 or b in (9, 10, 13) for b in head):
        return f"a {'JSON' if head.lstrip()[:1] in (b'{', b'[') else 'text'} file, not a torch checkpoint"
    return "not a torch checkpoint (neither a torch zip archive nor a pickle)"


def cause(message: str) -> str:
    first = (message.strip().splitlines() or ["unknown error"])[0]
    return first[:160]


def _upgrade(path: Path, state: dict[str, Any]) -> dict[str, Any]:
    """Older formats as format 3. Format 1 (phalanx 0.1) counted batches per rank in a sample order
    of its own: a mid-epoch checkpoint cannot continue that order, so its epoch starts over (said in
    a warning). Formats 1 and 2 hold one classifier, its optimizer and scaler."""
    version = state.get("version", 1)
    if version >= 3:
        return state
    if version < 2:
        if state.get("resume_batch"):
            print(
                f"phalanx: warning: {path} was saved mid-epoch by phalanx 0.1; epoch {state['epoch'] + 1} starts over",
                file=sys.stderr,
                flush=True,
            )
        state = {**state, "position": 0, "epoch_sums": [0.0, 0.0]}
    loss_sum, samples = state.get("epoch_sums") or [0.0, 0.0]
    best = state.get("best_val_acc")
    return {
        **state,
        "version": WHOLE_VERSION,
        "task": FORMAT_2_TASK,
        "models": {"model": state["model"]},
        "optimizers": {"model": state["optimizer"]},
        "scalers": {"model": state.get("scaler")},
        "ema": {"model": state["ema"]} if state.get("ema") else None,
        "task_state": {},
        "best": {"metric": "acc", "mode": "max", "value": best if best is not None and best >= 0 else None},
        "epoch_sums": {"losses": {"loss": loss_sum}, "samples": samples},
    }


def is_run_directory(path: Path) -> bool:
    """A folder holding a run's best.pt or latest.pt."""
    return (path / BEST).is_file() or (path / LATEST).is_file()


def in_run_directory(path: Path, option: str) -> tuple[Path, str]:
    """A checkpoint given as its run directory (``--checkpoint checkpoints/a``, as Lightning's
    ``ckpt_path="best"``): its best.pt, else its latest.pt; and the line that says which. A file is
    itself, with no line."""
    if not path.is_dir():
        return path, ""
    for name, why in ((BEST, "its best validation so far"), (LATEST, "it has no best.pt yet")):
        if (path / name).is_file():
            return path / name, f"phalanx: {option} {path} is a run directory: using its {name} ({why})"
    raise PhalanxError(
        f"{path} is a directory without {BEST} or {LATEST} (a run directory holds them); give a "
        "checkpoint file or a run's directory",
        option,
    )


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

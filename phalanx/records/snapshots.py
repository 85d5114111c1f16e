"""Loss snapshots: pickled plain data that ``phalanx visualize`` reads, locally or from S3.

Layout: ``<pickle-dir>/segment_000001.pkl``, ``segment_000002.pkl``, ... Each segment holds up to
``SEGMENT_RECORDS`` metric records; a full segment is sealed and never rewritten, and the open
(last) one is rewritten atomically with a superset of its points. So a reader that starts late,
polls slowly or restarts still finds every point, no write copies the whole history, and no file
is ever the only copy of a point while it is being replaced.

Each process start (a fresh run, a resume, an elastic restart) writes a new ``generation``: it
rewrites the history it continues from (a resumed run drops the points after its checkpoint).
Readers use the newest generation alone, and only once its segments 1..k are all present.

Loading admits plain data only (dict, list, tuple, str, bytes, int, float, bool, None): the
unpickler refuses every global, so a hostile pickle cannot import or call anything, and the values
are counted against a budget, so a small file cannot unfold into a huge structure. No torch here.

The kinds of record and what each must hold are defined once, in ``records`` (schema 3: any task's
named losses and metrics, and the dashboard's panes); segments of schemas 1 and 2 still load.
"""

from __future__ import annotations

import io
import pickle
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import records as record_kinds
from . import READABLE_SCHEMAS, SCHEMA

SEGMENT_RECORDS = 5000
SEGMENT_NAME = re.compile(r"^segment_(\d{6})\.pkl$")
PLAIN_TYPES = (dict, list, tuple, str, bytes, int, float, bool, type(None))


class UnsafeSnapshot(pickle.UnpicklingError):
    """A snapshot that is not plain data: refused, nothing in it ran."""


class _PlainDataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise UnsafeSnapshot(f"refers to {module}.{name}; snapshots hold plain data only")

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeSnapshot("uses persistent ids; snapshots hold plain data only")


MAX_NODES = 2_000_000  # a full segment holds about 100,000; a shared-reference bomb, 10^12
MAX_DEPTH = 50


def _check_plain(value: Any) -> None:
    """Plain data only, and bounded: a pickle can repeat one list a hundred times at each of six
    levels in 2 KB (10^12 leaves), so every node visited counts against a budget."""
    budget = MAX_NODES
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        budget -= 1
        if budget < 0:
            raise UnsafeSnapshot(f"holds more than {MAX_NODES:,} values (shared references?); refused")
        if depth > MAX_DEPTH or type(item) not in PLAIN_TYPES:
            raise UnsafeSnapshot(f"holds {type(item).__name__}; snapshots hold plain data only")
        if type(item) is dict:
            stack.extend((part, depth + 1) for pair in item.items() for part in pair)
        elif type(item) in (list, tuple):
            stack.extend((part, depth + 1) for part in item)


def segment_name(index: int) -> str:
    return f"segment_{index:06d}.pkl"


def remove_history(directory: Path) -> None:
    """The snapshot files of ``directory`` (a run refused at its first step leaves none), and the
    folder where that leaves it empty."""
    for path in directory.glob("*.pkl"):
        if SEGMENT_NAME.match(path.name):
            path.unlink(missing_ok=True)
    try:
        directory.rmdir()
    except OSError:  # not empty (another file was put there), or not there
        pass


def holds_snapshots(directory: Path) -> bool:
    """Whether a run's snapshot history is in ``directory`` (its first segment)."""
    return (directory / segment_name(1)).exists()


def dumps(segment: dict[str, Any]) -> bytes:
    _check_plain(segment)
    return pickle.dumps(segment, protocol=4)


def loads(data: bytes) -> dict[str, Any]:
    """Load one segment; raises UnsafeSnapshot or pickle/EOF/Value errors for bad data."""
    segment = _PlainDataUnpickler(io.BytesIO(data)).load()
    _check_plain(segment)
    if not isinstance(segment, dict) or segment.get("schema") not in READABLE_SCHEMAS:
        raise ValueError(f"not a phalanx snapshot (schema {' or '.join(map(str, READABLE_SCHEMAS))})")
    for key, kind in (
        ("run_id", str),
        ("generation", int),
        ("segment", int),
        ("sealed", bool),
        ("records", list),
        ("options", dict),
    ):
        if not isinstance(segment.get(key, {} if key == "options" else None), kind):
            raise ValueError(f"snapshot field {key!r} is missing or not {kind.__name__}")
    for index, record in enumerate(segment["records"]):
        record_kinds.check(index, record)
    return segment


@dataclass
class History:
    """What a reader assembled: the newest generation's records, in order."""

    run_id: str
    generation: int
    options: dict[str, Any]
    records: list[dict[str, Any]]


def assemble(segments: Iterable[dict[str, Any]]) -> History | None:
    """The newest generation, if its segments 1..k are complete; None while it is being written."""
    segments = list(segments)
    if not segments:
        return None
    newest = max(s["generation"] for s in segments)
    by_index = {s["segment"]: s for s in segments if s["generation"] == newest}
    found = [by_index.get(i) for i in range(1, max(by_index) + 1)]
    ordered = [s for s in found if s is not None]
    if len(ordered) < len(found) or not all(s["sealed"] for s in ordered[:-1]):
        return None
    records = [r for s in ordered for r in s["records"]]
    return History(ordered[0]["run_id"], newest, ordered[0].get("options", {}), records)


@dataclass
class SnapshotWriter:
    """Global rank 0's writer. ``on_written(path)`` hears of each file (for remote transfer)."""

    directory: Path
    run_id: str
    options: dict[str, Any]
    every_seconds: float
    on_written: Callable[[Path], None]
    write_file: Callable[[Path, bytes], None]
    records: list[dict[str, Any]] = field(default_factory=list)
    generation: int = 1
    _dirty_from: int = 0  # first segment index (0-based) not yet written since it changed
    _last_write: float = 0.0

    def start(self, history: list[dict[str, Any]]) -> None:
        """Begin a new generation that continues ``history`` and write it out in full."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.generation = 1 + max((self._generation_of(p) for p in self.directory.glob("segment_*.pkl")), default=0)
        self.records = list(history)
        self._dirty_from = 0
        self.flush()
        for path in self.directory.glob("segment_*.pkl"):  # leftovers of a longer, older history
            match = SEGMENT_NAME.match(path.name)
            if match and int(match.group(1)) > self._segment_count():
                path.unlink(missing_ok=True)

    def add(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        if time.monotonic() - self._last_write >= self.every_seconds:
            self.flush()

    def flush(self) -> None:
        """Write every segment that changed since the last write (usually just the open one)."""
        for index in range(self._dirty_from // SEGMENT_RECORDS, self._segment_count()):
            chunk = self.records[index * SEGMENT_RECORDS : (index + 1) * SEGMENT_RECORDS]
            segment = {
                "schema": SCHEMA,
                "run_id": self.run_id,
                "generation": self.generation,
                "segment": index + 1,
                "sealed": len(chunk) == SEGMENT_RECORDS,
                "written_at": time.time(),
                "options": self.options,
                "records": chunk,
            }
            path = self.directory / segment_name(index + 1)
            self.write_file(path, dumps(segment))
            self.on_written(path)
        self._dirty_from = len(self.records)
        self._last_write = time.monotonic()

    def _segment_count(self) -> int:
        return max(1, -(-len(self.records) // SEGMENT_RECORDS))

    @staticmethod
    def _generation_of(path: Path) -> int:
        try:
            return loads(path.read_bytes())["generation"]
        except Exception:  # a foreign or broken file does not stop training
            return 0

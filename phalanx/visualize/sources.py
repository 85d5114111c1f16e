"""Reading snapshots, locally or from S3, with bounds no file can get around.

A snapshot is data from outside: it is read only if it is a regular file (never a device, a FIFO
or a symlink out of the pickle directory) of at most ``MAX_SEGMENT_BYTES``, unpickled as plain
data only, within a budget of values (``snapshots``). A refused file is warned about once, and the
good ones still plot. No torch, no visdom here.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any

from ..errors import PhalanxError
from ..records import snapshots
from ..records.snapshots import History

MAX_SEGMENT_BYTES = 64 * 1024 * 1024  # a full segment of 5,000 records with images is a few MB


class RefusedFile(Exception):
    """A file that is not read at all (its type, place or size)."""


class SnapshotSource:
    """Reads the segments of one run's pickle dir, caching unchanged files; warns once per bad file."""

    label = ""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[Any, dict[str, Any] | None]] = {}  # name -> (version, segment)
        self.problems: dict[str, str] = {}  # bad file -> why, as last seen
        self._versions: dict[str, Any] = {}
        self._warned: set[tuple[str, Any]] = set()

    def _files(self) -> list[tuple[str, Any]]:
        """(segment file name, version) pairs; the version changes when the file does."""
        raise NotImplementedError

    def _read(self, name: str) -> bytes:
        raise NotImplementedError

    def has_segments(self) -> bool:
        return bool(self._files())

    def history(self, warn: bool) -> History | None:
        segments = []
        for name, version in self._files():
            cached = self._cache.get(name)
            if cached is None or cached[0] != version:
                cached = (version, self._load(name, version, warn))
                self._cache[name] = cached
            if cached[1] is not None:
                segments.append(cached[1])
        return snapshots.assemble(segments)

    def _load(self, name: str, version: Any, warn: bool) -> dict[str, Any] | None:
        try:
            segment = snapshots.loads(self._read(name))
            self.problems.pop(name, None)
            return segment
        except FileNotFoundError:  # replaced or removed between listing and reading: next poll
            return None
        except Exception as exc:  # corrupt, partial, hostile, too big, not a file: refuse it, keep going
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
            self.problems[name] = why
            self._versions[name] = version
            if warn:
                self.warn_problems()
            return None

    def warn_problems(self) -> None:
        """Say once (per version of a file) why each refused file was refused."""
        for name, why in sorted(self.problems.items()):
            seen = (name, self._versions.get(name))
            if seen not in self._warned:
                self._warned.add(seen)
                print(f"phalanx: warning: ignoring snapshot {self.label}{name}: {why}", file=sys.stderr, flush=True)


class LocalSource(SnapshotSource):
    def __init__(self, directory: Path):
        super().__init__()
        if not directory.is_dir():
            raise PhalanxError(
                f"{directory} does not exist; training's global rank 0 creates it "
                "(<checkpoints-dir>/<name>/pickle by default)",
                "--pickle-dir",
            )
        self.directory = directory
        self.root = directory.resolve()

    def _files(self) -> list[tuple[str, Any]]:
        found = []
        with os.scandir(self.directory) as entries:
            for entry in entries:
                if snapshots.SEGMENT_NAME.match(entry.name):
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    found.append((entry.name, (info.st_mtime_ns, info.st_size, info.st_ino, info.st_mode)))
        return sorted(found)

    def _read(self, name: str) -> bytes:
        real = (self.directory / name).resolve()
        if not real.is_relative_to(self.root):
            raise RefusedFile(f"a link out of the pickle directory (to {real})")
        # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then tells what it is.
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise RefusedFile("not a regular file")
            if info.st_size > MAX_SEGMENT_BYTES:
                raise RefusedFile(f"{info.st_size:,} bytes, more than {MAX_SEGMENT_BYTES:,}")
            with os.fdopen(fd, "rb", closefd=False) as fh:
                data = fh.read(MAX_SEGMENT_BYTES + 1)
        finally:
            os.close(fd)
        if len(data) > MAX_SEGMENT_BYTES:  # it grew after the check
            raise RefusedFile(f"more than {MAX_SEGMENT_BYTES:,} bytes")
        return data


class S3Source(SnapshotSource):
    def __init__(self, url: str, endpoint_url: str | None):
        super().__init__()
        from ..config.sections import parse_s3_url
        from ..records.remote import s3_client

        self.bucket, prefix = parse_s3_url(url, "--pickle-dir")
        self.prefix = f"{prefix}/" if prefix else ""
        self.client = s3_client(endpoint_url)
        self.sizes: dict[str, int] = {}  # from the last listing

    def _files(self) -> list[tuple[str, Any]]:
        found = []
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix)
        for page in pages:
            for obj in page.get("Contents", []):
                name = obj["Key"][len(self.prefix) :]
                if snapshots.SEGMENT_NAME.match(name):
                    found.append((name, obj["ETag"]))
                    self.sizes[name] = obj.get("Size", 0)
        return sorted(found)

    def _read(self, name: str) -> bytes:
        size = self.sizes.get(name, 0)
        if size > MAX_SEGMENT_BYTES:
            raise RefusedFile(f"{size:,} bytes, more than {MAX_SEGMENT_BYTES:,}")
        body = self.client.get_object(Bucket=self.bucket, Key=self.prefix + name)["Body"]
        data = body.read(MAX_SEGMENT_BYTES + 1)
        if len(data) > MAX_SEGMENT_BYTES:
            raise RefusedFile(f"more than {MAX_SEGMENT_BYTES:,} bytes")
        return data


def open_source(pickle_dir: str, s3_endpoint_url: str | None) -> SnapshotSource:
    if pickle_dir.startswith("s3://"):
        return S3Source(pickle_dir, s3_endpoint_url)
    return LocalSource(Path(pickle_dir))


def run_dirs(directory: Path) -> list[Path]:
    """The pickle dirs of the runs under ``directory`` (``<run>/pickle`` or ``<run>`` holding
    segments), for comparing runs; ``directory`` itself when it holds segments."""
    if any(snapshots.SEGMENT_NAME.match(p.name) for p in directory.iterdir()):
        return [directory]
    found = []
    for child in sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for candidate in (child / "pickle", child):
            if candidate.is_dir() and any(snapshots.SEGMENT_NAME.match(p.name) for p in candidate.iterdir()):
                found.append(candidate)
                break
    return found

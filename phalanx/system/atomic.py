"""Atomic file writes: readers (resume, visualize, uploads) never see a half-written file."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from ..errors import RunFailed


def atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write through ``write(fh)`` (what it returns, a count of bytes, is not used) into a temporary
    file beside ``path``, then rename it over.

    ``os.replace`` is atomic on POSIX within one filesystem, so ``path`` holds either the old
    complete file or the new complete file. On failure (disk full, a kill) the old file stays
    and the temporary is removed.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise RunFailed(f"cannot write {path} ({exc.strerror or exc}); the previous file is intact") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda fh: fh.write(text.encode()))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda fh: fh.write(data))


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable (a crash right after must not bring the old name back)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

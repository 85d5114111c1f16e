"""Checkpoints written off the training thread. The state is serialised where ``save`` is called
(the bytes are the state of that moment, whatever training changes next); one background thread
writes, syncs and renames the files (``checkpoint.write``: atomic, so a crash leaves the previous
file whole) and then hands them to the uploads. A save waits for the previous write; ``wait``
(preemption, the end of a run, any failure) for the last one."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import checkpoint


class CheckpointWriter:
    def __init__(self, written: Callable[[list[Path]], None]):
        self.written = written  # after the files are in place: the uploads
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def save(self, paths: list[Path], state: dict[str, Any]) -> None:
        self.wait()
        data = checkpoint.serialise(state)
        self.thread = threading.Thread(target=self._write, args=(paths, data), name="phalanx-checkpoint")
        self.thread.start()

    def _write(self, paths: list[Path], data: memoryview) -> None:
        try:
            checkpoint.write(paths, data)
            self.written(paths)
        except BaseException as exc:  # raised on the training thread, at the next save or wait
            self.error = exc

    def wait(self, quiet: bool = False) -> None:
        """Until the last save is on disk; its failure raised (``quiet``: a run already failing
        keeps its own error, and the previous file stays whole)."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        error, self.error = self.error, None
        if error is not None and not quiet:
            raise error

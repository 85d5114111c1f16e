"""Graceful stops: SIGTERM (preemption) or Ctrl-C asks the trainer to stop at the next step
boundary, after a checkpoint, instead of dying mid-step. A second Ctrl-C stops at once."""

from __future__ import annotations

import signal
import threading
from typing import Any

from ..errors import EXIT_INTERRUPTED, EXIT_TERMINATED, RunFailed


class StopRequest:
    def __init__(self) -> None:
        self.signum = 0
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and self.signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: the user does not want to wait
        self.signum = signum


class Preempted(RunFailed):
    """Stopped by a signal after saving a checkpoint; ``--resume auto`` continues exactly."""

    def __init__(self, signum: int, where: str):
        name = signal.Signals(signum).name
        super().__init__(
            f"stopped by {name} {where}; checkpoint saved: continue with --resume auto",
            exit_code=EXIT_INTERRUPTED if signum == signal.SIGINT else EXIT_TERMINATED,
        )

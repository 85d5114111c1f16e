"""A one-line progress bar on stderr: steps, running loss, throughput.

Drawn only on a terminal, and redrawn at most five times a second, so reading the loss (a device
sync) costs nothing measurable; logs and CI output get the per-epoch summary lines instead.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO


class ProgressBar:
    def __init__(self, total: int, label: str, enabled: bool, stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.enabled = enabled and self.stream.isatty()
        self.total, self.label = total, label
        self.done = self.samples = 0
        self.start = self.last_draw = time.perf_counter()

    def update(self, samples: int, loss: Callable[[], float]) -> None:
        self.done += 1
        self.samples += samples
        now = time.perf_counter()
        if self.enabled and (now - self.last_draw >= 0.2 or self.done == self.total):
            self.last_draw = now
            self._draw(loss(), self.samples / max(now - self.start, 1e-9))

    def _draw(self, loss: float, rate: float) -> None:
        width = 24
        filled = int(width * self.done / max(self.total, 1))
        bar = "#" * filled + "." * (width - filled)
        self.stream.write(f"\r{self.label} [{bar}] {self.done}/{self.total} loss {loss:.4f} {rate:,.0f} samples/s ")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r\033[K")
            self.stream.flush()

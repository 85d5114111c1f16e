"""Progress within an epoch: a one-line bar on a terminal, or a line every few seconds in a log.

On a terminal the bar is redrawn at most five times a second, so reading the loss (a device sync)
costs nothing measurable. Without one (a log file, a batch job's output), a line every
``--log-interval`` seconds says where the epoch is, timm-style, so a long epoch is not silence.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO


class ProgressLog:
    def __init__(self, total: int, label: str, enabled: bool, interval: float = 0.0, stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.tty = enabled and self.stream.isatty()
        self.lines = enabled and not self.tty and interval > 0
        self.interval = interval
        self.total, self.label = total, label
        self.done = self.samples = 0
        self.start = self.last_draw = time.perf_counter()

    def update(self, samples: int, loss: Callable[[], float] | None = None) -> None:
        """``loss``: the loss so far, shown beside the rate (None: a loop without one, predict's)."""
        self.done += 1
        self.samples += samples
        now = time.perf_counter()
        if self.tty and (now - self.last_draw >= 0.2 or self.done == self.total):
            self.last_draw = now
            self._draw(f" loss {loss():.4f}" if loss else "", self.samples / max(now - self.start, 1e-9))
        elif self.lines and now - self.last_draw >= self.interval and self.done < self.total:
            self.last_draw = now
            rate = self.samples / max(now - self.start, 1e-9)
            self.stream.write(
                f"{self.label}: {self.done}/{self.total} micro-batches ({100 * self.done / self.total:.0f}%)"
                f"{f'  loss {loss():.4f}' if loss else ''}  {rate:,.0f} samples/s  {now - self.start:.0f}s\n"
            )
            self.stream.flush()

    def _draw(self, loss: str, rate: float) -> None:
        width = 24
        filled = int(width * self.done / max(self.total, 1))
        bar = "#" * filled + "." * (width - filled)
        self.stream.write(f"\r{self.label} [{bar}] {self.done}/{self.total}{loss} {rate:,.0f} samples/s ")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\r\033[K")
            self.stream.flush()


ProgressBar = ProgressLog

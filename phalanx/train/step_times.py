"""Where a training step's time goes: waiting for the loader's batch, the task's forward and backward,
communication (the step's waits for other ranks: its collectives and the gradient all-reduce that
backward did not hide, ``phalanx.distributed.comm_clock``; 0 in one process), the optimizer step
with what follows it (moving averages, a teacher's update), and logging (the losses' all-reduce and
the records; counted in the window after the one it logs). Host clock, a few reads per micro-batch:
cheap enough to stay on. On a GPU the host does not wait for queued kernels, so these are the host's
waits, not the GPU's busy time (CUDA events would be; not built).

Summed over a logging window, averaged over the ranks with the window's losses (one all-reduce),
recorded as seconds per optimizer step, and totalled over the run for its last line."""

from __future__ import annotations

import time

from ..records import STEP_PARTS as PARTS
from ..records import STEP_TIME_KEYS as KEYS


class StepTimes:
    def __init__(self) -> None:
        self.window = [0.0] * len(PARTS)
        self.total = [0.0] * len(PARTS)
        self.mark = time.perf_counter()

    def start(self) -> None:
        """Before the loader is asked for an epoch's first batch."""
        self.mark = time.perf_counter()

    def lap(self, part: str, waited: float = 0.0) -> None:
        """The time since the last lap (or start) was spent on ``part``, but for ``waited`` seconds
        of it spent waiting for other ranks (communication)."""
        now = time.perf_counter()
        waited = min(waited, now - self.mark)
        self.window[PARTS.index(part)] += now - self.mark - waited
        self.window[PARTS.index("communication")] += waited
        self.mark = now

    def take(self) -> list[float]:
        """This rank's window (seconds per part), and a new window."""
        window, self.window = self.window, [0.0] * len(PARTS)
        return window

    def per_step(self, summed: list[float], world_size: int, steps: int) -> dict[str, float]:
        """The window's all-reduced sums -> mean seconds per step over the ranks (and to the run's total)."""
        mean = [value / world_size for value in summed]
        self.total = [a + b for a, b in zip(self.total, mean)]
        return {key: value / max(steps, 1) for key, value in zip(KEYS, mean)}

    def shares(self) -> str:
        """The run's time per step in words: "data 12%, compute 70%, communication 10%, optimizer
        7%, logging 1%"."""
        whole = sum(self.total) or 1.0
        return ", ".join(f"{part} {100 * value / whole:.0f}%" for part, value in zip(PARTS, self.total))

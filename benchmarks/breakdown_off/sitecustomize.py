"""Imported at start-up by the "off" contenders of benchmarks/breakdown_cost.py (and by their torchrun
workers, which inherit the path): the step-time breakdown's clock reads, collective timers and
gradient hooks replaced by nothing, to measure what they cost. Never on phalanx's own path."""

import contextlib

from phalanx.distributed import comm_clock
from phalanx.train import step_times

step_times.StepTimes.lap = lambda self, part, waited=0.0: None
comm_clock.CommClock.watch = lambda self, model: None
comm_clock.CommClock.collective = lambda self: contextlib.nullcontext()
comm_clock.CommClock.backward = lambda self, reduces=True: contextlib.nullcontext()

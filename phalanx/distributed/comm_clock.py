"""The communication a training step waits for, measured apart from its computation: the time in
the step's blocking collectives (a loss's all-gather and its backward's all-reduce, a monitor's
sums) and the gradient all-reduce that backward did not hide, from the last gradient computed to
the end of backward (DDP's reducer waits for its buckets there). A rank that reaches a collective
first waits for the others: a straggler shows as communication on the ranks that wait for it.

Host clock, as the rest of the step-time breakdown (``step_times``): on a GPU the host does not
wait for NCCL's kernels, so there this is the host's wait, not the link's busy time. Sharded
networks (``--strategy fsdp``) reduce their gradients in their own hooks: their wait stays in
compute; their gathers and the loss's collectives are counted."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from torch import nn


class CommClock:
    def __init__(self) -> None:
        self.waited = 0.0  # seconds since the last take()
        self.last_gradient = 0.0

    def watch(self, model: nn.Module) -> None:
        """Note when each trainable weight of ``model`` has its gradient (one clock read each)."""
        for param in model.parameters():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(self._gradient_ready)

    def _gradient_ready(self, _param: nn.Parameter) -> None:
        self.last_gradient = time.perf_counter()

    @contextlib.contextmanager
    def collective(self) -> Iterator[None]:
        """A blocking collective: all of its time is communication."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.waited += time.perf_counter() - started

    @contextlib.contextmanager
    def backward(self, reduces: bool = True) -> Iterator[None]:
        """A backward pass: the time after its last gradient is the all-reduce it did not hide
        (``reduces`` False: a micro-batch that only accumulates, whose backward reduces nothing)."""
        started = self.last_gradient = time.perf_counter()
        yield
        if reduces and self.last_gradient > started:  # a watched (DDP) network had gradients in this pass
            self.waited += time.perf_counter() - self.last_gradient

    def take(self) -> float:
        """The communication since the last take (seconds), and a new count."""
        waited, self.waited = self.waited, 0.0
        return waited

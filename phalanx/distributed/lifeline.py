"""Child processes that do not outlive their parent (stdlib only; visualize uses it too)."""

from __future__ import annotations

import os
import signal
import sys


def die_with_parent(parent: int, sig: int = signal.SIGTERM) -> None:
    """Ask Linux to send ``sig`` to this process when ``parent`` dies, even by SIGKILL.

    Call it in the child (first thing, or as a ``preexec_fn``). Elsewhere than Linux it does nothing.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, sig, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), sig)

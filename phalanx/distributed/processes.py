"""How phalanx processes end: children that do not outlive their parent (``die_with_parent``: the
workers, a visdom server visualize owns), and a process that ends without the interpreter's
finalisation once torch is loaded (``exit_process``). Standard library only: visualize uses it.


Finalising torch's modules took 0.5-1 s at the end of every command here (traced: no system call
in that time, nothing written), in a launcher waiting for nothing. After a process group it is also
unsafe: Gloo's worker threads can still hold tensors when Python tears itself down, and the process
then aborts (SIGABRT, "terminate called without an active exception") after a successful run even
with destroy_process_group() called (pytorch/pytorch#179291). By the time a command returns, every
file it wrote is written and closed, so flushing and ``os._exit`` loses nothing.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading

joined_process_group = False  # set by the strategy of a process that joined one


def exit_process(code: int) -> None:
    if not joined_process_group:
        # What the interpreter's exit does before finalising still happens, in its order: its
        # shutdown hooks (which wake idle thread-pool workers, such as the kernel compiler's of
        # --compile) and the join of every thread that is not a daemon, then the exit functions
        # (logging's handlers flushed, multiprocessing's children joined, weakref finalisers:
        # temporary directories removed). After a group both are skipped, as they always were.
        threading._shutdown()  # type: ignore[attr-defined]  # private: typeshed does not declare it
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader gone (`phalanx evaluate ... | head`), a stream closed
            pass
    os._exit(code)


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

"""Failures at run time in one line: the console gets what happened, a file gets the traceback.

Standard library only (the launcher and the CLI use it before and without torch).
"""

from __future__ import annotations

import re
import signal
import threading
import time
import traceback
from pathlib import Path

# What gloo and NCCL say when another process of the group went away.
_PEER_LOST = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "remote process exited",
    "communicator was aborted",
    "socket closed",
)
_TIMED_OUT = ("timed out", "timeout")
_CPP_LOCATION = re.compile(r"^\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*")


def cause_line(exc: BaseException) -> str:
    """The first line of an exception's message, without C++ source locations and stack frames."""
    for line in str(exc).splitlines():
        line = _CPP_LOCATION.sub("", line.strip())
        if line and not line.startswith(("Exception raised from", "frame #")):
            return line[:300]
    return ""


def innermost(exc: BaseException) -> BaseException:
    """The root of an exception chain (``raise ... from exc``, or an error while handling one)."""
    seen = {id(exc)}
    while True:
        nxt = exc.__cause__ or exc.__context__
        if nxt is None or id(nxt) in seen:
            return exc
        seen.add(id(nxt))
        exc = nxt


def summarize(exc: BaseException, backend: str | None = None) -> str:
    """One line: ``lost its peers (gloo: ...)``, a collective timeout, or ``Type: first line``."""
    line = cause_line(exc)
    lowered = line.lower()
    short = line.split(". ")[0]
    if any(words in lowered for words in _PEER_LOST):
        return f"lost its peers ({backend or 'process group'}: {short})"
    if type(exc).__name__ in ("DistBackendError", "DistError", "RuntimeError") and any(
        words in lowered for words in _TIMED_OUT
    ):
        return f"a collective timed out ({short}): a peer hung or died (see --dist-timeout)"
    root = innermost(exc)
    text = f"{type(exc).__name__}: {line}" if line else type(exc).__name__
    if root is not exc and cause_line(root) and cause_line(root) != line:
        text += f" ({type(root).__name__}: {cause_line(root)})"
    return text


def hold_stop_signals() -> None:
    """Defer SIGTERM and SIGINT for the rest of this failing process's life (or until
    ``restore_signal_mask``, when phalanx was called in process).

    When one DDP worker fails, torchrun terminates the others, which are failing too (they lost
    their peer) and are writing why: without this, the report of every rank but the first is cut
    off mid-write. The process exits soon after; a signal still pending then dies with it.
    """
    if threading.current_thread() is threading.main_thread():
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})


def signal_mask() -> set | None:
    """This thread's blocked signals (None off the main thread, where hold_stop_signals does nothing)."""
    if threading.current_thread() is threading.main_thread():
        return signal.pthread_sigmask(signal.SIG_BLOCK, set())
    return None


def restore_signal_mask(mask: set | None) -> None:
    """Undo hold_stop_signals for a caller that lives on (``phalanx.cli.main`` called in process): a
    mask left blocked would keep its Ctrl-C and SIGTERM from it, and from every process it starts."""
    if mask is not None and threading.current_thread() is threading.main_thread():
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def write_traceback(path: Path, exc: BaseException, header: str) -> Path | None:
    """Append the traceback to ``path`` (made with its folders); None when it cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as fh:
            fh.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {header}\n")
            fh.write("".join(traceback.format_exception(exc)))
        return path
    except OSError:
        return None

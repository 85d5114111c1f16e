"""``phalanx visualize``: a run's snapshots -> a visdom page, live; or several runs side by side.

The only package that imports visdom; it never imports torch, so it runs anywhere the snapshots
can be read (a laptop, another node, from S3). Modules: ``runs`` (which runs, waited for),
``sources`` (bounded, safe reading), ``follow`` (each poll, one run's failure kept to itself),
``plots`` (the windows), ``server`` (the visdom server it plots into, or starts, owns and restarts),
``assets`` (visdom's page files, fetched from the npm registry), ``options``. May import records,
the configuration, ``phalanx.distributed.processes`` (no torch) and the base.
"""

from __future__ import annotations

import json
import signal
import sys
from typing import Any

from ..errors import EXIT_INTERRUPTED, EXIT_TERMINATED, PhalanxError, RunFailed
from .follow import Follower
from .options import VisualizeOptions
from .plots import env_name, windows
from .runs import Runs
from .server import LOCAL_HOSTS, ServerLost, start_server_if_needed, visdom_client
from .sources import LocalSource, S3Source

__all__ = ["LocalSource", "S3Source", "VisualizeOptions", "env_name", "visualize", "window_points", "windows"]


class _Signalled(BaseException):
    """SIGTERM or SIGINT. A BaseException, as KeyboardInterrupt is: an ``except Exception`` on the
    way (the server's health check, a refused snapshot) would swallow an Exception, and visualize
    would go on after the signal (it did, under load, when SIGTERM came during the health check)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _stop_on_signals() -> None:
    def handler(signum: int, frame: Any) -> None:
        raise _Signalled(signum)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def visualize(opts: VisualizeOptions) -> int:
    _stop_on_signals()
    try:
        return _visualize(opts)
    except _Signalled as stop:
        raise RunFailed(
            f"visualize stopped by {signal.Signals(stop.signum).name}",
            exit_code=EXIT_INTERRUPTED if stop.signum == signal.SIGINT else EXIT_TERMINATED,
        ) from None


def _visualize(opts: VisualizeOptions) -> int:
    runs = Runs(opts)
    if opts.once and not runs.histories(warn=False):  # nothing to plot: one line says why
        problems = runs.problems()
        raise PhalanxError(
            f"no complete snapshot in {', '.join(opts.pickle_dir)}" + (f" ({problems})" if problems else ""),
            "--pickle-dir",
        )
    owned = None
    try:
        while True:
            owned = start_server_if_needed(opts.server, opts.port, opts.once, opts.listen_all, opts.visdom_log)
            base = f"http://localhost:{opts.port}" if owned else f"{opts.server}:{opts.port}"
            check_url = f"http://127.0.0.1:{opts.port}" if owned else f"{opts.server}:{opts.port}"
            try:
                Follower(opts, runs, visdom_client(opts.server, opts.port), base, check_url).run()
                return 0
            except ServerLost:
                if owned is not None:
                    owned.stop()
                    owned = None
                _after_losing_the_server(opts)
    finally:
        if owned is not None:
            owned.stop()


def _after_losing_the_server(opts: VisualizeOptions) -> None:
    """A server on this machine is started again (or another visualize's new one is used), and every
    run redrawn into it; one elsewhere, or under --once, is reported in one line."""
    where = f"{opts.server}:{opts.port}"
    host = opts.server.split("://", 1)[-1].split("/", 1)[0]
    if opts.once or host not in LOCAL_HOSTS:
        raise RunFailed(f"the visdom server at {where} stopped answering", "--server")
    print(
        f"phalanx: warning: the visdom server at {where} stopped answering (did the visualize that started it "
        "stop?); starting another and drawing every run again",
        file=sys.stderr,
        flush=True,
    )


def window_points(viz: Any, win: str, env: str) -> dict[str, tuple[list, list]]:
    """The points visdom holds for a window, per trace: {name: (x, y)} (used by tests and tools)."""
    data = json.loads(viz.get_window_data(win=win, env=env))
    return {trace.get("name", ""): (trace["x"], trace["y"]) for trace in data["content"]["data"]}

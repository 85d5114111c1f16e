"""``phalanx visualize``: a run's snapshots -> a visdom page, live; or several runs side by side.

The only package that imports visdom; it never imports torch, so it runs anywhere the snapshots
can be read (a laptop, another node, from S3). Modules: ``sources`` (bounded, safe reading),
``plots`` (the windows), ``server`` (the visdom server it plots into, or starts and owns).
"""

from __future__ import annotations

import html
import json
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import EXIT_INTERRUPTED, EXIT_TERMINATED, PhalanxError, RunFailed
from ..snapshots import History
from .plots import ComparePlots, RunPlots, env_name, windows
from .server import start_server_if_needed, visdom_client
from .sources import LocalSource, S3Source, SnapshotSource, open_source, run_dirs

__all__ = ["LocalSource", "S3Source", "VisualizeOptions", "env_name", "visualize", "window_points", "windows"]


@dataclass(frozen=True)
class VisualizeOptions:
    pickle_dir: tuple[str, ...]
    server: str = "http://localhost"
    port: int = 8097
    interval: float = 2.0
    once: bool = False
    env: str | None = None
    s3_endpoint_url: str | None = None
    listen_all: bool = False
    visdom_log: str | None = None


class Runs:
    """The runs to show: each --pickle-dir is one run (local or S3), or a folder of runs that is
    looked through again at every poll, so a run that starts later is picked up."""

    def __init__(self, opts: VisualizeOptions):
        self.opts = opts
        self.sources: dict[str, SnapshotSource] = {}
        self.folders: list[Path] = []
        for given in opts.pickle_dir:
            if given.startswith("s3://"):
                self.sources[given] = open_source(given, opts.s3_endpoint_url)
                continue
            source = LocalSource(Path(given))  # says so when the folder does not exist
            if not source.has_segments() and run_dirs(Path(given)):
                self.folders.append(Path(given))
            else:
                self.sources[given] = source
        self.find_new()

    def find_new(self) -> None:
        for folder in self.folders:
            for run in run_dirs(folder):
                if str(run) not in self.sources:
                    self.sources[str(run)] = LocalSource(run)
                    self.sources[str(run)].label = f"{run}/"

    @property
    def comparing(self) -> bool:
        return len(self.opts.pickle_dir) > 1 or bool(self.folders)

    def histories(self, warn: bool) -> dict[str, History]:
        self.find_new()
        found = {}
        for key, source in self.sources.items():
            history = source.history(warn)
            if history is not None:
                found[key] = history
        return found

    def warn_problems(self) -> None:
        for source in self.sources.values():
            source.warn_problems()

    def problems(self) -> str:
        return "; ".join(f"{n}: {w}" for s in self.sources.values() for n, w in sorted(s.problems.items())[:3])


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
        raise RunFailed(f"visualize stopped by {signal.Signals(stop.signum).name}",
                        exit_code=EXIT_INTERRUPTED if stop.signum == signal.SIGINT else EXIT_TERMINATED) from None


def _visualize(opts: VisualizeOptions) -> int:
    runs = Runs(opts)
    if opts.once and not runs.histories(warn=False):  # nothing to plot: one line says why
        problems = runs.problems()
        raise PhalanxError(f"no complete snapshot in {', '.join(opts.pickle_dir)}"
                           + (f" ({problems})" if problems else ""), "--pickle-dir")
    owned = None
    try:
        owned = start_server_if_needed(opts.server, opts.port, opts.once, opts.listen_all, opts.visdom_log)
        base = f"http://localhost:{opts.port}" if owned else f"{opts.server}:{opts.port}"
        _follow(opts, runs, visdom_client(opts.server, opts.port), base)
        return 0
    finally:
        if owned is not None:
            owned.stop()


def _follow(opts: VisualizeOptions, runs: Runs, viz: Any, base: str) -> None:
    plots: dict[str, RunPlots] = {}
    compare = ComparePlots(viz) if runs.comparing else None
    waiting_said, urls_said = False, set()
    index = RunIndex(viz, base)
    while True:
        histories = runs.histories(warn=True)
        runs.warn_problems()  # also those found before the loop
        if not histories and not waiting_said:
            print(f"phalanx: waiting for the first snapshot in {', '.join(opts.pickle_dir)}", flush=True)
            waiting_said = True
        for key, history in histories.items():
            run_plots = plots.setdefault(key, RunPlots(viz, opts.env if not runs.comparing else None))
            env = run_plots.fixed_env or env_name(history)
            if env not in urls_said:  # before plotting: the page can be opened as it fills
                urls_said.add(env)
                print(f"phalanx: {history.options.get('name', 'run')}: {base}/env/{env}", flush=True)
                index.add(str(history.options.get("name", "run")), env)
            added = run_plots.update(history)
            if added:
                print(f"phalanx: {added} new point(s) in visdom env {run_plots.env} ({len(history.records)} records)",
                      flush=True)
        if compare is not None and histories:
            compare.update({_label(h, histories): h for h in histories.values()})
            if compare.env not in urls_said:
                urls_said.add(compare.env)
                print(f"phalanx: runs compared: {base}/env/{compare.env}", flush=True)
                index.add("runs compared", compare.env)
        if opts.once:
            return
        time.sleep(opts.interval)


class RunIndex:
    """The server's root page (visdom's ``main`` env, what http://localhost:8097 opens): a link to
    every run's page, as a DeepLIIF user looks there first."""

    def __init__(self, viz: Any, base: str):
        self.viz, self.base = viz, base
        self.pages: dict[str, str] = {}

    def add(self, name: str, env: str) -> None:
        self.pages[env] = name
        links = "".join(f'<li><a href="{html.escape(self.base)}/env/{html.escape(env)}">{html.escape(label)}</a> '
                        f"({html.escape(env)})</li>" for env, label in self.pages.items())
        self.viz.text(f'<div class="phalanx-runs"><b>phalanx runs</b><ul>{links}</ul></div>', win="phalanx_runs",
                      env="main", opts={"title": "phalanx runs"})


def _label(history: History, histories: dict[str, History]) -> str:
    """A run's name in the legend; with its run id when two runs share a name."""
    name = str(history.options.get("name", "run"))
    same = sum(str(h.options.get("name", "run")) == name for h in histories.values())
    return name if same == 1 else f"{name} ({history.run_id})"


def window_points(viz: Any, win: str, env: str) -> dict[str, tuple[list, list]]:
    """The points visdom holds for a window, per trace: {name: (x, y)} (used by tests and tools)."""
    data = json.loads(viz.get_window_data(win=win, env=env))
    return {trace.get("name", ""): (trace["x"], trace["y"]) for trace in data["content"]["data"]}


"""One visdom server's view of the runs: every poll plots what is new, one run at a time.

A run whose plotting fails (a shape visdom refuses, a bad record) is reported once on stderr and
drawn again from scratch at the next poll; the other runs keep plotting. A server that stops
answering (``ServerLost``) ends the view: the caller starts another, or says so and exits.
"""

from __future__ import annotations

import html
import sys
import time
from typing import Any

from ..records.snapshots import History
from .plots import ComparePlots, RunPlots, env_name
from .runs import Runs
from .server import ServerLost, answers_as_visdom


class Follower:
    def __init__(self, opts: Any, runs: Runs, viz: Any, base: str, check_url: str):
        self.opts, self.runs, self.viz, self.base, self.check_url = opts, runs, viz, base, check_url
        self.plots: dict[str, RunPlots] = {}
        self.compare: ComparePlots | None = None
        self.urls_said: set[str] = set()
        self.failures_said: dict[str, str] = {}  # run -> the failure last reported
        self.waiting_said = False
        self.index = RunIndex(viz, base)

    def run(self) -> None:
        while True:
            self.poll()
            if self.opts.once:
                return
            time.sleep(self.opts.interval)
            if not answers_as_visdom(self.check_url):  # also when nothing new is to be plotted
                raise ServerLost(self.check_url)

    def poll(self) -> None:
        histories = self.runs.histories(warn=True)
        self.runs.warn_problems()  # also those found before the loop
        if not histories and not self.waiting_said and not self.runs.missing():
            print(f"phalanx: waiting for the first snapshot in {', '.join(self.opts.pickle_dir)}", flush=True)
            self.waiting_said = True
        for key, history in histories.items():
            self._isolated(key, lambda key=key, history=history: self._plot_run(key, history))
        if self.runs.comparing and histories:
            self.compare = self.compare or ComparePlots(self.viz)
            self._isolated("runs compared", lambda: self._plot_compare(histories))

    def _isolated(self, key: str, plot: Any) -> None:
        """Plot one run; a failure is that run's alone: said once, drawn afresh next time."""
        try:
            plot()
            self.failures_said.pop(key, None)
        except ConnectionError as exc:  # visdom's own, for a refused connection: the server, not the run
            raise ServerLost(self.check_url) from exc
        except Exception as exc:
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
            self.plots.pop(key, None)
            self.compare = None
            if self.failures_said.get(key) != why:
                self.failures_said[key] = why
                print(f"phalanx: warning: cannot plot {key} ({why}); the other runs go on", file=sys.stderr, flush=True)

    def _plot_run(self, key: str, history: History) -> None:
        run_plots = self.plots.setdefault(key, RunPlots(self.viz, self.opts.env if not self.runs.comparing else None))
        replaced = run_plots.env if run_plots.key and run_plots.key[0] != history.run_id else None
        env = run_plots.fixed_env or env_name(history)
        if env not in self.urls_said:  # before plotting: the page can be opened as it fills
            self.urls_said.add(env)
            print(f"phalanx: {history.options.get('name', 'run')}: {self.base}/env/{env}", flush=True)
            self.index.add(str(history.options.get("name", "run")), env)
        added = run_plots.update(history)
        if replaced and replaced != run_plots.env:  # a new run in the same folder (--overwrite): the old page goes
            self.viz.delete_env(replaced)
            self.index.remove(replaced)
            self.urls_said.discard(replaced)
            print(
                f"phalanx: {history.options.get('name', 'run')}: a new run ({history.run_id}) replaced the one "
                f"shown at {self.base}/env/{replaced}; that page is removed",
                flush=True,
            )
        if added:
            print(
                f"phalanx: {added} new point(s) in visdom env {run_plots.env} ({len(history.records)} records)",
                flush=True,
            )

    def _plot_compare(self, histories: dict[str, History]) -> None:
        assert self.compare is not None
        self.compare.update({_label(h, histories): h for h in histories.values()})
        if self.compare.env not in self.urls_said:
            self.urls_said.add(self.compare.env)
            print(f"phalanx: runs compared: {self.base}/env/{self.compare.env}", flush=True)
            self.index.add("runs compared", self.compare.env)


class RunIndex:
    """The server's root page (visdom's ``main`` env, what http://localhost:8097 opens): a link to
    every run's page, as a DeepLIIF user looks there first."""

    def __init__(self, viz: Any, base: str):
        self.viz, self.base = viz, base
        self.pages: dict[str, str] = {}

    def add(self, name: str, env: str) -> None:
        self.pages[env] = name
        self._show()

    def remove(self, env: str) -> None:
        self.pages.pop(env, None)
        self._show()

    def _show(self) -> None:
        links = "".join(
            f'<li><a href="{html.escape(self.base)}/env/{html.escape(env)}">{html.escape(label)}</a> '
            f"({html.escape(env)})</li>"
            for env, label in self.pages.items()
        )
        self.viz.text(
            f'<div class="phalanx-runs"><b>phalanx runs</b><ul>{links}</ul></div>',
            win="phalanx_runs",
            env="main",
            opts={"title": "phalanx runs"},
        )


def _label(history: History, histories: dict[str, History]) -> str:
    """A run's name in the legend; with its run id when two runs share a name."""
    name = str(history.options.get("name", "run"))
    same = sum(str(h.options.get("name", "run")) == name for h in histories.values())
    return name if same == 1 else f"{name} ({history.run_id})"

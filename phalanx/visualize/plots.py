"""Snapshots -> visdom windows. One env per run (``phalanx-<name>-<run id>``): a status pane, the
task's line panes (each named loss and validation metric on its own labelled axes, as the run's
``panes`` record lays them out: see ``records``), learning rate, throughput, GPU memory, the latest
confusion matrix and per-class accuracy where the task records one, and the task's images of the
latest epoch. ``ComparePlots`` overlays several runs' validation metrics in one env.

Line windows get only their new points (visdom appends); a new generation of the history (a
resume or restart) redraws them. The other windows show the latest epoch and are replaced.
"""

from __future__ import annotations

import time
from typing import Any

from .. import records as record_kinds
from ..records import STEP_PARTS
from ..records import STEP_TIME_KEYS as STEP_KEYS
from ..records.snapshots import History
from ..records.windows import HEIGHT, KINDS, WIDTH, drawn_windows

#: The windows every run's page may have besides its task's panes (``records.panes_of``).
FIXED_WINDOWS = ("status", "lr", "throughput", "step_time", "memory")
KEY_OPTIONS = (
    "task",
    "model",
    "dataset",
    "dataroot",
    "epochs",
    "batch_size",
    "lr",
    "optimizer",
    "lr_schedule",
    "precision",
    "augment",
    "gpu_ids",
    "weights",
    "ema_decay",
)


def line_panes(history: History) -> list[dict[str, Any]]:
    return [p for p in record_kinds.panes_of(history.records) if p.get("kind", "lines") == "lines"]


def windows(history: History) -> list[str]:
    """Every window of a run's page: its task's line panes, the fixed ones, then its other windows."""
    present = {r.get("kind", "") for r in history.records}
    others = drawn_windows(record_kinds.panes_of(history.records), present)
    return [p["win"] for p in line_panes(history)] + list(FIXED_WINDOWS) + [p["win"] for p in others]


def learning_rates(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    """One trace per optimizer where a run has several (a GAN's generator and discriminator may
    follow different schedules), else the one ``lr``."""
    names = rows[0].get("lrs") if rows else None
    if names and all(isinstance(r.get("lrs"), dict) and set(r["lrs"]) == set(names) for r in rows):
        return {f"lr ({name})": [r["lrs"][name] for r in rows] for name in names}
    return {"lr": [r["lr"] for r in rows]}


def stacked_step_times(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Each part of a step's time on top of the ones before it (data, + compute, + ...), in ms: the
    top line is the whole step."""
    stacked, total = {}, [0.0] * len(rows)
    for part, key in zip(STEP_PARTS, STEP_KEYS):
        total = [t + 1000 * r.get(key, 0.0) for t, r in zip(total, rows)]  # (runs before communication: none)
        stacked[part if part == STEP_PARTS[0] else f"+ {part}"] = total
    return stacked


def env_name(history: History) -> str:
    return f"phalanx-{history.options.get('name', 'run')}-{history.run_id}"


def of_kind(history: History, kind: str) -> list[dict[str, Any]]:
    return [r for r in history.records if r.get("kind") == kind]


class RunPlots:
    def __init__(self, viz: Any, env: str | None):
        self.viz, self.fixed_env = viz, env
        self.key: tuple[str, int] | None = None
        self.env = ""
        self.drawn = {"train": 0, "val": 0}
        self.shown: dict[str, Any] = {}  # window -> what it shows now (so unchanged windows are not resent)

    def update(self, history: History) -> int:
        """Plot what is new; returns the number of points added to the line windows."""
        train, val = of_kind(history, "train"), of_kind(history, "val")
        key = (history.run_id, history.generation)
        if key != self.key or len(train) < self.drawn["train"] or len(val) < self.drawn["val"]:
            if self.key and self.key[0] != history.run_id and self.fixed_env:
                self.viz.close(win=None, env=self.fixed_env)  # a replaced run's windows, those the new one lacks too
            self.env = self.fixed_env or env_name(history)
            self.key, self.drawn, self.shown = key, {"train": 0, "val": 0}, {}
        self._status(history)  # first: the top left of the page
        new = {"train": train[self.drawn["train"] :], "val": val[self.drawn["val"] :]}
        fresh = {kind: self.drawn[kind] == 0 for kind in new}
        x = {"train": [r["epoch_progress"] for r in new["train"]], "val": [r["epoch"] for r in new["val"]]}
        for pane in line_panes(history):
            kind = pane["record"]
            rows = new[kind]
            scale = 100.0 if pane.get("percent") else 1.0
            traces = {
                label: [scale * r[key] for r in rows]
                for key, label in pane["traces"]
                if rows and all(isinstance(r.get(key), (int, float)) for r in rows)
            }
            if traces:
                self._line(
                    pane["win"],
                    x[kind],
                    traces,
                    fresh[kind],
                    pane.get("title", pane["win"]),
                    pane.get("ylabel", ""),
                    bool(pane.get("percent")),
                )
        if new["train"]:
            rows = new["train"]
            self._line("lr", x["train"], learning_rates(rows), fresh["train"], "learning rate", "learning rate")
            self._line(
                "throughput",
                x["train"],
                {"samples/s": [r.get("samples_per_s", 0.0) for r in rows]},
                fresh["train"],
                "throughput (all ranks)",
                "samples / s",
            )
            if all(STEP_KEYS[0] in r for r in rows):  # runs before the breakdown have none
                self._line(
                    "step_time",
                    x["train"],
                    stacked_step_times(rows),
                    fresh["train"],
                    "time per step (mean over ranks, stacked)",
                    "ms per optimizer step",
                )
        rows = new["val"]
        if rows and all("memory_gib" in r for r in rows):
            per_rank = {f"rank {i}": [r["memory_gib"][i] for r in rows] for i in range(len(rows[0]["memory_gib"]))}
            self._line("memory", x["val"], per_rank, fresh["val"], "peak GPU memory per rank", "GiB")
        self.drawn = {"train": len(train), "val": len(val)}
        self._windows(history)
        return len(new["train"]) + len(new["val"])

    def _line(
        self, win: str, x: list, traces: dict[str, list], replace: bool, title: str, ylabel: str, percent: bool = False
    ) -> None:
        pane = {"win": win, "title": title, "ylabel": ylabel, "percent": percent}
        KINDS["lines"].draw(self.viz, self.env, pane, {"x": x, "traces": traces, "replace": replace})

    def _changed(self, win: str, content: Any) -> bool:
        if self.shown.get(win) == content:
            return False
        self.shown[win] = content
        return True

    def _windows(self, history: History) -> None:
        """Each window of another kind than lines: the latest record it draws, when that is new."""
        latest: dict[str, tuple[int, dict[str, Any]]] = {}
        for index, record in enumerate(history.records):
            latest[record.get("kind", "")] = (index, record)
        for pane in drawn_windows(record_kinds.panes_of(history.records), set(latest)):
            found = latest.get(pane["record"])
            if found is not None and self._changed(pane["win"], found[0]):
                KINDS[pane["kind"]].draw(self.viz, self.env, pane, found[1])

    def _status(self, history: History) -> None:
        rows = status_rows(history)
        if self._changed("status", rows):
            KINDS["table"].draw(
                self.viz, self.env, {"win": "status", "title": "status"}, {"rows": [list(row) for row in rows]}
            )


def status_rows(history: History) -> list[tuple[str, str]]:
    """Run name, state, progress, speed, time, best accuracy, world, and the key options."""
    options = history.options
    statuses, train = of_kind(history, "status"), of_kind(history, "train")
    start = next((r for r in reversed(statuses) if r["state"] in ("running", "restarted")), None)
    # The newest word: a resumed run's history keeps the "end" of the run it continues.
    last = next((r for r in reversed(history.records) if r.get("kind") in ("status", "end")), {"state": "running"})
    state = last.get("state", "finished")
    epochs = options.get("epochs", 0)
    progress = train[-1]["epoch_progress"] if train else 0.0
    rows = [
        ("run", f"{options.get('name', 'run')} ({history.run_id}, history generation {history.generation})"),
        ("state", state),
        ("progress", f"epoch {progress:.2f} of {epochs}, step {train[-1]['step'] if train else 0}"),
    ]
    if train:
        rows.append(("throughput", f"{train[-1].get('samples_per_s', 0):,.0f} samples/s"))
    sessions = training_sessions(history)
    if sessions:
        rows.append(("elapsed", _duration(sum(seconds for seconds, _ in sessions))))
        seconds, done = sessions[-1]  # the pace of the newest process start
        if state in ("running", "restarted") and done > 0 and epochs:
            rows.append(("time left (estimate)", _duration(seconds / done * max(0.0, epochs - progress))))
    best = best_of(history)
    if best is not None:
        rows.append(best)
    if start is not None:
        rows += [("world size", str(start.get("world_size", 1))), ("devices", str(start.get("devices", "")))]
    rows += [
        (key.replace("_", " "), str(options[key])) for key in KEY_OPTIONS if options.get(key) not in (None, "", [])
    ]
    return rows


def training_sessions(history: History) -> list[tuple[float, float]]:
    """(seconds, epochs) trained by each process start (a ``running``/``restarted`` status) that
    trained: from its status to its last train record. Measured from the newest start alone, a
    resume that had nothing left to do (its start newer than every point) showed a negative time."""
    sessions: list[tuple[dict[str, Any], dict[str, Any]]] = []
    start = None
    for record in history.records:
        if record.get("kind") == "status" and record["state"] in ("running", "restarted"):
            start = record
        elif record.get("kind") == "train" and start is not None:
            if sessions and sessions[-1][0] is start:
                sessions.pop()
            sessions.append((start, record))
    return [
        (max(0.0, last.get("time", time.time()) - first["time"]), last["epoch_progress"] - first.get("epoch", 0))
        for first, last in sessions
    ]


def best_of(history: History) -> tuple[str, str] | None:
    """("best validation <metric>", "value (epoch N)") of the run's best metric (``panes`` record)."""
    spec: dict[str, Any] = next(
        (r.get("best") for r in reversed(history.records) if r.get("kind") == "panes" and r.get("best")),
        {"metric": "acc", "mode": "max", "label": "accuracy", "percent": True},
    )
    val = [r for r in of_kind(history, "val") if isinstance(r.get(spec["metric"]), (int, float))]
    if not val:
        return None
    pick = max if spec.get("mode", "max") == "max" else min
    best = pick(val, key=lambda r: r[spec["metric"]])
    value = best[spec["metric"]]
    shown = f"{100 * value:.2f}%" if spec.get("percent") else f"{value:.4g}"
    return f"best validation {spec.get('label', spec['metric'])}", f"{shown} (epoch {best['epoch']})"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return (
        f"{seconds // 3600}h {seconds % 3600 // 60:02d}m {seconds % 60:02d}s"
        if seconds >= 3600
        else f"{seconds // 60}m {seconds % 60:02d}s"
    )


class ComparePlots:
    """Several runs' validation metrics, overlaid, with the run names in the legend: each
    validation pane of the runs' tasks gets one window (``compare_<pane>``) with its first metric."""

    def __init__(self, viz: Any, env: str = "phalanx-compare"):
        self.viz, self.env = viz, env
        self.shown: dict[str, tuple] = {}

    def update(self, histories: dict[str, History]) -> None:
        for label, history in sorted(histories.items()):
            val = of_kind(history, "val")
            panes = [p for p in line_panes(history) if p["record"] == "val"]
            content = tuple((r["epoch"], *(r.get(p["traces"][0][0]) for p in panes)) for r in val)
            if not val or self.shown.get(label) == content:
                continue
            x = [r["epoch"] for r in val]
            for pane in panes:
                key = pane["traces"][0][0]
                if not all(isinstance(r.get(key), (int, float)) for r in val):
                    continue
                scale = 100.0 if pane.get("percent") else 1.0
                win = f"compare_{pane['win']}"
                exists = self.viz.win_exists(win, env=self.env)
                self.viz.line(
                    X=x,
                    Y=[scale * r[key] for r in val],
                    win=win,
                    env=self.env,
                    name=label,
                    update="replace" if exists else None,
                    opts={
                        "title": pane.get("title", win),
                        "xlabel": "epoch",
                        "ylabel": pane.get("ylabel", ""),
                        "showlegend": True,
                        "width": WIDTH,
                        "height": HEIGHT,
                    },
                )
            self.shown[label] = content

"""Snapshots -> visdom windows. One env per run (``phalanx-<name>-<run id>``): a status pane, the
train loss, validation loss and accuracy (separate axes), learning rate, throughput, GPU memory,
the latest confusion matrix and per-class accuracy, and a grid of validation images with their
predictions. ``ComparePlots`` overlays several runs' validation curves in one env.

Line windows get only their new points (visdom appends); a new generation of the history (a
resume or restart) redraws them. The other windows show the latest epoch and are replaced.
"""

from __future__ import annotations

import base64
import html
import time
from typing import Any

from ..snapshots import History

WINDOWS = ("status", "train_loss", "val_loss", "val_acc", "lr", "throughput", "confusion", "per_class", "images")
KEY_OPTIONS = ("model", "dataset", "dataroot", "epochs", "batch_size", "lr", "optimizer", "lr_schedule", "precision",
               "augment", "gpu_ids", "weights", "ema_decay")


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
            self.env = self.fixed_env or env_name(history)
            self.key, self.drawn, self.shown = key, {"train": 0, "val": 0}, {}
        new_train, new_val = train[self.drawn["train"]:], val[self.drawn["val"]:]
        if new_train:
            x = [r["epoch_progress"] for r in new_train]
            fresh = self.drawn["train"] == 0
            self._line("train_loss", x, {"loss": [r["loss"] for r in new_train]}, fresh,
                       "train loss (mean over ranks)", "cross-entropy loss")
            self._line("lr", x, {"lr": [r["lr"] for r in new_train]}, fresh, "learning rate", "learning rate")
            self._line("throughput", x, {"samples/s": [r.get("samples_per_s", 0.0) for r in new_train]}, fresh,
                       "throughput (all ranks)", "samples / s")
        if new_val:
            x = [r["epoch"] for r in new_val]
            fresh = self.drawn["val"] == 0
            losses = {"val loss": [r["loss"] for r in new_val]}
            accuracy = {"val accuracy": [100 * r["acc"] for r in new_val]}
            if all("ema_acc" in r for r in new_val):
                losses["EMA val loss"] = [r["ema_loss"] for r in new_val]
                accuracy["EMA val accuracy"] = [100 * r["ema_acc"] for r in new_val]
            self._line("val_loss", x, losses, fresh, "validation loss", "cross-entropy loss")
            self._line("val_acc", x, accuracy, fresh, "validation accuracy (top-1)", "accuracy (%)",
                       ytickmin=0, ytickmax=100)
            if all("memory_gib" in r for r in new_val):
                per_rank = {f"rank {i}": [r["memory_gib"][i] for r in new_val] for i in range(len(new_val[0]["memory_gib"]))}
                self._line("memory", x, per_rank, fresh, "peak GPU memory per rank", "GiB")
        self.drawn = {"train": len(train), "val": len(val)}
        self._confusion(of_kind(history, "confusion"))
        self._images(of_kind(history, "images"))
        self._status(history)
        return len(new_train) + len(new_val)

    def _line(self, win: str, x: list, traces: dict[str, list], replace: bool, title: str, ylabel: str,
              **axes: Any) -> None:
        opts = {"title": title, "xlabel": "epoch", "ylabel": ylabel, "showlegend": True, **axes}
        for index, (name, y) in enumerate(traces.items()):
            # The first trace of a fresh window creates it; every other call appends.
            update = None if replace and index == 0 else "append"
            self.viz.line(X=x, Y=y, win=win, env=self.env, name=name, update=update, opts=opts)

    def _changed(self, win: str, content: Any) -> bool:
        if self.shown.get(win) == content:
            return False
        self.shown[win] = content
        return True

    def _confusion(self, records: list[dict[str, Any]]) -> None:
        if not records or not self._changed("confusion", records[-1]["epoch"]):
            return
        last = records[-1]
        classes, matrix = [str(c) for c in last["classes"]], last["matrix"]
        self.viz.heatmap(X=matrix, win="confusion", env=self.env, opts={
            "title": f"confusion matrix, epoch {last['epoch']}", "columnnames": classes, "rownames": classes,
            "xlabel": "predicted class", "ylabel": "true class"})
        accuracy = [100 * row[i] / max(1, sum(row)) for i, row in enumerate(matrix)]
        self.viz.bar(X=accuracy, win="per_class", env=self.env, opts={
            "title": f"accuracy per class, epoch {last['epoch']}", "rownames": classes, "ylabel": "accuracy (%)",
            "xlabel": "class"})

    def _images(self, records: list[dict[str, Any]]) -> None:
        if not records or not self._changed("images", records[-1]["epoch"]):
            return
        last = records[-1]
        cells = []
        for item in last["items"]:
            right = item["label"] == item["predicted"]
            data = base64.b64encode(item["png"]).decode()
            cells.append(f'<figure style="margin:4px;text-align:center"><img src="data:image/png;base64,{data}" '
                         f'style="width:64px;height:64px;image-rendering:pixelated"><figcaption style="font:12px '
                         f'sans-serif;color:{"#070" if right else "#b00"}">{html.escape(item["label"])} &rarr; '
                         f'{html.escape(item["predicted"])}</figcaption></figure>')
        shown = sum(i["label"] == i["predicted"] for i in last["items"])
        page = (f'<div class="phalanx-images"><b>validation images, epoch {last["epoch"]}</b> (true &rarr; predicted, '
                f'{shown} of {len(last["items"])} right)<div style="display:flex;flex-wrap:wrap">{"".join(cells)}'
                '</div></div>')
        self.viz.text(page, win="images", env=self.env, opts={"title": "validation images"})

    def _status(self, history: History) -> None:
        rows = status_rows(history)
        if not self._changed("status", rows):
            return
        table = "".join(f"<tr><th style='text-align:left;padding-right:12px'>{html.escape(k)}</th>"
                        f"<td>{html.escape(str(v))}</td></tr>" for k, v in rows)
        self.viz.text(f'<table class="phalanx-status">{table}</table>', win="status", env=self.env,
                      opts={"title": "status"})


def status_rows(history: History) -> list[tuple[str, str]]:
    """Run name, state, progress, speed, time, best accuracy, world, and the key options."""
    options = history.options
    statuses, train, val = of_kind(history, "status"), of_kind(history, "train"), of_kind(history, "val")
    start = next((r for r in reversed(statuses) if r["state"] in ("running", "restarted")), None)
    state = "finished" if of_kind(history, "end") else statuses[-1]["state"] if statuses else "running"
    epochs = options.get("epochs", 0)
    progress = train[-1]["epoch_progress"] if train else 0.0
    rows = [("run", f"{options.get('name', 'run')} ({history.run_id}, history generation {history.generation})"),
            ("state", state),
            ("progress", f"epoch {progress:.2f} of {epochs}, step {train[-1]['step'] if train else 0}")]
    if train:
        rows.append(("throughput", f"{train[-1].get('samples_per_s', 0):,.0f} samples/s"))
    if start is not None and train:
        elapsed = train[-1].get("time", time.time()) - start["time"]
        done = progress - start.get("epoch", 0)
        rows.append(("elapsed", _duration(elapsed)))
        if state in ("running", "restarted") and done > 0 and epochs:
            rows.append(("time left (estimate)", _duration(elapsed / done * max(0.0, epochs - progress))))
    if val:
        best = max(val, key=lambda r: r["acc"])
        rows.append(("best validation accuracy", f"{100 * best['acc']:.2f}% (epoch {best['epoch']})"))
    if start is not None:
        rows += [("world size", str(start.get("world_size", 1))), ("devices", str(start.get("devices", "")))]
    rows += [(key.replace("_", " "), str(options[key])) for key in KEY_OPTIONS if options.get(key) not in (None, "", [])]
    return rows


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m {seconds % 60:02d}s" if seconds >= 3600 else \
        f"{seconds // 60}m {seconds % 60:02d}s"


class ComparePlots:
    """Several runs' validation accuracy and loss, overlaid, with the run names in the legend."""

    def __init__(self, viz: Any, env: str = "phalanx-compare"):
        self.viz, self.env = viz, env
        self.shown: dict[str, tuple] = {}

    def update(self, histories: dict[str, History]) -> None:
        for label, history in sorted(histories.items()):
            val = of_kind(history, "val")
            content = tuple((r["epoch"], r["acc"], r["loss"]) for r in val)
            if not val or self.shown.get(label) == content:
                continue
            x = [r["epoch"] for r in val]
            for win, title, ylabel, y in (
                    ("compare_val_acc", "validation accuracy (top-1)", "accuracy (%)", [100 * r["acc"] for r in val]),
                    ("compare_val_loss", "validation loss", "cross-entropy loss", [r["loss"] for r in val])):
                exists = self.viz.win_exists(win, env=self.env)
                self.viz.line(X=x, Y=y, win=win, env=self.env, name=label, update="replace" if exists else None,
                              opts={"title": title, "xlabel": "epoch", "ylabel": ylabel, "showlegend": True})
            self.shown[label] = content

"""Dashboard window kinds, each declared once: the record kind it draws, what such a record must
hold (the snapshot loader checks it before anything reads it) and how ``visualize`` draws it.

A task's panes name a kind (``{"win": ..., "kind": "matrix", "record": "confusion"}``; a pane
without one is ``lines``). A record of a kind's ``record`` that no pane names is drawn in the
kind's default windows, so old snapshots and tasks that name no window still show it. Adding a
kind is a class here and an entry in ``KINDS``: the writer, the loader and ``visualize`` read it
from this table. Standard library only; ``viz`` is a visdom client, passed in.

Line windows are the one kind drawn point by point (visdom appends; ``visualize.plots`` keeps
what it drew), from ``train`` and ``val`` records, whose own fields ``records`` declares.
"""

from __future__ import annotations

import base64
from typing import Any


def escape(text: str) -> str:
    """``html.escape``, imported where a window is drawn: html's entity table (4 ms) is not on a
    training process's way to its first step (benchmarks/first_step.py --profile)."""
    import html

    return html.escape(text)


# Every window has the same size, so visdom's grid packs them without overlap at any page width.
WIDTH, HEIGHT = 440, 330


class WindowKind:
    """One kind of window: drawn from the latest record of ``record``."""

    name = ""
    record: str | None = None  # the record kind drawn; None: a line window (train/val records)
    fields: dict[str, type | tuple[type, ...]] = {}  # what such a record must hold besides its kind
    defaults: tuple[dict[str, str], ...] = ()  # windows drawn when no pane names this kind's record

    def check(self, index: int, record: dict[str, Any]) -> None:
        """Raise ValueError when ``record`` lacks what ``draw`` reads (beyond ``fields``)."""

    def draw(self, viz: Any, env: str, pane: dict[str, Any], record: dict[str, Any]) -> None:
        raise NotImplementedError


class Lines(WindowKind):
    name = "lines"

    def draw(self, viz: Any, env: str, pane: dict[str, Any], record: dict[str, Any]) -> None:
        """``record``: ``{"x": [...], "traces": {label: [...]}, "replace": bool}``, the new points."""
        opts = {
            "title": pane.get("title", pane["win"]),
            "xlabel": "epoch",
            "ylabel": pane.get("ylabel", ""),
            "showlegend": True,
            "width": WIDTH,
            "height": HEIGHT,
            **({"ytickmin": 0, "ytickmax": 100} if pane.get("percent") else {}),
        }
        for index, (name, y) in enumerate(record["traces"].items()):
            # The first trace of a fresh window creates it; every other call appends.
            update = None if record["replace"] and index == 0 else "append"
            viz.line(X=record["x"], Y=y, win=pane["win"], env=env, name=name, update=update, opts=opts)


class Matrix(WindowKind):
    """A square matrix of counts with its row and column names (a confusion matrix)."""

    name = "matrix"
    record = "confusion"
    fields = {"epoch": int, "matrix": list, "classes": list}
    defaults: tuple[dict[str, str], ...] = (
        {"win": "confusion", "kind": "matrix", "title": "confusion matrix"},
        {"win": "per_class", "kind": "row_shares", "title": "accuracy per class"},
    )

    def check(self, index: int, record: dict[str, Any]) -> None:
        classes, matrix = record["classes"], record["matrix"]
        if len(matrix) != len(classes) or not all(
            isinstance(row, list) and len(row) == len(classes) and all(type(v) is int for v in row) for row in matrix
        ):
            raise ValueError(f"record {index} ({record['kind']}) is not a square matrix of counts")

    def draw(self, viz: Any, env: str, pane: dict[str, Any], record: dict[str, Any]) -> None:
        if not record["classes"]:
            return  # visdom's heatmap refuses an empty matrix
        names = [str(c) for c in record["classes"]]
        viz.heatmap(
            X=record["matrix"],
            win=pane["win"],
            env=env,
            opts={
                "title": f"{pane.get('title', 'confusion matrix')}, epoch {record['epoch']}",
                "columnnames": names,
                "rownames": names,
                "xlabel": "predicted class",
                "ylabel": "true class",
                "width": WIDTH,
                "height": HEIGHT,
            },
        )


class RowShares(Matrix):
    """A bar per row of the matrix: its diagonal share (per-class accuracy), in percent."""

    name = "row_shares"
    defaults = ()

    def draw(self, viz: Any, env: str, pane: dict[str, Any], record: dict[str, Any]) -> None:
        if not record["classes"]:
            return
        names = [str(c) for c in record["classes"]]
        heights = [100 * row[i] / max(1, sum(row)) for i, row in enumerate(record["matrix"])]
        title = f"{pane.get('title', 'accuracy per class')}, epoch {record['epoch']}"
        # visdom's ``bar`` squeezes its input, so a single bar (a one-class run) fails its own "X
        # should be one or two-dimensional": the plotly trace is sent as it is.
        layout = {
            "title": title,
            "showlegend": False,
            "margin": {"l": 60, "r": 60, "t": 60, "b": 60},
            "xaxis": {"title": "class", "type": "category"},
            "yaxis": {"title": "accuracy (%)"},
        }
        viz._send(
            {
                "data": [{"x": names, "y": heights, "type": "bar"}],
                "win": pane["win"],
                "eid": env,
                "layout": layout,
                "opts": {"title": title, "width": WIDTH, "height": HEIGHT},
            }
        )


class Images(WindowKind):
    """A grid of captioned PNGs (``records.images_item``), green or red where right or wrong."""

    name = "images"
    record = "images"
    fields = {"epoch": int, "items": list}
    defaults = ({"win": "images", "kind": "images"},)

    def check(self, index: int, record: dict[str, Any]) -> None:
        for item in record["items"]:
            if not (
                isinstance(item, dict)
                and isinstance(item.get("png"), bytes)
                and (
                    isinstance(item.get("caption"), str)
                    or isinstance(item.get("label"), str)
                    and isinstance(item.get("predicted"), str)
                )
            ):
                raise ValueError(f"record {index} (images) has an item without png bytes and a caption")

    def draw(self, viz: Any, env: str, pane: dict[str, Any], record: dict[str, Any]) -> None:
        cells = []
        for item in record["items"]:
            caption = item.get("caption") or f"{item['label']} \u2192 {item['predicted']}"
            ok = item.get("ok", item.get("label") == item.get("predicted") if "label" in item else None)
            color = "#333" if ok is None else "#070" if ok else "#b00"
            data = base64.b64encode(item["png"]).decode()
            cells.append(
                f'<figure style="margin:4px;text-align:center"><img src="data:image/png;base64,{data}" '
                f'style="height:64px;image-rendering:pixelated"><figcaption style="font:12px '
                f'sans-serif;color:{color}">{escape(caption)}</figcaption></figure>'
            )
        title = str(record.get("title") or pane.get("title") or "validation images (true \u2192 predicted)")
        right = [item for item in record["items"] if "ok" in item or "label" in item]
        shown = sum(item.get("ok", item.get("label") == item.get("predicted")) for item in right)
        tally = f" ({shown} of {len(right)} right)" if right else ""
        page = (
            f'<div class="phalanx-images"><b>{escape(title)}, epoch {record["epoch"]}</b>{tally}'
            f'<div style="display:flex;flex-wrap:wrap">{"".join(cells)}</div></div>'
        )
        viz.text(
            page, win=pane["win"], env=env, opts={"title": title.split(" (")[0], "width": 2 * WIDTH, "height": HEIGHT}
        )


class Table(WindowKind):
    """Rows of (name, value): the status pane, or a task's ``table`` record."""

    name = "table"
    record = "table"
    fields = {"epoch": int, "rows": list}

    def check(self, index: int, record: dict[str, Any]) -> None:
        if not all(isinstance(row, list) and len(row) == 2 for row in record["rows"]):
            raise ValueError(f"record {index} (table) has a row that is not [name, value]")

    def draw(self, viz: Any, env: str, pane: dict[str, Any], record: dict[str, Any]) -> None:
        table = "".join(
            f"<tr><th style='text-align:left;padding-right:12px'>{escape(str(k))}</th><td>{escape(str(v))}</td></tr>"
            for k, v in record["rows"]
        )
        viz.text(
            f'<table class="phalanx-{escape(pane["win"])}">{table}</table>',
            win=pane["win"],
            env=env,
            opts={"title": pane.get("title", pane["win"]), "width": WIDTH, "height": HEIGHT},
        )


class Text(WindowKind):
    """Plain text a task writes (a ``text`` record), shown escaped, line breaks kept."""

    name = "text"
    record = "text"
    fields = {"epoch": int, "text": str}

    def draw(self, viz: Any, env: str, pane: dict[str, Any], record: dict[str, Any]) -> None:
        viz.text(
            f"<pre>{escape(record['text'][:100_000])}</pre>",
            win=pane["win"],
            env=env,
            opts={
                "title": f"{pane.get('title', pane['win'])}, epoch {record['epoch']}",
                "width": WIDTH,
                "height": HEIGHT,
            },
        )


KINDS: dict[str, WindowKind] = {kind.name: kind for kind in (Lines(), Matrix(), RowShares(), Images(), Table(), Text())}

#: Each record kind that windows draw -> the first kind declaring it (its fields, check and defaults).
RECORDS: dict[str, WindowKind] = {}
for _kind in KINDS.values():
    if _kind.record:
        RECORDS.setdefault(_kind.record, _kind)


def window(win: str, kind: str, title: str, record: str | None = None) -> dict[str, Any]:
    """A pane of another kind than lines: ``kind`` draws the latest ``record`` (its default record kind)."""
    if kind not in KINDS or kind == "lines":
        raise ValueError(f"window kinds are {', '.join(k for k in KINDS if k != 'lines')} (got {kind!r})")
    return {"win": win, "kind": kind, "title": title, "record": record or KINDS[kind].record}


def drawn_windows(panes: list[dict[str, Any]], record_kinds: set[str]) -> list[dict[str, Any]]:
    """The panes of other kinds than lines, and the default windows of each record kind present that
    no pane names (old snapshots; tasks that name no window)."""
    named = [p for p in panes if p.get("kind", "lines") != "lines" and p.get("kind") in KINDS]
    covered = {p.get("record") for p in named}
    defaults = [
        {**d, "record": kind.record}
        for kind in RECORDS.values()
        if kind.record in record_kinds and kind.record not in covered
        for d in kind.defaults
    ]
    return named + defaults

"""The records package: the kinds of record (this module), the dashboard's windows (``windows``),
the snapshots (``snapshots``), their pictures (``pictures``) and copies to remote storage
(``remote``). May import the configuration and the base modules; importing it imports no torch.

The kinds of record a run writes, defined once: for the trainer that writes them (metrics.jsonl
and the snapshots), the snapshot loader that checks them, and ``visualize`` that plots them.

Records are flat plain-data dicts with a ``kind``. ``train`` records carry the task's named
losses (averaged over ranks), ``val`` records its validation metrics; which keys go on which axes
is said by the run's ``panes`` record, written once at the start, so a new task's losses and
metrics appear on the dashboard without any change to ``visualize``. Standard library only.

Schema 3 adds ``panes`` and the named losses and metrics; a snapshot of schema 1 or 2 (written
when phalanx trained classifiers only) has no ``panes`` record and is shown as a classification run.
"""

from __future__ import annotations

from typing import Any

from .windows import RECORDS

SCHEMA = 3
READABLE_SCHEMAS = (1, 2, 3)
NUMBER = (int, float)
#: Where a training step's time goes (``phalanx.train.step_times``), and the keys of a ``train``
#: record that hold each part's seconds per step.
STEP_PARTS = ("data", "compute", "communication", "optimizer", "logging")
STEP_TIME_KEYS = tuple(f"step_{part}_s" for part in STEP_PARTS)

#: What a reader may rely on in each kind of record (others are passed through unread).
FIELDS: dict[str, dict[str, Any]] = {
    "train": {"epoch": int, "step": int, "epoch_progress": NUMBER, "lr": NUMBER},
    "val": {"epoch": int},
    "status": {"state": str, "time": NUMBER},
    **{name: kind.fields for name, kind in RECORDS.items()},  # what the dashboard's windows draw
    "panes": {"panes": list},
    "first_step": {"time": NUMBER},
    "end": {},
}

#: Keys of ``train`` and ``val`` records that are not a task's losses or metrics.
RESERVED = frozenset(
    {
        "kind",
        "epoch",
        "step",
        "epoch_progress",
        "lr",
        "lrs",
        "samples_per_s",
        "samples",
        "seconds",
        "time",
        "world_size",
        "memory_gib",
        "epochs",
        "state",
        *STEP_TIME_KEYS,
    }
)


def _pane(win: str, title: str, ylabel: str, record: str, traces: list[list[str]], percent: bool = False) -> dict:
    return {"win": win, "title": title, "ylabel": ylabel, "record": record, "traces": traces, "percent": percent}


#: The panes of every snapshot before schema 3 (which only classifiers wrote); a classifier's today.
SCHEMA_2_PANES = [
    _pane("train_loss", "train loss (mean over ranks)", "cross-entropy loss", "train", [["loss", "loss"]]),
    _pane(
        "val_loss", "validation loss", "cross-entropy loss", "val", [["loss", "val loss"], ["ema_loss", "EMA val loss"]]
    ),
    _pane(
        "val_acc",
        "validation accuracy (top-1)",
        "accuracy (%)",
        "val",
        [["acc", "val accuracy"], ["ema_acc", "EMA val accuracy"]],
        percent=True,
    ),
]


def check(index: int, record: Any) -> None:
    """Raise ValueError when a record lacks what readers rely on."""
    if not isinstance(record, dict) or not isinstance(record.get("kind"), str):
        raise ValueError(f"record {index} is not a mapping with a 'kind'")
    kind = record["kind"]
    for key, expected in FIELDS.get(kind, {}).items():
        value = record.get(key)
        if not isinstance(value, expected) or isinstance(value, bool):
            raise ValueError(f"record {index} ({kind}) has no {key!r} of the right type")
    if kind in ("train", "val"):  # a task's losses and metrics: numbers, plotted as they are
        for key, value in record.items():
            if key not in RESERVED and (not isinstance(value, NUMBER) or isinstance(value, bool)):
                raise ValueError(f"record {index} ({kind}) has {key!r} that is not a number")
    if kind in RECORDS:
        RECORDS[kind].check(index, record)
    elif kind == "panes":
        for pane in record["panes"]:
            if not (isinstance(pane, dict) and isinstance(pane.get("win"), str) and _pane_ok(pane)):
                raise ValueError(f"record {index} (panes) has a pane without a window, a record kind and traces")


def _pane_ok(pane: dict[str, Any]) -> bool:
    """A line pane plots keys of train or val records; a pane of another kind names it and its record
    (a kind this phalanx does not know is left undrawn, not refused: a newer run's snapshot)."""
    if pane.get("kind", "lines") != "lines":
        return isinstance(pane.get("kind"), str) and isinstance(pane.get("record"), str)
    return (
        pane.get("record") in ("train", "val")
        and isinstance(pane.get("traces"), list)
        and all(isinstance(t, list) and len(t) == 2 and all(isinstance(s, str) for s in t) for t in pane["traces"])
    )


def panes_of(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The run's line panes (its last ``panes`` record; a classification run's before schema 3)."""
    for record in reversed(records):
        if isinstance(record, dict) and record.get("kind") == "panes":
            return record["panes"]
    return SCHEMA_2_PANES


def images_item(png: bytes, caption: str, ok: bool | None = None) -> dict[str, Any]:
    """One image of an ``images`` record (``ok``: shown green or red, or neither)."""
    item: dict[str, Any] = {"png": png, "caption": caption}
    if ok is not None:
        item["ok"] = ok
    return item

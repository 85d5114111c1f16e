"""Which checkpoint is ``best.pt``: the validation metric that picks it (the task's, or
``--best-metric``), its direction, and the best value so far."""

from __future__ import annotations

import math
from typing import Any

from ..errors import PhalanxError
from ..tasks.base import Declaration


class Best:
    """The validation metric that picks ``best.pt``, its direction, and the best value so far."""

    def __init__(self, declared: Declaration, asked: str | None):
        name, mode = declared.best_metric
        if asked:
            name, _, given_mode = asked.partition(":")
            known = list(declared.metrics)
            known += [f"ema_{k}" for k in known]
            if name not in known:
                raise PhalanxError(
                    f"this task's validation metrics are {', '.join(known)} (got {name!r})", "--best-metric"
                )
            mode = given_mode or (
                declared.best_metric[1]
                if name.removeprefix("ema_") == declared.best_metric[0]
                else "min"
                if any(w in name.lower() for w in ("loss", "l1", "l2", "error"))
                else "max"
            )
            if mode not in ("max", "min"):
                raise PhalanxError(f"the direction after ':' is max or min (got {mode!r})", "--best-metric")
        self.name, self.mode = name, mode
        self.value: float | None = None

    def improves(self, metrics: dict[str, float]) -> bool:
        value = metrics[self.name]
        if not math.isfinite(value):
            return False
        if self.value is None or (value > self.value if self.mode == "max" else value < self.value):
            self.value = value
            return True
        return False

    def state(self) -> dict[str, Any]:
        return {"metric": self.name, "mode": self.mode, "value": self.value}

    def spec(self, declared: Declaration, panes: list[dict[str, Any]]) -> dict[str, Any]:
        """How the dashboard names and shows it (the ``panes`` record's ``best``)."""
        bare = self.name.removeprefix("ema_")
        percent = any(
            pane.get("percent")
            for pane in panes
            if pane["record"] == "val" and any(key == bare for key, _ in pane["traces"])
        )
        label = declared.label(bare)
        return {
            "metric": self.name,
            "mode": self.mode,
            "percent": percent,
            "label": f"EMA {label}" if self.name.startswith("ema_") else label,
        }

    def restore(self, state: dict[str, Any]) -> None:
        if state.get("metric") == self.name:  # another --best-metric starts its own record
            self.value = state.get("value")

"""Tasks: what phalanx trains. A task owns its data, models, losses, steps, metrics and dashboard
panes (``base.Task``); the trainer runs any of them the same way. Each built-in task is a folder
(``classify/``, ``translate/``, ``deepliif/``, ``selfsupervised/``, ``detect/``, ``segment/``) whose
``__init__`` declares it to the registry (``phalanx.config.registry``).

This module is the API a task of your own imports, loaded (with torch) on first use: ``from
phalanx.tasks import Task, TaskData, ...``.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """``from phalanx.tasks import Task, TaskData, Inference, pane, window, images_item, png, strip,
    denormalize``: the API, imported (with torch) on first use. ``window`` is a pane of another kind
    than lines (``phalanx.records.windows.KINDS``); the last four make a ``visuals`` record's pictures."""
    if name in ("Task", "TaskData", "Evaluation", "Declaration", "pane", "RunContext", "StepContext", "Pending"):
        from . import base

        return getattr(base, name)
    if name in ("Inference", "Predictor", "Trained"):
        from . import inference

        return getattr(inference, name)
    if name in ("png", "strip", "denormalize"):
        from ..records import pictures

        return getattr(pictures, name)
    if name == "images_item":
        from ..records import images_item

        return images_item
    if name == "option":
        from ..config.fields import option

        return option
    if name == "PhalanxError":
        from ..errors import PhalanxError

        return PhalanxError
    if name == "window":
        from ..records.windows import window

        return window
    raise AttributeError(name)

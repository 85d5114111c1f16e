"""Tasks: what phalanx trains. A task owns its data, models, losses, steps, metrics and dashboard
panes (``base.Task``); the trainer runs any of them the same way. Each built-in task is a folder
(``classify/``, ``translate/``, ``deepliif/``, ``selfsupervised/``, ``detect/``, ``segment/``) whose
``__init__`` declares it to the registry (``phalanx.config.registry``); beside them the contract
(``base``, ``contract``: what a task declares and what it is lent), ``inference`` (evaluate,
predict and export's parts) and ``features`` (any task's ``predict --features``).

May import models, checkpoint, distributed, data, records, config and the base; the task folders
stand apart (DeepLIIF's builds on pix2pix's alone), and nothing outside ``tasks/`` imports one:
the registry finds them by name (``setup.cfg``'s contracts).

This module is the API a task of your own imports, loaded (with torch) on first use: ``from
phalanx.tasks import Task, TaskData, ...``; ``__all__`` lists it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names as a type checker sees them (at run time: on first use, below)
    from ..config.fields import option
    from ..errors import PhalanxError
    from ..records import images_item
    from ..records.pictures import denormalize, png, strip
    from ..records.windows import window
    from .base import (
        Batch,
        Declaration,
        Evaluation,
        Pending,
        Plain,
        PlainRecord,
        RunContext,
        StepContext,
        StepLosses,
        Task,
        TaskData,
        Visuals,
        pane,
    )
    from .inference import Inference, Predictor, Trained

# Each name of the API -> the module that holds it (relative to this package).
_WHERE = {
    **dict.fromkeys(
        (
            "Task",
            "TaskData",
            "Evaluation",
            "Declaration",
            "pane",
            "RunContext",
            "StepContext",
            "Pending",
            "Batch",
            "Plain",
            "PlainRecord",
            "StepLosses",
            "Visuals",
        ),
        ".base",
    ),
    **dict.fromkeys(("Inference", "Predictor", "Trained"), ".inference"),
    **dict.fromkeys(("png", "strip", "denormalize"), "..records.pictures"),
    "images_item": "..records",
    "window": "..records.windows",
    "option": "..config.fields",
    "PhalanxError": "..errors",
}
__all__ = [
    "Batch",
    "Declaration",
    "Evaluation",
    "Inference",
    "Pending",
    "PhalanxError",
    "Plain",
    "PlainRecord",
    "Predictor",
    "RunContext",
    "StepContext",
    "StepLosses",
    "Task",
    "TaskData",
    "Trained",
    "Visuals",
    "denormalize",
    "images_item",
    "option",
    "pane",
    "png",
    "strip",
    "window",
]  # (the keys of _WHERE: tests/test_contract.py checks it)


def __getattr__(name: str) -> Any:
    """The API, imported (with torch) on first use. ``window`` is a pane of another kind than lines
    (``phalanx.records.windows.KINDS``); ``images_item``, ``png``, ``strip`` and ``denormalize``
    make a ``visuals`` record's pictures; ``option`` a field of a task's ``Options``."""
    if name not in _WHERE:
        raise AttributeError(f"module 'phalanx.tasks' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name], __name__), name)


def __dir__() -> list[str]:
    return __all__

"""Classification: the folder's declaration, which the task registry reads (``SPECS``). Standard
library only, so ``phalanx --help`` reads it without torch; the task's code is imported when a run
starts."""

from __future__ import annotations

from ...config.registry import TaskInfo
from .options import ClassifyOptions, classifier_lr

SPECS = (
    TaskInfo(
        "classify",
        "Classification (--task classify)",
        "image classification: one network, cross-entropy, accuracy",
        ClassifyOptions,
        "phalanx.tasks.classify.task:ClassifyTask",
        adapt=classifier_lr,
        predicts=".csv, .jsonl or - (JSON lines on stdout)",
    ),
)

"""Object detection on COCO-format data (torchvision's detectors, LitDet's job): the folder's
declaration, which the task registry reads (``SPECS``). Standard library only, so ``phalanx --help``
reads it without torch; the task's code is imported when a run starts."""

from __future__ import annotations

from ...config.registry import TaskInfo
from .options import DetectOptions

SPECS = (
    TaskInfo(
        "detect",
        "Detection (--task detect)",
        "object detection on COCO-format data (LitDet's job)",
        DetectOptions,
        "phalanx.tasks.detect.task:DetectTask",
        # torchvision's detection reference: SGD 0.9, weight decay 1e-4; LitDet's warmup.
        {
            "model": "fasterrcnn_mobilenet_v3_large_320_fpn",
            "lr": 0.01,
            "momentum": 0.9,
            "weight_decay": 1e-4,
            "batch_size": 4,
            "warmup_epochs": 1.0,
        },
        predicts=".json",
        unused={"drop_path": "torchvision's detectors have no stochastic depth"},
    ),
)

"""Semantic segmentation on image + mask pairs: the folder's declaration, which the task registry reads
(``SPECS``). Standard library only, so ``phalanx --help`` reads it without torch; the task's code is
imported when a run starts."""

from __future__ import annotations

from ...config.registry import TaskInfo
from .options import SegmentOptions

SPECS = (
    TaskInfo(
        "segment",
        "Segmentation (--task segment)",
        "semantic segmentation on image + mask pairs",
        SegmentOptions,
        "phalanx.tasks.segment.task:SegmentTask",
        # torchvision's segmentation reference: SGD 0.9, weight decay 1e-4.
        {
            "model": "lraspp_mobilenet_v3_large",
            "lr": 0.01,
            "momentum": 0.9,
            "weight_decay": 1e-4,
            "batch_size": 8,
            "image_size": 256,
        },
        predicts="a folder",
        unused={"drop_path": "torchvision's segmenters have no stochastic depth"},
    ),
)

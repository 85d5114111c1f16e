"""Paired image-to-image translation with GANs (pix2pix): the folder's declaration, which the task
registry reads (``SPECS``). Standard library only, so ``phalanx --help`` reads it without torch; the
task's code is imported when a run starts."""

from __future__ import annotations

from ...config.registry import TaskInfo
from .options import TranslateOptions

SPECS = (
    TaskInfo(
        "translate",
        "Translation (--task translate)",
        "paired image-to-image translation with GANs (pix2pix, DeepLIIF)",
        TranslateOptions,
        "phalanx.tasks.translate.task:TranslateTask",
        # pix2pix's recipe: Adam(2e-4, beta1 0.5), constant then linearly to zero, batch 1, 256 px.
        {
            "lr": 2e-4,
            "optimizer": "adam",
            "betas": (0.5, 0.999),
            "weight_decay": 0.0,
            "lr_schedule": "linear",
            "batch_size": 1,
            "image_size": 256,
            "model": "pix2pix",
        },
        unused={
            "model": "its networks are pix2pix's: --generator, --ngf, --ndf, --d-layers, --norm",
            "drop_path": "pix2pix's networks have no stochastic depth",
        },
        aka="pix2pix",
        predicts="a folder",
    ),
)

"""DeepLIIF's model: the folder's declaration, which the task registry reads (``SPECS``). Standard
library only, so ``phalanx --help`` reads it without torch; the task's code is imported when a run
starts."""

from __future__ import annotations

from ...config.registry import TaskInfo
from .options import DeepLIIFOptions

SPECS = (
    TaskInfo(
        "deepliif",
        "DeepLIIF (--task deepliif)",
        "DeepLIIF's model: modalities and a segmentation from an IHC image, and their networks' files",
        DeepLIIFOptions,
        "phalanx.tasks.deepliif.task:DeepLIIFTask",
        # deepliif train's recipe: Adam(2e-4, beta1 0.5), constant then linearly to zero, batch 1, 512 px.
        {
            "lr": 2e-4,
            "optimizer": "adam",
            "betas": (0.5, 0.999),
            "weight_decay": 0.0,
            "lr_schedule": "linear",
            "batch_size": 1,
            "image_size": 512,
            "model": "deepliif",
        },
        unused={
            "model": "its networks are DeepLIIF's: --net-g, --net-gs, --ngf, --ndf, --d-layers, --norm",
            "drop_path": "DeepLIIF's networks have no stochastic depth",
        },
        predicts="a folder",
        exports="deepliif",
        reads_folders="phalanx.tasks.deepliif.model_dir:trained_from",
        folders_words="a DeepLIIF model directory (train_opt.txt and its networks' files)",
        weights_options="phalanx.tasks.deepliif.train_opt:weights_options",
        prepares="phalanx.tasks.deepliif.prepare:prepare_training_data",
        prepares_words="DeepLIIF's raw layout: NAME_IHC.png and its NAME_Hematoxylin, _DAPI, _Lap2, _Marker "
        "and _Seg images (any name holding IHC; its partners the same name with IHC replaced), joined side "
        "by side as `deepliif prepare-training-data` joins them",
    ),
)

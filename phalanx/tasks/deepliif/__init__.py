"""DeepLIIF's models: the folder's declaration, which the task registry reads (``SPECS``). Standard
library only, so ``phalanx --help`` reads it without torch; the task's code is imported when a run
starts."""

from __future__ import annotations

from ...config.registry import TaskInfo
from .options import CycleGANOptions, DeepLIIFExtOptions, DeepLIIFKDOptions, DeepLIIFOptions, SDGOptions

# deepliif train's recipe: Adam(2e-4, beta1 0.5), constant then linearly to zero, batch 1, 512 px.
DEEPLIIF_RECIPE = {
    "lr": 2e-4,
    "optimizer": "adam",
    "betas": (0.5, 0.999),
    "weight_decay": 0.0,
    "lr_schedule": "linear",
    "batch_size": 1,
    "image_size": 512,
}
DEEPLIIF_UNUSED = {
    "model": "its networks are DeepLIIF's: --net-g, --net-gs, --ngf, --ndf, --d-layers, --norm",
    "drop_path": "DeepLIIF's networks have no stochastic depth",
}

SPECS = (
    TaskInfo(
        "deepliif",
        "DeepLIIF (--task deepliif)",
        "DeepLIIF's model: modalities and a segmentation from an IHC image, and their networks' files",
        DeepLIIFOptions,
        "phalanx.tasks.deepliif.task:DeepLIIFTask",
        {**DEEPLIIF_RECIPE, "model": "deepliif"},
        unused=DEEPLIIF_UNUSED,
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
    TaskInfo(
        "deepliif-ext",
        "DeepLIIFExt (--task deepliif-ext)",
        "DeepLIIFExt: any number of modalities from an image, each with its own segmentation",
        DeepLIIFExtOptions,
        "phalanx.tasks.deepliif.ext:DeepLIIFExtTask",
        {**DEEPLIIF_RECIPE, "model": "deepliif-ext"},
        unused=DEEPLIIF_UNUSED,
        predicts="a folder",
        exports="deepliif",
    ),
    TaskInfo(
        "sdg",
        "SDG (--task sdg)",
        "DeepLIIF's synthetic data generation: modalities from one or more input panels",
        SDGOptions,
        "phalanx.tasks.deepliif.sdg:SDGTask",
        {**DEEPLIIF_RECIPE, "model": "sdg"},
        unused=DEEPLIIF_UNUSED,
        predicts="a folder",
        exports="deepliif",
    ),
    TaskInfo(
        "deepliif-kd",
        "DeepLIIFKD (--task deepliif-kd)",
        "DeepLIIFKD: DeepLIIF's model distilled from a trained DeepLIIF model directory (--teacher DIR)",
        DeepLIIFKDOptions,
        "phalanx.tasks.deepliif.kd:DeepLIIFKDTask",
        {**DEEPLIIF_RECIPE, "model": "deepliif-kd"},
        unused=DEEPLIIF_UNUSED,
        predicts="a folder",
        exports="deepliif",
        weights_options="phalanx.tasks.deepliif.train_opt:weights_options",
    ),
    TaskInfo(
        "cyclegan",
        "CycleGAN (--task cyclegan)",
        "DeepLIIF's CycleGAN: unpaired translation from trainA/ into each of trainB1/ ... trainBm/",
        CycleGANOptions,
        "phalanx.tasks.deepliif.cyclegan:CycleGANTask",
        {**DEEPLIIF_RECIPE, "model": "cyclegan"},
        unused=DEEPLIIF_UNUSED,
        predicts="a folder",
        exports="deepliif",
    ),
)

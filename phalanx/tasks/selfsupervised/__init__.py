"""Self-supervised pretraining, eight methods (Lightly's job): the folder's declaration, which the task
registry reads (``SPECS``). Standard library only, so ``phalanx --help`` reads it without torch; the
task's code is imported when a run starts."""

from __future__ import annotations

from ...config.registry import TaskInfo
from .options import (
    BarlowTwinsOptions,
    BYOLOptions,
    DINOOptions,
    MoCoOptions,
    SimCLROptions,
    SimSiamOptions,
    SwAVOptions,
    VICRegOptions,
)

SPECS = (
    TaskInfo(
        "simclr",
        "Self-supervised: SimCLR (--task simclr)",
        "contrastive pretraining, negatives from the global batch (Lightly's job)",
        SimCLROptions,
        "phalanx.tasks.selfsupervised.simclr:SimCLRTask",
        {"optimizer": "sgd", "lr": 0.06, "momentum": 0.9, "weight_decay": 5e-4},
        predicts=".npy",
    ),
    TaskInfo(
        "byol",
        "Self-supervised: BYOL (--task byol)",
        "pretraining with a momentum teacher, no negatives",
        BYOLOptions,
        "phalanx.tasks.selfsupervised.byol:BYOLTask",
        {"optimizer": "sgd", "lr": 0.06, "momentum": 0.9, "weight_decay": 5e-4},
        predicts=".npy",
    ),
    TaskInfo(
        "moco",
        "Self-supervised: MoCo (--task moco)",
        "contrastive pretraining against a queue of a momentum encoder's keys (MoCo v2)",
        MoCoOptions,
        "phalanx.tasks.selfsupervised.moco:MoCoTask",
        {"optimizer": "sgd", "lr": 0.06, "momentum": 0.9, "weight_decay": 5e-4},
        predicts=".npy",
    ),
    TaskInfo(
        "dino",
        "Self-supervised: DINO (--task dino)",
        "self-distillation with a momentum teacher, a centre and multi-crop views",
        DINOOptions,
        "phalanx.tasks.selfsupervised.dino:DINOTask",
        {"optimizer": "sgd", "lr": 0.06, "momentum": 0.9, "weight_decay": 5e-4},
        unused={"crop_scale": "DINO's crops take --global-scale and --local-scale"},
        predicts=".npy",
    ),
    TaskInfo(
        "swav",
        "Self-supervised: SwAV (--task swav)",
        "online clustering: swapped predictions of Sinkhorn-Knopp codes over the global batch",
        SwAVOptions,
        "phalanx.tasks.selfsupervised.swav:SwAVTask",
        {"optimizer": "sgd", "lr": 0.06, "momentum": 0.9, "weight_decay": 5e-4},
        unused={"crop_scale": "SwAV's crops take --global-scale and --local-scale"},
        predicts=".npy",
    ),
    TaskInfo(
        "simsiam",
        "Self-supervised: SimSiam (--task simsiam)",
        "pretraining with a predictor and a stop-gradient, no negatives, no teacher",
        SimSiamOptions,
        "phalanx.tasks.selfsupervised.simsiam:SimSiamTask",
        {"optimizer": "sgd", "lr": 0.06, "momentum": 0.9, "weight_decay": 5e-4},
        predicts=".npy",
    ),
    TaskInfo(
        "barlowtwins",
        "Self-supervised: Barlow Twins (--task barlowtwins)",
        "pretraining by decorrelating the global batch's embeddings",
        BarlowTwinsOptions,
        "phalanx.tasks.selfsupervised.decorrelation:BarlowTwinsTask",
        {"optimizer": "sgd", "lr": 0.06, "momentum": 0.9, "weight_decay": 5e-4},
        predicts=".npy",
    ),
    TaskInfo(
        "vicreg",
        "Self-supervised: VICReg (--task vicreg)",
        "pretraining with invariance, variance and covariance terms over the global batch",
        VICRegOptions,
        "phalanx.tasks.selfsupervised.decorrelation:VICRegTask",  # 0.06 diverged on the digits (seed 1); 0.03 trained
        {"optimizer": "sgd", "lr": 0.03, "momentum": 0.9, "weight_decay": 5e-4},
        predicts=".npy",
    ),
)

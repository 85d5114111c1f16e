"""The self-supervised methods' own options: the views and kNN monitor they share, and each
method's heads, temperatures and weights (standard library only)."""

from __future__ import annotations

from dataclasses import dataclass

from ...config.fields import bad_value, check_fields, option


def _check_blur(blur: float) -> None:
    if blur != -1.0 and not 0 <= blur <= 1:
        raise bad_value("blur", f"must be in [0, 1], or -1 (got {blur})")


@dataclass(frozen=True)
class ViewOptions:
    """What every self-supervised task takes: the views' blur and the kNN monitor."""

    blur: float = option(
        -1.0,
        "Probability of a Gaussian blur of a view (-1: 0.5 above 64 px, none up to 64 px, as "
        "Lightly's CIFAR-10 recipe).",
        metavar="P",
    )
    knn_k: int = option(
        200, "Neighbours of the kNN accuracy that monitors the backbone each epoch.", metavar="K", above=0
    )
    knn_temperature: float = option(0.1, "Temperature of the kNN accuracy's neighbour weights.", metavar="T", above=0)

    def __post_init__(self) -> None:
        check_fields(self)
        _check_blur(self.blur)


@dataclass(frozen=True)
class SimCLROptions(ViewOptions):
    temperature: float = option(0.5, "NT-Xent temperature.", metavar="T", above=0)
    projection_dim: int = option(
        128, "Output size of the projection head (and BYOL's prediction head).", metavar="N", above=0
    )
    hidden_dim: int = option(
        0,
        "Hidden size of the projection head (0: the backbone's feature size; --task byol: "
        "of its projection and prediction heads, 0: 4 x the feature size).",
        metavar="N",
        at_least=0,
    )
    head_norm: str = option(
        "batch",
        "Normalisation in the projection head: batch (SimCLR's) or none (with a backbone "
        "without BatchNorm, 2 DDP workers x B train exactly what one process x 2B does).",
        choices=("batch", "none"),
    )
    gather: bool = option(
        True, "Negatives from every rank's samples (the global batch), with gradients; off: this rank's samples only."
    )


@dataclass(frozen=True)
class BYOLOptions(ViewOptions):
    projection_dim: int = option(128, "Output size of the projection and prediction heads.", metavar="N", above=0)
    hidden_dim: int = option(
        0,
        "Hidden size of the projection and prediction heads (0: 4 x the backbone's feature size).",
        metavar="N",
        at_least=0,
    )
    head_norm: str = option("batch", "Normalisation in the projection and prediction heads.", choices=("batch", "none"))
    teacher_momentum: float = option(
        0.99,
        "The momentum teacher's starting EMA decay; it rises to 1 on a cosine over training, as in BYOL.",
        metavar="M",
        at_least=0,
        at_most=1,
    )


@dataclass(frozen=True)
class MoCoOptions(ViewOptions):
    projection_dim: int = option(128, "Output size of the projection head (MoCo v2's 128).", metavar="N", above=0)
    hidden_dim: int = option(
        0, "Hidden size of the projection head (0: the backbone's feature size).", metavar="N", at_least=0
    )
    head_norm: str = option(
        "none", "Normalisation in the projection head: none (MoCo v2's) or batch.", choices=("batch", "none")
    )
    temperature: float = option(
        0.1, "Temperature of the InfoNCE loss against the queue (Lightly's MoCo benchmark's).", metavar="T", above=0
    )
    queue_size: int = option(
        4096, "Keys kept as negatives: every rank's keys enter the queue in the batch's order.", metavar="N", above=0
    )
    teacher_momentum: float = option(
        0.996,
        "The key encoder's starting EMA decay; it rises to 1 on a cosine over training (Lightly's MoCo benchmark).",
        metavar="M",
        at_least=0,
        at_most=1,
    )


@dataclass(frozen=True)
class MultiCropOptions(ViewOptions):
    """DINO's and SwAV's views: two global crops and local ones."""

    global_scale: float = option(
        0.4,
        "Smallest area fraction of a global crop (its largest: 1; DINO's 0.4, SwAV's 0.14).",
        metavar="FRACTION",
        above=0,
        at_most=1,
    )
    local_views: int = option(6, "Local crops per image (0: the two global views alone).", metavar="N", at_least=0)
    local_size: int = option(
        0,
        "Side of a local crop (0: 3/7 of --image-size, as DINO's and SwAV's 96 of 224, and at "
        "least 8 px: at --image-size 8 as large as a global crop).",
        metavar="N",
        at_least=0,
    )
    local_scale: float = option(
        0.05,
        "Smallest area fraction of a local crop (its largest: --global-scale).",
        metavar="FRACTION",
        above=0,
        at_most=1,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.local_scale > self.global_scale:
            raise bad_value(
                "local_scale", f"must be at most --global-scale ({self.global_scale}); got {self.local_scale}"
            )


@dataclass(frozen=True)
class DINOOptions(MultiCropOptions):
    output_dim: int = option(65536, "Outputs of the DINO head (the prototypes' count).", metavar="N", above=0)
    hidden_dim: int = option(2048, "Hidden size of the DINO head's two hidden layers.", metavar="N", above=0)
    bottleneck_dim: int = option(
        256, "Size of the l2-normalised bottleneck before the head's last layer.", metavar="N", above=0
    )
    head_norm: str = option(
        "none",
        "Normalisation after the head's hidden layers: none (DINO's default) or batch (its --use_bn_in_head).",
        choices=("none", "batch"),
    )
    teacher_temp: float = option(0.04, "Teacher temperature after its warmup.", metavar="T", above=0)
    warmup_teacher_temp: float = option(
        0.04,
        "Teacher temperature in the first epoch, rising linearly to --teacher-temp over --warmup-teacher-temp-epochs.",
        metavar="T",
        above=0,
    )
    warmup_teacher_temp_epochs: int = option(30, "Epochs of the teacher temperature's warmup.", metavar="N", above=0)
    student_temp: float = option(0.1, "Student temperature.", metavar="T", above=0)
    center_momentum: float = option(
        0.9,
        "Momentum of the centre of the teacher's outputs (updated with the global batch's mean).",
        metavar="M",
        at_least=0,
        below=1,
    )
    teacher_momentum: float = option(
        0.996,
        "The teacher's starting EMA decay; it rises to 1 on a cosine over training.",
        metavar="M",
        at_least=0,
        at_most=1,
    )
    freeze_last_layer: int = option(
        1, "Epochs during which the head's last layer does not train.", metavar="N", at_least=0
    )


@dataclass(frozen=True)
class SwAVOptions(MultiCropOptions):
    global_scale: float = option(
        0.14,
        "Smallest area fraction of a global crop (its largest: 1; SwAV's 0.14).",
        metavar="FRACTION",
        above=0,
        at_most=1,
    )
    projection_dim: int = option(
        128, "Output size of the projection head (the prototypes' dimension).", metavar="N", above=0
    )
    hidden_dim: int = option(2048, "Hidden size of the projection head.", metavar="N", above=0)
    head_norm: str = option("batch", "Normalisation in the projection head.", choices=("batch", "none"))
    prototypes: int = option(3000, "Prototypes (SwAV's clusters).", metavar="N", above=0)
    temperature: float = option(0.1, "Temperature of the swapped prediction's softmax.", metavar="T", above=0)
    sinkhorn_iterations: int = option(3, "Sinkhorn-Knopp iterations of the codes.", metavar="N", above=0)
    sinkhorn_epsilon: float = option(0.05, "Sinkhorn-Knopp's entropy weight.", metavar="E", above=0)
    freeze_prototypes: int = option(1, "Epochs during which the prototypes do not train.", metavar="N", at_least=0)
    queue_length: int = option(
        0,
        "Features of earlier global batches that join each step's Sinkhorn-Knopp codes "
        "(SwAV's queue, for small batches: 3840 in its paper; 0: none).",
        metavar="N",
        at_least=0,
    )
    queue_start_epoch: int = option(
        15, "The first epoch whose codes use the queue (once it is full; SwAV's 15).", metavar="N", above=0
    )


@dataclass(frozen=True)
class GlobalBatchOptions(ViewOptions):
    """Barlow Twins' and VICReg's: a three-layer projector and a loss over the global batch."""

    projection_dim: int = option(2048, "Output size of the projection head (Lightly's 2048).", metavar="N", above=0)
    hidden_dim: int = option(2048, "Hidden size of the projection head's two hidden layers.", metavar="N", above=0)
    head_norm: str = option(
        "batch",
        "Normalisation in the projection head: batch (the papers') or none (with a "
        "backbone without BatchNorm, 2 DDP workers x B train exactly what one process x 2B does).",
        choices=("batch", "none"),
    )
    gather: bool = option(
        True, "The loss over every rank's embeddings (the global batch), with gradients; off: over this rank's own."
    )


@dataclass(frozen=True)
class BarlowTwinsOptions(GlobalBatchOptions):
    redundancy_weight: float = option(
        5e-3,
        "Weight of the off-diagonal (redundancy reduction) term of the "
        "cross-correlation against the diagonal one (Barlow Twins' lambda).",
        metavar="W",
        at_least=0,
    )


@dataclass(frozen=True)
class VICRegOptions(GlobalBatchOptions):
    invariance_weight: float = option(
        25.0, "Weight of VICReg's invariance term (the views' mean squared distance).", metavar="W", at_least=0
    )
    variance_weight: float = option(
        25.0, "Weight of VICReg's variance term (each dimension's std kept above 1).", metavar="W", at_least=0
    )
    covariance_weight: float = option(
        1.0, "Weight of VICReg's covariance term (off-diagonal covariances to 0).", metavar="W", at_least=0
    )
    variance_eps: float = option(1e-4, "Added to the variance before its square root.", metavar="E", above=0)


@dataclass(frozen=True)
class SimSiamOptions(ViewOptions):
    projection_dim: int = option(
        2048, "Output size of the projection head (and of the predictor).", metavar="N", above=0
    )
    hidden_dim: int = option(2048, "Hidden size of the projection head.", metavar="N", above=0)
    predictor_dim: int = option(512, "Hidden size of the predictor (SimSiam's bottleneck).", metavar="N", above=0)
    head_norm: str = option("batch", "Normalisation in the projection and prediction heads.", choices=("batch", "none"))

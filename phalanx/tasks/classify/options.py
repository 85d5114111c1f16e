"""``--task classify``'s own options (standard library only: ``--help`` reads them without torch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...config.fields import bad_value, check_fields, option


@dataclass(frozen=True)
class ClassifyOptions:
    num_classes: int = option(
        0,
        "Classifier outputs (0: the number of classes in the data; --task segment: "
        "the masks' classes, background included, 0: the largest mask value + 1).",
        metavar="N",
        at_least=0,
    )
    label_smoothing: float = option(0.0, "Label smoothing of the training loss.", metavar="E", at_least=0, below=1)
    mixup_alpha: float = option(
        0.0, "MixUp of training batches with Beta(A, A) weights (0: off).", metavar="A", at_least=0
    )
    cutmix_alpha: float = option(
        0.0,
        "CutMix of training batches with Beta(A, A) areas (0: off; with --mixup-alpha, one of the two per batch).",
        metavar="A",
        at_least=0,
    )
    random_erasing: float = option(
        0.0, "Probability of erasing a random rectangle of a training image.", metavar="P", at_least=0, at_most=1
    )
    freeze_backbone: bool = option(
        False, "Train the classifier head only (the last Linear layer); frozen BatchNorm statistics stay as loaded."
    )
    probe_norm: bool = option(
        False,
        "With --freeze-backbone: the frozen features standardised before the head "
        "(BatchNorm without affine, as MAE's linear probe), for a backbone whose features "
        "share a large offset (DINO's on the built-in digits).",
    )
    head_lr_mult: float = option(1.0, "Learning-rate multiplier of the classifier head.", metavar="M", at_least=0)

    def __post_init__(self) -> None:
        check_fields(self)
        if self.freeze_backbone and self.head_lr_mult == 0:
            raise bad_value("head_lr_mult", "0 with --freeze-backbone leaves nothing to train")
        if self.probe_norm and not self.freeze_backbone:
            raise bad_value("probe_norm", "needs --freeze-backbone (it standardises a linear probe's frozen features)")


def classifier_lr(given: dict[str, Any]) -> dict[str, Any]:
    """The registry's ``adapt`` of ``--task classify``: a torchvision classifier's default LR:
    torchvision's reference recipe (0.1 for a batch of 256, linearly less for less), with a one-
    epoch warmup. smallcnn keeps 0.1."""
    model = given.get("model", "smallcnn")
    if "lr" in given or model == "smallcnn" or ":" in str(model):
        return {}
    batch = given.get("batch_size", 32)
    accumulated = given.get("grad_accum", 1)
    if not isinstance(batch, int) or not isinstance(accumulated, int) or batch <= 0 or accumulated <= 0:
        return {}  # a bad value: RunConfig names it
    return {
        "lr": round(0.1 * batch * accumulated / 256, 8),
        **({} if "warmup_epochs" in given else {"warmup_epochs": 1.0}),
    }

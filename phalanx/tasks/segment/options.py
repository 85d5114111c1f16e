"""``--task segment``'s own options (standard library only)."""

from __future__ import annotations

from dataclasses import dataclass

from ...config.fields import bad_value, check_fields, option


@dataclass(frozen=True)
class SegmentOptions:
    num_classes: int = option(
        0,
        "Classes of the masks, background (0) included (0: the largest value found in the masks, plus one).",
        metavar="N",
        at_least=0,
    )
    ignore_index: int = option(
        255, "Mask value of pixels that neither train nor count in the metrics.", metavar="V", at_least=0
    )
    aux_loss: bool = option(False, "torchvision's auxiliary classifier (fcn, deeplabv3), its loss weighted 0.5.")

    def __post_init__(self) -> None:
        check_fields(self)
        if self.num_classes == 1:
            raise bad_value("num_classes", "1 class is the background alone; give 2 or more (or 0 to count them)")

"""``--task detect``'s own options (standard library only)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ...config.fields import check_fields, option


@dataclass(frozen=True)
class DetectOptions:
    annotations: str | None = option(
        None, "The training split's COCO JSON, when it is not DIR/train/annotations.json.", metavar="FILE"
    )
    val_annotations: str | None = option(
        None, "The validation split's COCO JSON, when it is not DIR/val/annotations.json.", metavar="FILE"
    )

    def __post_init__(self) -> None:
        check_fields(self)
        for name in ("annotations", "val_annotations"):  # absolute: evaluate and workers run elsewhere
            if getattr(self, name):
                object.__setattr__(self, name, os.path.abspath(getattr(self, name)))

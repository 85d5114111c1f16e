"""``--task segment``'s evaluation (IoU per class), predictions (a mask and an overlay per image,
at the image's own size) and export."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.data import Dataset

from ...data.inputs import InputImages, output_names
from ...data.masks import MaskPairs, find_masks
from ...errors import PhalanxError
from ...records.pictures import png
from ...system.atomic import atomic_write_bytes
from ..base import Evaluation, full_precision
from ..inference import Inference, Predictor
from .pictures import overlay

if TYPE_CHECKING:
    from ...config.inference import PredictOptions
    from .task import SegmentTask


class SegmentInference(Inference):
    task: SegmentTask

    def evaluation_split(self, split: Path) -> tuple[Dataset, str]:
        found = find_masks(split, self.task.classes, self.task.options.ignore_index, skip_broken=False)
        return MaskPairs(found, self.task.transforms(self.info["size"], False)), f"{split} ({len(found)} pairs)"

    def results(self, evaluation: Evaluation) -> dict[str, Any]:
        return {
            "images": evaluation.extra["samples"],
            "iou": evaluation.extra["iou"],
            "confusion_matrix": evaluation.extra["confusion"].tolist(),
            "scored_at": self.scored_at(),
        }

    def scored_at(self) -> str:
        # Validation's pixels, not predict's: predict writes each mask at its image's own size, so a
        # mIoU of predict's masks against full-size truth can differ from this one.
        size = self.cfg.data.image_size
        return (
            f"masks resized (shorter side) to {size} px and centre-cropped to {size}x{size}, as validation "
            "prepares them; predict writes masks at each image's own size"
        )

    def results_table(self, results: dict[str, Any]) -> str:
        m = results["metrics"]
        lines = [
            f"scored on {results['scored_at']}",
            f"images {results['images']}  mIoU {m['mIoU']:.4f}  pixel accuracy {100 * m['pixel_acc']:.2f}%",
            "",
            f"{'class':<8} {'IoU':>8}",
        ]
        lines += [f"{c:<8} {'-' if v is None else f'{v:.4f}':>8}" for c, v in enumerate(results["iou"])]
        return "\n".join(lines)

    def check_predict_output(self, output: str) -> None:
        path = Path(output)
        if path.suffix or (path.exists() and not path.is_dir()):
            raise PhalanxError(
                f"is a folder for --task segment (masks/ and overlays/ of PNGs), not a file ({path.name})", "--output"
            )

    def predictor(self, paths: list[Path], opts: PredictOptions, device: torch.device) -> Predictor:
        """Each image's mask (a class index per pixel, at the image's size) to OUTPUT/masks/<name>.png,
        and the image with its classes painted over to OUTPUT/overlays/<name>.png; <name> keeps the
        image's folders below the deepest folder holding every input (``output_names``)."""
        info = self.info
        mean, std = torch.tensor(info["mean"]).view(3, 1, 1), torch.tensor(info["std"]).view(3, 1, 1)
        inputs = InputImages(paths, "RGB", lambda image: (image.float() / 255 - mean) / std, keep_raw=True)
        return MaskPredictor(
            inputs, paths, device, Logits(self.models["segmenter"]), self.task.classes, info["size"], Path(opts.output)
        )

    def export_modules(self) -> dict[str, tuple[nn.Module, torch.Tensor]]:
        size = self.info["size"]
        return {"segmenter": (Logits(self.models["segmenter"]), torch.zeros(2, 3, size, size))}

    def export_metadata(self) -> dict[str, Any]:
        info = self.info
        return {
            "input": "RGB",
            "mean": info["mean"],
            "std": info["std"],
            "classes": info["classes"],
            "scale": "pixels / 255, then (x - mean) / std",
            "outputs": "logits (N, classes, H, W); argmax over classes for the mask",
        }


class Logits(nn.Module):
    """A segmenter that returns torchvision's ``{"out": logits}`` as the logits alone (for export)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        out = self.model(images)
        return out["out"] if isinstance(out, dict) else out


def _png_bytes(picture) -> bytes:
    import io

    buffer = io.BytesIO()
    picture.save(buffer, "PNG")
    return buffer.getvalue()


class MaskPredictor(Predictor):
    """One image at a time, at its own size: resized to the training size's shorter side for the
    network, the logits resized back."""

    def __init__(
        self,
        inputs: Dataset,
        paths: list[Path],
        device: torch.device,
        model: nn.Module,
        classes: int,
        size: int,
        output: Path,
    ):
        super().__init__(inputs, paths, device)
        self.model, self.classes, self.size, self.output = model.to(device), classes, size, output
        self.names = output_names(paths)  # before any work: two images never share an output

    def predict(self, indices: list[int], images: list[torch.Tensor], raws: list) -> None:
        from PIL import Image

        for index, image, raw in zip(indices, images, raws):
            height, width = image.shape[-2:]
            scale = self.size / min(height, width)
            shape = (max(1, round(height * scale)), max(1, round(width * scale)))
            small = nn.functional.interpolate(image[None], size=shape, mode="bilinear", antialias=True)
            logits = nn.functional.interpolate(
                full_precision(self.model(small.to(self.device))).cpu(), size=(height, width), mode="bilinear"
            )
            mask = logits.argmax(1)[0]
            array = mask.numpy().astype("uint8" if self.classes <= 256 else "int32")
            for folder, data in (
                ("masks", _png_bytes(Image.fromarray(array))),
                ("overlays", png(overlay(raw.float() / 255, mask, self.classes), min_side=0)),
            ):
                target = self.output / folder / self.names[index]
                target.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_bytes(target, data)

"""``--task detect``'s evaluation (COCO mAP by pycocotools, per category), predictions (COCO-style
detections to JSON) and export (scripted: a detector takes a list of images)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.data import Dataset

from ...data.coco import CocoImages, PredictedIds, collate, load_split, predicted_ids
from ...data.inputs import InputImages
from ...errors import PhalanxError
from ...system.atomic import atomic_write_text
from ..base import Evaluation
from ..inference import Inference, Predictor

if TYPE_CHECKING:
    from ...config.inference import PredictOptions
    from .task import DetectTask


class DetectInference(Inference):
    task: DetectTask

    predict_options = ("score_threshold",)
    script_export = True  # torchvision's detectors take lists of images: TorchScript scripts them; tracing cannot

    eval_collate = staticmethod(collate)

    def evaluation_split(self, split: Path) -> tuple[Dataset, str]:
        self.task.val_split = load_split(split, None, skip_broken=False, categories=self.task.categories)
        return CocoImages(self.task.val_split), f"{split} ({len(self.task.val_split)} images)"

    def results(self, evaluation: Evaluation) -> dict[str, Any]:
        names = [
            "AP",
            "AP50",
            "AP75",
            "AP_small",
            "AP_medium",
            "AP_large",
            "AR1",
            "AR10",
            "AR100",
            "AR_small",
            "AR_medium",
            "AR_large",
        ]
        coco = {name: (None if value < 0 else value) for name, value in zip(names, evaluation.extra["stats"])}
        return {
            "images": evaluation.extra["samples"],
            "coco": coco,
            "per_class_AP": evaluation.extra["per_class"],
            "detections": evaluation.extra["detections"],
        }

    def results_table(self, results: dict[str, Any]) -> str:
        lines = [
            f"images {results['images']}  detections {results['detections']}",
            "",
            "COCO's summary (its AP, AP50, AP75 are training's val_mAP, val_mAP50, val_mAP75)",
        ]
        lines += [f"{name:<10} {'-' if value is None else f'{value:.4f}'}" for name, value in results["coco"].items()]
        lines += ["", f"{'category':<20} {'AP':>8}"]
        lines += [
            f"{name[:20]:<20} {ap:>8.4f}" if ap is not None else f"{name[:20]:<20} {'-':>8}"
            for name, ap in results["per_class_AP"].items()
        ]
        return "\n".join(lines)

    def check_predict_output(self, output: str) -> None:
        if Path(output).suffix != ".json":
            raise PhalanxError(f"must end in .json: COCO-style detections (got {Path(output).name})", "--output")

    def predictor(self, paths: list[Path], opts: PredictOptions, device: torch.device) -> Predictor:
        """COCO-style detections (bbox [x, y, w, h] in pixels, score, category) of each image, to
        OUTPUT.json: ``image_id`` and ``file_name`` those of an ``annotations.json`` beside the images
        that names them all (pycocotools scores the file as it is), else the image's position and path."""
        named = predicted_ids(paths)
        if named.source is not None:
            print(f"phalanx: image_id and file_name as {named.source} gives them")
        inputs = InputImages(paths, "RGB", lambda image: image.float() / 255.0)
        return DetectionPredictor(inputs, paths, device, self.models["detector"], self, named, opts)

    def coco_rows(self, found: dict[str, torch.Tensor], which: dict[str, Any], threshold: float) -> list[dict]:
        """One image's detections at or above ``threshold`` as COCO results, each with ``which`` image's keys."""
        rows = []
        for box, score, label in zip(found["boxes"].tolist(), found["scores"].tolist(), found["labels"].tolist()):
            if score < threshold:
                continue
            category = self.task.categories[label - 1] if 0 < label <= len(self.task.categories) else None
            rows.append(
                {
                    **which,
                    "category_id": category["id"] if category else label,
                    "category": category["name"] if category else str(label),
                    "bbox": [round(v, 2) for v in (box[0], box[1], box[2] - box[0], box[3] - box[1])],
                    "score": round(score, 5),
                }
            )
        return rows

    def export_modules(self) -> dict[str, tuple[nn.Module, torch.Tensor]]:
        return {"detector": (self.models["detector"], torch.zeros(1, 3, 64, 64))}

    def export_metadata(self) -> dict[str, Any]:
        return {
            "input": "a list of RGB images, (3, H, W) floats in [0, 1]",
            "categories": self.task.categories,
            "outputs": "a tuple (losses, detections): losses is an empty dict in eval mode; detections, per "
            "image: boxes (x0, y0, x1, y1 pixels), scores, labels (1..K: the categories in order)",
            "load": "import torchvision before torch.jit.load: it registers the detector's operators "
            "(torchvision::nms); without it the load fails with 'Unknown builtin op'",
            "usage": "import torch, torchvision; model = torch.jit.load(FILE); losses, detections = model([image])",
        }


class DetectionPredictor(Predictor):
    def __init__(
        self,
        inputs: Dataset,
        paths: list[Path],
        device: torch.device,
        detector: nn.Module,
        inference: DetectInference,
        named: PredictedIds,
        opts: PredictOptions,
    ):
        super().__init__(inputs, paths, device)
        self.detector, self.inference, self.named = detector.to(device), inference, named
        self.batch_size, self.threshold, self.output = opts.batch_size, opts.score_threshold, Path(opts.output)
        self.rows: list[dict[str, Any]] = []

    def predict(self, indices: list[int], images: list[torch.Tensor], raws: list) -> None:
        for index, found in zip(indices, self.detector([image.to(self.device) for image in images])):
            which = {
                "image_id": self.named.ids[index],
                "file_name": self.named.file_names[index],
                "path": str(self.paths[index]),
            }
            self.rows += self.inference.coco_rows(found, which, self.threshold)

    def finish(self) -> None:
        atomic_write_text(self.output, json.dumps(self.rows, indent=1) + "\n")

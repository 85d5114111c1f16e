"""``--task detect``: object detection, LitDet's job, with torchvision's detectors or your own.

Data in COCO format (``data/coco.py``); boxes move with the augmentation (torchvision v2 and
``tv_tensors``). A detector in training mode returns its losses by name (``loss_classifier``,
``loss_box_reg``, ...), each a mean over the micro-batch, logged by name. Validation scores the
detections of every validation image exactly once, gathered from all ranks, with ``pycocotools``
(COCO mAP@[.5:.95], mAP@.5, per-class AP): a metric that does not split into per-rank sums.
"""

from __future__ import annotations

import contextlib
import copy
import io
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ... import records
from ...data import SeededView
from ...data.coco import CocoImages, collate, load_split
from ...data.layout import train_dir, validation_dir
from ...errors import PhalanxError
from ...records.pictures import png
from ..base import (
    Batch,
    Declaration,
    Evaluation,
    RunContext,
    StepContext,
    StepLosses,
    Task,
    TaskData,
    dataset_size,
    fixed_sample,
    pane,
)
from .options import DetectOptions

if TYPE_CHECKING:
    from ...config import RunConfig

DETECTORS = (
    "fasterrcnn_mobilenet_v3_large_320_fpn",
    "fasterrcnn_mobilenet_v3_large_fpn",
    "fasterrcnn_resnet50_fpn",
    "fasterrcnn_resnet50_fpn_v2",
    "retinanet_resnet50_fpn",
    "retinanet_resnet50_fpn_v2",
    "fcos_resnet50_fpn",
    "ssd300_vgg16",
    "ssdlite320_mobilenet_v3_large",
)
SHOWN = 6  # validation images drawn each epoch


def loss_names_of(model: nn.Module) -> tuple[str, ...]:
    """The losses a detector returns in training mode, by its kind; your own detector's are found by
    one training-mode forward of a copy on two blank images."""
    from torchvision.models import detection

    if isinstance(model, detection.FasterRCNN):
        return ("loss_classifier", "loss_box_reg", "loss_objectness", "loss_rpn_box_reg")
    if isinstance(model, detection.FCOS):
        return ("classification", "bbox_regression", "bbox_ctrness")
    if isinstance(model, (detection.RetinaNet, detection.SSD)):
        return ("classification", "bbox_regression")
    probe = copy.deepcopy(model).train()
    images = [torch.zeros(3, 64, 64), torch.zeros(3, 64, 64)]
    targets = [{"boxes": torch.tensor([[8.0, 8.0, 40.0, 40.0]]), "labels": torch.tensor([1])}] * 2
    try:
        found = probe(images, targets)
    except Exception as exc:
        raise PhalanxError(
            f"the detector's training-mode forward failed on two 64x64 images with one box each "
            f"({type(exc).__name__}: {str(exc).splitlines()[0][:160]})",
            "--model",
        ) from None
    if not isinstance(found, dict) or not found:
        raise PhalanxError("a detector in training mode returns a dict of losses (torchvision's convention)", "--model")
    return tuple(sorted(found))


class DetectTask(Task):
    name = "detect"
    Inference = ".inference:DetectInference"  # (by name: the inference imports this module for its types)
    Options = DetectOptions
    primary_model = "detector"
    best_metric = ("mAP", "max")
    metrics = ("mAP", "mAP50", "mAP75")
    metric_labels = {"mAP": "COCO mAP@[.5:.95]", "mAP50": "mAP@.5", "mAP75": "mAP@.75"}
    options: DetectOptions
    data_parallel_refused = "torchvision's detectors take lists of images, which DataParallel does not split"

    def __init__(self, cfg: RunConfig):
        super().__init__(cfg)
        self.categories: list[dict[str, Any]] = []

    # --- data and networks
    def build_data(self) -> TaskData:
        from torchvision.transforms import v2

        cfg = self.cfg
        if not cfg.data.dataroot:
            raise PhalanxError(
                "--task detect reads COCO data: give --dataroot DIR (DIR/train/images/ with "
                "DIR/train/annotations.json, DIR/val/ likewise)",
                "--dataroot",
            )
        root = Path(cfg.data.dataroot)
        if not train_dir(root).is_dir():
            raise PhalanxError(
                f"{root} has no train/ folder; expected {root}/train/images/ and {root}/train/annotations.json",
                "--dataroot",
            )
        annotations = Path(self.options.annotations) if self.options.annotations else None
        train = load_split(train_dir(root), annotations, cfg.data.skip_broken)
        if not validation_dir(root).is_dir():
            raise PhalanxError(
                f"{root} has no val/ folder: COCO scores a split of its own (val/images/ and val/annotations.json)",
                "--dataroot",
            )
        val = load_split(
            validation_dir(root),
            Path(self.options.val_annotations) if self.options.val_annotations else None,
            cfg.data.skip_broken,
            train.categories,
        )
        self.categories, self.val_split = train.categories, val
        flip = cfg.data.hflip and cfg.data.augment != "none"
        augment = v2.RandomHorizontalFlip(0.5) if flip else None
        base = CocoImages(train)
        boxes = sum(len(b) for b in train.boxes.values())
        skipped = {**train.skipped, **val.skipped}
        gone = f"; {len(skipped)} image(s) left out" if skipped else ""
        description = (
            f"{root} ({len(train)} train images with {boxes} boxes / {len(val)} val, "
            f"{len(self.categories)} categories{', horizontal flips' if flip else ''}{gone})"
        )
        info = {"categories": self.categories, "image_size": cfg.data.image_size}
        return TaskData(
            SeededView(base, (lambda sample: augment(*sample)) if augment else None, cfg.seed),
            CocoImages(val),
            description,
            info,
            collate=collate,
            skipped=skipped,
        )

    def restore_info(self, info: dict[str, Any]) -> None:
        self.categories = info["categories"]

    def build_models(self, data: TaskData) -> dict[str, nn.Module]:
        classes = len(data.info["categories"]) + 1  # and the background
        spec = self.cfg.network.model
        if ":" in spec:
            from ...models import build_model

            model = build_model(spec, classes, 3)
        else:
            from torchvision.models import get_model

            if spec not in DETECTORS:
                raise PhalanxError(
                    f"--task detect takes {', '.join(DETECTORS)}, or your own package.module:function (got {spec!r})",
                    "--model",
                )
            size = data.info.get("image_size") or 0
            sized = {"min_size": size, "max_size": size} if size and not spec.startswith("ssd") else {}
            # weights=None: nothing is downloaded; --weights loads a checkpoint from the hub cache.
            model = get_model(spec, weights=None, weights_backbone=None, num_classes=classes, **sized)
        return {"detector": model}

    def declare(self, data: TaskData, models: Mapping[str, nn.Module]) -> Declaration:
        """The losses of the detector's kind, beside their sum."""
        return replace(super().declare(data, models), loss_names=("loss", *loss_names_of(models["detector"])))

    def load_weights(self, models: Mapping[str, nn.Module], spec: str, data: TaskData) -> list[str]:
        from ...models.weights import load_weights

        return [load_weights(models["detector"], spec, [c["name"] for c in self.categories])]

    # --- training
    def training_step(self, batch: Batch, ctx: StepContext) -> StepLosses:
        images, targets = batch
        found = ctx.models["detector"](images, [{"boxes": t["boxes"], "labels": t["labels"]} for t in targets])
        return {"loss": sum(found.values()), **found}

    # --- validation: COCO mAP of every validation image's detections, gathered from all ranks
    @torch.no_grad()
    def detections(
        self, model: nn.Module, images: list[torch.Tensor], ctx: RunContext
    ) -> list[dict[str, torch.Tensor]]:
        with ctx.autocast():
            return model([ctx.to_device(image) for image in images])

    @torch.no_grad()
    def evaluate(self, models: Mapping[str, nn.Module], loader: Iterable[Batch], ctx: RunContext) -> Evaluation:
        model = models["detector"]
        category_of = {i + 1: c["id"] for i, c in enumerate(self.categories)}
        results, seen = [], []
        for images, targets in loader:
            for target, found in zip(targets, self.detections(model, images, ctx)):
                seen.append(int(target["image_id"]))
                for box, score, label in zip(
                    found["boxes"].tolist(), found["scores"].tolist(), found["labels"].tolist()
                ):
                    x0, y0, x1, y1 = box
                    results.append(
                        {
                            "image_id": int(target["image_id"]),
                            "category_id": category_of.get(label, -1),
                            "bbox": [x0, y0, x1 - x0, y1 - y0],
                            "score": float(score),
                        }
                    )
        everything = ctx.all_gather_objects([("image", i) for i in seen] + [("box", r) for r in results])
        images = sorted(i for kind, i in everything if kind == "image")
        detected = [r for kind, r in everything if kind == "box"]
        stats, per_class = coco_scores(self.val_split.raw, images, detected, self.categories)
        metrics = {"mAP": max(stats[0], 0.0), "mAP50": max(stats[1], 0.0), "mAP75": max(stats[2], 0.0)}
        return Evaluation(
            metrics,
            {
                "samples": len(images),
                "images": images,
                "stats": stats,
                "per_class": per_class,
                "detections": len(detected),
            },
        )

    def summary(self, metrics: dict[str, float]) -> str:
        return f"val_mAP {metrics['mAP']:.4f}  val_mAP50 {metrics['mAP50']:.4f}"

    def format_metric(self, name: str, value: float) -> str:
        return f"{value:.4f}"

    # --- dashboard
    def panes(self, declared: Declaration) -> list[dict[str, Any]]:
        panes = [
            pane(f"train_{name}", f"train {name} (mean over ranks)", name, "train", [(name, name)])
            for name in declared.loss_names
        ]
        return panes + [
            pane(
                "val_mAP",
                "validation COCO mAP",
                "average precision",
                "val",
                [("mAP", "mAP@[.5:.95]"), ("mAP50", "mAP@.5"), ("ema_mAP", "EMA mAP@[.5:.95]")],
            )
        ]

    def visuals(self, data: TaskData) -> DetectionSample:
        shown = fixed_sample(dataset_size(data.val), SHOWN, self.cfg.seed)
        return DetectionSample(self, [data.val[i] for i in shown])


def coco_scores(
    ground_truth: dict[str, Any], image_ids: list[int], results: list[dict[str, Any]], categories: list[dict[str, Any]]
) -> tuple[list[float], dict[str, float | None]]:
    """pycocotools' COCOeval (bbox) of ``results`` on ``image_ids``: its 12 statistics, and the AP of
    each category (None where the split has none of it)."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    kept = set(image_ids)
    data = {
        **ground_truth,
        "images": [i for i in ground_truth["images"] if int(i["id"]) in kept],
        "annotations": [
            {"iscrowd": 0, "area": a["bbox"][2] * a["bbox"][3], **a, "id": n + 1}
            for n, a in enumerate(ground_truth["annotations"])
            if int(a["image_id"]) in kept
        ],
    }
    valid = [r for r in results if r["category_id"] in {c["id"] for c in categories}]
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress and table
        truth = COCO()
        truth.dataset = data
        truth.createIndex()
        if not valid:
            return [0.0] * 12, {c["name"]: 0.0 for c in categories}
        scored = COCOeval(truth, truth.loadRes(valid), "bbox")
        scored.params.imgIds = sorted(kept)
        scored.evaluate()
        scored.accumulate()
        scored.summarize()
    stats = [float(s) for s in scored.stats]  # -1: no ground truth of that size in the split
    precision = scored.eval["precision"]  # [thresholds, recall, categories, areas, max detections]
    per_class = {}
    for index, category in enumerate(categories):
        values = precision[:, :, index, 0, -1]
        values = values[values > -1]
        per_class[category["name"]] = float(values.mean()) if values.size else None
    return stats, per_class


class DetectionSample:
    """Each epoch: the same validation images with their detections (score above 0.5) in red and
    their ground-truth boxes in green."""

    def __init__(self, task: DetectTask, samples: list):
        self.task, self.samples = task, samples

    @torch.no_grad()
    def record(self, models: Mapping[str, nn.Module], epoch: int, ctx: RunContext) -> dict[str, Any]:
        import warnings

        from torchvision.utils import draw_bounding_boxes

        model = models["detector"]  # in eval mode here (the trainer's): detections, not losses
        found = self.task.detections(model, [image for image, _ in self.samples], ctx) if self.samples else []
        items = []
        for (image, target), detected in zip(self.samples, found):
            pixels = (image.as_subclass(torch.Tensor).clamp(0, 1) * 255).byte()
            keep = detected["scores"].cpu() > 0.5
            boxes = detected["boxes"].cpu()[keep].float()
            with warnings.catch_warnings():  # an image without boxes: nothing to draw, nothing to warn about
                warnings.simplefilter("ignore", UserWarning)
                pixels = draw_bounding_boxes(pixels, target["boxes"].as_subclass(torch.Tensor), colors="lime", width=1)
                pixels = draw_bounding_boxes(pixels, boxes, colors="red", width=1)
            names = [
                self.task.categories[int(label) - 1]["name"]
                for label in detected["labels"].cpu()[keep]
                if 0 < int(label) <= len(self.task.categories)
            ]
            caption = (
                f"image {int(target['image_id'])}: {len(names)} found ({', '.join(names[:4])})"
                if names
                else f"image {int(target['image_id'])}: none found"
            )
            items.append(records.images_item(png(pixels.float() / 255), caption))
        return {
            "kind": "images",
            "epoch": epoch,
            "title": "validation images: detections (red), truth (green)",
            "items": items,
        }

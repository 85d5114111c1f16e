"""``--task segment``: semantic segmentation with torchvision's segmenters or your own.

Image + mask PNG pairs (``data/masks.py``). The loss of a sample is its pixels' mean cross-entropy
(``--ignore-index`` left out), so 2 DDP workers x B train what one process x 2B does. Validation:
the confusion matrix of every validation pixel, all-reduced (exact at any world size), gives the
IoU of each class, their mean (mIoU) and the pixel accuracy.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ... import records
from ...data import SeededView
from ...data.layout import train_dir, validation_dir
from ...data.masks import MaskPairs, find_masks
from ...data.transforms import IMAGENET_MEAN, IMAGENET_STD, normalisation, one_size
from ...errors import PhalanxError
from ...records.pictures import denormalize, png, strip
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
    full_precision,
    pane,
)
from .options import SegmentOptions
from .pictures import overlay

if TYPE_CHECKING:
    from ...config import RunConfig

SEGMENTERS = (
    "lraspp_mobilenet_v3_large",
    "deeplabv3_mobilenet_v3_large",
    "deeplabv3_resnet50",
    "deeplabv3_resnet101",
    "fcn_resnet50",
    "fcn_resnet101",
)
SHOWN = 4


class SegmentTask(Task):
    name = "segment"
    Inference = ".inference:SegmentInference"  # (by name: the inference imports this module for its types)
    Options = SegmentOptions
    primary_model = "segmenter"
    best_metric = ("mIoU", "max")
    metrics = ("mIoU", "pixel_acc", "loss")
    metric_labels = {"mIoU": "mean IoU", "pixel_acc": "pixel accuracy", "loss": "loss"}
    options: SegmentOptions

    def __init__(self, cfg: RunConfig):
        super().__init__(cfg)
        self.classes = self.options.num_classes

    # --- data and networks
    def transforms(self, size: int, train: bool):
        from torchvision import tv_tensors
        from torchvision.transforms import v2

        steps = (
            [v2.RandomResizedCrop(size, scale=(0.25, 1.0), antialias=True)]
            if train
            else [v2.Resize(size, antialias=True), v2.CenterCrop(size)]
        )
        if train and self.cfg.data.hflip:
            steps.append(v2.RandomHorizontalFlip())
        steps += [
            v2.ToDtype({tv_tensors.Image: torch.float32, "others": None}, scale=True),
            v2.Normalize(list(self.mean), list(self.std)),
        ]
        return v2.Compose(steps)

    def build_data(self) -> TaskData:
        cfg, o = self.cfg, self.options
        size = one_size(cfg.data, "segment")
        if not cfg.data.dataroot:
            raise PhalanxError(
                "--task segment reads image and mask pairs: give --dataroot DIR (DIR/train/images/ "
                "and DIR/train/masks/)",
                "--dataroot",
            )
        root = Path(cfg.data.dataroot)
        if not train_dir(root).is_dir() or not validation_dir(root).is_dir():
            raise PhalanxError(f"{root} needs train/ and val/, each with images/ and masks/", "--dataroot")
        train = find_masks(train_dir(root), o.num_classes, o.ignore_index, cfg.data.skip_broken)
        self.classes = o.num_classes or train.largest + 1
        val = find_masks(validation_dir(root), self.classes, o.ignore_index, cfg.data.skip_broken)
        if self.classes < 2:
            raise PhalanxError(
                f"the masks of {train_dir(root)} hold the background alone; give --num-classes", "--num-classes"
            )
        stats = normalisation(cfg.data, cfg.network.weights, 3)
        # (--mean gives stats: normalisation takes them)
        self.mean, self.std = (
            stats
            if stats is not None and (cfg.data.normalize != "auto" or cfg.data.mean)
            else (IMAGENET_MEAN, IMAGENET_STD)
        )
        augment = cfg.data.augment != "none"
        prepare = self.transforms(size, train=False)
        base = MaskPairs(train)
        augmented = self.transforms(size, True)
        training = SeededView(
            base,
            (lambda s: augmented(*s)) if augment else (lambda s: prepare(*s)),
            cfg.seed,
            plain=MaskPairs(train, prepare),
        )
        skipped = {**train.skipped, **val.skipped}
        gone = f"; {len(skipped)} pair(s) left out" if skipped else ""
        description = (
            f"{root} ({len(train)} train / {len(val)} val pairs, {self.classes} classes, {size}x{size}"
            f"{', random resized crop + flip' if augment else ''}{gone})"
        )
        info = {
            "classes": self.classes,
            "size": size,
            "mean": list(self.mean),
            "std": list(self.std),
            "ignore_index": o.ignore_index,
        }
        return TaskData(training, MaskPairs(val, prepare), description, info, skipped=skipped)

    def restore_info(self, info: dict[str, Any]) -> None:
        self.classes, self.mean, self.std = info["classes"], tuple(info["mean"]), tuple(info["std"])

    def build_models(self, data: TaskData) -> dict[str, nn.Module]:
        classes, spec = data.info["classes"], self.cfg.network.model
        if ":" in spec:
            from ...models import build_model

            return {"segmenter": build_model(spec, classes, 3)}
        if spec not in SEGMENTERS:
            raise PhalanxError(
                f"--task segment takes {', '.join(SEGMENTERS)}, or your own package.module:function (got {spec!r})",
                "--model",
            )
        from torchvision.models import get_model

        extra = {"aux_loss": self.options.aux_loss} if not spec.startswith("lraspp") else {}
        if self.options.aux_loss and spec.startswith("lraspp"):
            raise PhalanxError("lraspp has no auxiliary classifier", "--aux-loss")
        return {"segmenter": get_model(spec, weights=None, weights_backbone=None, num_classes=classes, **extra)}

    def load_weights(self, models: Mapping[str, nn.Module], spec: str, data: TaskData) -> list[str]:
        from ...models.weights import load_weights

        return [load_weights(models["segmenter"], spec, [str(c) for c in range(self.classes)])]

    # --- training
    def per_sample(self, logits: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        """Each sample's mean cross-entropy over its pixels that count."""
        ignore = self.options.ignore_index
        loss = nn.functional.cross_entropy(logits, masks, ignore_index=ignore, reduction="none")
        counted = (masks != ignore).flatten(1).sum(1).clamp(min=1)
        return loss.flatten(1).sum(1) / counted

    def training_step(self, batch: Batch, ctx: StepContext) -> StepLosses:
        images, masks = batch
        out = ctx.models["segmenter"](images)
        logits = out["out"] if isinstance(out, dict) else out
        loss = self.per_sample(logits, masks)
        if isinstance(out, dict) and "aux" in out:
            loss = loss + 0.5 * self.per_sample(out["aux"], masks)
        return {"loss": loss}

    # --- validation: an all-reduced confusion matrix
    def empty_sums(self) -> dict[str, torch.Tensor]:
        return {"loss": torch.zeros(()), "samples": torch.zeros(()), "confusion": torch.zeros(self.classes**2)}

    def validation_step(
        self, models: Mapping[str, nn.Module], batch: Batch, ctx: RunContext
    ) -> dict[str, torch.Tensor]:
        images, masks = batch
        out = models["segmenter"](images)
        logits = full_precision(out["out"] if isinstance(out, dict) else out)
        counted = masks != self.options.ignore_index
        predicted = logits.argmax(1)
        pairs = masks[counted] * self.classes + predicted[counted]
        return {
            "loss": self.per_sample(logits, masks).sum(),
            "samples": torch.tensor(float(len(images))),
            "confusion": torch.bincount(pairs, minlength=self.classes**2),
        }

    def validation_metrics(self, sums: dict[str, torch.Tensor]) -> Evaluation:
        confusion = sums["confusion"].round().to(torch.int64).view(self.classes, self.classes).cpu()
        truth, predicted, hits = confusion.sum(1), confusion.sum(0), confusion.diag()
        union = truth + predicted - hits
        iou = [float(hits[c]) / float(union[c]) if union[c] else None for c in range(self.classes)]
        present = [v for v in iou if v is not None]
        count = max(float(sums["samples"]), 1.0)
        metrics = {
            "mIoU": sum(present) / len(present) if present else 0.0,
            "pixel_acc": float(hits.sum()) / max(float(confusion.sum()), 1.0),
            "loss": float(sums["loss"]) / count,
        }
        return Evaluation(metrics, {"iou": iou, "confusion": confusion, "samples": int(float(sums["samples"]))})

    def summary(self, metrics: dict[str, float]) -> str:
        return (
            f"val_loss {metrics['loss']:.4f}  val_mIoU {metrics['mIoU']:.4f}  val_pixel_acc "
            f"{100 * metrics['pixel_acc']:.2f}%"
        )

    def format_metric(self, name: str, value: float) -> str:
        return f"{100 * value:.2f}%" if name.endswith("acc") else f"{value:.4f}"

    # --- dashboard
    def panes(self, declared: Declaration) -> list[dict[str, Any]]:
        return [
            pane("train_loss", "train loss (mean over ranks)", "cross-entropy per pixel", "train", [("loss", "loss")]),
            pane(
                "val_loss",
                "validation loss",
                "cross-entropy per pixel",
                "val",
                [("loss", "val loss"), ("ema_loss", "EMA val loss")],
            ),
            pane("val_mIoU", "validation mean IoU", "IoU", "val", [("mIoU", "mIoU"), ("ema_mIoU", "EMA mIoU")]),
            pane(
                "val_pixel_acc",
                "validation pixel accuracy",
                "accuracy (%)",
                "val",
                [("pixel_acc", "pixel accuracy")],
                percent=True,
            ),
        ]

    def visuals(self, data: TaskData) -> SegmentationSample:
        shown = fixed_sample(dataset_size(data.val), SHOWN, self.cfg.seed)
        return SegmentationSample(self, [data.val[i] for i in shown])


class SegmentationSample:
    """Each epoch: the same validation images, each as image | prediction | truth."""

    def __init__(self, task: SegmentTask, samples: list):
        self.task, self.samples = task, samples

    @torch.no_grad()
    def record(self, models: Mapping[str, nn.Module], epoch: int, ctx: RunContext) -> dict[str, Any]:
        if not self.samples:
            return {"kind": "images", "epoch": epoch, "items": []}
        model = models["segmenter"]  # in eval mode here (the trainer's)
        images = torch.stack([image.as_subclass(torch.Tensor) for image, _ in self.samples])
        with ctx.autocast():
            out = model(ctx.to_device(images))
        predicted = full_precision(out["out"] if isinstance(out, dict) else out).argmax(1).cpu()
        items = []
        for i, (image, mask) in enumerate(self.samples):
            shown = denormalize(image.as_subclass(torch.Tensor), self.task.mean, self.task.std)
            truth = mask.as_subclass(torch.Tensor).clone()
            truth[truth == self.task.options.ignore_index] = 0
            panels = [shown, overlay(shown, predicted[i], self.task.classes), overlay(shown, truth, self.task.classes)]
            items.append(records.images_item(png(strip(panels)), "image | predicted | truth"))
        return {"kind": "images", "epoch": epoch, "title": "validation: image | predicted | truth", "items": items}

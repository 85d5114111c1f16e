"""``--task classify`` (the default): one network, cross-entropy (label smoothing, MixUp/CutMix soft
targets), top-1 accuracy, a confusion matrix, and a fixed sample of validation images with their
predictions on the dashboard."""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.data import Dataset

from ... import records
from ...data import DataBundle, build_datasets, dataset_labels
from ...errors import PhalanxError
from ...models import build_model, check_input_size, required_channels, timm_preferences
from ...models.weights import Backbone, insert_probe_norm, load_weights, param_groups
from ...records.pictures import denormalize, png
from ...records.windows import window
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
    full_precision,
)
from .options import ClassifyOptions

if TYPE_CHECKING:
    from ...config import RunConfig

MAX_CONFUSION_CLASSES = 100  # larger matrices would swell the metrics log
SAMPLE = 16  # validation images shown each epoch


class ClassifyTask(Task):
    name = "classify"
    Inference = ".inference:ClassifyInference"  # (by name: the inference imports this module for its types)
    Options = ClassifyOptions
    loss_names = ("loss",)
    primary_model = "model"
    best_metric = ("acc", "max")
    metrics = ("loss", "acc", "top5")
    metric_labels = {"acc": "accuracy", "top5": "top-5 accuracy", "loss": "loss"}
    options: ClassifyOptions

    def __init__(self, cfg: RunConfig):
        super().__init__(cfg)
        if self.options.freeze_backbone and cfg.devices.sync_bn:
            raise PhalanxError(
                "with --freeze-backbone is not built: the frozen backbone's BatchNorm layers keep "
                "their loaded statistics (nothing of theirs to synchronise), and --probe-norm's are "
                "each rank's own; train without --sync-bn",
                "--sync-bn",
            )
        self.loss_fn = nn.CrossEntropyLoss(reduction="none", label_smoothing=self.options.label_smoothing)
        self.classes: list[str] = []
        self.mix = None
        self.backbone: Backbone | None = None
        self.flips = False

    # --- data and models
    def build_data(self) -> TaskData:
        data = build_datasets(
            self.cfg,
            required_channels(self.cfg.network.model),
            self.options.random_erasing,
            timm_preferences(self.cfg.network.model),
        )
        self.classes = data.classes
        self.flips = data.pipeline.random and self.cfg.data.hflip
        num = self.num_classes(data)
        self.mix = _mixer(self.options, num)
        description = data.description + (f", {num} outputs" if num != data.num_classes else "")
        return TaskData(data.train, data.val, description, data_info(data), skipped=data.skipped)

    def num_classes(self, data: DataBundle) -> int:
        if data.num_classes < 2:  # every prediction would be right: "100%" that means nothing
            only = f" ({data.classes[0]})" if data.classes else ""
            raise PhalanxError(
                f"the training data has one class{only}; a classifier needs two or more "
                "(self-supervised tasks, --task simclr or byol, learn from one folder)",
                "--dataroot",
            )
        wanted = self.options.num_classes
        if wanted and wanted < data.num_classes:
            raise PhalanxError(f"{wanted} is fewer than the {data.num_classes} classes in the data", "--num-classes")
        return wanted or data.num_classes

    def build_models(self, data: TaskData) -> dict[str, nn.Module]:
        outputs = self.options.num_classes or len(data.info["classes"])
        model = build_model(self.cfg.network.model, outputs, data.info["channels"], self.cfg.network.drop_path)
        check_input_size(model, self.cfg.network.model, data.info["size"])
        if self.options.probe_norm:
            insert_probe_norm(model)
        if self.options.freeze_backbone:
            self.backbone = Backbone(model)
        return {"model": model}

    def load_weights(self, models: Mapping[str, nn.Module], spec: str, data: TaskData) -> list[str]:
        return [
            load_weights(
                models["model"],
                spec,
                data.info["classes"],
                self.cfg.network.model,
                (data.info["mean"], data.info["std"]),
            )
        ]

    def notes(self) -> list[str]:
        notes = [f"phalanx: {self.backbone.description}"] if self.backbone is not None else []
        if self.flips and looks_like_characters(self.classes):
            notes.append(
                f"phalanx: warning: the classes ({', '.join(self.classes[:4])}, ...) look like digits or "
                "letters, which a horizontal flip turns into other shapes; --no-hflip keeps them as they are"
            )
        return notes

    def param_groups(self, models: Mapping[str, nn.Module]) -> dict[str, list[dict[str, Any]]]:
        return {"model": param_groups(models["model"], self.options.head_lr_mult)}

    def train_mode(self, models: Mapping[str, nn.Module]) -> None:
        models["model"].train()
        if self.backbone is not None:
            self.backbone.train_mode()

    # --- training
    def training_step(self, batch: Batch, ctx: StepContext) -> StepLosses:
        inputs, targets = batch
        if self.mix is not None:  # soft targets: probabilities over the classes
            inputs, targets = self.mix(inputs, targets)
        return {"loss": self.loss_fn(ctx.models["model"](inputs), targets)}

    # --- validation
    def empty_sums(self) -> dict[str, torch.Tensor]:
        classes = len(self.classes)
        return {
            "loss": torch.zeros(()),
            "correct": torch.zeros(()),
            "top5": torch.zeros(()),
            "samples": torch.zeros(()),
            "confusion": torch.zeros(classes * classes),
        }

    def validation_step(
        self, models: Mapping[str, nn.Module], batch: Batch, ctx: RunContext
    ) -> dict[str, torch.Tensor]:
        inputs, targets = batch
        logits = full_precision(models["model"](inputs))
        classes = len(self.classes)
        top = logits.topk(min(5, logits.shape[1]), dim=1).indices
        predicted = top[:, 0]
        return {
            "loss": nn.functional.cross_entropy(logits, targets, reduction="sum"),
            "correct": (predicted == targets).sum(),
            "top5": (top == targets[:, None]).any(1).sum(),
            "samples": torch.tensor(float(targets.numel())),
            "confusion": torch.bincount(targets * classes + predicted.clamp(max=classes - 1), minlength=classes**2),
        }

    def validation_metrics(self, sums: dict[str, torch.Tensor]) -> Evaluation:
        count = float(sums["samples"])
        classes = len(self.classes)
        metrics = {
            "loss": float(sums["loss"]) / max(count, 1.0),
            "acc": float(sums["correct"]) / max(count, 1.0),
            "top5": float(sums["top5"]) / max(count, 1.0),
        }
        confusion = sums["confusion"].round().to(torch.int64).view(classes, classes).cpu()
        return Evaluation(metrics, {"confusion": confusion, "samples": int(count)})

    def epoch_records(self, evaluation: Evaluation, epoch: int) -> list[dict[str, Any]]:
        if len(self.classes) > MAX_CONFUSION_CLASSES:
            return []
        return [
            {
                "kind": "confusion",
                "epoch": epoch,
                "classes": self.classes,
                "matrix": evaluation.extra["confusion"].tolist(),
            }
        ]

    def summary(self, metrics: dict[str, float]) -> str:
        text = f"val_loss {metrics['loss']:.4f}  val_acc {100 * metrics['acc']:.2f}%"
        if "ema_acc" in metrics:
            text += f"  ema_acc {100 * metrics['ema_acc']:.2f}%"
        return text

    def format_metric(self, name: str, value: float) -> str:
        return f"{100 * value:.2f}%" if name.endswith(("acc", "top5")) else f"{value:.4f}"

    # --- dashboard
    def panes(self, declared: Declaration) -> list[dict[str, Any]]:
        return [
            *records.SCHEMA_2_PANES,
            window("confusion", "matrix", "confusion matrix"),
            window("per_class", "row_shares", "accuracy per class"),
        ]

    def visuals(self, data: TaskData) -> ValidationSample:
        return ValidationSample(data.val, self.classes, data.info["mean"], data.info["std"], self.cfg.seed)

    def restore_info(self, info: dict[str, Any]) -> None:
        """What a checkpoint says the data resolved to (inference builds no training data)."""
        self.classes = list(info["classes"])


CHARACTER = re.compile(r"^(?:(?:digit|number|num|char|character|letter|class)[ _-]?)?[0-9A-Za-z]$", re.IGNORECASE)


def looks_like_characters(classes: list[str]) -> bool:
    """Class names such as 0-9, a-z or digit3: a flip changes what such images show."""
    return len(classes) >= 2 and all(CHARACTER.match(name) for name in classes)


def data_info(data: DataBundle) -> dict[str, Any]:
    """What the data resolved to (classes, image size, normalisation): inference needs it."""
    p = data.pipeline
    return {
        "classes": data.classes,
        "channels": data.in_channels,
        "size": p.size,
        "crop_pct": p.crop_pct,
        "mean": list(p.mean),
        "std": list(p.std),
    }


def _mixer(options: ClassifyOptions, num_classes: int):
    if not options.mixup_alpha and not options.cutmix_alpha:
        return None  # and no torchvision import: it costs a process seconds
    from torchvision.transforms import v2

    mixers = []
    if options.mixup_alpha > 0:
        mixers.append(v2.MixUp(alpha=options.mixup_alpha, num_classes=num_classes))
    if options.cutmix_alpha > 0:
        mixers.append(v2.CutMix(alpha=options.cutmix_alpha, num_classes=num_classes))
    return mixers[0] if len(mixers) == 1 else v2.RandomChoice(mixers)


class ValidationSample:
    """A fixed, seeded sample of validation images spread over the classes (round robin, each class
    in a seeded order), shown with the model's predictions each epoch: the same images every epoch,
    so the grid shows the predictions change as training goes."""

    def __init__(self, val: Dataset, classes: list[str], mean: list[float], std: list[float], seed: int):
        indices = spread_sample(dataset_labels(val), dataset_size(val), SAMPLE, seed)
        items = [val[i] for i in indices]
        self.images = torch.stack([image for image, _ in items]) if items else torch.zeros(0)
        self.labels = [classes[int(label)] for _, label in items]
        self.classes = classes
        self.pngs = [png(image) for image in denormalize(self.images, mean, std)] if items else []

    @torch.no_grad()
    def record(self, models: Mapping[str, nn.Module], epoch: int, ctx: RunContext) -> dict[str, Any]:
        with ctx.autocast():  # the networks are in eval mode here (the trainer's)
            predicted = models["model"](ctx.to_device(self.images)).argmax(1).tolist() if self.pngs else []
        return {
            "kind": "images",
            "epoch": epoch,
            "title": "validation images (true → predicted)",
            "items": [
                {
                    **records.images_item(image, f"{label} → {self.classes[p]}", label == self.classes[p]),
                    "label": label,
                    "predicted": self.classes[p],
                }
                for image, label, p in zip(self.pngs, self.labels, predicted)
            ],
        }


def spread_sample(labels: list[int] | None, length: int, count: int, seed: int) -> list[int]:
    """``count`` indices of a split, seeded, spread over its classes as evenly as the classes allow."""
    order = list(range(length))
    random.Random(seed).shuffle(order)
    if labels is None:
        return sorted(order[:count])
    by_class: dict[int, list[int]] = {}
    for index in order:
        by_class.setdefault(labels[index], []).append(index)
    queues = [by_class[label] for label in sorted(by_class)]
    chosen: list[int] = []
    while len(chosen) < min(count, length):
        for queue in queues:
            if queue and len(chosen) < count:
                chosen.append(queue.pop(0))
    return chosen

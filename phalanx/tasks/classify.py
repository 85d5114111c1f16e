"""``--task classify`` (the default): one network, cross-entropy (label smoothing, MixUp/CutMix soft
targets), top-1 accuracy, a confusion matrix, and a fixed sample of validation images with their
predictions on the dashboard."""

from __future__ import annotations

import csv
import io
import json
import random
import re
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from .. import records
from ..atomic import atomic_write
from ..data import DataBundle, Mapped, build_datasets, dataset_labels, transforms
from ..data.images import ImageFiles, PathTable
from ..data.inputs import InputImages
from ..data.manifest import checked
from ..errors import PhalanxError
from ..finetune import Backbone, backbone_of, load_weights, param_groups
from ..models import build_model, required_channels, timm_preferences
from ..pictures import denormalize, png
from . import BUILTIN
from .base import Evaluation, Task, TaskData, full_precision
from .options import ClassifyOptions
from .predicting import Predictor

MAX_CONFUSION_CLASSES = 100  # larger matrices would swell the metrics log
SAMPLE = 16  # validation images shown each epoch


class ClassifyTask(Task):
    name = "classify"
    defaults = BUILTIN["classify"].defaults  # also a subclass's (your own task built on it)
    reads = BUILTIN["classify"].reads
    Options = ClassifyOptions
    loss_names = ("loss",)
    primary_model = "model"
    best_metric = ("acc", "max")
    metric_labels = {"acc": "accuracy", "top5": "top-5 accuracy", "loss": "loss"}
    options: ClassifyOptions

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        self.loss_fn = nn.CrossEntropyLoss(reduction="none", label_smoothing=self.options.label_smoothing)
        self.classes: list[str] = []
        self.mix = None
        self.backbone: Backbone | None = None
        self.flips = False

    # --- data and models
    def build_data(self) -> TaskData:
        data = build_datasets(self.cfg, required_channels(self.cfg.model), self.options.random_erasing,
                              timm_preferences(self.cfg.model))
        self.classes = data.classes
        self.flips = data.pipeline.random and self.cfg.hflip
        num = self.num_classes(data)
        self.mix = _mixer(self.options, num)
        description = data.description + (f", {num} outputs" if num != data.num_classes else "")
        return TaskData(data.train, data.val, description, data_info(data), skipped=data.skipped)

    def num_classes(self, data: DataBundle) -> int:
        if data.num_classes < 2:  # every prediction would be right: "100%" that means nothing
            only = f" ({data.classes[0]})" if data.classes else ""
            raise PhalanxError(f"the training data has one class{only}; a classifier needs two or more "
                               "(self-supervised tasks, --task simclr or byol, learn from one folder)", "--dataroot")
        wanted = self.options.num_classes
        if wanted and wanted < data.num_classes:
            raise PhalanxError(f"{wanted} is fewer than the {data.num_classes} classes in the data", "--num-classes")
        return wanted or data.num_classes

    def build_models(self, data: TaskData) -> dict[str, nn.Module]:
        outputs = self.options.num_classes or len(data.info["classes"])
        model = build_model(self.cfg.model, outputs, data.info["channels"])
        if self.options.freeze_backbone:
            self.backbone = Backbone(model)
        return {"model": model}

    def load_weights(self, models: Mapping[str, nn.Module], spec: str, data: TaskData) -> list[str]:
        return [load_weights(models["model"], spec, data.info["classes"], self.cfg.model)]

    def notes(self) -> list[str]:
        notes = [f"phalanx: {self.backbone.description}"] if self.backbone is not None else []
        if self.flips and looks_like_characters(self.classes):
            notes.append(f"phalanx: warning: the classes ({', '.join(self.classes[:4])}, ...) look like digits or "
                         "letters, which a horizontal flip turns into other shapes; --no-hflip keeps them as they are")
        return notes

    def param_groups(self, models: Mapping[str, nn.Module]) -> dict[str, list[dict[str, Any]]]:
        return {"model": param_groups(models["model"], self.options.head_lr_mult)}

    def train_mode(self, models: Mapping[str, nn.Module]) -> None:
        models["model"].train()
        if self.backbone is not None:
            self.backbone.train_mode()

    # --- training
    def training_step(self, batch: Any, ctx: Any) -> dict[str, torch.Tensor]:
        inputs, targets = batch
        if self.mix is not None:  # soft targets: probabilities over the classes
            inputs, targets = self.mix(inputs, targets)
        return {"loss": self.loss_fn(ctx.models["model"](inputs), targets)}

    # --- validation
    def empty_sums(self) -> dict[str, torch.Tensor]:
        classes = len(self.classes)
        return {"loss": torch.zeros(()), "correct": torch.zeros(()), "top5": torch.zeros(()),
                "samples": torch.zeros(()), "confusion": torch.zeros(classes * classes)}

    def validation_step(self, models: Mapping[str, nn.Module], batch: Any, ctx: Any) -> dict[str, torch.Tensor]:
        inputs, targets = batch
        logits = full_precision(models["model"](inputs))
        classes = len(self.classes)
        top = logits.topk(min(5, logits.shape[1]), dim=1).indices
        predicted = top[:, 0]
        return {"loss": nn.functional.cross_entropy(logits, targets, reduction="sum"),
                "correct": (predicted == targets).sum(), "top5": (top == targets[:, None]).any(1).sum(),
                "samples": torch.tensor(float(targets.numel())),
                "confusion": torch.bincount(targets * classes + predicted.clamp(max=classes - 1),
                                            minlength=classes ** 2)}

    def validation_metrics(self, sums: dict[str, torch.Tensor]) -> Evaluation:
        count = float(sums["samples"])
        classes = len(self.classes)
        metrics = {"loss": float(sums["loss"]) / max(count, 1.0), "acc": float(sums["correct"]) / max(count, 1.0),
                   "top5": float(sums["top5"]) / max(count, 1.0)}
        confusion = sums["confusion"].round().to(torch.int64).view(classes, classes).cpu()
        return Evaluation(metrics, {"confusion": confusion, "samples": int(count)})

    def epoch_records(self, evaluation: Evaluation, epoch: int) -> list[dict[str, Any]]:
        if len(self.classes) > MAX_CONFUSION_CLASSES:
            return []
        return [{"kind": "confusion", "epoch": epoch, "classes": self.classes,
                 "matrix": evaluation.extra["confusion"].tolist()}]

    def metric_names(self) -> list[str]:
        return ["loss", "acc", "top5"]

    def summary(self, metrics: dict[str, float]) -> str:
        text = f"val_loss {metrics['loss']:.4f}  val_acc {100 * metrics['acc']:.2f}%"
        if "ema_acc" in metrics:
            text += f"  ema_acc {100 * metrics['ema_acc']:.2f}%"
        return text

    def format_metric(self, name: str, value: float) -> str:
        return f"{100 * value:.2f}%" if name.endswith(("acc", "top5")) else f"{value:.4f}"

    # --- dashboard
    def panes(self) -> list[dict[str, Any]]:
        return records.CLASSIFY_PANES

    def visuals(self, data: TaskData) -> "ValidationSample":
        return ValidationSample(data.val, self.classes, data.info["mean"], data.info["std"], self.cfg.seed)

    # --- using a checkpoint
    def evaluation_data(self, trained: Any, dataroot: str | None, dataset: str | None) -> tuple[Dataset, str]:
        if not dataroot or (dataset or "folder") != "folder":
            data = self.build_data()
            what = f"the run's validation split ({data.description})" if not dataroot else data.description
            return data.val, what
        root = Path(dataroot)
        split = root / "val" if (root / "val").is_dir() else root
        if not split.is_dir():
            raise PhalanxError(f"{root} is not a directory", "--dataroot")
        found = checked(split)
        unknown = sorted(set(found.classes) - set(self.classes))
        if unknown:
            raise PhalanxError(f"{split} has classes the model was not trained on: {', '.join(unknown[:5])} (it "
                               f"knows {', '.join(self.classes[:10])})", "--dataroot")
        if found.broken:
            path, why = next(iter(found.broken.items()))
            raise PhalanxError(f"cannot read image {split / path} ({why})", "--dataroot")
        labels = np.asarray([self.classes.index(found.classes[label]) for label in found.labels], dtype=np.int64)
        files = ImageFiles(split, PathTable(found.paths), labels, "L" if trained.info["channels"] == 1 else "RGB")
        pipeline = pipeline_of(trained.info)
        files.min_side = pipeline.min_decoded_side(self.cfg.crop_scale)
        prepare = transforms.build(pipeline, self.cfg, train=False)
        return Mapped(files, prepare), f"{split} ({len(files)} images, {len(found.classes)} classes)"

    def results(self, evaluation: Evaluation) -> dict[str, Any]:
        confusion = evaluation.extra["confusion"]
        per_class = {}
        for index, name in enumerate(self.classes):
            total = int(confusion[index].sum())
            per_class[name] = {"images": total, "accuracy": confusion[index, index].item() / total if total else None}
        k = min(5, len(self.classes))
        m = evaluation.metrics
        return {"images": evaluation.extra["samples"], "loss": m["loss"], "top1": m["acc"], f"top{k}": m["top5"],
                "per_class": per_class, "classes": self.classes, "confusion_matrix": confusion.tolist()}

    def results_table(self, results: dict[str, Any]) -> str:
        k = next(key for key in results if key.startswith("top") and key != "top1")
        lines = [f"{results['checkpoint']} on {results['data']}",
                 f"images {results['images']}  loss {results['loss']:.4f}  top-1 {100 * results['top1']:.2f}%  "
                 f"top-{k[3:]} {100 * results[k]:.2f}%", "", f"{'class':<20} {'images':>7} {'accuracy':>9}"]
        for name, row in results["per_class"].items():
            accuracy = "-" if row["accuracy"] is None else f"{100 * row['accuracy']:.2f}%"
            lines.append(f"{name[:20]:<20} {row['images']:>7} {accuracy:>9}")
        classes = results["classes"]
        if len(classes) <= 12:  # larger matrices are in the JSON only
            width = max(6, max(len(c) for c in classes) + 1)
            lines += ["", "confusion (rows: true class, columns: predicted)",
                      " " * width + "".join(f"{c[:width - 1]:>{width}}" for c in classes)]
            for name, row in zip(classes, results["confusion_matrix"]):
                lines.append(f"{name[:width - 1]:<{width}}" + "".join(f"{v:>{width}}" for v in row))
        return "\n".join(lines)

    def feature_inputs(self, trained: Any, paths: list[Path]) -> tuple[nn.Module, Dataset]:
        """The classifier without its last Linear layer, on images prepared as validation prepares them."""
        pipeline = pipeline_of(trained.info)
        images = InputImages(paths, "L" if trained.info["channels"] == 1 else "RGB",
                             transforms.build(pipeline, self.cfg, train=False), pipeline.min_decoded_side(1.0))
        return backbone_of(trained.models[self.primary_model])[0], images

    def check_predict_output(self, output: str) -> None:
        if Path(output).suffix not in (".csv", ".jsonl"):
            raise PhalanxError(f"must end in .csv or .jsonl (got {Path(output).name})", "--output")

    def predictor(self, trained: Any, paths: list[Path], opts: Any, device: torch.device) -> Predictor:
        """The most likely classes of each image, to a CSV or JSONL table."""
        pipeline = pipeline_of(trained.info)
        inputs = InputImages(paths, "L" if trained.info["channels"] == 1 else "RGB",
                             transforms.build(pipeline, self.cfg, train=False), pipeline.min_decoded_side(1.0))
        return ClassPredictor(inputs, paths, device, trained.models[self.primary_model], self.classes, opts)

    def export_modules(self, trained: Any) -> dict[str, tuple[nn.Module, torch.Tensor]]:
        size, channels = trained.info["size"], trained.info["channels"]
        example = torch.randn(2, channels, size, size, generator=torch.Generator().manual_seed(0))
        return {self.primary_model: (trained.models[self.primary_model], example)}

    def export_metadata(self, trained: Any) -> dict[str, Any]:
        """Class names and preprocessing, for files that leave phalanx (export's FILE.json)."""
        info = trained.info
        return {"classes": self.classes, "channels": info["channels"], "image_size": info["size"],
                "resize_shorter_side": pipeline_of(info).evaluation_resize, "center_crop": info["size"],
                "mean": list(info["mean"]), "std": list(info["std"]),
                "input": "RGB" if info["channels"] == 3 else "grayscale",
                "scale": "pixels / 255, then (x - mean) / std", "outputs": "logits, one per class"}

    def restore_info(self, info: dict[str, Any]) -> None:
        """What a checkpoint says the data resolved to (inference builds no training data)."""
        self.classes = list(info["classes"])


class ClassPredictor(Predictor):
    def __init__(self, inputs: Dataset, paths: list[Path], device: torch.device, model: nn.Module,
                 classes: list[str], opts: Any):
        super().__init__(inputs, paths, device)
        self.model, self.classes, self.batch_size, self.output = model.to(device), classes, opts.batch_size, opts.output
        self.k = min(opts.top_k, len(classes))
        self.rows: list[dict[str, Any]] = []

    def predict(self, indices: list[int], images: list[torch.Tensor], raws: list) -> None:
        probabilities = self.model(torch.stack(images).to(self.device)).float().softmax(1)
        top = probabilities.topk(self.k, dim=1)
        for i, p, c in zip(indices, top.values.tolist(), top.indices.tolist()):
            self.rows.append({"path": str(self.paths[i]), "class": self.classes[c[0]], "probability": p[0],
                              "top_k": [{"class": self.classes[ci], "probability": pi} for ci, pi in zip(c, p)]})

    def finish(self) -> None:
        _write_predictions(Path(self.output), self.rows)


CHARACTER = re.compile(r"^(?:(?:digit|number|num|char|character|letter|class)[ _-]?)?[0-9A-Za-z]$", re.IGNORECASE)


def looks_like_characters(classes: list[str]) -> bool:
    """Class names such as 0-9, a-z or digit3: a flip changes what such images show."""
    return len(classes) >= 2 and all(CHARACTER.match(name) for name in classes)


def data_info(data: DataBundle) -> dict[str, Any]:
    """What the data resolved to (classes, image size, normalisation): inference needs it."""
    p = data.pipeline
    return {"classes": data.classes, "channels": data.in_channels, "size": p.size, "crop_pct": p.crop_pct,
            "mean": list(p.mean), "std": list(p.std)}


def pipeline_of(info: dict[str, Any]) -> transforms.Pipeline:
    return transforms.Pipeline(info["size"], "none", info["crop_pct"], tuple(info["mean"]), tuple(info["std"]))


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


def _write_predictions(output: Path, rows: list[dict[str, Any]]) -> None:
    if output.suffix == ".jsonl":
        text = "".join(json.dumps(row) + "\n" for row in rows)
    else:
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(["path", "class", "probability", "top_k"])
        for row in rows:
            top = ";".join(f"{t['class']}:{t['probability']:.6f}" for t in row["top_k"])
            writer.writerow([row["path"], row["class"], f"{row['probability']:.6f}", top])
        text = buffer.getvalue()
    atomic_write(output, lambda fh: fh.write(text.encode()))


class ValidationSample:
    """A fixed, seeded sample of validation images spread over the classes (round robin, each class
    in a seeded order), shown with the model's predictions each epoch: the same images every epoch,
    so the grid shows the predictions change as training goes."""

    def __init__(self, val: Dataset, classes: list[str], mean: list[float], std: list[float], seed: int):
        indices = spread_sample(dataset_labels(val), len(val), SAMPLE, seed)
        items = [val[i] for i in indices]
        self.images = torch.stack([image for image, _ in items]) if items else torch.zeros(0)
        self.labels = [classes[int(label)] for _, label in items]
        self.classes = classes
        self.pngs = [png(image) for image in denormalize(self.images, mean, std)] if items else []

    @torch.no_grad()
    def record(self, models: Mapping[str, nn.Module], epoch: int, ctx: Any) -> dict[str, Any]:
        model = models["model"]
        was_training = model.training
        model.eval()
        with ctx.autocast():
            predicted = model(ctx.to_device(self.images)).argmax(1).tolist() if self.pngs else []
        model.train(was_training)
        return {"kind": "images", "epoch": epoch, "title": "validation images (true → predicted)", "items": [
            {**records.images_item(image, f"{label} → {self.classes[p]}", label == self.classes[p]),
             "label": label, "predicted": self.classes[p]}
            for image, label, p in zip(self.pngs, self.labels, predicted)]}


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

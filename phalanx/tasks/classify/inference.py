"""``--task classify``'s evaluation (per-class accuracy and a confusion matrix, on any folder of
the trained classes), predictions (top-k classes to CSV or JSONL), features and export."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from ...data import Mapped, transforms
from ...data.images import ImageFiles, PathTable
from ...data.inputs import InputImages
from ...data.layout import evaluation_dir
from ...data.manifest import checked
from ...errors import PhalanxError
from ...models.weights import backbone_of
from ...system.atomic import atomic_write
from ..base import Evaluation
from ..inference import STDOUT, Inference, Predictor

if TYPE_CHECKING:
    from ...config.inference import PredictOptions
    from .task import ClassifyTask


class ClassifyInference(Inference):
    task: ClassifyTask
    predict_options = ("top_k",)
    streams = True  # predict --output -: the table's rows as JSON lines on stdout

    def evaluation_data(self, dataroot: str | None, dataset: str | None) -> tuple[Dataset, str]:
        if not dataroot or (dataset or "folder") != "folder":
            data = self.task.build_data()
            what = f"the run's validation split ({data.description})" if not dataroot else data.description
            return data.val, what
        root = Path(dataroot)
        split = evaluation_dir(root)
        if not split.is_dir():
            raise PhalanxError(f"{root} is not a directory", "--dataroot")
        found = checked(split)
        unknown = sorted(set(found.classes) - set(self.task.classes))
        if unknown:
            raise PhalanxError(
                f"{split} has classes the model was not trained on: {', '.join(unknown[:5])} (it "
                f"knows {', '.join(self.task.classes[:10])})",
                "--dataroot",
            )
        if found.broken:
            path, why = next(iter(found.broken.items()))
            raise PhalanxError(f"cannot read image {split / path} ({why})", "--dataroot")
        labels = np.asarray([self.task.classes.index(found.classes[label]) for label in found.labels], dtype=np.int64)
        files = ImageFiles(split, PathTable(found.paths), labels, "L" if self.info["channels"] == 1 else "RGB")
        pipeline = pipeline_of(self.info)
        files.min_side = pipeline.min_decoded_side(self.cfg.data.crop_scale)
        prepare = transforms.build(pipeline, self.cfg.data, train=False)
        return Mapped(files, prepare), f"{split} ({len(files)} images, {len(found.classes)} classes)"

    def results(self, evaluation: Evaluation) -> dict[str, Any]:
        confusion = evaluation.extra["confusion"]
        per_class = {}
        for index, name in enumerate(self.task.classes):
            total = int(confusion[index].sum())
            per_class[name] = {"images": total, "accuracy": confusion[index, index].item() / total if total else None}
        k = min(5, len(self.task.classes))
        m = evaluation.metrics
        return {
            "images": evaluation.extra["samples"],
            "loss": m["loss"],
            "top1": m["acc"],
            f"top{k}": m["top5"],
            "per_class": per_class,
            "classes": self.task.classes,
            "confusion_matrix": confusion.tolist(),
        }

    def results_table(self, results: dict[str, Any]) -> str:
        k = next(key for key in results if key.startswith("top") and key != "top1")
        lines = [
            f"images {results['images']}  loss {results['loss']:.4f}  top-1 {100 * results['top1']:.2f}%  "
            f"top-{k[3:]} {100 * results[k]:.2f}%",
            "",
            f"{'class':<20} {'images':>7} {'accuracy':>9}",
        ]
        for name, row in results["per_class"].items():
            accuracy = "-" if row["accuracy"] is None else f"{100 * row['accuracy']:.2f}%"
            lines.append(f"{name[:20]:<20} {row['images']:>7} {accuracy:>9}")
        classes = results["classes"]
        if len(classes) <= 12:  # larger matrices are in the JSON only
            width = max(6, max(len(c) for c in classes) + 1)
            lines += [
                "",
                "confusion (rows: true class, columns: predicted)",
                " " * width + "".join(f"{c[: width - 1]:>{width}}" for c in classes),
            ]
            for name, row in zip(classes, results["confusion_matrix"]):
                lines.append(f"{name[: width - 1]:<{width}}" + "".join(f"{v:>{width}}" for v in row))
        return "\n".join(lines)

    def feature_inputs(self, paths: list[Path]) -> tuple[nn.Module, Dataset]:
        """The classifier without its last Linear layer, on images prepared as validation prepares them."""
        pipeline = pipeline_of(self.info)
        images = InputImages(
            paths,
            "L" if self.info["channels"] == 1 else "RGB",
            transforms.build(pipeline, self.cfg.data, train=False),
            pipeline.min_decoded_side(1.0),
        )
        return backbone_of(self.models[self.task.primary_model])[0], images

    def check_predict_output(self, output: str) -> None:
        if output != STDOUT and Path(output).suffix not in (".csv", ".jsonl"):
            raise PhalanxError(f"must end in .csv or .jsonl, or be - for stdout (got {Path(output).name})", "--output")

    def predictor(self, paths: list[Path], opts: PredictOptions, device: torch.device) -> Predictor:
        """The most likely classes of each image, to a CSV or JSONL table."""
        pipeline = pipeline_of(self.info)
        inputs = InputImages(
            paths,
            "L" if self.info["channels"] == 1 else "RGB",
            transforms.build(pipeline, self.cfg.data, train=False),
            pipeline.min_decoded_side(1.0),
        )
        return ClassPredictor(inputs, paths, device, self.models[self.task.primary_model], self.task.classes, opts)

    def export_modules(self) -> dict[str, tuple[nn.Module, torch.Tensor]]:
        size, channels = self.info["size"], self.info["channels"]
        example = torch.randn(2, channels, size, size, generator=torch.Generator().manual_seed(0))
        return {self.task.primary_model: (self.models[self.task.primary_model], example)}

    def export_metadata(self) -> dict[str, Any]:
        """Class names and preprocessing, for files that leave phalanx (export's FILE.json)."""
        info = self.info
        return {
            "classes": self.task.classes,
            "channels": info["channels"],
            "image_size": info["size"],
            "resize_shorter_side": pipeline_of(info).evaluation_resize,
            "center_crop": info["size"],
            "mean": list(info["mean"]),
            "std": list(info["std"]),
            "input": "RGB" if info["channels"] == 3 else "grayscale",
            "scale": "pixels / 255, then (x - mean) / std",
            "outputs": "logits, one per class",
        }


class ClassPredictor(Predictor):
    def __init__(
        self, inputs: Dataset, paths: list[Path], device: torch.device, model: nn.Module, classes: list[str], opts: Any
    ):
        super().__init__(inputs, paths, device)
        self.model, self.classes, self.batch_size, self.output = model.to(device), classes, opts.batch_size, opts.output
        self.k = min(opts.top_k, len(classes))
        self.rows: list[dict[str, Any]] = []

    def predict(self, indices: list[int], images: list[torch.Tensor], raws: list) -> None:
        probabilities = self.model(torch.stack(images).to(self.device)).float().softmax(1)
        top = probabilities.topk(self.k, dim=1)
        for i, p, c in zip(indices, top.values.tolist(), top.indices.tolist()):
            self.rows.append(
                {
                    "path": str(self.paths[i]),
                    "class": self.classes[c[0]],
                    "probability": p[0],
                    "top_k": [{"class": self.classes[ci], "probability": pi} for ci, pi in zip(c, p)],
                }
            )

    def finish(self) -> None:
        write_predictions(self.output, self.rows)


def pipeline_of(info: dict[str, Any]) -> transforms.Pipeline:
    return transforms.Pipeline(info["size"], "none", info["crop_pct"], tuple(info["mean"]), tuple(info["std"]))


def write_predictions(output: str, rows: list[dict[str, Any]]) -> None:
    """A CSV or JSONL file, written whole and renamed into place; ``-``: JSON lines on stdout."""
    if output == STDOUT or output.endswith(".jsonl"):
        text = "".join(json.dumps(row) + "\n" for row in rows)
    else:
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(["path", "class", "probability", "top_k"])
        for row in rows:
            top = ";".join(f"{t['class']}:{t['probability']:.6f}" for t in row["top_k"])
            writer.writerow([row["path"], row["class"], f"{row['probability']:.6f}", top])
        text = buffer.getvalue()
    if output == STDOUT:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    atomic_write(Path(output), lambda fh: fh.write(text.encode()))

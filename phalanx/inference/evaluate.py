"""``phalanx evaluate``: top-1 and top-5 accuracy, loss, per-class accuracy and the confusion matrix
of a checkpoint, on the run's own validation split (reproducing what training recorded) or on
other data. Started inside a process group (torchrun, SLURM, MPI), the ranks share the data and
every sample is counted once, as in training's validation.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ..atomic import atomic_write_text
from ..config import RunConfig
from ..data import Mapped, build_datasets, loader_workers
from ..data.images import ImageFiles, PathTable
from ..data.manifest import checked
from ..errors import PhalanxError
from ..models import required_channels
from ..parallel import placement, strategy_for
from ..sampling import ShardSampler
from .model import Trained, load_trained
from .options import EvaluateOptions


def run_config(trained: Trained, opts: EvaluateOptions) -> RunConfig:
    """The training configuration, with this command's devices, batch size and data."""
    changes: dict[str, Any] = {"gpu_ids": opts.gpu_ids, "num_workers": opts.num_workers, "resume": None,
                               "overwrite": False, "sync_bn": False}
    if opts.batch_size:
        changes["batch_size"] = opts.batch_size
    if opts.dataroot:
        changes.update(dataroot=opts.dataroot, dataset=opts.dataset or "folder")
    return trained.config.replace(**changes)


def evaluation_data(trained: Trained, cfg: RunConfig, opts: EvaluateOptions) -> tuple[Dataset, str]:
    if not opts.dataroot:  # the run's own validation split, built as training built it
        data = build_datasets(cfg, required_channels(cfg.model))
        return data.val, f"the run's validation split ({data.description})"
    if cfg.dataset != "folder":
        data = build_datasets(cfg, required_channels(cfg.model))
        return data.val, data.description
    root = Path(opts.dataroot)
    split = root / "val" if (root / "val").is_dir() else root
    if not split.is_dir():
        raise PhalanxError(f"{root} is not a directory", "--dataroot")
    found = checked(split)
    unknown = sorted(set(found.classes) - set(trained.classes))
    if unknown:
        raise PhalanxError(f"{split} has classes the model was not trained on: {', '.join(unknown[:5])} (it knows "
                           f"{', '.join(trained.classes[:10])})", "--dataroot")
    if found.broken:
        path, why = next(iter(found.broken.items()))
        raise PhalanxError(f"cannot read image {split / path} ({why})", "--dataroot")
    labels = np.asarray([trained.classes.index(found.classes[label]) for label in found.labels], dtype=np.int64)
    files = ImageFiles(split, PathTable(found.paths), labels, "L" if trained.channels == 1 else "RGB")
    files.min_side = trained.pipeline.min_decoded_side(cfg.crop_scale)
    return Mapped(files, trained.preprocess()), f"{split} ({len(files)} images, {len(found.classes)} classes)"


def evaluate(opts: EvaluateOptions) -> dict[str, Any]:
    trained = load_trained(opts.checkpoint, opts.ema)
    cfg = run_config(trained, opts)
    with strategy_for(cfg, placement()) as strategy:
        dataset, what = evaluation_data(trained, cfg, opts)
        model = trained.model.to(strategy.device)
        if cfg.channels_last:
            model = model.to(memory_format=torch.channels_last)
        workers = loader_workers(cfg, strategy.local_world_size, strategy.training_threads)
        loader = DataLoader(dataset, batch_size=cfg.batch_size, num_workers=workers,
                            sampler=ShardSampler(len(dataset), strategy.rank, strategy.world_size))
        sums, confusion = _counts(model, loader, len(trained.classes), cfg, strategy.device)
        sums, confusion = strategy.all_reduce_sum(sums), strategy.all_reduce_sum(confusion)
        results = _results(trained, sums.tolist(), confusion.cpu(), what, strategy.world_size)
        if strategy.is_main:
            print(table(results))
            if opts.output:
                atomic_write_text(Path(opts.output), json.dumps(results, indent=2) + "\n")
        return results


@torch.no_grad()
def _counts(model: torch.nn.Module, loader: DataLoader, classes: int, cfg: RunConfig,
            device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Loss sum, top-1 and top-k hits, count; and the confusion matrix (true x predicted)."""
    k = min(5, classes)
    sums = torch.zeros(4, dtype=torch.float64, device=device)
    confusion = torch.zeros(classes, classes, dtype=torch.int64, device=device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision)
    autocast = torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()
    for inputs, targets in loader:
        inputs, targets = inputs.to(device), targets.to(device)
        if cfg.channels_last:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        with autocast:  # as training's validation computed it
            logits = model(inputs)
        logits = logits.float()
        top = logits.topk(k, dim=1).indices
        sums += torch.stack([torch.nn.functional.cross_entropy(logits, targets, reduction="sum").double(),
                             (top[:, 0] == targets).sum().double(), (top == targets[:, None]).any(1).sum().double(),
                             torch.tensor(float(len(targets)), dtype=torch.float64, device=device)])
        confusion += torch.bincount(targets * classes + top[:, 0], minlength=classes * classes).view(classes, classes)
    return sums, confusion


def _results(trained: Trained, sums: list[float], confusion: torch.Tensor, what: str, world: int) -> dict[str, Any]:
    loss, top1, topk, count = sums
    if count == 0:
        raise PhalanxError("no image to evaluate", "--dataroot")
    per_class = {}
    for index, name in enumerate(trained.classes):
        total = int(confusion[index].sum())
        per_class[name] = {"images": total, "accuracy": confusion[index, index].item() / total if total else None}
    return {"checkpoint": str(trained.path), "data": what, "images": int(count), "world_size": world,
            "loss": loss / count, "top1": top1 / count, f"top{min(5, len(trained.classes))}": topk / count,
            "per_class": per_class, "classes": trained.classes, "confusion_matrix": confusion.tolist()}


def table(results: dict[str, Any]) -> str:
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

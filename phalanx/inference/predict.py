"""``phalanx predict``: the most likely classes of image files, batched, with their probabilities.

Images are prepared as the run's validation prepared them (from the checkpoint). An image that
cannot be read is reported and skipped; it never stops the batch or the run.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from ..atomic import atomic_write
from ..data import loader_workers
from ..data.images import decode, import_decoders, read_bounded
from ..data.manifest import IMAGE_SUFFIXES
from ..errors import PhalanxError
from ..progress import ProgressBar
from .model import Trained, device_for, load_trained
from .options import PredictOptions


def image_paths(inputs: tuple[str, ...]) -> list[Path]:
    """Files as given, folders searched recursively for image files, in a stable order."""
    found: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found += sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        elif path.is_file():
            found.append(path)
        else:
            raise PhalanxError(f"{item} is neither an image file nor a folder", "IMAGES")
    if not found:
        raise PhalanxError(f"no image files in {', '.join(inputs)}", "IMAGES")
    return found


class Images(Dataset):
    """Prepared images, or the reason one could not be read (collated apart, never raised)."""

    def __init__(self, paths: list[Path], trained: Trained):
        self.paths, self.mode = paths, "L" if trained.channels == 1 else "RGB"
        self.transform = trained.preprocess()
        self.min_side = trained.pipeline.min_decoded_side(1.0)
        import_decoders()

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor | None, str | None]:
        try:
            image = decode(read_bounded(self.paths[index]), self.mode, self.min_side, fast=True)
            return index, self.transform(image), None
        except Exception as exc:
            return index, None, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]


def _collate(items: list) -> tuple[list[int], torch.Tensor | None, list[tuple[int, str]]]:
    good = [(i, image) for i, image, _ in items if image is not None]
    bad = [(i, why) for i, image, why in items if image is None]
    return [i for i, _ in good], torch.stack([image for _, image in good]) if good else None, bad


def predict(paths_given: tuple[str, ...], opts: PredictOptions) -> int:
    output = Path(opts.output)
    if output.suffix not in (".csv", ".jsonl"):
        raise PhalanxError(f"must end in .csv or .jsonl (got {output.name})", "--output")
    trained = load_trained(opts.checkpoint, opts.ema)
    paths = image_paths(paths_given)
    device = device_for(opts.gpu_ids)
    model = trained.model.to(device)
    workers = loader_workers(trained.config.replace(num_workers=opts.num_workers), 1,
                             torch.get_num_threads() if device.type == "cpu" else 1)
    loader = DataLoader(Images(paths, trained), batch_size=opts.batch_size, num_workers=workers, collate_fn=_collate)
    k = min(opts.top_k, len(trained.classes))
    rows, skipped = [], []
    bar = ProgressBar(len(loader), "predict", opts.progress)
    with torch.no_grad():
        for indices, images, bad in loader:
            skipped += [(paths[i], why) for i, why in bad]
            if images is not None:
                probabilities = model(images.to(device)).float().softmax(1)
                top = probabilities.topk(k, dim=1)
                for i, p, c in zip(indices, top.values.tolist(), top.indices.tolist()):
                    rows.append(_row(paths[i], trained.classes, p, c))
            bar.update(len(indices) + len(bad), lambda: 0.0)
    bar.close()
    _write(output, rows)
    for path, why in skipped:
        print(f"phalanx: warning: skipped {path}: {why}", file=sys.stderr, flush=True)
    print(f"phalanx: {len(rows)} image(s) predicted, {len(skipped)} skipped; wrote {output}")
    return len(skipped)


def _row(path: Path, classes: list[str], probabilities: list[float], indices: list[int]) -> dict[str, Any]:
    return {"path": str(path), "class": classes[indices[0]], "probability": probabilities[0],
            "top_k": [{"class": classes[c], "probability": p} for c, p in zip(indices, probabilities)]}


def _write(output: Path, rows: list[dict[str, Any]]) -> None:
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

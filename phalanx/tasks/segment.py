"""``--task segment``: semantic segmentation with torchvision's segmenters or your own.

Image + mask PNG pairs (``data/masks.py``). The loss of a sample is its pixels' mean cross-entropy
(``--ignore-index`` left out), so 2 DDP workers x B train what one process x 2B does. Validation:
the confusion matrix of every validation pixel, all-reduced (exact at any world size), gives the
IoU of each class, their mean (mIoU) and the pixel accuracy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch
from torch import nn
from torch.utils.data import Dataset

from .. import records
from ..atomic import atomic_write
from ..data import SeededView
from ..data.inputs import InputImages, output_names
from ..data.masks import MaskPairs, find_masks
from ..data.transforms import IMAGENET_MEAN, IMAGENET_STD, normalisation
from ..errors import PhalanxError
from ..pictures import denormalize, png, strip
from . import BUILTIN
from .base import Evaluation, Task, TaskData, fixed_sample, full_precision, pane
from .options import SegmentOptions
from .predicting import Predictor

SEGMENTERS = ("lraspp_mobilenet_v3_large", "deeplabv3_mobilenet_v3_large", "deeplabv3_resnet50", "deeplabv3_resnet101",
              "fcn_resnet50", "fcn_resnet101")
SHOWN = 4


def palette(classes: int) -> torch.Tensor:
    """A colour per class (0, the background, black), well apart for the first dozen."""
    colours = [(0, 0, 0)]
    for c in range(1, classes):
        hue = (c * 0.618034) % 1.0
        r, g, b = (max(0.0, min(1.0, abs((hue * 6 + k) % 6 - 3) - 1)) for k in (0, 4, 2))
        colours.append((r, g, b))
    return torch.tensor(colours)


def overlay(image: torch.Tensor, mask: torch.Tensor, classes: int) -> torch.Tensor:
    """An image in [0, 1] (3, H, W) with its mask's classes painted over at half strength."""
    colours = palette(max(classes, 2))[mask.clamp(0, max(classes, 2) - 1)].permute(2, 0, 1)
    painted = mask > 0
    return torch.where(painted[None], 0.5 * image + 0.5 * colours, image)


class Logits(nn.Module):
    """A segmenter that returns torchvision's ``{"out": logits}`` as the logits alone (for export)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        out = self.model(images)
        return out["out"] if isinstance(out, dict) else out


class SegmentTask(Task):
    name = "segment"
    defaults = BUILTIN["segment"].defaults  # also a subclass's (your own task built on it)
    reads = BUILTIN["segment"].reads
    Options = SegmentOptions
    primary_model = "segmenter"
    best_metric = ("mIoU", "max")
    metric_labels = {"mIoU": "mean IoU", "pixel_acc": "pixel accuracy", "loss": "loss"}
    options: SegmentOptions

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        self.classes = self.options.num_classes

    # --- data and networks
    def transforms(self, size: int, train: bool):
        from torchvision import tv_tensors
        from torchvision.transforms import v2

        steps = [v2.RandomResizedCrop(size, scale=(0.25, 1.0), antialias=True)] if train else \
            [v2.Resize(size, antialias=True), v2.CenterCrop(size)]
        if train and self.cfg.hflip:
            steps.append(v2.RandomHorizontalFlip())
        steps += [v2.ToDtype({tv_tensors.Image: torch.float32, "others": None}, scale=True),
                  v2.Normalize(list(self.mean), list(self.std))]
        return v2.Compose(steps)

    def build_data(self) -> TaskData:
        cfg, o = self.cfg, self.options
        if not cfg.dataroot:
            raise PhalanxError("--task segment reads image and mask pairs: give --dataroot DIR (DIR/train/images/ "
                               "and DIR/train/masks/)", "--dataroot")
        root = Path(cfg.dataroot)
        if not (root / "train").is_dir() or not (root / "val").is_dir():
            raise PhalanxError(f"{root} needs train/ and val/, each with images/ and masks/", "--dataroot")
        train = find_masks(root / "train", o.num_classes, o.ignore_index, cfg.skip_broken)
        self.classes = o.num_classes or train.largest + 1
        val = find_masks(root / "val", self.classes, o.ignore_index, cfg.skip_broken)
        if self.classes < 2:
            raise PhalanxError(f"the masks of {root / 'train'} hold the background alone; give --num-classes",
                               "--num-classes")
        stats = normalisation(cfg, 3)
        self.mean, self.std = stats if stats is not None and cfg.normalize != "auto" or cfg.mean else \
            (IMAGENET_MEAN, IMAGENET_STD)
        size = cfg.image_size
        augment = cfg.augment != "none"
        prepare = self.transforms(size, train=False)
        base = MaskPairs(train)
        training = SeededView(base, (lambda s, t=self.transforms(size, True): t(*s)) if augment else
                              (lambda s: prepare(*s)), cfg.seed, plain=MaskPairs(train, prepare))
        skipped = {**train.skipped, **val.skipped}
        gone = f"; {len(skipped)} pair(s) left out" if skipped else ""
        description = (f"{root} ({len(train)} train / {len(val)} val pairs, {self.classes} classes, {size}x{size}"
                       f"{', random resized crop + flip' if augment else ''}{gone})")
        info = {"classes": self.classes, "size": size, "mean": list(self.mean), "std": list(self.std),
                "ignore_index": o.ignore_index}
        return TaskData(training, MaskPairs(val, prepare), description, info, skipped=skipped)

    def restore_info(self, info: dict[str, Any]) -> None:
        self.classes, self.mean, self.std = info["classes"], tuple(info["mean"]), tuple(info["std"])

    def build_models(self, data: TaskData) -> dict[str, nn.Module]:
        classes, spec = data.info["classes"], self.cfg.model
        if ":" in spec:
            from ..models import build_model

            return {"segmenter": build_model(spec, classes, 3)}
        if spec not in SEGMENTERS:
            raise PhalanxError(f"--task segment takes {', '.join(SEGMENTERS)}, or your own package.module:function "
                               f"(got {spec!r})", "--model")
        from torchvision.models import get_model

        extra = {"aux_loss": self.options.aux_loss} if not spec.startswith("lraspp") else {}
        if self.options.aux_loss and spec.startswith("lraspp"):
            raise PhalanxError("lraspp has no auxiliary classifier", "--aux-loss")
        return {"segmenter": get_model(spec, weights=None, weights_backbone=None, num_classes=classes, **extra)}

    def load_weights(self, models: Mapping[str, nn.Module], spec: str, data: TaskData) -> list[str]:
        from ..finetune import load_weights

        return [load_weights(models["segmenter"], spec, [str(c) for c in range(self.classes)])]

    # --- training
    def per_sample(self, logits: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        """Each sample's mean cross-entropy over its pixels that count."""
        ignore = self.options.ignore_index
        loss = nn.functional.cross_entropy(logits, masks, ignore_index=ignore, reduction="none")
        counted = (masks != ignore).flatten(1).sum(1).clamp(min=1)
        return loss.flatten(1).sum(1) / counted

    def training_step(self, batch: Any, ctx: Any) -> dict[str, torch.Tensor]:
        images, masks = batch
        out = ctx.models["segmenter"](images)
        logits = out["out"] if isinstance(out, dict) else out
        loss = self.per_sample(logits, masks)
        if isinstance(out, dict) and "aux" in out:
            loss = loss + 0.5 * self.per_sample(out["aux"], masks)
        return {"loss": loss}

    # --- validation: an all-reduced confusion matrix
    def metric_names(self) -> list[str]:
        return ["mIoU", "pixel_acc", "loss"]

    def empty_sums(self) -> dict[str, torch.Tensor]:
        return {"loss": torch.zeros(()), "samples": torch.zeros(()), "confusion": torch.zeros(self.classes ** 2)}

    def validation_step(self, models: Mapping[str, nn.Module], batch: Any, ctx: Any) -> dict[str, torch.Tensor]:
        images, masks = batch
        out = models["segmenter"](images)
        logits = full_precision(out["out"] if isinstance(out, dict) else out)
        counted = masks != self.options.ignore_index
        predicted = logits.argmax(1)
        pairs = masks[counted] * self.classes + predicted[counted]
        return {"loss": self.per_sample(logits, masks).sum(), "samples": torch.tensor(float(len(images))),
                "confusion": torch.bincount(pairs, minlength=self.classes ** 2)}

    def validation_metrics(self, sums: dict[str, torch.Tensor]) -> Evaluation:
        confusion = sums["confusion"].round().to(torch.int64).view(self.classes, self.classes).cpu()
        truth, predicted, hits = confusion.sum(1), confusion.sum(0), confusion.diag()
        union = truth + predicted - hits
        iou = [float(hits[c]) / float(union[c]) if union[c] else None for c in range(self.classes)]
        present = [v for v in iou if v is not None]
        count = max(float(sums["samples"]), 1.0)
        metrics = {"mIoU": sum(present) / len(present) if present else 0.0,
                   "pixel_acc": float(hits.sum()) / max(float(confusion.sum()), 1.0),
                   "loss": float(sums["loss"]) / count}
        return Evaluation(metrics, {"iou": iou, "confusion": confusion, "samples": int(float(sums["samples"]))})

    def summary(self, metrics: dict[str, float]) -> str:
        return f"val_loss {metrics['loss']:.4f}  val_mIoU {metrics['mIoU']:.4f}  val_pixel_acc " \
               f"{100 * metrics['pixel_acc']:.2f}%"

    def format_metric(self, name: str, value: float) -> str:
        return f"{100 * value:.2f}%" if name.endswith("acc") else f"{value:.4f}"

    # --- dashboard
    def panes(self) -> list[dict[str, Any]]:
        return [pane("train_loss", "train loss (mean over ranks)", "cross-entropy per pixel", "train", [("loss", "loss")]),
                pane("val_loss", "validation loss", "cross-entropy per pixel", "val",
                     [("loss", "val loss"), ("ema_loss", "EMA val loss")]),
                pane("val_mIoU", "validation mean IoU", "IoU", "val", [("mIoU", "mIoU"), ("ema_mIoU", "EMA mIoU")]),
                pane("val_pixel_acc", "validation pixel accuracy", "accuracy (%)", "val",
                     [("pixel_acc", "pixel accuracy")], percent=True)]

    def visuals(self, data: TaskData) -> "SegmentationSample":
        return SegmentationSample(self, [data.val[i] for i in fixed_sample(len(data.val), SHOWN, self.cfg.seed)])

    # --- using a checkpoint
    def evaluation_split(self, trained: Any, split: Path) -> tuple[Dataset, str]:
        found = find_masks(split, self.classes, self.options.ignore_index, skip_broken=False)
        return MaskPairs(found, self.transforms(trained.info["size"], False)), f"{split} ({len(found)} pairs)"

    def results(self, evaluation: Evaluation) -> dict[str, Any]:
        return {"images": evaluation.extra["samples"], "iou": evaluation.extra["iou"],
                "confusion_matrix": evaluation.extra["confusion"].tolist(), "scored_at": self.scored_at()}

    def scored_at(self) -> str:
        # Validation's pixels, not predict's: predict writes each mask at its image's own size, so a
        # mIoU of predict's masks against full-size truth can differ from this one.
        size = self.cfg.image_size
        return (f"masks resized (shorter side) to {size} px and centre-cropped to {size}x{size}, as validation "
                "prepares them; predict writes masks at each image's own size")

    def results_table(self, results: dict[str, Any]) -> str:
        m = results["metrics"]
        lines = [f"{results['checkpoint']} on {results['data']}", f"scored on {results['scored_at']}",
                 f"images {results['images']}  mIoU {m['mIoU']:.4f}  pixel accuracy {100 * m['pixel_acc']:.2f}%", "",
                 f"{'class':<8} {'IoU':>8}"]
        lines += [f"{c:<8} {'-' if v is None else f'{v:.4f}':>8}" for c, v in enumerate(results["iou"])]
        return "\n".join(lines)

    def check_predict_output(self, output: str) -> None:
        path = Path(output)
        if path.suffix or (path.exists() and not path.is_dir()):
            raise PhalanxError(f"is a folder for --task segment (masks/ and overlays/ of PNGs), not a file "
                               f"({path.name})", "--output")

    def predictor(self, trained: Any, paths: list[Path], opts: Any, device: torch.device) -> Predictor:
        """Each image's mask (a class index per pixel, at the image's size) to OUTPUT/masks/<name>.png,
        and the image with its classes painted over to OUTPUT/overlays/<name>.png; <name> keeps the
        image's folders below the deepest folder holding every input (``output_names``)."""
        info = trained.info
        mean, std = torch.tensor(info["mean"]).view(3, 1, 1), torch.tensor(info["std"]).view(3, 1, 1)
        inputs = InputImages(paths, "RGB", lambda image: (image.float() / 255 - mean) / std, keep_raw=True)
        return MaskPredictor(inputs, paths, device, Logits(trained.models["segmenter"]), self.classes, info["size"],
                             Path(opts.output))

    def export_modules(self, trained: Any) -> dict[str, tuple[nn.Module, torch.Tensor]]:
        size = trained.info["size"]
        return {"segmenter": (Logits(trained.models["segmenter"]), torch.zeros(2, 3, size, size))}

    def export_metadata(self, trained: Any) -> dict[str, Any]:
        info = trained.info
        return {"input": "RGB", "mean": info["mean"], "std": info["std"], "classes": info["classes"],
                "scale": "pixels / 255, then (x - mean) / std",
                "outputs": "logits (N, classes, H, W); argmax over classes for the mask"}


def _png_bytes(picture) -> bytes:
    import io

    buffer = io.BytesIO()
    picture.save(buffer, "PNG")
    return buffer.getvalue()


class SegmentationSample:
    """Each epoch: the same validation images, each as image | prediction | truth."""

    def __init__(self, task: SegmentTask, samples: list):
        self.task, self.samples = task, samples

    @torch.no_grad()
    def record(self, models: Mapping[str, nn.Module], epoch: int, ctx: Any) -> dict[str, Any]:
        if not self.samples:
            return {"kind": "images", "epoch": epoch, "items": []}
        model = models["segmenter"]
        was_training = model.training
        model.eval()
        images = torch.stack([image.as_subclass(torch.Tensor) for image, _ in self.samples])
        with ctx.autocast():
            out = model(ctx.to_device(images))
        predicted = full_precision(out["out"] if isinstance(out, dict) else out).argmax(1).cpu()
        model.train(was_training)
        items = []
        for i, (image, mask) in enumerate(self.samples):
            shown = denormalize(image.as_subclass(torch.Tensor), self.task.mean, self.task.std)
            truth = mask.as_subclass(torch.Tensor).clone()
            truth[truth == self.task.options.ignore_index] = 0
            panels = [shown, overlay(shown, predicted[i], self.task.classes), overlay(shown, truth, self.task.classes)]
            items.append(records.images_item(png(strip(panels)), "image | predicted | truth"))
        return {"kind": "images", "epoch": epoch, "title": "validation: image | predicted | truth", "items": items}


class MaskPredictor(Predictor):
    """One image at a time, at its own size: resized to the training size's shorter side for the
    network, the logits resized back."""

    def __init__(self, inputs: Dataset, paths: list[Path], device: torch.device, model: nn.Module, classes: int,
                 size: int, output: Path):
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
            logits = nn.functional.interpolate(full_precision(self.model(small.to(self.device))).cpu(),
                                               size=(height, width), mode="bilinear")
            mask = logits.argmax(1)[0]
            array = mask.numpy().astype("uint8" if self.classes <= 256 else "int32")
            for folder, data in (("masks", _png_bytes(Image.fromarray(array))),
                                 ("overlays", png(overlay(raw.float() / 255, mask, self.classes), min_side=0))):
                target = self.output / folder / self.names[index]
                target.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(target, lambda fh, data=data: fh.write(data))

"""The options of ``evaluate``, ``predict`` and ``export``, each declared once (as ``RunConfig``'s)."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import DATASETS
from ..fields import option

CHECKPOINT_HELP = "A phalanx checkpoint (latest.pt, best.pt, epoch_NNNN.pt); it is all these commands need."


@dataclass(frozen=True)
class EvaluateOptions:
    checkpoint: str = option(None, CHECKPOINT_HELP, metavar="PATH")
    dataroot: str | None = option(None, "Evaluate on this data instead of the run's validation split: a folder of "
                                  "class folders (DIR/val/ if there is one), or torchvision's files for --dataset.",
                                  metavar="DIR")
    dataset: str | None = option(None, "With --dataroot: the data set kind (default: folder).", choices=DATASETS)
    output: str | None = option(None, "Also write the results as JSON to this file.", metavar="FILE")
    batch_size: int = option(0, "Batch size (0: the run's).", metavar="N")
    gpu_ids: tuple[int, ...] = option((), "GPU to evaluate on (-1 or none: CPU).", metavar="ID")
    num_workers: str = option("auto", "DataLoader worker processes.", metavar="N|auto")
    ema: bool = option(False, "Evaluate the moving average of the weights (a run with --ema-decay).")


@dataclass(frozen=True)
class PredictOptions:
    checkpoint: str = option(None, CHECKPOINT_HELP, metavar="PATH")
    output: str = option(None, "Where to write the predictions: .csv or .jsonl (classify), a folder (translate, "
                         "segment), .json (detect), .npy (simclr, byol, --features).", metavar="PATH")
    features: bool = option(False, "Write each image's features instead (OUTPUT.npy, one row per image, the image "
                            "list in OUTPUT.txt): a classifier without its last Linear layer, a SimCLR/BYOL "
                            "backbone.")
    top_k: int = option(5, "How many of the most likely classes to list per image.", metavar="K")
    batch_size: int = option(64, "Images per batch.", metavar="N")
    gpu_ids: tuple[int, ...] = option((), "GPU to predict on (-1 or none: CPU).", metavar="ID")
    num_workers: str = option("auto", "DataLoader worker processes.", metavar="N|auto")
    ema: bool = option(False, "Predict with the moving average of the weights (a run with --ema-decay).")
    progress: bool = option(True, "Show a progress bar on stderr.")
    score_threshold: float = option(0.3, "--task detect: detections below this score are left out.", metavar="S")
    tile_overlap: int = option(32, "--task translate: images larger than the training size are translated in tiles "
                               "of that size overlapping by this many pixels, blended.", metavar="PIXELS")


@dataclass(frozen=True)
class ExportOptions:
    checkpoint: str = option(None, CHECKPOINT_HELP, metavar="PATH")
    format: str = option("torchscript", "torchscript: loads with torch.jit.load; exported-program: loads with "
                         "torch.export.load.", choices=("torchscript", "exported-program"))
    output: str = option(None, "The file to write; class names and preprocessing go beside it, in FILE.json.",
                         metavar="FILE")
    ema: bool = option(False, "Export the moving average of the weights (a run with --ema-decay).")

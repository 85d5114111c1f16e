"""The options of ``evaluate``, ``predict`` and ``export``, each declared once (as ``RunConfig``'s)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import PhalanxError
from . import registry
from .fields import option
from .sections import DATASETS

CHECKPOINT_HELP = (
    "A phalanx checkpoint (latest.pt, best.pt, epoch_NNNN.pt), or a run directory (its best.pt, "
    "else its latest.pt)"
    + "".join(f", or {words}" for _, words in registry.folder_readers())
    + "; it is all these commands need."
)
PROGRESS_HELP = "Show a progress bar on stderr."
OVERWRITE_HELP = (
    "Replace an --output file that phalanx did not write (never the checkpoint itself); files phalanx "
    "wrote are replaced without it."
)


def at_least(value: int, least: int, option_name: str, why: str) -> None:
    """Checked where the options are built, so a bad value is refused before any work."""
    if value < least:
        raise PhalanxError(f"must be at least {least} ({why}); got {value}", option_name)


@dataclass(frozen=True)
class EvaluateOptions:
    checkpoint: str = option(None, CHECKPOINT_HELP, metavar="PATH")
    dataroot: str | None = option(
        None,
        "Evaluate on this data instead of the run's validation split: a folder of "
        "class folders (DIR/val/ if there is one), or torchvision's files for --dataset.",
        metavar="DIR",
    )
    dataset: str | None = option(None, "With --dataroot: the data set kind (default: folder).", choices=DATASETS)
    output: str | None = option(None, "Also write the results as JSON to this file.", metavar="FILE")
    batch_size: int = option(0, "Batch size (0: the run's).", metavar="N")
    gpu_ids: tuple[int, ...] = option((), "GPU to evaluate on (-1 or none: CPU).", metavar="ID")
    num_workers: str = option("auto", "DataLoader worker processes.", metavar="N|auto")
    ema: bool = option(False, "Evaluate the moving average of the weights (a run with --ema-decay).")
    knn_k: int = option(
        0,
        "A self-supervised checkpoint's kNN accuracy with this many neighbours (0: the run's "
        "--knn-k); fewer than the labelled images, or every one votes.",
        metavar="K",
    )
    progress: bool = option(True, PROGRESS_HELP)
    overwrite: bool = option(False, OVERWRITE_HELP)

    def __post_init__(self) -> None:
        at_least(self.batch_size, 0, "--batch-size", "images per batch; 0 for the run's")
        at_least(self.knn_k, 0, "--knn-k", "neighbours; 0 for the run's")


@dataclass(frozen=True)
class PredictOptions:
    # Read by some tasks' predictors alone (each task's Inference.predict_options says which).
    TASK_SPECIFIC = (
        "top_k",
        "score_threshold",
        "tile_overlap",
        "region_size",
        "tiling",
        "tile_size",
        "seg_weights",
        "seg_intermediate",
        "seg_thresh",
        "size_thresh",
        "size_thresh_upper",
        "marker_thresh",
    )

    # ... and of those, the ones that set the checkpoint's task option of the same name
    TASK_OVERRIDES = ("seg_weights",)

    checkpoint: str = option(None, CHECKPOINT_HELP, metavar="PATH")
    output: str = option(
        None,
        f"Where to write the predictions: {registry.predict_outputs_help()}; .npy with --features.",
        metavar="PATH",
    )
    features: bool = option(
        False,
        "Write each image's features instead (OUTPUT.npy, one row per image, the image "
        "list in OUTPUT.txt): a classifier without its last Linear layer, a self-supervised "
        "backbone.",
    )
    top_k: int = option(5, "How many of the most likely classes to list per image.", metavar="K")
    batch_size: int = option(64, "Images per batch.", metavar="N")
    gpu_ids: tuple[int, ...] = option((), "GPU to predict on (-1 or none: CPU).", metavar="ID")
    num_workers: str = option("auto", "DataLoader worker processes.", metavar="N|auto")
    ema: bool = option(False, "Predict with the moving average of the weights (a run with --ema-decay).")
    progress: bool = option(True, PROGRESS_HELP)
    score_threshold: float = option(
        0.3,
        "Detection: detections below this score are left out (0 keeps every detection, as COCO mAP counts them).",
        metavar="S",
    )
    tile_overlap: str = option(
        "auto",
        "Translation: images larger than the training size are translated in "
        "tiles of that size overlapping by this many pixels, blended (auto: a quarter of "
        "the training size; DeepLIIF's tiling: a sixteenth of the tile, as deepliif test).",
        metavar="PIXELS|auto",
    )
    tiling: str = option(
        "deepliif",
        "DeepLIIF: deepliif tiles as deepliif test does (its positions, each tile resized to the "
        "networks' size, each output pixel from one tile: its outputs pixel for pixel); blend "
        "weighs overlapping tiles towards their centres and sums them (as translation tiles: no "
        "seams where tiles meet, other pixels than DeepLIIF's).",
        choices=("deepliif", "blend"),
    )
    tile_size: int = option(
        0,
        "DeepLIIF: the tiles' size in the image (deepliif test's --tile-size), each resized to the "
        "networks' size; 0: the networks' size (a DeepLIIF directory's scale_size, a run's "
        "--image-size). Also the magnification the cells are counted at: above 384 40x, above 192 20x, else 10x.",
        metavar="PIXELS",
    )
    seg_weights: tuple[float, ...] = option(
        (),
        "DeepLIIF: the segmentation's weights, the input's first, over the checkpoint's (a DeepLIIF "
        "directory's train_opt.txt, a run's --seg-weights).",
        metavar="W[,W...]",
    )
    seg_intermediate: bool = option(
        False, "DeepLIIF: also each segmentation network's own output, in NAME_s/ (deepliif test's --seg-intermediate)."
    )
    seg_thresh: int = option(
        120,
        "DeepLIIF's cell counts: a Seg pixel is part of a cell where red + blue exceeds this (and green is at most 80).",
        metavar="N",
    )
    size_thresh: str = option(
        "default",
        "DeepLIIF's cell counts: cells of at most this many pixels are not counted (default: DeepLIIF's, "
        "from the image's cell sizes; none: every cell above 4 pixels).",
        metavar="PIXELS|default|none",
    )
    size_thresh_upper: str = option(
        "none", "DeepLIIF's cell counts: cells of at least this many pixels are not counted.", metavar="PIXELS|none"
    )
    marker_thresh: str = option(
        "none",
        "DeepLIIF's cell counts: a cell whose brightest Marker pixel exceeds this is positive whatever "
        "its colour (default: DeepLIIF's, 90% of the Marker's 0.1 to 99.9 percentile range; none: by colour alone).",
        metavar="N|default|none",
    )
    region_size: int = option(
        2048,
        "Translation: a TIFF (a whole slide: TIFF, OME-TIFF, SVS) larger than this on "
        "a side is read, translated and written region by region, OME-TIFF outputs; memory "
        "stays about one region's.",
        metavar="PIXELS",
    )
    overwrite: bool = option(False, OVERWRITE_HELP)

    def __post_init__(self) -> None:
        at_least(self.top_k, 1, "--top-k", "how many classes to list per image")
        at_least(self.region_size, 1, "--region-size", "pixels on a side of a region of a slide")
        at_least(self.batch_size, 1, "--batch-size", "images per batch")
        if not 0 <= self.score_threshold <= 1:
            raise PhalanxError(
                f"must be between 0 and 1 (a detection's score); got {self.score_threshold}", "--score-threshold"
            )
        self.overlap_pixels()  # checked now, used by translation
        at_least(self.tile_size, 0, "--tile-size", "pixels on a side of a tile; 0 for the networks' size")
        at_least(self.seg_thresh, 0, "--seg-thresh", "red + blue of a cell pixel")
        if any(w < 0 for w in self.seg_weights):
            raise PhalanxError("weights must not be negative", "--seg-weights")
        self.thresholds()

    def thresholds(self) -> dict[str, int | str | None]:
        """The count thresholds as DeepLIIF's ``compute_final_results`` takes them."""
        found: dict[str, int | str | None] = {}
        for name, words in (
            ("size_thresh", ("default", "none")),
            ("size_thresh_upper", ("none",)),
            ("marker_thresh", ("default", "none")),
        ):
            text = str(getattr(self, name)).strip().lower()
            if text in words:
                found[name] = None if text == "none" else text
                continue
            try:
                found[name] = int(text)
            except ValueError:
                raise PhalanxError(
                    f"expected a whole number or {' or '.join(words)}, got {getattr(self, name)!r}",
                    "--" + name.replace("_", "-"),
                ) from None
            at_least(int(text), 0, "--" + name.replace("_", "-"), "pixels or a marker value")
        return found

    def overlap_pixels(self) -> int | None:
        """``--tile-overlap`` in pixels; None for auto (the task picks it from the training size)."""
        text = str(self.tile_overlap).strip().lower()
        if text == "auto":
            return None
        try:
            pixels = int(text)
        except ValueError:
            raise PhalanxError(
                f"expected a number of pixels or auto, got {self.tile_overlap!r}", "--tile-overlap"
            ) from None
        at_least(pixels, 0, "--tile-overlap", "pixels two neighbouring tiles share")
        return pixels


@dataclass(frozen=True)
class ExportOptions:
    checkpoint: str = option(None, CHECKPOINT_HELP, metavar="PATH")
    format: str = option(
        "torchscript",
        "torchscript: loads with torch.jit.load; exported-program: loads with "
        "torch.export.load; "
        + "; ".join(
            f"{name} (--task {name}): its own model directory, --output DIR" for name in registry.native_formats()
        )
        + ".",
        choices=("torchscript", "exported-program", *registry.native_formats()),
    )
    output: str = option(
        None, "The file to write; class names and preprocessing go beside it, in FILE.json.", metavar="FILE"
    )
    ema: bool = option(False, "Export the moving average of the weights (a run with --ema-decay).")
    overwrite: bool = option(False, OVERWRITE_HELP)

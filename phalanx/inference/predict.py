"""``phalanx predict``: what a checkpoint's task makes of image files (classes, translated images,
detections, masks, features), batched. An image that cannot be read is reported and skipped; when
nothing could be predicted the command fails."""

from __future__ import annotations

import sys

from ..data.inputs import image_paths
from ..errors import EXIT_FAILED, PhalanxError
from .model import device_for, load_trained
from .options import PredictOptions


def predict(paths_given: tuple[str, ...], opts: PredictOptions) -> int:
    trained = load_trained(opts.checkpoint, opts.ema)
    trained.task.check_predict_output(opts.output)
    paths = image_paths(paths_given)
    device = device_for(opts.gpu_ids)
    predicted, skipped = trained.task.predict(trained, paths, opts, device)
    for path, why in skipped:
        print(f"phalanx: warning: skipped {path}: {why}", file=sys.stderr, flush=True)
    if not predicted:
        raise PhalanxError(f"no image could be predicted ({len(skipped)} skipped); nothing written", "IMAGES",
                           exit_code=EXIT_FAILED)
    print(f"phalanx: {predicted} image(s) predicted, {len(skipped)} skipped; wrote {opts.output}")
    return len(skipped)

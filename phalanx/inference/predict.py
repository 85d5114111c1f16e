"""``phalanx predict``: what a checkpoint's task makes of image files (classes, translated images,
detections, masks, features), batched. An image that cannot be read is reported and skipped; when
nothing could be predicted the command fails."""

from __future__ import annotations

import sys
from pathlib import Path

from ..data.inputs import image_paths
from ..errors import EXIT_FAILED, PhalanxError
from ..tasks.features import check_features_output, write_features
from ..tasks import Task
from .model import device_for, load_trained
from .options import PredictOptions
from .outputs import check_predict_files, check_predict_place


def predict(paths_given: tuple[str, ...], opts: PredictOptions) -> int:
    output = Path(opts.output)
    check_predict_place(output)  # before the model loads
    trained = load_trained(opts.checkpoint, opts.ema)
    task = trained.task
    if opts.features:
        if type(task).feature_inputs is Task.feature_inputs:
            raise PhalanxError(f"--task {trained.config.task} has no network that makes features of an image "
                               "(classify, simclr and byol have)", "--features")
        check_features_output(opts.output)
    else:
        task.check_predict_output(opts.output)
    check_predict_files(output, opts.features, opts.checkpoint, opts.overwrite)
    paths = image_paths(paths_given)
    device = device_for(opts.gpu_ids)
    if opts.features:
        predicted, skipped = write_features(*task.feature_inputs(trained, paths), paths, opts, device, task.cfg)
    else:
        predicted, skipped = task.predict(trained, paths, opts, device)
    for path, why in skipped:
        print(f"phalanx: warning: skipped {path}: {why}", file=sys.stderr, flush=True)
    if not predicted:
        raise PhalanxError(f"no image could be predicted ({len(skipped)} skipped); nothing written", "IMAGES",
                           exit_code=EXIT_FAILED)
    print(f"phalanx: {predicted} image(s) predicted, {len(skipped)} skipped; wrote {opts.output}")
    return len(skipped)

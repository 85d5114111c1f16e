"""``phalanx predict``: what a checkpoint's task makes of image files (classes, translated images,
detections, masks, features), batched. An image that cannot be read is reported and skipped; when
nothing could be predicted the command fails."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from ..config.inference import PredictOptions
from ..data import loader_workers
from ..data.inputs import collate_inputs, image_paths
from ..distributed.devices import inference_device
from ..errors import EXIT_FAILED, PhalanxError
from ..tasks.features import FeaturesPredictor, check_features_output
from ..tasks.inference import STDOUT, Inference, Predictor
from ..train.progress import ProgressBar
from .model import load_trained
from .outputs import check_apart, check_predict_files, check_predict_place


def predict(paths_given: tuple[str, ...], opts: PredictOptions, typed: frozenset[str] = frozenset()) -> int:
    """``typed``: the options given on the command line (one another task reads is refused)."""
    output, to_stdout = Path(opts.output), opts.output == STDOUT
    if not to_stdout:
        check_predict_place(output)  # before the model loads
        if not output.suffix:  # a folder of outputs (files go beside the inputs harmlessly: no image suffix)
            check_apart(paths_given, output)
    overrides = {name: getattr(opts, name) for name in PredictOptions.TASK_OVERRIDES if name in typed}
    trained = load_trained(opts.checkpoint, opts.ema, task_changes=overrides)
    inference = trained.inference()
    if to_stdout and (opts.features or not inference.streams):
        raise PhalanxError(
            f"- (stdout) takes a table of predictions, a JSON line an image; --task {trained.config.task}'s "
            f"predict{' --features' if opts.features else ''} writes files: give a path",
            "--output",
        )
    read = () if opts.features else inference.predict_options
    unread = [name for name in PredictOptions.TASK_SPECIFIC if name in typed and name not in read]
    if unread:
        raise PhalanxError(
            f"--task {trained.config.task}'s predict{' --features' if opts.features else ''} does not "
            "read it (another task's option: see `phalanx predict --help`)",
            f"--{unread[0].replace('_', '-')}",
        )
    if opts.features:
        if type(inference).feature_inputs is Inference.feature_inputs:
            raise PhalanxError(
                f"--task {trained.config.task} has no network that makes features of an image", "--features"
            )
        check_features_output(opts.output)
    else:
        inference.check_predict_output(opts.output)
    if not to_stdout:
        check_predict_files(output, opts.features, str(trained.path), opts.overwrite)
    paths = image_paths(paths_given)
    device = inference_device(opts.gpu_ids)
    if opts.features:
        found = inference.feature_inputs(paths)
        assert found is not None, f"{type(inference).__name__}.feature_inputs returned None"
        network, inputs = found
        predictor: Predictor = FeaturesPredictor(network, inputs, paths, opts, device)
    else:
        predictor = inference.predictor(paths, opts, device)
    # A run trained in float64 (--precision fp64) predicts in float64, as it evaluates.
    predictor.dtype = next((p.dtype for m in trained.models.values() for p in m.parameters()), torch.float32)
    predicted, skipped = run(predictor, opts, "features" if opts.features else "predict")
    for path, why in skipped:
        print(f"phalanx: warning: skipped {path}: {why}", file=sys.stderr, flush=True)
    if not predicted:
        raise PhalanxError(
            f"no image could be predicted ({len(skipped)} skipped); nothing written", "IMAGES", exit_code=EXIT_FAILED
        )
    print(
        f"phalanx: {predicted} image(s) predicted, {len(skipped)} skipped; wrote {'stdout' if to_stdout else opts.output}",
        file=sys.stderr if to_stdout else sys.stdout,
    )  # stdout holds the predictions alone
    return len(skipped)


@torch.no_grad()
def run(predictor: Predictor, opts: PredictOptions, label: str) -> tuple[int, list[tuple[Path, str]]]:
    """Every input through the task's predictor; returns (images predicted, [(path, why skipped)])."""
    device = predictor.device
    workers = loader_workers(opts.num_workers, 1, torch.get_num_threads() if device.type == "cpu" else 1)
    loader = DataLoader(
        predictor.inputs, batch_size=predictor.batch_size, num_workers=workers, collate_fn=collate_inputs
    )
    done, skipped = 0, []
    bar = ProgressBar(len(loader), label, opts.progress)
    for indices, images, raws, bad in loader:
        skipped += [(predictor.paths[i], why) for i, why in bad]
        if images:
            images = [
                image.to(predictor.dtype) if isinstance(image, torch.Tensor) and image.is_floating_point() else image
                for image in images
            ]  # (a Slide is read by the predictor itself)
            failed = len(predictor.unreadable)
            predictor.predict(indices, images, raws)
            done += len(images) - (len(predictor.unreadable) - failed)
        bar.update(len(indices) + len(bad))
    bar.close()
    skipped += predictor.unreadable
    if done:
        predictor.finish()
    return done, skipped

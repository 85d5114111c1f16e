"""What ``phalanx predict`` asks of a task: the images as its network takes them, and what to make
of each batch. The loop itself (the loader and its workers, the progress bar, unreadable files
skipped and counted) is ``inference.predict``'s, the same for every task."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import Dataset


class Predictor:
    """One ``predict`` over a list of image files.

    ``inputs`` is a ``data.inputs.InputImages`` of the paths (its ``prepare`` makes an image what
    the network takes); ``batch_size`` images go through ``predict`` at once (1 where each image
    keeps its own size). ``predict`` writes each image's outputs, or keeps them for ``finish``,
    which writes them once at least one image was predicted.
    """

    batch_size = 1

    def __init__(self, inputs: Dataset, paths: list[Path], device: torch.device):
        self.inputs, self.paths, self.device = inputs, paths, device

    def predict(self, indices: list[int], images: list[torch.Tensor], raws: list) -> None:
        """``images[i]`` is ``paths[indices[i]]`` prepared; ``raws[i]`` its decoded pixels where the
        inputs keep them (``keep_raw``), else None."""
        raise NotImplementedError

    def finish(self) -> None:
        """Write what ``predict`` kept (a table, a JSON of every detection); nothing by default."""

"""``predict --features``: a network's features of each image, for use outside phalanx (retrieval,
clustering, a classifier of your own): ``OUTPUT.npy``, one row per image, and the images' paths,
one a line in the same order, in ``OUTPUT.txt``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from ..errors import PhalanxError
from ..system.atomic import atomic_write, atomic_write_text
from .base import full_precision
from .inference import Predictor

if TYPE_CHECKING:
    from ..config.inference import PredictOptions


def check_features_output(output: str) -> None:
    if Path(output).suffix != ".npy":
        raise PhalanxError(
            f"must end in .npy: the features, one row per image, with the image list beside it in "
            f".txt (got {Path(output).name})",
            "--output",
        )


class FeaturesPredictor(Predictor):
    """A network's features of each image, kept in order; written with the image list at the end."""

    def __init__(
        self, network: nn.Module, inputs: Dataset, paths: list[Path], opts: PredictOptions, device: torch.device
    ):
        super().__init__(inputs, paths, device)
        self.network, self.output, self.batch_size = network.to(device).eval(), Path(opts.output), opts.batch_size
        self.rows: list[np.ndarray] = []
        self.names: list[str] = []

    def predict(self, indices: list[int], images: list[torch.Tensor], raws: list) -> None:
        features = full_precision(self.network(torch.stack(images).to(self.device))).flatten(1)
        self.rows.append(features.float().cpu().numpy())
        self.names += [str(self.paths[i]) for i in indices]

    def finish(self) -> None:
        features = np.concatenate(self.rows)
        atomic_write(self.output, lambda fh: np.save(fh, features))
        atomic_write_text(self.output.with_suffix(".txt"), "".join(name + "\n" for name in self.names))

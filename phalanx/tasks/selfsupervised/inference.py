"""A self-supervised run's evaluation (kNN accuracy and the loss on validation views), features of
images (``predict``, with or without ``--features``) and the backbone's export."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.data import Dataset

from ...data import transforms
from ...data.inputs import InputImages
from ..features import FeaturesPredictor, check_features_output
from ..inference import Inference, Predictor

if TYPE_CHECKING:
    from ...config.inference import PredictOptions
    from ..contract import Evaluation
    from .base import SelfSupervisedTask


class SelfSupervisedInference(Inference):
    task: SelfSupervisedTask

    def results(self, evaluation: Evaluation) -> dict[str, Any]:
        return {**super().results(evaluation), "knn_k": self.task.options.knn_k}  # which k gave knn_acc

    def results_table(self, results: dict[str, Any]) -> str:
        m = results["metrics"]
        knn = f"  kNN accuracy {100 * m['knn_acc']:.2f}%" if "knn_acc" in m else ""
        warned = f"\n{self.task.knn_note}" if "knn_acc" in m and self.task.knn_note else ""  # every image votes
        return (
            f"images {results['samples']}  view loss {m['view_loss']:.4f} ({self.task.view_loss_meaning}){knn}{warned}"
        )

    def check_predict_output(self, output: str) -> None:
        check_features_output(output)

    def predictor(self, paths: list[Path], opts: PredictOptions, device: torch.device) -> Predictor:
        """The backbone's features of each image: what ``predict --features`` writes."""
        return FeaturesPredictor(*self.feature_inputs(paths), paths, opts, device)

    def feature_inputs(self, paths: list[Path]) -> tuple[nn.Module, Dataset]:
        info = self.info
        prepare = transforms.Prepare(info["size"], info["size"], tuple(info["mean"]), tuple(info["std"]))
        return self.models["backbone"], InputImages(paths, "L" if info["channels"] == 1 else "RGB", prepare)

    def export_modules(self) -> dict[str, tuple[nn.Module, torch.Tensor]]:
        size, channels = self.info["size"], self.info["channels"]
        return {"backbone": (self.models["backbone"], torch.zeros(2, channels, size, size))}

    def export_metadata(self) -> dict[str, Any]:
        return {**super().export_metadata(), "outputs": "the backbone's features (a feature extractor)"}

"""A trained model from its checkpoint alone: configuration, weights, and how to prepare images."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from .. import checkpoint
from ..config import RunConfig, from_mapping
from ..data import transforms
from ..errors import PhalanxError
from ..models import build_model

OPTION = "--checkpoint"


@dataclass
class Trained:
    path: Path
    config: RunConfig
    model: nn.Module
    classes: list[str]
    channels: int
    pipeline: transforms.Pipeline

    def preprocess(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """What validation did to an image (uint8 or [0, 1] float tensor): resize, centre crop, normalise."""
        return transforms.build(self.pipeline, self.config, train=False)

    def metadata(self) -> dict[str, Any]:
        """Class names and preprocessing, for files that leave phalanx (export's FILE.json)."""
        p = self.pipeline
        return {"classes": self.classes, "channels": self.channels, "image_size": p.size, "resize_shorter_side":
                round(p.size / p.crop_pct), "center_crop": p.size, "mean": list(p.mean), "std": list(p.std),
                "input": "RGB" if self.channels == 3 else "grayscale", "scale": "pixels / 255, then (x - mean) / std",
                "model": self.config.model, "checkpoint": str(self.path)}


def load_trained(path: str, ema: bool = False) -> Trained:
    """Rebuild the model by name and load its weights; a foreign, truncated or mismatched file is one
    clear error (exit 2)."""
    state = checkpoint.load(Path(path), OPTION)
    try:
        cfg = from_mapping(state["config"], source=OPTION)
    except (KeyError, TypeError, PhalanxError) as exc:
        raise PhalanxError(f"{path} has no usable run configuration ({exc})", OPTION) from None
    info = state.get("data") or _infer_data(cfg, state["model"])
    weights = state.get("ema") if ema else state["model"]
    if weights is None:
        raise PhalanxError(f"{path} has no moving average of the weights (trained without --ema-decay)", "--ema")
    model = build_model(cfg.model, len(info["classes"]), info["channels"])
    try:
        model.load_state_dict(weights)
    except RuntimeError as exc:  # missing keys, unexpected keys, shapes
        first = str(exc).strip().splitlines()[0]
        raise PhalanxError(f"{path} does not fit model {cfg.model!r} ({first[:200]})", OPTION) from None
    pipeline = transforms.Pipeline(info["size"], "none", info["crop_pct"], tuple(info["mean"]), tuple(info["std"]))
    return Trained(Path(path), cfg, model.eval(), list(info["classes"]), info["channels"], pipeline)


def _infer_data(cfg: RunConfig, weights: dict[str, torch.Tensor]) -> dict[str, Any]:
    """phalanx 0.1 checkpoints predate the "data" entry: rebuild it as 0.1 trained ([-1, 1] inputs)."""
    outputs = [v for k, v in weights.items() if k.endswith("weight") and v.dim() == 2][-1].shape[0]
    channels = next(v for v in weights.values() if v.dim() == 4).shape[1]
    size = cfg.image_size or (8 if cfg.dataset == "digits" else 32)
    return {"classes": [str(i) for i in range(outputs)], "channels": channels, "size": size, "crop_pct": 1.0,
            "mean": [0.5] * channels, "std": [0.5] * channels}


def device_for(gpu_ids: tuple[int, ...]) -> torch.device:
    if not gpu_ids or gpu_ids == (-1,):
        return torch.device("cpu")
    from ..parallel import check_gpu_ids

    check_gpu_ids(gpu_ids[:1])
    return torch.device("cuda", gpu_ids[0])

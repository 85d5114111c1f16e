"""The models package: networks by name (this module), weights to start from (``weights``) and
what the trainer does to every network (``recipe``: memory format, compilation, moving averages).
May import the checkpoint format, distributed, data, records, the configuration and the base.

Models by name: the built-in small CNN, torchvision classifiers, or a user's factory function."""

from __future__ import annotations

import difflib
import inspect

import torch
from torch import nn

from ..errors import PhalanxError
from ..system.plugins import import_user_module


class SmallCNN(nn.Module):
    """Two conv blocks and a classifier: trains the built-in digits to >97% in seconds on a CPU.

    No BatchNorm on purpose: DDP with per-rank batches then computes exactly what one process
    with the combined batch does, which is what the equivalence tests check.
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 1, width: int = 32):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(4),  # 8x8 digits and 224x224 photos alike end at 4x4
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(2 * width * 16, 128), nn.ReLU(inplace=True), nn.Linear(128, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def _torchvision_names() -> list[str]:
    import torchvision.models

    return sorted(torchvision.models.list_models(module=torchvision.models))


TIMM = "timm/"  # --model timm/NAME: a model of timm's zoo (pip install 'phalanx[timm]')


def required_channels(spec: str) -> int | None:
    """Input channels a model insists on (torchvision classifiers take RGB), or None for any."""
    return None if spec == "smallcnn" or ":" in spec or spec.startswith(TIMM) else 3


def build_model(spec: str, num_classes: int, in_channels: int, drop_path: float = 0.0) -> nn.Module:
    """``drop_path``: stochastic depth's rate, for the models that have one (refused for others)."""
    if spec.startswith(TIMM):
        return _timm_model(spec[len(TIMM) :], num_classes, in_channels, drop_path)
    if drop_path and (spec == "smallcnn" or ":" in spec):
        raise PhalanxError(
            f"--model {spec} has no stochastic depth (timm/ models and torchvision's ConvNeXt, "
            "EfficientNet, Swin and MaxViT have)",
            "--drop-path",
        )
    if spec == "smallcnn":
        return SmallCNN(num_classes=num_classes, in_channels=in_channels)
    if ":" in spec:
        return _user_model(spec, num_classes, in_channels)
    names = _torchvision_names()
    if spec not in names:
        close = difflib.get_close_matches(spec, names + ["smallcnn"], n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else "see torchvision.models.list_models()"
        raise PhalanxError(f"unknown model '{spec}'; {hint}", "--model")
    import torchvision.models

    # weights=None: no download at run time; a run trains from scratch.
    depth = {"stochastic_depth_prob": drop_path} if drop_path else {}
    try:
        return torchvision.models.get_model(spec, weights=None, num_classes=num_classes, **depth)
    except TypeError:
        if not depth:
            raise
        raise PhalanxError(
            f"--model {spec} has no stochastic depth (timm/ models and torchvision's ConvNeXt, "
            "EfficientNet, Swin and MaxViT have)",
            "--drop-path",
        ) from None


def check_input_size(model: nn.Module, spec: str, size: int) -> None:
    """Models built for one input size (torchvision's ViTs, timm's with a strict patch embedding)
    refused at other sizes before anything runs: they failed at the first step with torch's
    assertion."""
    embed = getattr(model, "patch_embed", None)
    fixed = (
        getattr(model, "image_size", None)
        if isinstance(getattr(model, "image_size", None), int)
        else embed.img_size[-1]
        if embed is not None and getattr(embed, "strict_img_size", False)
        else None
    )
    if fixed is not None and fixed != size:
        raise PhalanxError(
            f"--model {spec} is built for {fixed} px images and takes no other size (this run's are "
            f"{size} px); give --image-size {fixed}",
            "--image-size",
        )


def _timm():
    try:
        import timm
    except ImportError:
        raise PhalanxError(
            "timm/ models need timm: pip install 'phalanx[timm]' (or pip install timm)", "--model"
        ) from None
    return timm


def _timm_model(name: str, num_classes: int, in_channels: int, drop_path: float = 0.0) -> nn.Module:
    """A timm model, as timm's train.py builds it: ``num_classes`` and ``in_chans`` passed to
    ``create_model``; never pretrained here (``--weights timm`` loads from the local cache)."""
    timm = _timm()
    if not timm.is_model(name.split(".")[0]):
        close = difflib.get_close_matches(name, timm.list_models(), n=3, cutoff=0.6)
        hint = f"did you mean {', '.join('timm/' + c for c in close)}?" if close else "see timm.list_models()"
        raise PhalanxError(f"timm has no model '{name}'; {hint}", "--model")
    depth = {"drop_path_rate": drop_path} if drop_path else {}
    try:
        return timm.create_model(name, pretrained=False, num_classes=num_classes, in_chans=in_channels, **depth)
    except TypeError:
        if not depth:
            raise
        raise PhalanxError(f"timm's {name} has no stochastic depth (no drop_path_rate)", "--drop-path") from None


def timm_preferences(spec: str) -> dict | None:
    """A timm model's pretrained configuration: mean, std, input size, crop_pct, and where its
    weights live on the Hugging Face hub. None for other models."""
    if not spec.startswith(TIMM):
        return None
    _timm()
    from timm.models import get_pretrained_cfg

    pretrained = get_pretrained_cfg(spec[len(TIMM) :])
    if pretrained is None:
        return None
    return {
        "mean": list(pretrained.mean),
        "std": list(pretrained.std),
        "size": int(pretrained.input_size[-1]),
        "crop_pct": pretrained.crop_pct,
        "hf_hub_id": pretrained.hf_hub_id,
    }


def _user_model(spec: str, num_classes: int, in_channels: int) -> nn.Module:
    """``package.module:function``: imported by name (never eval'd), called with the keyword
    arguments it declares among ``num_classes`` and ``in_channels``."""
    module_name, _, func_name = spec.partition(":")
    module = import_user_module(module_name, "--model")
    factory = getattr(module, func_name, None)
    if not callable(factory):
        raise PhalanxError(f"module '{module_name}' has no function '{func_name}'", "--model")
    params = inspect.signature(factory).parameters
    offered = {"num_classes": num_classes, "in_channels": in_channels}
    try:
        model = factory(**{k: v for k, v in offered.items() if k in params})
    except Exception as exc:
        raise PhalanxError(f"'{spec}' failed: {type(exc).__name__}: {exc}", "--model") from None
    if not isinstance(model, nn.Module):
        raise PhalanxError(f"'{spec}' returned {type(model).__name__}, not a torch.nn.Module", "--model")
    return model

"""Starting from trained weights: load them, start a classifier head of another size anew, freeze
the backbone, give the head its own learning rate.

``--weights`` takes a file (a torchvision-format state dict, or a phalanx checkpoint) or a
torchvision weights name, which must already be in torch's hub cache: phalanx never downloads.
Loading uses ``weights_only=True``; nothing in the file runs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .errors import PhalanxError

OPTION = "--weights"


def weights_file(spec: str) -> Path:
    """The file behind ``--weights``: a path, or a torchvision weights name found in the hub cache."""
    path = Path(spec)
    if path.is_file():
        return path
    if "_Weights." not in spec:
        raise PhalanxError(f"{spec} does not exist (a file, or a torchvision weights name such as "
                           "ResNet18_Weights.IMAGENET1K_V1)", OPTION)
    from torchvision.models import get_weight

    try:
        weights = get_weight(spec)
    except (ValueError, KeyError, AttributeError):
        raise PhalanxError(f"{spec} is not a torchvision weights name", OPTION) from None
    cached = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(weights.url)
    if not cached.is_file():
        raise PhalanxError(f"{spec} is not in torch's hub cache; phalanx does not download: put {weights.url} "
                           f"at {cached}", OPTION)
    return cached


def _state_of(path: Path) -> tuple[dict[str, torch.Tensor], list[str] | None, str]:
    """The weights in a file, the classes they were trained on when a phalanx classification checkpoint
    says, and what of a checkpoint of another task was taken (a self-supervised run's backbone)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # not a torch file, truncated, or a pickle with classes in it
        from .checkpoint import unloadable

        raise PhalanxError(f"{path} does not load as weights: {unloadable(path, exc)}", OPTION) from None
    classes, note = None, ""
    if isinstance(state, dict) and state.get("format") == "phalanx-checkpoint":
        task = state.get("task", "classify")
        if task == "classify":
            classes = (state.get("data") or {}).get("classes")
        else:  # another task's primary network (a backbone); the rest (heads, ...) stays behind
            others = sorted(set(state.get("models") or {}) - {"backbone", "model"})
            note = f" (a --task {task} run's backbone" + (f"; its {', '.join(others)} left out)" if others else ")")
        state = state["model"]
    elif isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise PhalanxError(f"{path} holds no state dict of tensors", OPTION)
    return {k.removeprefix("module."): v for k, v in state.items()}, classes, note


def load_weights(model: nn.Module, spec: str, classes: list[str]) -> str:
    """Load what fits; report what was loaded, replaced, left as built. A head trained on other
    classes starts anew: of another shape, or (a phalanx checkpoint tells) of other class names,
    whose rows would otherwise mean the wrong classes."""
    path = weights_file(spec)
    state, trained_on, note = _state_of(path)
    own = model.state_dict()
    head = f"{head_module(model)[0]}."
    other_classes = trained_on is not None and list(trained_on) != list(classes)
    fits = {k for k, v in state.items() if k in own and own[k].shape == v.shape
            and not (other_classes and k.startswith(head))}
    loaded = {k: state[k] for k in fits}
    replaced = [k for k in state if k in own and k not in fits]
    untouched = [k for k in own if k not in loaded and k not in replaced]
    if not loaded:
        raise PhalanxError(f"no tensor in {path} fits this model (is it the --model it was trained with?)", OPTION)
    model.load_state_dict(loaded, strict=False)
    shapes = ", ".join(f"{k} {_shape(state[k])} -> {_shape(own[k])}" for k in replaced[:3])
    why = "trained on other classes, trained anew" if other_classes else "another shape, trained anew"
    return (f"phalanx: weights {path}{note}: {len(loaded)} tensors loaded, {len(replaced)} replaced"
            + (f" ({why}: {shapes})" if replaced else "")
            + f", {len(untouched)} left as built, {len(set(state) - set(own))} unused")


def _shape(tensor: torch.Tensor) -> str:
    return "x".join(map(str, tensor.shape))


def head_module(model: nn.Module) -> tuple[str, nn.Module]:
    """The classifier head: the model's last Linear layer."""
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise PhalanxError("the model has no Linear layer to keep as the head", "--freeze-backbone")
    return linears[-1]


class Backbone:
    """``--freeze-backbone``: everything but the head stops learning, BatchNorm statistics included."""

    def __init__(self, model: nn.Module):
        head_name, head = head_module(model)
        self.head = {id(p) for p in head.parameters()}
        for param in model.parameters():
            if id(param) not in self.head:
                param.requires_grad_(False)
        self.norms = [m for name, m in model.named_modules()
                      if isinstance(m, nn.modules.batchnorm._NormBase) and not name.startswith(head_name)]
        self.description = f"backbone frozen, training {head_name} only"

    def train_mode(self) -> None:
        """After ``model.train()``: frozen BatchNorm layers keep their running statistics."""
        for norm in self.norms:
            norm.eval()


def param_groups(model: nn.Module, head_lr_mult: float) -> list[dict[str, Any]]:
    """Trainable parameters, the head's with its own LR multiplier when it differs."""
    params = [p for p in model.parameters() if p.requires_grad]
    if head_lr_mult == 1.0:
        return [{"params": params, "lr_mult": 1.0}]
    head = {id(p) for p in head_module(model)[1].parameters()}
    groups = [{"params": [p for p in params if id(p) not in head], "lr_mult": 1.0},
              {"params": [p for p in params if id(p) in head], "lr_mult": head_lr_mult}]
    return [g for g in groups if g["params"]]

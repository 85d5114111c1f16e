"""What the trainer does to every network besides training it, decided once from the options:
the memory format, compilation, and an exponential moving average of the weights.

A task's own recipe (a loss, batch mixing, a frozen backbone) is the task's (``tasks/``).
"""

from __future__ import annotations

import copy
from typing import cast

import torch
from torch import nn

from ..distributed.blocks import checkpoint_activations


class ModelEma:
    """An exponential moving average of a model's weights and buffers (timm's model EMA): after
    each optimizer step, ``ema = decay * ema + (1 - decay) * weights``. Every rank holds the same
    weights after a step, so every rank's average is the same too."""

    def __init__(self, model: nn.Module, decay: float):
        self.module = copy.deepcopy(model).eval().requires_grad_(False)
        self.decay = decay

    def update(self, model: nn.Module) -> None:
        ema_update(self.module, model, self.decay)


@torch.no_grad()
def ema_update(average: nn.Module, model: nn.Module, decay: float) -> None:
    """``average = decay * average + (1 - decay) * model``, weights and floating buffers alike (other
    buffers copied): the one moving average of phalanx, for ``--ema-decay`` and a momentum teacher."""
    pairs = list(zip(average.state_dict().values(), model.state_dict().values()))
    floats = [(e, m) for e, m in pairs if e.is_floating_point()]
    if floats:
        torch._foreach_lerp_([e for e, _ in floats], [m for _, m in floats], 1.0 - decay)
    for e, m in pairs:
        if not e.is_floating_point():
            e.copy_(m)


def prepare(model: nn.Module, channels_last: bool, compile: bool, activation_checkpointing: bool = False) -> nn.Module:
    """The network as it trains, before the parallel wrapper (an EMA copies it first)."""
    if activation_checkpointing:
        model = checkpoint_activations(model)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    # (cast: torch.compile of a module is a module, an OptimizedModule; its types say a callable)
    return cast(nn.Module, torch.compile(model)) if compile else model

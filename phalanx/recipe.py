"""What a training step does besides forward and backward, decided once from the options: the
loss (label smoothing, soft targets), batch mixing (MixUp / CutMix), the memory format and
compilation of the model, a frozen backbone, and an exponential moving average of the weights.

The trainer calls the same methods whatever the options; ``Recipe`` holds the choices, as
``Strategy`` does for the parallel modes.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from .config import RunConfig
from .finetune import Backbone


class ModelEma:
    """An exponential moving average of a model's weights and buffers (timm's model EMA): after
    each optimizer step, ``ema = decay * ema + (1 - decay) * weights``. Every rank holds the same
    weights after a step, so every rank's average is the same too."""

    def __init__(self, model: nn.Module, decay: float):
        self.module = copy.deepcopy(model).eval().requires_grad_(False)
        self.decay = decay

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        pairs = list(zip(self.module.state_dict().values(), model.state_dict().values()))
        floats = [(e, m) for e, m in pairs if e.is_floating_point()]
        if floats:
            torch._foreach_lerp_([e for e, _ in floats], [m for _, m in floats], 1.0 - self.decay)
        for e, m in pairs:
            if not e.is_floating_point():
                e.copy_(m)


class Recipe:
    def __init__(self, cfg: RunConfig, num_classes: int, backbone: Backbone | None):
        self.loss_fn = nn.CrossEntropyLoss(reduction="none", label_smoothing=cfg.label_smoothing)
        self.mix = _mixer(cfg, num_classes)
        self.channels_last, self.compile = cfg.channels_last, cfg.compile
        self.backbone = backbone
        self.ema_decay = cfg.ema_decay
        self.ema: ModelEma | None = None

    def prepare(self, model: nn.Module) -> nn.Module:
        """The model as it trains (before the parallel wrapper); the EMA copies it first."""
        if self.ema_decay:
            self.ema = ModelEma(model, self.ema_decay)
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
        return torch.compile(model) if self.compile else model

    def train_mode(self, model: nn.Module) -> None:
        model.train()
        if self.backbone is not None:
            self.backbone.train_mode()

    def batch(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mixed images and soft targets when MixUp/CutMix is on; channels-last when asked."""
        if self.mix is not None:
            inputs, targets = self.mix(inputs, targets)
        if self.channels_last and inputs.dim() == 4:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        return inputs, targets

    def eval_inputs(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.channels_last and inputs.dim() == 4:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        return inputs

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Per-sample losses (class indices or, after mixing, probabilities as targets)."""
        return self.loss_fn(logits, targets)

    def after_step(self, model: nn.Module) -> None:
        if self.ema is not None:
            self.ema.update(model)


def _mixer(cfg: RunConfig, num_classes: int):
    if not cfg.mixup_alpha and not cfg.cutmix_alpha:
        return None  # and no torchvision import: it costs a process seconds
    from torchvision.transforms import v2

    mixers = []
    if cfg.mixup_alpha > 0:
        mixers.append(v2.MixUp(alpha=cfg.mixup_alpha, num_classes=num_classes))
    if cfg.cutmix_alpha > 0:
        mixers.append(v2.CutMix(alpha=cfg.cutmix_alpha, num_classes=num_classes))
    return mixers[0] if len(mixers) == 1 else v2.RandomChoice(mixers)

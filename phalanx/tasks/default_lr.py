"""The learning rate a torchvision classifier gets when none is given (the registry's ``adapt`` of
``--task classify``). Standard library only, as the registry."""

from __future__ import annotations

from typing import Any


def classifier_lr(given: dict[str, Any]) -> dict[str, Any]:
    """A torchvision classifier's default LR: torchvision's reference recipe (0.1 for a batch of
    256, linearly less for less), with a one-epoch warmup. smallcnn keeps 0.1."""
    model = given.get("model", "smallcnn")
    if "lr" in given or model == "smallcnn" or ":" in str(model):
        return {}
    batch = given.get("batch_size", 32)
    accumulated = given.get("grad_accum", 1)
    if not isinstance(batch, int) or not isinstance(accumulated, int) or batch <= 0 or accumulated <= 0:
        return {}  # a bad value: RunConfig names it
    return {"lr": round(0.1 * batch * accumulated / 256, 8), **({} if "warmup_epochs" in given else
                                                                 {"warmup_epochs": 1.0})}


# torch's default for Adam and AdamW (a Lightning or plain-torch user's habit): what an SGD task's
# rate becomes when its user picks one of them without --lr. An SGD rate means nothing to Adam:
# resnet18 on the built-in digits, 2 epochs, one run each: 97.2% at 0.001, 94.7% at the classifier's
# 0.0125; smallcnn 90.3% at 0.001, 92.2% at 0.1 (2026-11-27).
ADAPTIVE_LR = 1e-3


def optimizer_lr(defaults: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """Adam or AdamW without ``--lr``: torch's default rate for them, unless the task gives its own
    for its own Adam (pix2pix's 0.0002). An SGD task's rate (or none: the general 0.1) is SGD's."""
    adaptive = ("adam", "adamw")
    own = defaults.get("optimizer", "sgd")
    if "lr" in given or given.get("optimizer", own) not in adaptive or (own in adaptive and "lr" in defaults):
        return {}
    return {"lr": ADAPTIVE_LR}

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

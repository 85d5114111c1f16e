"""An independent reference: the training that phalanx documents, written as a plain loop.

Equivalence tests compare phalanx (one process, DDP, resumed at other world sizes) with this loop,
not only with another phalanx run that could share a bug. Nothing here calls phalanx's training
code; the data set is phalanx's (the data pipeline is not what these tests check).
"""

from __future__ import annotations

import hashlib
import math

import torch
from torch import nn


def epoch_order(num_samples: int, seed: int, epoch: int) -> torch.Tensor:
    """The documented order: a permutation seeded by a hash of (seed, "order", epoch)."""
    digest = hashlib.blake2b(repr((seed, "order", epoch)).encode(), digest_size=8).digest()
    generator = torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)
    return torch.randperm(num_samples, generator=generator)


def lr_factor(schedule: str, epochs: int, start: float, end: float, warmup: float = 0.0,
              step_epochs: int = 30) -> float:
    """The documented schedule, in epochs of progress: warmup to ``end``, then the schedule at ``start``."""
    if warmup > 0 and start < warmup:
        return min(1.0, end / warmup)
    if schedule == "cosine":
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (start - warmup) / (epochs - warmup))))
    if schedule == "step":
        return 0.1 ** (int(start + 1e-9) // step_epochs)
    return 1.0


def train(model: nn.Module, dataset, *, epochs: int, global_batch: int, lr: float, momentum: float = 0.9,
          weight_decay: float = 5e-4, seed: int = 0, schedule: str = "cosine", ema_decay: float = 0.0,
          ema: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Mean cross-entropy over each global batch of the documented order, plain SGD. With
    ``ema_decay``, ``ema`` (a dict) receives the moving average: ema = d * ema + (1 - d) * weights."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    if ema is not None:
        ema.update({k: v.detach().clone() for k, v in model.state_dict().items()})
    n = len(dataset)
    images = torch.stack([dataset[i][0] for i in range(n)])
    labels = torch.tensor([int(dataset[i][1]) for i in range(n)])
    model.train()
    for epoch in range(1, epochs + 1):
        order = epoch_order(n, seed, epoch)
        for start in range(0, n, global_batch):
            batch = order[start:start + global_batch]
            end = min(n, start + global_batch)
            factor = lr_factor(schedule, epochs, epoch - 1 + start / n, epoch - 1 + end / n)
            for group in optimizer.param_groups:
                group["lr"] = lr * factor
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(images[batch]), labels[batch]).backward()
            optimizer.step()
            if ema is not None:
                for key, value in model.state_dict().items():
                    ema[key] = ema_decay * ema[key] + (1 - ema_decay) * value.detach()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)

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


def lr_factor(
    schedule: str,
    epochs: int,
    start: float,
    end: float,
    warmup: float = 0.0,
    step_epochs: int = 30,
    decay_epochs: float = 0.0,
) -> float:
    """The documented schedule, in epochs of progress: warmup to ``end``, then the schedule at ``start``."""
    if warmup > 0 and start < warmup:
        return min(1.0, end / warmup)
    if schedule == "linear":  # pix2pix: constant, then linearly to 0 over the last decay epochs
        decay = decay_epochs or epochs / 2
        return max(0.0, min(1.0, (epochs - start) / decay))
    if schedule == "cosine":
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (start - warmup) / (epochs - warmup))))
    if schedule == "step":
        return 0.1 ** (int(start + 1e-9) // step_epochs)
    return 1.0


def train(
    model: nn.Module,
    dataset,
    *,
    epochs: int,
    global_batch: int | list[int],
    lr: float,
    momentum: float = 0.9,
    weight_decay: float = 5e-4,
    seed: int = 0,
    schedule: str = "cosine",
    ema_decay: float = 0.0,
    ema: dict[str, torch.Tensor] | None = None,
    clip_norm: float = 0.0,
    clip_value: float = 0.0,
    decay_1d: bool = True,
    nesterov: bool = False,
) -> dict[str, torch.Tensor]:
    """Mean cross-entropy over each global batch of the documented order, plain SGD. With
    ``ema_decay``, ``ema`` (a dict) receives the moving average: ema = d * ema + (1 - d) * weights.
    ``clip_norm``/``clip_value``: the gradient clipped by torch's own functions before each step.
    ``decay_1d`` False: no weight decay for biases and normalisation weights (timm's grouping).
    ``global_batch`` may be a list, one per epoch (a run resumed at another world size)."""
    groups = (
        [{"params": list(model.parameters())}]
        if decay_1d
        else [
            {"params": [p for p in model.parameters() if p.ndim >= 2]},
            {"params": [p for p in model.parameters() if p.ndim < 2], "weight_decay": 0.0},
        ]
    )
    optimizer = torch.optim.SGD(groups, lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)
    if ema is not None:
        ema.update({k: v.detach().clone() for k, v in model.state_dict().items()})
    n = len(dataset)
    images = torch.stack([dataset[i][0] for i in range(n)])
    labels = torch.tensor([int(dataset[i][1]) for i in range(n)])
    model.train()
    for epoch in range(1, epochs + 1):
        order = epoch_order(n, seed, epoch)
        size = global_batch[epoch - 1] if isinstance(global_batch, list) else global_batch
        for start in range(0, n, size):
            batch = order[start : start + size]
            end = min(n, start + size)
            factor = lr_factor(schedule, epochs, epoch - 1 + start / n, epoch - 1 + end / n)
            for group in optimizer.param_groups:
                group["lr"] = lr * factor
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(images[batch]), labels[batch]).backward()
            if clip_norm:
                nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
            if clip_value:
                nn.utils.clip_grad_value_(model.parameters(), clip_value)
            optimizer.step()
            if ema is not None:
                for key, value in model.state_dict().items():
                    ema[key] = ema_decay * ema[key] + (1 - ema_decay) * value.detach()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def max_scaled_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest difference of a tensor over its largest magnitude (at least 1): float64 rounding
    grows with the values rounded (DINO's head biases reach 10^3, where 1e-12 absolute is about 4 ulps)."""
    assert a.keys() == b.keys()
    return max(((a[k].double() - b[k].double()).abs().max() / b[k].double().abs().max().clamp(min=1)).item() for k in a)


def set_lrs(optimizers, lr: float, factor: float) -> None:
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["lr"] = lr * factor


def train_adversarial_autoencoder(
    generator: nn.Module,
    discriminator: nn.Module,
    images: torch.Tensor,
    *,
    epochs: int,
    global_batch: int,
    lr: float,
    betas=(0.5, 0.999),
    lambda_l1: float = 10.0,
    seed: int = 0,
    schedule: str = "cosine",
) -> tuple[dict, dict]:
    """The pix2pix recipe as a plain loop: per global batch of the documented order, a discriminator
    step (real vs reconstructed, halved), then a generator step (fool the updated discriminator,
    plus lambda x L1), each Adam with the schedule's LR. Returns both networks' weights."""
    opt_g = torch.optim.Adam(generator.parameters(), lr=lr, betas=betas, weight_decay=0.0)
    opt_d = torch.optim.Adam(discriminator.parameters(), lr=lr, betas=betas, weight_decay=0.0)

    def bce(logits, real):
        target = torch.full_like(logits, 1.0 if real else 0.0)
        return nn.functional.binary_cross_entropy_with_logits(logits, target)

    n = len(images)
    for epoch in range(1, epochs + 1):
        order = epoch_order(n, seed, epoch)
        for start in range(0, n, global_batch):
            end = min(n, start + global_batch)
            set_lrs([opt_g, opt_d], lr, lr_factor(schedule, epochs, epoch - 1 + start / n, epoch - 1 + end / n))
            real = images[order[start:end]]
            fake = generator(real)
            opt_d.zero_grad()
            (0.5 * (bce(discriminator(real), True) + bce(discriminator(fake.detach()), False))).backward()
            opt_d.step()
            for p in discriminator.parameters():
                p.requires_grad_(False)
            opt_g.zero_grad()
            (bce(discriminator(fake), True) + lambda_l1 * (fake - real).abs().mean()).backward()
            opt_g.step()
            for p in discriminator.parameters():
                p.requires_grad_(True)
    return (
        {k: v.detach().clone() for k, v in generator.state_dict().items()},
        {k: v.detach().clone() for k, v in discriminator.state_dict().items()},
    )


def train_global_batch_loss(
    encoder: nn.Module, points: torch.Tensor, *, epochs: int, global_batch: int, lr: float, seed: int = 0
) -> dict[str, torch.Tensor]:
    """tests/support/phalanx_testtasks.py's GatherTask as a plain loop over whole global batches
    (no gather: one process holds every sample): SGD, constant LR, the centre updated after each step."""
    optimizer = torch.optim.SGD(encoder.parameters(), lr=lr)
    center = torch.zeros(encoder.out_features, dtype=points.dtype)
    n = len(points)
    for epoch in range(1, epochs + 1):
        order = epoch_order(n, seed, epoch)
        for start in range(0, n, global_batch):
            z = encoder(points[order[start : start + global_batch]]) - center
            similarity = z @ z.T / 2.0
            similarity.fill_diagonal_(float("-inf"))
            loss = (torch.logsumexp(similarity, dim=1) + (z**2).sum(1) * 0.05).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            center = 0.5 * center + 0.5 * (z.detach() + center).mean(0)
    return {k: v.detach().clone() for k, v in encoder.state_dict().items()}


def train_pix2pix(
    generator: nn.Module,
    discriminator: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    epochs: int,
    global_batch: int,
    lr: float,
    betas=(0.5, 0.999),
    lambda_l1: float = 100.0,
    seed: int = 0,
    schedule: str = "linear",
) -> tuple[dict, dict]:
    """pix2pix as a plain loop (Isola et al. 2017): per global batch of the documented order, the
    discriminator's step on (input, target) against (input, generated), halved; then the
    generator's, fooling the updated discriminator plus lambda x L1, each Adam on the schedule."""
    opt_g = torch.optim.Adam(generator.parameters(), lr=lr, betas=betas, weight_decay=0.0)
    opt_d = torch.optim.Adam(discriminator.parameters(), lr=lr, betas=betas, weight_decay=0.0)
    criterion = nn.BCEWithLogitsLoss()
    n = len(inputs)
    for epoch in range(1, epochs + 1):
        order = epoch_order(n, seed, epoch)
        for start in range(0, n, global_batch):
            end = min(n, start + global_batch)
            set_lrs([opt_g, opt_d], lr, lr_factor(schedule, epochs, epoch - 1 + start / n, epoch - 1 + end / n))
            a, b = inputs[order[start:end]], targets[order[start:end]]
            fake = generator(a)
            opt_d.zero_grad()
            pred_real, pred_fake = discriminator(torch.cat([a, b], 1)), discriminator(torch.cat([a, fake.detach()], 1))
            loss_d = 0.5 * (
                criterion(pred_real, torch.ones_like(pred_real)) + criterion(pred_fake, torch.zeros_like(pred_fake))
            )
            loss_d.backward()
            opt_d.step()
            for p in discriminator.parameters():
                p.requires_grad_(False)
            opt_g.zero_grad()
            pred = discriminator(torch.cat([a, fake], 1))
            (criterion(pred, torch.ones_like(pred)) + lambda_l1 * (fake - b).abs().mean()).backward()
            opt_g.step()
            for p in discriminator.parameters():
                p.requires_grad_(True)
    return (
        {k: v.detach().clone() for k, v in generator.state_dict().items()},
        {k: v.detach().clone() for k, v in discriminator.state_dict().items()},
    )

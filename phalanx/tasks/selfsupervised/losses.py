"""The self-supervised methods' losses, each an ``nn.Module`` (as Lightly's ``loss/``): usable and
tested on embeddings alone, without a run. Each is per sample (a 1-D tensor: exact under DDP at any
world size) unless it is a loss of the whole batch (Barlow Twins', VICReg's: 0-dim, with its terms).
Where the global batch matters, the task gathers the embeddings and hands them in."""

from __future__ import annotations

import math

import torch
from torch import nn

_cosine = nn.functional.cosine_similarity


class NTXentLoss(nn.Module):
    """SimCLR's (Chen et al. 2020): each view's positive is the other view of its image, its
    negatives every other view of ``all1``/``all2`` (the gathered global batch, whose rows
    ``start:start + len(z1)`` are these; by default ``z1`` and ``z2`` themselves)."""

    def __init__(self, temperature: float = 0.5):
        super().__init__()
        self.temperature = temperature

    def forward(
        self,
        z1: torch.Tensor,
        z2: torch.Tensor,
        all1: torch.Tensor | None = None,
        all2: torch.Tensor | None = None,
        start: int = 0,
    ) -> torch.Tensor:
        all1, all2 = (z1, z2) if all1 is None or all2 is None else (all1, all2)
        z1, z2 = nn.functional.normalize(z1, dim=1), nn.functional.normalize(z2, dim=1)
        candidates = torch.cat([nn.functional.normalize(all1, dim=1), nn.functional.normalize(all2, dim=1)])
        count, local = len(all1), torch.arange(len(z1), device=z1.device)
        own = local + start
        losses = []
        for anchors, itself, positive in ((z1, own, own + count), (z2, own + count, own)):
            logits = anchors @ candidates.T / self.temperature
            logits[local, itself] = -math.inf  # a view is not its own negative
            losses.append(nn.functional.cross_entropy(logits, positive, reduction="none"))
        return 0.5 * (losses[0] + losses[1])


class BYOLLoss(nn.Module):
    """BYOL's (Grill et al. 2020): 2 - 2 cos between each view's prediction and the teacher's
    embedding of the other view, symmetrised; no gradient reaches the teacher's."""

    @staticmethod
    def one_way(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return 2 - 2 * _cosine(prediction, target.detach(), dim=1)

    def forward(self, p1: torch.Tensor, p2: torch.Tensor, t1: torch.Tensor, t2: torch.Tensor) -> torch.Tensor:
        return 0.5 * (self.one_way(p1, t2) + self.one_way(p2, t1))


class InfoNCELoss(nn.Module):
    """MoCo's (He et al. 2020): each query's cross-entropy of its key among the queue's negatives
    (unit vectors, cosine / temperature)."""

    def __init__(self, temperature: float = 0.1):
        super().__init__()
        self.temperature = temperature

    def forward(self, query: torch.Tensor, key: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
        query, key = nn.functional.normalize(query, dim=1), nn.functional.normalize(key, dim=1)
        logits = (
            torch.cat([(query * key).sum(1, keepdim=True), query @ negatives.to(query).T], dim=1) / self.temperature
        )
        return nn.functional.cross_entropy(
            logits, torch.zeros(len(query), dtype=torch.long, device=query.device), reduction="none"
        )


class DINOLoss(nn.Module):
    """DINO's (Caron et al. 2021): the mean over (teacher view, student view) pairs of different
    views of the cross-entropy from the centred teacher, sharpened by ``teacher_temperature``, to
    the student at ``student_temperature``; also the teacher's mean entropy (its collapse to the
    uniform distribution)."""

    def __init__(self, student_temperature: float = 0.1):
        super().__init__()
        self.student_temperature = student_temperature

    def forward(
        self, teacher: list[torch.Tensor], student: list[torch.Tensor], center: torch.Tensor, teacher_temperature: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        probabilities = nn.functional.softmax(
            (torch.stack(teacher) - center.to(teacher[0])) / teacher_temperature, dim=-1
        )
        log_student = nn.functional.log_softmax(torch.stack(student) / self.student_temperature, dim=-1)
        cross = -torch.einsum("tbd,sbd->tsb", probabilities, log_student)
        same = torch.eye(len(teacher), len(student), dtype=torch.bool, device=cross.device)
        loss = cross[~same].sum(0) / int((~same).sum())
        entropy = -(probabilities * torch.log(probabilities.clamp_min(1e-30))).sum(-1).mean(0)
        return loss, entropy.detach()


@torch.no_grad()
def sinkhorn(scores: torch.Tensor, iterations: int, epsilon: float) -> torch.Tensor:
    """Codes (batch x prototypes) whose prototypes are used equally over the batch, each sample's
    summing to 1: Lightly's (and SwAV's) iterations, on one process's whole batch."""
    codes = torch.exp(scores / epsilon).t()
    codes /= codes.sum()
    batch = codes.shape[1]
    for _ in range(iterations):
        codes /= codes.sum(dim=1, keepdim=True)
        codes /= codes.sum(dim=0, keepdim=True)
        codes /= batch
    return (codes * batch).t()


class SwAVLoss(nn.Module):
    """SwAV's swapped prediction (Caron et al. 2020): for each global crop's codes, the
    cross-entropy of every other crop's prediction, averaged as Lightly's ``SwaVLoss`` averages it."""

    def __init__(self, temperature: float = 0.1):
        super().__init__()
        self.temperature = temperature

    def forward(self, scores: list[torch.Tensor], codes: list[torch.Tensor]) -> torch.Tensor:
        loss = scores[0].new_zeros(len(scores[0]))
        for i, code in enumerate(codes):
            for v, score in enumerate(scores):
                if v != i:
                    log_p = nn.functional.log_softmax(score / self.temperature, dim=1)
                    loss = loss - (code * log_p).sum(1) / (len(scores) - 1)
        return loss / len(codes)


class NegativeCosineLoss(nn.Module):
    """SimSiam's (Chen & He 2021): the symmetrised negative cosine between each view's prediction
    and the other view's embedding, the embeddings' gradient stopped."""

    def forward(self, p1: torch.Tensor, p2: torch.Tensor, z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        return -0.5 * (_cosine(p1, z2.detach(), dim=1) + _cosine(p2, z1.detach(), dim=1))


def _off_diagonal(matrix: torch.Tensor) -> torch.Tensor:
    return matrix[~torch.eye(len(matrix), dtype=torch.bool, device=matrix.device)]


class BarlowTwinsLoss(nn.Module):
    """Barlow Twins' (Zbontar et al. 2021), of a whole batch: each dimension standardised over the
    batch (biased variance, as ``F.batch_norm``), their cross-correlation C pulled towards the
    identity; the loss (``"loss"``) and its two terms."""

    def __init__(self, redundancy_weight: float = 5e-3):
        super().__init__()
        self.redundancy_weight = redundancy_weight

    def forward(self, z1: torch.Tensor, z2: torch.Tensor) -> dict[str, torch.Tensor]:
        def standardised(z: torch.Tensor) -> torch.Tensor:
            return nn.functional.batch_norm(z, None, None, training=True)

        correlation = standardised(z1).T @ standardised(z2) / len(z1)
        on = (torch.diagonal(correlation) - 1).pow(2).sum()
        off = _off_diagonal(correlation).pow(2).sum()
        return {"loss": on + self.redundancy_weight * off, "on_diagonal": on.detach(), "off_diagonal": off.detach()}


class VICRegLoss(nn.Module):
    """VICReg's (Bardes et al. 2022), of a whole batch, each term as Lightly's ``VICRegLoss``
    computes it: the loss (``"loss"``) and its invariance, variance and covariance terms."""

    def __init__(
        self,
        invariance_weight: float = 25.0,
        variance_weight: float = 25.0,
        covariance_weight: float = 1.0,
        variance_eps: float = 1e-4,
    ):
        super().__init__()
        self.weights = (invariance_weight, variance_weight, covariance_weight)
        self.eps = variance_eps

    def forward(self, z1: torch.Tensor, z2: torch.Tensor) -> dict[str, torch.Tensor]:
        def variance(z: torch.Tensor) -> torch.Tensor:
            return nn.functional.relu(1.0 - torch.sqrt(z.var(dim=0) + self.eps)).mean()

        def covariance(z: torch.Tensor) -> torch.Tensor:
            centred = z - z.mean(dim=0)
            return _off_diagonal(centred.T @ centred / (len(z) - 1)).pow(2).sum() / z.shape[1]

        invariance = nn.functional.mse_loss(z1, z2)
        spread = 0.5 * (variance(z1) + variance(z2))
        covariances = covariance(z1) + covariance(z2)
        w_inv, w_var, w_cov = self.weights
        return {
            "loss": w_inv * invariance + w_var * spread + w_cov * covariances,
            "invariance": invariance.detach(),
            "variance": spread.detach(),
            "covariance": covariances.detach(),
        }

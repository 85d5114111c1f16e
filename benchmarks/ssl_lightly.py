"""The eight self-supervised methods written with Lightly 1.6 as its examples write them: the
contender of ``benchmarks/selfsupervised.py``. A plain loop, or a DDP loop when torchrun starts it.

    python benchmarks/ssl_lightly.py METHOD ROOT EPOCHS BATCH

The same work as phalanx's run in the benchmark: phalanx's smallcnn without its last layer (128
features), heads of 128 (hidden and output) as Lightly builds them (its SimCLR and SimSiam heads end
in a BatchNorm, phalanx's in a Linear), SGD 0.06 (momentum 0.9, weight decay 5e-4) with a cosine
decay each step as phalanx's, every image each epoch (no dropped last batch), one compute thread;
SimCLR's augmentation at phalanx's strength (colour jitter 0.4, 0.4, 0.4, 0.1 with p 0.8, grayscale
0.2, no blur) for the two-view methods, the same at DINO's and SwAV's crop sizes and scales for the
multi-crop ones; BYOL's loss as phalanx's (2 - 2 cos, Lightly's -cos plus 2). Prints the samples/s
of each epoch and the kNN accuracy (Lightly's ``knn_predict``, k 200, temperature 0.1) of the
validation images against the training images' features as one JSON line.
"""

from __future__ import annotations

import copy
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
from lightly import loss as losses
from lightly.models.modules import heads
from lightly.models.utils import deactivate_requires_grad, update_momentum
from lightly.transforms import SimCLRTransform
from lightly.transforms.dino_transform import DINOViewTransform
from lightly.transforms.multi_view_transform import MultiViewTransform
from lightly.utils.benchmarking import knn_predict
from lightly.utils.scheduler import cosine_schedule
from torch import nn
from torchvision.datasets import ImageFolder
from torchvision.transforms import v2

from phalanx.models import SmallCNN

FEATURES = HEAD = 128
QUEUE, PROTOTYPES, DINO_OUTPUTS = 1024, 300, 1024  # the benchmark gives phalanx the same sizes
# Multi-crop, as phalanx's --task dino / swav draw them: 2 global crops of the image size and 6
# local crops of 3/7 of it, SimCLR's colour jitter (at phalanx's strength) and grayscale, no blur, no
# solarisation.
CROPS = {"dino": ((0.4, 1.0), (0.05, 0.4)), "swav": ((0.14, 1.0), (0.05, 0.14))}


def multi_crop(method: str, size: int) -> MultiViewTransform:
    (global_scale, local_scale) = CROPS[method]

    def view(crop: int, scale: tuple[float, float]) -> DINOViewTransform:
        return DINOViewTransform(
            crop_size=crop, crop_scale=scale, cj_strength=0.5, cj_sat=0.8, gaussian_blur=0.0, solarization_prob=0.0
        )

    local = max(8, round(size * 3 / 7))
    return MultiViewTransform([view(size, global_scale)] * 2 + [view(local, local_scale)] * 6)


class Method(nn.Module):
    """One method's networks and its loss on a batch of views, as Lightly's examples write it."""

    def __init__(self, method: str, steps_per_epoch: int, total_steps: int, distributed: bool):
        super().__init__()
        self.method, self.total_steps = method, total_steps
        backbone = SmallCNN(num_classes=10, in_channels=3)
        backbone.classifier[3] = nn.Identity()
        self.backbone = backbone
        if method == "simclr":
            self.head = heads.SimCLRProjectionHead(FEATURES, HEAD, HEAD)
            self.criterion = losses.NTXentLoss(temperature=0.5, gather_distributed=True)
        elif method == "byol":
            self.head = heads.BYOLProjectionHead(FEATURES, HEAD, HEAD)
            self.predictor = heads.BYOLPredictionHead(HEAD, HEAD, HEAD)
            self.criterion = losses.NegativeCosineSimilarity()
        elif method == "moco":
            self.head = heads.MoCoProjectionHead(FEATURES, HEAD, HEAD)
            self.criterion = losses.NTXentLoss(temperature=0.1, memory_bank_size=(QUEUE, HEAD), gather_distributed=True)
        elif method == "dino":
            self.head = heads.DINOProjectionHead(FEATURES, HEAD, 64, DINO_OUTPUTS, freeze_last_layer=1)
            self.criterion = losses.DINOLoss(output_dim=DINO_OUTPUTS)
        elif method == "swav":
            self.head = heads.SwaVProjectionHead(FEATURES, HEAD, HEAD)
            self.prototypes = heads.SwaVPrototypes(HEAD, PROTOTYPES, n_steps_frozen_prototypes=steps_per_epoch)
            self.criterion = losses.SwaVLoss(sinkhorn_gather_distributed=distributed)
        elif method == "simsiam":
            self.head = heads.SimSiamProjectionHead(FEATURES, HEAD, HEAD)
            self.predictor = heads.SimSiamPredictionHead(HEAD, 64, HEAD)
            self.criterion = losses.NegativeCosineSimilarity()
        elif method == "barlowtwins":
            self.head = heads.BarlowTwinsProjectionHead(FEATURES, HEAD, HEAD)
            self.criterion = losses.BarlowTwinsLoss(gather_distributed=True)
        elif method == "vicreg":
            self.head = heads.VICRegProjectionHead(FEATURES, HEAD, HEAD, num_layers=3)
            self.criterion = losses.VICRegLoss(gather_distributed=True)
        if method in ("byol", "moco", "dino"):
            self.teacher_backbone = copy.deepcopy(backbone)
            if method == "dino":  # its weight-normalised last layer cannot be deep-copied: Lightly builds a second head
                self.teacher_head = heads.DINOProjectionHead(FEATURES, HEAD, 64, DINO_OUTPUTS)
                self.teacher_head.load_state_dict(self.head.state_dict())
            else:
                self.teacher_head = copy.deepcopy(self.head)
            deactivate_requires_grad(self.teacher_backbone)
            deactivate_requires_grad(self.teacher_head)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))

    def teacher(self, x: torch.Tensor) -> torch.Tensor:
        return self.teacher_head(self.teacher_backbone(x))

    def forward(self, views: list[torch.Tensor], step: int, epoch: int) -> torch.Tensor:
        m = self.method
        if m in ("byol", "moco", "dino"):
            momentum = cosine_schedule(step, self.total_steps, 0.99 if m == "byol" else 0.996, 1.0)
            update_momentum(self.backbone, self.teacher_backbone, momentum)
            update_momentum(self.head, self.teacher_head, momentum)
        if m in ("simclr", "barlowtwins", "vicreg"):
            return self.criterion(self.embed(views[0]), self.embed(views[1]))
        if m == "byol":
            p0, p1 = self.predictor(self.embed(views[0])), self.predictor(self.embed(views[1]))
            z0, z1 = self.teacher(views[0]).detach(), self.teacher(views[1]).detach()
            return 2 + self.criterion(p0, z1) + self.criterion(p1, z0)  # phalanx's 0.5 * (2 - 2 cos) x 2
        if m == "simsiam":
            z0, z1 = self.embed(views[0]), self.embed(views[1])
            p0, p1 = self.predictor(z0), self.predictor(z1)
            return 0.5 * (self.criterion(z0.detach(), p1) + self.criterion(z1.detach(), p0))
        if m == "moco":
            return self.criterion(self.embed(views[0]), self.teacher(views[1]).detach())
        if m == "dino":
            teacher_out = [self.teacher(v) for v in views[:2]]
            student_out = [self.embed(v) for v in views]
            return self.criterion(teacher_out, student_out, epoch=epoch)
        self.prototypes.normalize()  # swav
        scores = [self.prototypes(nn.functional.normalize(self.embed(v), dim=1), step) for v in views]
        return self.criterion(scores[:2], scores[2:])


def main() -> None:
    method, root, epochs, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    torch.set_num_threads(1)
    torch.manual_seed(int(os.environ.get("BENCH_SEED", "0")))  # --seeds: kNN over initialisations
    transform = (
        multi_crop(method, 32)
        if method in CROPS
        else SimCLRTransform(input_size=32, gaussian_blur=0.0, min_scale=0.08, cj_strength=0.5)
    )
    train = ImageFolder(root + "/train", transform=transform)
    sampler = torch.utils.data.DistributedSampler(train, shuffle=True, seed=0) if distributed else None
    loader = torch.utils.data.DataLoader(
        train, batch_size=batch // world, shuffle=sampler is None, sampler=sampler, drop_last=False, num_workers=0
    )
    model = Method(method, len(loader), len(loader) * epochs, distributed)
    # SwAV's prototypes take no gradient while frozen (Lightly turns their requires_grad off): DDP
    # must be told that some parameters go unused.
    trained = (
        nn.parallel.DistributedDataParallel(model, find_unused_parameters=method == "swav") if distributed else model
    )
    optimizer = torch.optim.SGD(
        [p for p in model.parameters() if p.requires_grad], lr=0.06, momentum=0.9, weight_decay=5e-4
    )
    total = len(loader) * epochs
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * step / total)))
    rates, step = [], 0
    for epoch in range(epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        started, count = time.perf_counter(), 0
        for views, _ in loader:
            loss = trained(views, step, epoch)
            optimizer.zero_grad()
            loss.backward()
            if method == "dino":
                model.head.cancel_last_layer_gradients(current_epoch=epoch)
            optimizer.step()
            schedule.step()
            count, step = count + len(views[0]) * world, step + 1
        rates.append(count / (time.perf_counter() - started))
    if rank == 0:
        print(json.dumps({"epoch_rates": rates, "knn_acc": knn_accuracy(model.backbone, root)}))
    if distributed:
        dist.destroy_process_group()


def knn_accuracy(backbone: nn.Module, root: str) -> float:
    plain = v2.Compose(
        [
            v2.PILToTensor(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        ]
    )

    def features(split: str) -> tuple[torch.Tensor, torch.Tensor]:
        data = ImageFolder(root + "/" + split, transform=plain)
        xs, ys = zip(*[(x, y) for x, y in data])
        with torch.no_grad():
            return nn.functional.normalize(backbone.eval()(torch.stack(xs)), dim=1), torch.tensor(ys)

    bank, bank_labels = features("train")
    query, labels = features("val")
    predicted = knn_predict(query, bank.T, bank_labels, 10, 200, 0.1)[:, 0]
    return (predicted == labels).float().mean().item()


if __name__ == "__main__":
    main()

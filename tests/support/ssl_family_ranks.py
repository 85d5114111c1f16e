"""Run under torchrun (2 gloo ranks): phalanx's Barlow Twins, VICReg, DINO and SwAV losses over the
global batch, against Lightly's distributed ones, on fixed float64 embeddings that differ per rank (rank 1's shifted
and scaled, as a rank's share of real data may be). Writes each rank's values and gradients to
$OUT/rank<R>.pt for tests/test_ssl_family.py to compare."""

import os
import sys

import torch
import torch.distributed as dist
from lightly.loss import BarlowTwinsLoss, DINOLoss, SwaVLoss, VICRegLoss

from phalanx.config import RunConfig
from phalanx.distributed.devices import placement
from phalanx.distributed.strategies import make_strategy
from phalanx.tasks.selfsupervised.decorrelation import BarlowTwinsTask, VICRegTask
from phalanx.tasks.selfsupervised.dino import DINOTask
from phalanx.tasks.selfsupervised.losses import sinkhorn
from phalanx.tasks.selfsupervised.swav import SwAVTask
from phalanx.train.context import DeviceContext

strategy = make_strategy(RunConfig.flat(task="vicreg"), placement())
rank, world = dist.get_rank(), dist.get_world_size()
generator = torch.Generator().manual_seed(100 + rank)


def embeddings():
    z = torch.randn(5, 6, generator=generator, dtype=torch.float64) * (1 + rank) + rank
    return z.requires_grad_(True)


def ours(task, z1, z2):
    all1, _ = strategy.all_gather_rows(z1, len(z1))
    all2, _ = strategy.all_gather_rows(z2, len(z2))
    loss = task.criterion(all1, all2)["loss"]
    loss.backward()
    return loss.item(), (z1.grad.clone(), z2.grad.clone())


def whole(z):
    """Every rank's rows, without gradients, as one process would see them."""
    parts = [torch.empty_like(z) for _ in range(world)]
    dist.all_gather(parts, z.detach())
    return torch.cat(parts).requires_grad_(True)


found = {}
z1, z2 = embeddings(), embeddings()
found["vicreg_ours"], found["vicreg_our_grads"] = ours(VICRegTask(RunConfig.flat(task="vicreg")), z1, z2)
z1.grad = z2.grad = None
theirs = VICRegLoss(gather_distributed=True)(z1, z2)
theirs.backward()
found["vicreg_theirs"], found["vicreg_their_grads"] = theirs.item(), (z1.grad.clone(), z2.grad.clone())

z1, z2 = embeddings(), embeddings()
found["barlow_ours"], found["barlow_our_grads"] = ours(BarlowTwinsTask(RunConfig.flat(task="barlowtwins")), z1, z2)
all1, all2 = whole(z1), whole(z2)
one_process = BarlowTwinsLoss()(all1, all2)  # one process on the global batch
one_process.backward()
rows = slice(rank * len(z1), (rank + 1) * len(z1))
found["barlow_one_process"] = one_process.item()
found["barlow_one_process_grads"] = (all1.grad[rows].clone(), all2.grad[rows].clone())
found["barlow_lightly_gathered"] = BarlowTwinsLoss(gather_distributed=True)(z1.detach(), z2.detach()).item()
# DINO: per-sample losses (their mean over ranks is the global mean), the centre from the global batch.
task, ctx = (
    DINOTask(RunConfig.flat(task="dino", task_options={"output_dim": 6})),
    DeviceContext(strategy, "fp64", False),
)
teacher = [embeddings().detach() for _ in range(2)]
student = [embeddings() for _ in range(3)]
loss, _ = task.criterion(teacher, student, task.center, 0.0625)
found["dino_ours"] = loss.mean().item()
found["dino_our_grads"] = torch.autograd.grad(loss.mean(), student)
task.update_center(torch.stack(teacher), ctx).result()
theirs = DINOLoss(output_dim=6, warmup_teacher_temp=0.0625, teacher_temp=0.0625)
theirs.center = theirs.center.double()
value = theirs(teacher, student, teacher_temp=0.0625)
found["dino_theirs"], found["dino_their_grads"] = value.item(), torch.autograd.grad(value, student)
found["dino_centres"] = (task.center.clone(), theirs.center.flatten().clone())

# SwAV: codes from every rank's scores (gathered), against Lightly's all-reduced Sinkhorn-Knopp.
swav = SwAVTask(RunConfig.flat(task="swav"))
scores = [embeddings() for _ in range(3)]  # 2 global crops, 1 local
codes = []
for score in scores[:2]:
    everyone, start = strategy.all_gather_rows(score.detach(), len(score))
    codes.append(sinkhorn(everyone, 3, 0.05)[start : start + len(score)])
loss = swav.criterion(scores, codes).mean()
found["swav_ours"], found["swav_our_grads"] = loss.item(), torch.autograd.grad(loss, scores)
value = SwaVLoss(sinkhorn_gather_distributed=True)(scores[:2], scores[2:])
found["swav_theirs"], found["swav_their_grads"] = value.item(), torch.autograd.grad(value, scores)
torch.save(found, os.path.join(sys.argv[1], f"rank{rank}.pt"))
dist.destroy_process_group()

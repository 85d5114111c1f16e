"""Run under torchrun (2 gloo ranks): phalanx's SimCLR NT-Xent against Lightly's NTXentLoss with
gather_distributed=True, on fixed embeddings that differ per rank. Writes each rank's values and
gradients to $OUT/rank<R>.pt for the test to compare."""

import os
import sys

import torch
import torch.distributed as dist
from lightly.loss import NTXentLoss

from phalanx.config import RunConfig
from phalanx.distributed.devices import placement
from phalanx.distributed.strategies import make_strategy
from phalanx.tasks.selfsupervised.simclr import SimCLRTask

strategy = make_strategy(RunConfig.flat(task="simclr"), placement())
rank = dist.get_rank()
task = SimCLRTask(RunConfig.flat(task="simclr", task_options={"temperature": 0.2}))
generator = torch.Generator().manual_seed(100 + rank)  # rank 1's embeddings are not rank 0's
z1 = torch.randn(5, 8, generator=generator, dtype=torch.float64, requires_grad=True)
z2 = torch.randn(5, 8, generator=generator, dtype=torch.float64, requires_grad=True)
all1, start = strategy.all_gather_rows(z1, 5)
all2, _ = strategy.all_gather_rows(z2, 5)
ours = task.criterion(z1, z2, all1, all2, start).mean()
ours.backward()
mine = (z1.grad.clone(), z2.grad.clone())
z1.grad = z2.grad = None
theirs = NTXentLoss(temperature=0.2, gather_distributed=True)(z1, z2)
theirs.backward()
torch.save(
    {"ours": ours.item(), "theirs": theirs.item(), "our_grads": mine, "their_grads": (z1.grad, z2.grad)},
    os.path.join(sys.argv[1], f"rank{rank}.pt"),
)
dist.destroy_process_group()

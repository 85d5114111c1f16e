"""Two ranks on one GPU (``torchrun --nproc-per-node=2 syncbn_ranks.py OUT``), gloo with CUDA tensors:
phalanx's --sync-bn conversion under DDP, each rank with half of a fixed float64 batch. Rank 0 saves
the gradients and the BatchNorm state for test_cuda.py to compare with one process and the whole batch."""

import os
import sys

import torch
import torch.distributed as dist
from phalanx_testmodels import batchnorm

from phalanx.distributed.strategy import prepare_model

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(0)
torch.manual_seed(0)
model = prepare_model(batchnorm(num_classes=10, in_channels=3), sync_bn=True).double().cuda()
sync_layers = sum(isinstance(m, torch.nn.SyncBatchNorm) for m in model.modules())
ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
images = torch.randn(16, 3, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).cuda()
labels = torch.arange(16).remainder(10).cuda()
share = slice(rank * 16 // world, (rank + 1) * 16 // world)
# DDP averages gradients over ranks: each rank's mean loss over its half gives the whole batch's mean.
torch.nn.functional.cross_entropy(ddp(images[share]), labels[share]).backward()
if rank == 0:
    torch.save(
        {
            "grads": {n: p.grad.cpu() for n, p in model.named_parameters()},
            "state": {k: v.cpu() for k, v in model.state_dict().items()},
            "sync_layers": sync_layers,
        },
        os.path.join(sys.argv[1], "rank0.pt"),
    )
dist.barrier()
dist.destroy_process_group()

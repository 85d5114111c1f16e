"""The reference for "zero overhead": a minimal hand-written training loop.

    python benchmarks/handwritten.py MODEL BATCH STEPS WARMUP                  # one process
    python -m torch.distributed.run --nproc_per_node 2 benchmarks/handwritten.py ...  # DDP, gloo

BENCH_CHANNELS_LAST=1 and BENCH_COMPILE=1 apply the speed options as phalanx's --channels-last and
--compile do: the model and inputs in channels-last memory format; torch.compile of the model.
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from common import build_model, report, synthetic


def main(model_name: str, batch: int, steps: int, warmup: int) -> None:
    ddp = "WORLD_SIZE" in os.environ
    world = int(os.environ.get("WORLD_SIZE", 1))
    if ddp:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = build_model(model_name)
    channels_last = os.environ.get("BENCH_CHANNELS_LAST") == "1"
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    if os.environ.get("BENCH_COMPILE") == "1":
        model = torch.compile(model)
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(model)
    data = synthetic(steps * batch * world)
    sampler = (
        torch.utils.data.DistributedSampler(data, shuffle=True, seed=0)
        if ddp
        else torch.utils.data.RandomSampler(data, generator=torch.Generator().manual_seed(0))
    )
    loader = torch.utils.data.DataLoader(data, batch_size=batch, sampler=sampler)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    model.train()
    first = start = None
    for step, (inputs, targets) in enumerate(loader, start=1):
        if channels_last:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        loss = loss_fn(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step == 1:
            first = time.time()
        if step == warmup:
            start = time.perf_counter()
    seconds = time.perf_counter() - start
    if not ddp or dist.get_rank() == 0:
        report(first_step_time=first, samples=(steps - warmup) * batch * world, seconds=seconds)
    if ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], *map(int, sys.argv[2:5]))

"""The contenders phalanx is compared with on a GPU, each a fresh process:

    python benchmarks/gpu_loops.py hand MODEL SIZE BATCH STEPS WARMUP PRECISION COMPILE WORKERS
    python benchmarks/gpu_loops.py hand-ahead MODEL ...   # the next batch fetched before each step, as Lightning does
    python benchmarks/gpu_loops.py lightning MODEL SIZE BATCH STEPS WARMUP PRECISION COMPILE WORKERS

The same work as ``phalanx train --dataset synthetic``: seeded random RGB images in memory, scaled
to [-1, 1], a DataLoader with WORKERS workers and pinned memory, channels-last model and inputs,
SGD (lr 0.01, momentum 0.9, weight decay 5e-4), autocast in PRECISION (fp32 or bf16), torch.compile
when COMPILE is 1. The report (to $BENCH_RESULT): samples and seconds from the end of step WARMUP to
the end of step STEPS (the device synchronised at both ends), peak allocated GPU memory; the
hand-written loop also times the same number of steps on its last batch, already on the GPU (the
rate with no input pipeline: whether the loader starves the GPU).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import time

import torch


def data(samples: int, size: int, seed: int = 0) -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    images = torch.rand(samples, 3, size, size, generator=generator)
    labels = torch.randint(0, 10, (samples,), generator=generator)
    return torch.utils.data.TensorDataset(images.mul_(2).sub_(1), labels)


def model_of(name: str, compile_model: bool) -> torch.nn.Module:
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.get_model(name, weights=None, num_classes=10).cuda()
    model = model.to(memory_format=torch.channels_last)
    return torch.compile(model) if compile_model else model


def loader(dataset, batch: int, workers: int) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=batch,
        shuffle=True,
        num_workers=workers,
        pin_memory=True,
        persistent_workers=workers > 0,
        drop_last=True,
    )


def autocast(precision: str):
    return torch.autocast("cuda", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()


def report(**values) -> None:
    values["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    with open(os.environ["BENCH_RESULT"], "w") as fh:
        json.dump(values, fh)


def fetched_one_ahead(batches):
    """Batches as Lightning's fetcher gives them: the next one is taken from the loader before the
    current one trains."""
    source = iter(batches)
    ahead = next(source, None)
    while ahead is not None:
        current, ahead = ahead, next(source, None)
        yield current


def hand(
    name: str,
    size: int,
    batch: int,
    steps: int,
    warmup: int,
    precision: str,
    compile_model: bool,
    workers: int,
    ahead: bool = False,
) -> None:
    model = model_of(name, compile_model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    model.train()
    first = start = None
    batches = loader(data(steps * batch, size), batch, workers)
    for step, (inputs, targets) in enumerate(fetched_one_ahead(batches) if ahead else batches, start=1):
        inputs = inputs.cuda(non_blocking=True).contiguous(memory_format=torch.channels_last)
        targets = targets.cuda(non_blocking=True)
        with autocast(precision):
            loss = loss_fn(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step == 1:
            torch.cuda.synchronize()
            first = time.time()
        if step == warmup:
            torch.cuda.synchronize()
            start = time.perf_counter()
        if step == steps:
            break
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    # The same steps again on the last batch, already on the GPU: the rate with no input pipeline,
    # a ceiling that says whether the loader (every contender's, the same) starves the GPU.
    began = time.perf_counter()
    for _ in range(steps - warmup):
        with autocast(precision):
            loss = loss_fn(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize()
    report(
        first_step_time=first,
        samples=(steps - warmup) * batch,
        seconds=seconds,
        compute_images_per_s=(steps - warmup) * batch / (time.perf_counter() - began),
    )


def lightning(
    name: str, size: int, batch: int, steps: int, warmup: int, precision: str, compile_model: bool, workers: int
) -> None:
    import lightning as L

    class Classifier(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = model_of(name, compile_model)
            self.loss_fn = torch.nn.CrossEntropyLoss()

        def training_step(self, batch_, batch_idx):
            inputs, targets = batch_
            return self.loss_fn(self.model(inputs.contiguous(memory_format=torch.channels_last)), targets)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)

    class Timer(L.Callback):
        first = start = None

        def on_train_batch_end(self, trainer, module, outputs, batch_, batch_idx):
            if batch_idx == 0:
                torch.cuda.synchronize()
                self.first = time.time()
            if batch_idx + 1 == warmup:
                torch.cuda.synchronize()
                self.start = time.perf_counter()

        def on_train_end(self, trainer, module):
            torch.cuda.synchronize()
            self.seconds = time.perf_counter() - self.start

    timer = Timer()
    trainer = L.Trainer(
        accelerator="gpu",
        devices=1,
        precision="bf16-mixed" if precision == "bf16" else "32-true",
        max_steps=steps,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[timer],
    )
    trainer.fit(Classifier(), loader(data(steps * batch, size), batch, workers))
    report(first_step_time=timer.first, samples=(steps - warmup) * batch, seconds=timer.seconds)


if __name__ == "__main__":
    kind, model_name, *numbers = sys.argv[1:]
    size, batch, steps, warmup = map(int, numbers[:4])
    run = {"hand": hand, "hand-ahead": functools.partial(hand, ahead=True), "lightning": lightning}[kind]
    run(model_name, size, batch, steps, warmup, numbers[4], numbers[5] == "1", int(numbers[6]))

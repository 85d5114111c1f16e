"""Which samples each rank trains on, and when: the same for any world size.

An epoch's order is a function of the seed and the epoch alone. It is cut into global
micro-batches of ``world_size x batch_size`` samples, and rank r takes every world_size-th sample of
each (r, r + W, ...). Training progress is a global position, samples consumed in the epoch, which
a checkpoint records; a run resumed at another world size cuts the rest of the same order into its
own global micro-batches. Every training sample is seen exactly once per epoch, whatever the world
size was before a resume (Mosaic's streaming data sets call this elastic determinism).

Gradients stay exact when ranks hold unequal shares (the last micro-batch of an epoch): each rank
scales its summed loss by ``world_size / samples in the global step``, so DDP's average over ranks
is the mean over the step's samples. A rank whose share is empty trains on one padding sample with
weight 0, because every rank must take part in each gradient all-reduce.
"""

from __future__ import annotations

import hashlib
import math
import random
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Sampler

from ..errors import RunFailed


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from a seed and a context (``derive_seed(seed, "order", epoch)``).

    Hashing keeps unrelated streams apart: seed 1, epoch 2 and seed 2, epoch 1 share nothing,
    as they would with ``seed + epoch``.
    """
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def epoch_order(num_samples: int, seed: int, epoch: int) -> torch.Tensor:
    """The permutation of the training set for ``epoch``: the same on every rank and world size."""
    generator = torch.Generator().manual_seed(derive_seed(seed, "order", epoch))
    return torch.randperm(num_samples, generator=generator)


@dataclass(frozen=True)
class MicroBatch:
    """One forward/backward of one rank."""

    indices: list[int]  # this rank's samples; one padding sample when its share is empty
    real: int  # samples that count: len(indices), or 0 for the padding sample
    start: int  # global position (samples of the epoch consumed, all ranks) before this micro-batch
    end: int  # and after it
    step_samples: int  # samples of the whole optimizer step, all ranks and accumulated micro-batches
    ends_step: bool  # the optimizer steps after this micro-batch
    step_start: int = 0  # global position where this micro-batch's optimizer step begins

    def loss_scale(self, world_size: int) -> float:
        """Multiplies this rank's summed loss so that DDP's mean over ranks is the step's mean."""
        return world_size / self.step_samples


def sample_order(total: int, world_size: int) -> list[int]:
    """For every rank's rows of a global micro-batch gathered in rank order (rank r holds its
    samples r, r + W, ...): the position of each sample, in the order one process holding the whole
    micro-batch has them."""
    counts = [len(range(rank, total, world_size)) for rank in range(world_size)]
    offsets = [sum(counts[:rank]) for rank in range(world_size)]
    return [offsets[position % world_size] + position // world_size for position in range(total)]


def plan_epoch(
    order: torch.Tensor, start: int, batch_size: int, world_size: int, rank: int, grad_accum: int = 1
) -> list[MicroBatch]:
    """This rank's micro-batches for the rest of an epoch, from global position ``start``."""
    total = len(order)
    per_micro = batch_size * world_size
    per_step = per_micro * grad_accum
    plan = []
    for step_start in range(start, total, per_step):
        step_end = min(total, step_start + per_step)
        for micro_start in range(step_start, step_end, per_micro):
            micro_end = min(step_end, micro_start + per_micro)
            mine = order[micro_start + rank : micro_end : world_size].tolist()
            real = len(mine)
            if not mine:  # fewer samples left than ranks: take part, weigh nothing
                mine = [int(order[micro_start])]
            plan.append(
                MicroBatch(
                    mine,
                    real,
                    micro_start,
                    micro_end,
                    step_end - step_start,
                    ends_step=micro_end == step_end,
                    step_start=step_start,
                )
            )
    return plan


def last_micro_batch(num_samples: int, batch_size: int, world_size: int) -> int:
    """The samples of an epoch's last global micro-batch, all ranks (``plan_epoch`` from the epoch's
    start; gradient accumulation cuts no differently)."""
    per_micro = batch_size * world_size
    return num_samples % per_micro or per_micro


def smallest_share(num_samples: int, batch_size: int, world_size: int) -> int:
    """The fewest rows a rank's micro-batch holds in an epoch: its share of the last one (a padding
    sample is one row)."""
    return max(1, last_micro_batch(num_samples, batch_size, world_size) // world_size)


def steps_per_epoch(num_samples: int, batch_size: int, world_size: int, grad_accum: int = 1) -> int:
    return math.ceil(num_samples / (batch_size * world_size * grad_accum))


class EpochBatches(Sampler[list[tuple[int, int]]]):
    """The DataLoader's batch sampler: yields this rank's planned batches as (epoch, index) keys.

    The trainer sets the plan before iterating the loader each epoch; the epoch travels with each
    index so that a data set can seed a sample's augmentation by (epoch, index), in loader worker
    processes too, and a resumed run repeats it exactly.
    """

    def __init__(self) -> None:
        self.epoch = 0
        self.plan: list[MicroBatch] = []

    def set(self, epoch: int, plan: list[MicroBatch]) -> None:
        self.epoch, self.plan = epoch, plan

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        for micro in self.plan:
            yield [(self.epoch, index) for index in micro.indices]

    def __len__(self) -> int:
        return len(self.plan)

    def delivered(self, loader: Iterable[Any]) -> Iterator[tuple[MicroBatch, Any]]:
        """The plan's micro-batches, each with the loader's batch of it. A loader that ends first
        fails the run: a StopIteration raised inside a data set's ``__getitem__`` ends a
        DataLoader's iteration silently (an epoch cut short; under DDP, the other ranks waiting)."""
        made = 0
        for pair in zip(self.plan, loader):
            made += 1
            yield pair
        if made < len(self.plan):
            raise ended_early("training", made, len(self.plan), f" planned for epoch {self.epoch}")


def every_batch(loader: Any, what: str = "validation") -> Iterator[Any]:
    """A validation or evaluation loader's batches, failing the run if it ends before its length: a
    StopIteration inside a data set would otherwise end it silently, and the metrics would be over
    fewer images than the data set holds."""
    made = 0
    for batch in loader:
        made += 1
        yield batch
    if made < len(loader):
        raise ended_early(what, made, len(loader), "")


def ended_early(what: str, made: int, planned: int, when: str) -> RunFailed:
    return RunFailed(
        f"the {what} data ended after {made} of the {planned} batches{when}: a StopIteration raised "
        "inside the data set's __getitem__ ends a DataLoader"
    )


class ShardSampler(Sampler[int]):
    """Exact validation shards: index i goes to rank i % world, so every sample is counted once
    (DistributedSampler would pad with duplicates to even out the ranks)."""

    def __init__(self, length: int, rank: int, world_size: int):
        self.indices = range(rank, length, world_size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def seed_streams(seed: int, device: torch.device | None = None) -> None:
    """Seed every random stream a model or user code may draw from (dropout, Python's random).

    The CPU generator and the training device's own, not ``torch.manual_seed``: that also queues a
    seed for every lazily initialised backend (CUDA, XPU, MTIA), each capturing a stack trace, 70 us
    a call measured here, at every step."""
    torch.default_generator.manual_seed(seed)
    if device is not None and device.type == "cuda":
        torch.cuda.manual_seed(seed)
    random.seed(seed)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(seed % 2**32)

"""``--dry-run``'s memory line: what each rank keeps of the networks' weights, gradients and
optimizer state under each strategy, counted from the parameters (built on the meta device, no
memory taken), so a user sees before launching whether a model fits. Activations, the batch and
the framework's own buffers are not counted: they depend on the inputs, not on the strategy. And
the one bound checked before anything is allocated: a batch at ``--image-size`` must fit in memory."""

from __future__ import annotations

import os

from torch import nn

from ..config import RunConfig
from ..distributed.blocks import blocks
from ..errors import PhalanxError

GIB = 2**30


def optimizer_copies(cfg: RunConfig) -> int:
    """Tensors of optimizer state per weight: Adam's two moments, SGD's momentum buffer."""
    if cfg.optim.optimizer in ("adam", "adamw"):
        return 2
    return 1 if cfg.optim.momentum > 0 else 0


def gathered(model: nn.Module) -> int:
    """Weights FSDP holds whole at once at most, in one network: its own (outside every block: they
    stay gathered through forward and backward) and two blocks' own (the one running and the next,
    prefetched), each block's own being its weights outside the blocks nested in it."""
    owner: dict[int, int] = {}
    found = blocks(model)
    for index, block in enumerate(found):  # outer blocks first: a nested block takes its weights over
        for param in block.parameters():
            owner[id(param)] = index
    own = [0] * len(found)
    root = 0
    for param in model.parameters():
        if id(param) in owner:
            own[owner[id(param)]] += param.numel()
        else:
            root += param.numel()
    return root + sum(sorted(own)[-2:])


def memory_lines(cfg: RunConfig, models: dict[str, nn.Module], world_size: int) -> list[str]:
    """DDP's (a whole copy on each rank) and FSDP's (a shard of each, and what is gathered whole while
    a network runs, weights and their gradients) bytes per rank."""
    width = 8 if cfg.optim.precision == "fp64" else 4  # weights stay float32 under bf16/fp16 autocast
    weights = sum(p.numel() for model in models.values() for p in model.parameters())
    trained = sum(p.numel() for model in models.values() for p in model.parameters() if p.requires_grad)
    whole = (weights + trained * (1 + optimizer_copies(cfg))) * width
    gathered_width = 2 if cfg.optim.precision == "bf16" else width  # fsdp gathers bf16 runs' blocks in bfloat16
    running = 2 * gathered_width * max((gathered(model) for model in models.values()), default=0)
    shard = -(-whole // world_size)
    return [
        f"memory per rank for weights, gradients and optimizer state ({cfg.optim.optimizer}; activations not "
        f"counted): ddp {size(whole)}; fsdp over {world_size} rank{'s' if world_size != 1 else ''} "
        f"{size(shard)} + up to {size(running)} gathered whole while a network runs"
    ]


def size(count: int) -> str:
    return f"{count / GIB:.2f} GiB" if count >= GIB else f"{count / 2**20:.2f} MiB"


def check_batch_memory(cfg: RunConfig) -> None:
    """``--image-size`` bounded before anything is allocated, whatever the data: a batch of
    one-channel float32 images at that size (the least any task holds) must fit in this machine's
    memory. A folder at --image-size 100000 asked for 39 GB for its first image, after the run
    directory had been made."""
    if not cfg.data.image_size:  # the data's own size: the data source bounds what it holds
        return
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    per_image = cfg.data.image_size**2 * 4
    if cfg.optim.batch_size * per_image > memory:
        largest = int((memory / (cfg.optim.batch_size * 4)) ** 0.5)
        raise PhalanxError(
            f"a batch of {cfg.optim.batch_size} image(s) at {cfg.data.image_size} px would take at least "
            f"{cfg.optim.batch_size * per_image / 2**30:,.0f} GiB, more than this machine's "
            f"{memory / 2**30:.0f} GiB of memory; give at most {largest} px, or a smaller "
            "--batch-size",
            "--image-size",
        )

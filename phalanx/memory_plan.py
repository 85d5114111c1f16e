"""``--dry-run``'s memory line: what each rank keeps of the networks' weights, gradients and
optimizer state under each strategy, counted from the parameters (built on the meta device, no
memory taken), so a user sees before launching whether a model fits. Activations, the batch and
the framework's own buffers are not counted: they depend on the inputs, not on the strategy."""

from __future__ import annotations

from torch import nn

from .config import RunConfig
from .sharded import blocks

GIB = 2 ** 30


def optimizer_copies(cfg: RunConfig) -> int:
    """Tensors of optimizer state per weight: Adam's two moments, SGD's momentum buffer."""
    if cfg.optim.optimizer in ("adam", "adamw"):
        return 2
    return 1 if cfg.optim.momentum > 0 else 0


def memory_lines(cfg: RunConfig, models: dict[str, nn.Module], world_size: int) -> list[str]:
    """DDP's (a whole copy on each rank) and FSDP's (a shard of each, and the largest block gathered
    whole while it runs, its weights and their gradients) bytes per rank."""
    width = 8 if cfg.optim.precision == "fp64" else 4  # weights stay float32 under bf16/fp16 autocast
    weights = sum(p.numel() for model in models.values() for p in model.parameters())
    trained = sum(p.numel() for model in models.values() for p in model.parameters() if p.requires_grad)
    whole = (weights + trained * (1 + optimizer_copies(cfg))) * width
    largest = max((sum(p.numel() for p in block.parameters()) for model in models.values() for block in blocks(model)),
                  default=0) * width
    shard = -(-whole // world_size)
    return [f"memory per rank for weights, gradients and optimizer state ({cfg.optim.optimizer}; activations not "
            f"counted): ddp {size(whole)}; fsdp over {world_size} rank{'s' if world_size != 1 else ''} "
            f"{size(shard)} + {size(2 * largest)} for the largest block gathered whole"]


def size(count: int) -> str:
    return f"{count / GIB:.2f} GiB" if count >= GIB else f"{count / 2 ** 20:.2f} MiB"

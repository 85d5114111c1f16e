"""A network's blocks: the parts ``--strategy fsdp`` shards apart (each gathered whole only while
it runs) and ``--activation-checkpointing`` recomputes in backward instead of keeping their
activations."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

CONTAINERS = (nn.Sequential, nn.ModuleList)


def blocks(model: nn.Module) -> list[nn.Module]:
    """A model's own ``fsdp_blocks()`` where it has one, else the elements (with weights) of the
    outermost Sequential and ModuleList containers (ResNet's and ViT's blocks, the layers of a
    network that is one Sequential) and, inside each, an element that holds at least half of its
    weights (a U-Net's inner levels, one in the next), outer blocks before the blocks inside them.
    The rest stays with the network."""
    declared = getattr(model, "fsdp_blocks", None)
    if callable(declared):
        return list(declared())
    found: list[nn.Module] = []

    def visit(module: nn.Module, least: int) -> None:
        children = list(module.children()) if isinstance(module, CONTAINERS) else []
        if not children:
            for child in module.children():
                visit(child, least)
            return
        for element in children:
            size = _size(element)
            if size and size >= least:
                found.append(element)
                visit(element, (size + 1) // 2)
            elif size:
                visit(element, least)

    visit(model, 1)
    return found


def _size(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def outermost(found: list[nn.Module]) -> list[nn.Module]:
    """The blocks inside no other block (a recomputed block recomputes the blocks inside it)."""
    inner = {id(sub) for block in found for sub in block.modules() if sub is not block}
    return [block for block in found if id(block) not in inner]


def checkpoint_activations(model: nn.Module) -> nn.Module:
    """Each outermost block keeps only its inputs; backward runs its forward again (torch's
    composable ``checkpoint``: names of weights unchanged, so checkpoints are the same). The
    random streams are replayed, and the buffers a forward updates (BatchNorm's statistics) are
    put back after the second forward, so the training is the same training."""
    from torch.distributed._composable import checkpoint

    for block in outermost(blocks(model)):
        checkpoint(block, context_fn=lambda block=block: (contextlib.nullcontext(), _buffers_kept(block)))
    return model


@contextlib.contextmanager
def _buffers_kept(block: nn.Module) -> Iterator[None]:
    kept = [(buffer, buffer.detach().clone()) for buffer in block.buffers()]
    try:
        yield
    finally:
        for buffer, value in kept:
            buffer.detach().copy_(value)

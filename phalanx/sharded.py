"""``--strategy fsdp``: DDP workers that shard every network's weights, gradients and optimizer
state over the ranks (torch's FSDP2, ``fully_shard`` on each block and on the network) instead of
replicating them, for networks that do not fit one device.

What DDP guarantees holds unchanged: FSDP2's reduce-scatter averages the gradients over the ranks
as DDP's all-reduce does, so a step is the same step; accumulation skips the gradient sync until
the last micro-batch. A checkpoint holds every network and optimizer state whole, gathered from
the shards (every rank takes part, rank 0 writes), in the format of any other run: it resumes at
any world size and under either strategy, and evaluate, predict and export read it as any other.
Validation and the pictures see every network whole on every rank (ranks may validate different
numbers of batches, and rank 0 alone draws), with rank 0's BatchNorm statistics, as under DDP.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator

import torch
from torch import nn

from .errors import PhalanxError
from .parallel import DDPStrategy, prepare_model

CONTAINERS = (nn.Sequential, nn.ModuleList)


def blocks(model: nn.Module) -> list[nn.Module]:
    """The modules sharded apart from the network itself, each gathered whole only while it runs:
    a model's own ``fsdp_blocks()`` where it has one, else the elements (with weights) of the
    outermost Sequential and ModuleList containers (ResNet's and ViT's blocks, the layers of a
    network that is one Sequential) and, inside each, an element that holds at least half of its
    weights (a U-Net's inner levels, one in the next). The rest stays with the network's group."""
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


def _sharded_modules(models: Iterable[nn.Module]) -> list[nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for model in models for m in model.modules() if isinstance(m, FSDPModule)]


def _dtensor() -> type:
    from torch.distributed.tensor import DTensor

    return DTensor


class FSDPStrategy(DDPStrategy):
    gathers_state = True

    def wrap(self, model: nn.Module, find_unused_parameters: bool = False) -> nn.Module:
        from torch.distributed.fsdp import fully_shard

        model = prepare_model(model, self.sync_bn).to(self.device)
        if not any(p.requires_grad for p in model.parameters()):
            raise PhalanxError("a network without trainable weights (a momentum teacher) is not sharded yet; "
                               "use --strategy ddp for this task", "--strategy")
        for module in model.modules():  # FSDP2 hands a block its inputs as views, which may not change in place
            if getattr(module, "inplace", False) is True:
                module.inplace = False
        for block in reversed(blocks(model)):  # inner blocks first, as fully_shard needs
            fully_shard(block)
        fully_shard(model)
        return model

    def forward_only(self, model: nn.Module) -> nn.Module:
        return model

    def eval_model(self, model: nn.Module) -> nn.Module:
        return model

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    def max_divergence(self, model: nn.Module) -> float:
        return 0.0  # one copy of each weight, sharded: nothing to drift apart

    def _rank0_buffers(self, models: Iterable[nn.Module]) -> None:
        """Every rank takes rank 0's buffers (BatchNorm's statistics), as DDP does before each forward."""
        import torch.distributed as dist

        for model in models:
            for buffer in model.buffers():
                dist.broadcast(buffer.data, src=0)

    @contextlib.contextmanager
    def whole_networks(self, models: Iterable[nn.Module]) -> Iterator[None]:
        models = list(models)
        self._rank0_buffers(models)
        sharded = _sharded_modules(models)
        for module in sharded:  # gathered now; no collective until the block ends, whatever each rank runs
            module.set_reshard_after_forward(False, recurse=False)
            module.unshard()
        try:
            yield
        finally:
            roots = {id(model) for model in models}
            for module in sharded:
                module.reshard()
                # FSDP2 keeps a network's own weights (its root) gathered after forward, for backward
                if id(module) not in roots:
                    module.set_reshard_after_forward(True, recurse=False)

    def full_state(self, state: Any) -> Any:
        """Each sharded tensor gathered whole (a collective per tensor, in the state's order, which is
        every rank's); rank 0 keeps them, the other ranks drop them as they come."""
        dtensor = _dtensor()
        if isinstance(state, dtensor):
            whole = state.full_tensor()
            return whole if self.is_main else None
        if isinstance(state, dict):
            return {key: self.full_state(value) for key, value in state.items()}
        if isinstance(state, (list, tuple)):
            return type(state)(self.full_state(value) for value in state)
        return state

    def local_model_state(self, saved: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
        own = model.state_dict()
        return {key: _shard_like(value, own[key]) if key in own else value for key, value in saved.items()}

    def local_optimizer_state(self, saved: dict[str, Any], optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        state = {index: {key: _shard_like(value, params[int(index)]) if torch.is_tensor(value) and value.dim() else value
                         for key, value in values.items()}
                 for index, values in saved["state"].items()}
        return {**saved, "state": state}

    def describe(self) -> str:
        return super().describe().replace("DDP rank", "FSDP rank", 1)


def _shard_like(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A whole tensor as this rank's shard of ``like`` (a copy: the whole tensor is not kept alive)."""
    dtensor = _dtensor()
    if not isinstance(like, dtensor) or isinstance(value, dtensor):
        return value
    from torch.distributed.tensor import distribute_tensor

    spread = distribute_tensor(value.to(like.device), like.device_mesh, like.placements, src_data_rank=None)
    return dtensor.from_local(spread.to_local().clone(), spread.device_mesh, spread.placements, shape=spread.shape,
                              stride=spread.stride())

"""``--strategy fsdp``: DDP workers that shard every network's weights, gradients and optimizer
state over the ranks (torch's FSDP2, ``fully_shard`` on each block and on the network) instead of
replicating them, for networks that do not fit one device.

What DDP guarantees holds unchanged: FSDP2's reduce-scatter averages the gradients over the ranks
as DDP's all-reduce does, so a step is the same step; accumulation skips the gradient sync until
the last micro-batch. Each rank writes its own shard of a checkpoint (``phalanx.checkpoint.sharded``), or
with ``--fsdp-checkpoints whole`` every rank helps gather the networks and optimizer states whole
for rank 0 to write (``full_state``); either resumes at any world size under either strategy.
Under ``--precision bf16`` each block is gathered in bfloat16 and its gradients averaged in
float32. Validation and the pictures see every network whole on every rank (ranks may validate
different numbers of batches, and rank 0 alone draws), with rank 0's BatchNorm statistics, as
under DDP.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypedDict, cast

import torch
from torch import nn

from ..config import RunConfig
from ..errors import PhalanxError
from .blocks import blocks
from .cluster import Placement
from .devices import RunPlan
from .rank_buffers import broadcast_from_rank0
from .strategy import DDPStrategy, prepare_model

if TYPE_CHECKING:  # (imported where used: torch.distributed's FSDP and DTensor load slowly)
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy
    from torch.distributed.tensor import DTensor


class _Sharding(TypedDict):
    """``fully_shard``'s options, the same for every block and the network."""

    mesh: DeviceMesh
    reshard_after_forward: bool
    mp_policy: MixedPrecisionPolicy


def _sharded_modules(models: Iterable[nn.Module]) -> list[FSDPModule]:
    from torch.distributed.fsdp import FSDPModule

    return [m for model in models for m in model.modules() if isinstance(m, FSDPModule)]


def _dtensor() -> type[DTensor]:
    from torch.distributed.tensor import DTensor

    return DTensor


class FSDPStrategy(DDPStrategy):
    def __init__(self, cfg: RunConfig, env: Placement, plan: RunPlan):
        super().__init__(cfg, env, plan)
        self.reshard_after_forward = cfg.devices.reshard_after_forward
        # --precision bf16: each block gathered in bfloat16 for its forward and backward (half the
        # traffic and memory of its float32 weights), its gradients averaged in float32, and the
        # weights and optimizer state kept in float32 (torchtitan's and Lightning's default policy)
        self.gathered_dtype = torch.bfloat16 if cfg.optim.precision == "bf16" else None
        # sharded: each rank writes its shard (phalanx.checkpoint.sharded); whole: every rank helps gather it for rank 0
        self.writes_shards = cfg.devices.fsdp_checkpoints == "sharded"
        self.gathers_state = not self.writes_shards
        self._mesh: DeviceMesh | None = None

    def wrap(self, model: nn.Module, find_unused_parameters: bool = False) -> nn.Module:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        model = prepare_model(model, self.sync_bn, self.device).to(self.device)
        if not any(p.requires_grad for p in model.parameters()):
            raise PhalanxError(
                "a network without trainable weights (a momentum teacher) is not sharded yet; "
                "use --strategy ddp for this task",
                "--strategy",
            )
        for module in model.modules():  # FSDP2 hands a block its inputs as views, which may not change in place
            if getattr(module, "inplace", False) is True:
                # (nn.Module's __setattr__ is typed for tensors and modules only; any value is allowed)
                module.inplace = False  # type: ignore[assignment]  # (see above)
        policy = (
            MixedPrecisionPolicy(param_dtype=self.gathered_dtype, reduce_dtype=torch.float32)
            if self.gathered_dtype
            else MixedPrecisionPolicy()
        )
        shard = _Sharding(mesh=self.mesh(), reshard_after_forward=self.reshard_after_forward, mp_policy=policy)
        for block in reversed(blocks(model)):  # inner blocks first, as fully_shard needs
            fully_shard(block, **shard)
        fully_shard(model, **shard)
        return model

    def mesh(self) -> DeviceMesh:
        """The ranks as a mesh of this strategy's devices. fully_shard's own default is a mesh of the
        machine's accelerator: CPU workers on a GPU machine were sharded onto CUDA (and failed there)."""
        from torch.distributed.device_mesh import init_device_mesh

        if self._mesh is None:
            self._mesh = init_device_mesh(self.device.type, (self.world_size,))
        return self._mesh

    def forward_only(self, model: nn.Module) -> nn.Module:
        return model

    def eval_model(self, model: nn.Module) -> nn.Module:
        return model

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        sharded = cast("FSDPModule", model)  # wrap's (cast: fully_shard's module keeps nn.Module's static type)
        sharded.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            sharded.set_requires_gradient_sync(True)

    def after_step(self, models: Iterable[nn.Module]) -> None:
        pass  # each rank's own statistics until validation takes rank 0's (whole_networks)

    def max_divergence(self, model: nn.Module) -> float:
        return 0.0  # one copy of each weight, sharded: nothing to drift apart

    @contextlib.contextmanager
    def whole_networks(self, models: Iterable[nn.Module]) -> Iterator[None]:
        models = list(models)
        broadcast_from_rank0(models, self.clock)  # every rank validates rank 0's statistics
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
                    module.set_reshard_after_forward(self.reshard_after_forward, recurse=False)

    def full_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """Each sharded tensor gathered whole (a collective per tensor, in the state's order, which is
        every rank's); rank 0 keeps them, the other ranks drop them as they come."""
        return {key: self._gathered(value) for key, value in state.items()}

    def _gathered(self, state: Any) -> Any:
        """``full_state`` of any part of a run's state (tensors, in dicts, lists and tuples, and the rest)."""
        dtensor = _dtensor()
        if isinstance(state, dtensor):
            whole = state.full_tensor()
            return whole if self.is_main else None
        if isinstance(state, dict):
            return {key: self._gathered(value) for key, value in state.items()}
        if isinstance(state, (list, tuple)):
            return type(state)(self._gathered(value) for value in state)
        return state

    def local_model_state(self, saved: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
        own = model.state_dict()
        return {key: _shard_like(value, own[key]) if key in own else value for key, value in saved.items()}

    def local_optimizer_state(self, saved: dict[str, Any], optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        state = {
            index: {
                key: _shard_like(value, params[int(index)]) if torch.is_tensor(value) and value.dim() else value
                for key, value in values.items()
            }
            for index, values in saved["state"].items()
        }
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
    return dtensor.from_local(
        spread.to_local().clone(), spread.device_mesh, spread.placements, shape=spread.shape, stride=spread.stride()
    )

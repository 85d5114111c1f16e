"""Parallel modes: one small object per mode with the same methods (wrapping, the collectives,
the process group's life).

Where a process sits and which device it trains on are planned in ``devices`` before a strategy
exists. ``Strategy.is_main`` is the one predicate that says "I am global rank 0": every write in
phalanx is guarded by it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from datetime import timedelta
from typing import Any, cast

import torch
from torch import nn

from ..config import RunConfig
from ..system.cores import available_cores, cpu_quota
from . import sync_norm
from .cluster import Placement
from .comm_clock import CommClock
from .devices import RunPlan, cpu_threads_per_worker, elastic_restart_count
from .gather_rows import GatherRows
from .rank_buffers import broadcast_from_rank0, ddp_without_buffer_broadcasts, max_difference_from_rank0


def prepare_model(model: nn.Module, sync_bn: bool, device: torch.device | None = None) -> nn.Module:
    """``--sync-bn``: BatchNorm layers become torch's SyncBatchNorm on GPUs, phalanx's
    GlobalBatchNorm on the CPU (torch's has CUDA kernels only); the same parameters and buffers, so
    checkpoints still load into the plain model."""
    if not sync_bn:
        return model
    return (
        sync_norm.convert(model)
        if device is not None and device.type == "cpu"
        else nn.SyncBatchNorm.convert_sync_batchnorm(model)
    )


class Strategy:
    """One device in one process. Subclasses change how the model is wrapped and reduced."""

    rank = 0
    local_rank = 0
    world_size = 1
    local_world_size = 1
    is_main = True
    plan: RunPlan

    def __init__(self, device: torch.device):
        self.device = device
        if device.type == "cpu" and cpu_quota() and torch.get_num_threads() > available_cores():
            torch.set_num_threads(available_cores())  # torch sizes its threads by the affinity, not the quota
        self.clock = CommClock()  # the step's waits for other ranks (the step-time breakdown's communication)

    @property
    def training_threads(self) -> int:
        """Cores the training computation itself keeps busy (loader workers get the rest)."""
        return torch.get_num_threads() if self.device.type == "cpu" else 1

    def wrap(self, model: nn.Module, find_unused_parameters: bool = False) -> nn.Module:
        return model.to(self.device)

    def forward_only(self, model: nn.Module) -> nn.Module:
        """A wrapped network for a forward pass whose gradients stay out of the wrapper's
        bookkeeping (DDP's reducer); DataParallel still splits the batch."""
        return model

    def padding(self, active: bool) -> contextlib.AbstractContextManager[None]:
        """While this rank's micro-batch is a padding sample: no rows of it in synchronised BatchNorm."""
        return sync_norm.padding_rows(active)

    def all_gather_rows(self, tensor: torch.Tensor, rows: int) -> tuple[torch.Tensor, int]:
        """Every rank's first ``rows`` rows, in rank order, and where this rank's begin."""
        return tensor[:rows], 0

    def all_gather_objects(self, items: list[Any]) -> list[Any]:
        return list(items)

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The bare module, for saving and evaluation: no ``module.`` (DataParallel, DDP) or
        ``_orig_mod.`` (torch.compile) prefixes in checkpoints."""
        while True:
            compiled = getattr(model, "_orig_mod", None)
            if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
                model = model.module
            elif isinstance(compiled, nn.Module):
                model = compiled
            else:
                return model

    def eval_model(self, model: nn.Module) -> nn.Module:
        """The module to evaluate with: DataParallel still splits the batch over its GPUs."""
        return model

    def peak_memory(self) -> dict[str, Any]:
        """On CUDA: each rank's peak allocated memory (GiB), gathered with one small all-reduce."""
        if self.device.type != "cuda":
            return {}
        peaks = torch.zeros(self.world_size, device=self.device, dtype=torch.float64)
        peaks[self.rank] = torch.cuda.max_memory_allocated(self.device) / 2**30
        return {"memory_gib": self.all_reduce_sum(peaks).tolist()}

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def start_all_reduce_sum(self, tensor: torch.Tensor) -> Any:
        """Start summing ``tensor`` over ranks in place; the handle's ``wait()`` ends it (None: done)."""
        return None

    def barrier(self) -> None:
        pass

    def max_divergence(self, model: nn.Module) -> float:
        """Largest difference of any parameter or buffer between ranks (0.0: in sync)."""
        return 0.0

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        """Skip the gradient all-reduce on accumulation steps that do not end in an optimizer step."""
        return contextlib.nullcontext()

    # --- what a checkpoint holds of sharded networks (``fsdp.FSDPStrategy``); here, as they are
    gathers_state = False  # whether every rank takes part in making a checkpoint's state (full_state)
    writes_shards = False  # whether every rank writes its own shard of the networks (``phalanx.checkpoint.sharded``)

    def full_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """A run's state as a checkpoint holds it: every network and optimizer state whole."""
        return state

    def local_model_state(self, saved: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
        """A checkpoint's weights of a network as this rank's wrapped network takes them."""
        return saved

    def local_optimizer_state(self, saved: dict[str, Any], optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        return saved

    def after_step(self, models: Iterable[nn.Module]) -> None:
        """After every optimizer step: what keeps the ranks' networks the same beyond their weights."""

    def whole_networks(self, models: Iterable[nn.Module]) -> contextlib.AbstractContextManager[None]:
        """The networks whole on every rank inside the block (validation, pictures drawn by rank 0)."""
        return contextlib.nullcontext()

    def close(self) -> None:
        pass

    def describe(self) -> str:
        return str(self.device)


class DataParallelStrategy(Strategy):
    """torch.nn.DataParallel over several GPUs of this process; outputs gather on the first id."""

    def __init__(self, gpu_ids: tuple[int, ...]):
        super().__init__(torch.device("cuda", gpu_ids[0]))
        self.gpu_ids = gpu_ids

    def wrap(self, model: nn.Module, find_unused_parameters: bool = False) -> nn.Module:
        return nn.DataParallel(model.to(self.device), device_ids=list(self.gpu_ids), output_device=self.gpu_ids[0])

    def describe(self) -> str:
        return f"DataParallel over cuda:{',cuda:'.join(map(str, self.gpu_ids))}"


class DDPStrategy(Strategy):
    """One DistributedDataParallel worker: device ``cuda:gpu_ids[local_rank]``, or the CPU."""

    def __init__(self, cfg: RunConfig, env: Placement, plan: RunPlan):
        self.rank, self.local_rank, self.world_size = env.rank, env.local_rank, env.world_size
        self.local_world_size = env.local_world_size
        self.is_main = env.rank == 0
        self.sync_bn = cfg.devices.sync_bn
        device = plan.device
        if device.type == "cpu":
            torch.set_num_threads(cpu_threads_per_worker(env.local_world_size))
        else:
            torch.cuda.set_device(device)
        super().__init__(device)
        backend = self.backend = plan.backend
        import torch.distributed as dist
        from torch.distributed.rendezvous import rendezvous

        timeout = timedelta(seconds=cfg.devices.dist_timeout)
        if env.launcher in ("slurm", "mpi"):  # torch's env:// rendezvous reads these
            os.environ.update(
                RANK=str(env.rank),
                WORLD_SIZE=str(env.world_size),
                LOCAL_RANK=str(env.local_rank),
                LOCAL_WORLD_SIZE=str(env.local_world_size),
                MASTER_ADDR=env.master_addr,
                MASTER_PORT=str(env.master_port),
            )
        store, rank, world = next(rendezvous("env://", timeout=timeout))
        # torchrun keeps one store across elastic restarts; without a prefix per attempt the
        # restarted workers read the dead workers' addresses and fail to connect.
        store = dist.PrefixStore(f"phalanx/attempt_{elastic_restart_count()}", store)
        # device_id binds NCCL to this worker's GPU; gloo ignores it and takes the CPU.
        dist.init_process_group(
            backend,
            store=store,
            rank=rank,
            world_size=world,
            timeout=timeout,
            device_id=device if device.type == "cuda" else None,
        )

    def wrap(self, model: nn.Module, find_unused_parameters: bool = False) -> nn.Module:
        model = prepare_model(model, self.sync_bn, self.device).to(self.device)
        if not any(p.requires_grad for p in model.parameters()):
            return model  # nothing to synchronise (a momentum teacher): DDP refuses such a module
        ids = [self.device.index] if self.device.type == "cuda" else None
        wrapped = ddp_without_buffer_broadcasts(model, ids, find_unused_parameters)  # (once a step: after_step)
        self.clock.watch(model)
        return wrapped

    def forward_only(self, model: nn.Module) -> nn.Module:
        return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model

    def all_gather_rows(self, tensor: torch.Tensor, rows: int) -> tuple[torch.Tensor, int]:
        import torch.distributed as dist

        self._queued_work_done()
        with self.clock.collective():
            counts = torch.zeros(self.world_size, dtype=torch.int64, device=self.device)
            counts[self.rank] = rows
            dist.all_reduce(counts)
            counts_list = counts.tolist()
            return GatherRows.apply(tensor, rows, counts_list, self.rank, self.clock), sum(counts_list[: self.rank])

    def _queued_work_done(self) -> None:
        """Before a collective whose host waits for the GPU (its result read on the host): the
        kernels queued before it finish outside its time (else they count as communication)."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def all_gather_objects(self, items: list[Any]) -> list[Any]:
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.world_size
        self._queued_work_done()
        with self.clock.collective():
            dist.all_gather_object(gathered, list(items))
        return [item for part in gathered for item in part]

    def eval_model(self, model: nn.Module) -> nn.Module:
        # The bare module: ranks may hold different numbers of validation batches, and DDP's
        # forward could otherwise wait on a collective that the other ranks never join.
        return self.unwrap(model)

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        with self.clock.collective():
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def start_all_reduce_sum(self, tensor: torch.Tensor) -> Any:
        import torch.distributed as dist

        return dist.all_reduce(tensor, op=dist.ReduceOp.SUM, async_op=True)

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        # wrap's DDP wrapper (cast: nn.Module's types say any attribute is a Tensor or a Module)
        return cast(nn.parallel.DistributedDataParallel, model).no_sync()

    def after_step(self, models: Iterable[nn.Module]) -> None:
        broadcast_from_rank0(models, self.clock)  # every network's, a momentum teacher's too

    def max_divergence(self, model: nn.Module) -> float:
        return max_difference_from_rank0(model, self.device)

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    def describe(self) -> str:
        count = torch.get_num_threads()
        threads = f" ({count} thread{'s' if count != 1 else ''} per worker)" if self.device.type == "cpu" else ""
        return f"DDP rank {self.rank}/{self.world_size} on {self.device} ({self.backend}){threads}"

"""The strategy of a training or evaluating process, made from the run's plan: one place that knows
every parallel mode (``strategy``: one device, DataParallel, DDP; ``fsdp``: FSDP)."""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator

import torch

from ..config import RunConfig
from . import processes
from .cluster import Placement
from .devices import check_gpu_ids, plan_run, tune_cpu_allocator
from .fsdp import FSDPStrategy
from .strategy import DataParallelStrategy, DDPStrategy, Strategy


def make_strategy(cfg: RunConfig, env: Placement | None) -> Strategy:
    check_gpu_ids(cfg.devices.gpu_ids)
    plan = plan_run(cfg, env)
    if cfg.devices.uses_cpu:
        tune_cpu_allocator()
    if plan.mode == "ddp":
        assert env is not None  # (plan_run plans DDP for a worker's placement only)
        strategy: Strategy = (FSDPStrategy if cfg.devices.strategy == "fsdp" else DDPStrategy)(cfg, env, plan)
    elif plan.mode == "dataparallel":
        strategy = DataParallelStrategy(tuple(device.index for device in plan.devices))
    else:
        if plan.device.type == "cuda":
            torch.cuda.set_device(plan.device)
        strategy = Strategy(plan.device)
    strategy.plan = plan
    return strategy


@contextlib.contextmanager
def strategy_for(cfg: RunConfig, env: Placement | None) -> Iterator[Strategy]:
    """The strategy for this process, torn down (process group destroyed) however the run ends."""
    strategy = make_strategy(cfg, env)
    if isinstance(strategy, DDPStrategy):
        processes.joined_process_group = True
    try:
        yield strategy
    except BaseException as exc:
        # Free the failed run's locals (a DDP model among them) before its process group goes.
        traceback.clear_frames(exc.__traceback__)
        raise
    finally:
        strategy.close()

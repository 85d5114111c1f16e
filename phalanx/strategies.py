"""The strategy of a training or evaluating process, made from the run's plan, and the process's
end: one place that knows every parallel mode (``parallel``: one device, DataParallel, DDP;
``sharded``: FSDP)."""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from typing import Iterator

import torch

from .cluster import Placement
from .config import RunConfig
from .devices import check_gpu_ids, plan_run, tune_cpu_allocator
from .parallel import DataParallelStrategy, DDPStrategy, Strategy
from .sharded import FSDPStrategy


def make_strategy(cfg: RunConfig, env: Placement | None) -> Strategy:
    check_gpu_ids(cfg.devices.gpu_ids)
    plan = plan_run(cfg, env)
    if cfg.devices.uses_cpu:
        tune_cpu_allocator()
    if plan.mode == "ddp":
        strategy: Strategy = (FSDPStrategy if cfg.devices.strategy == "fsdp" else DDPStrategy)(cfg, env, plan)
    elif plan.mode == "dataparallel":
        strategy = DataParallelStrategy(tuple(device.index for device in plan.devices))
    else:
        if plan.device.type == "cuda":
            torch.cuda.set_device(plan.device)
        strategy = Strategy(plan.device)
    strategy.plan = plan
    return strategy


_joined_process_group = False


def exit_process(code: int) -> None:
    """Exit; after a process group, skip interpreter finalisation.

    Gloo's worker threads can still hold tensors when Python tears itself down, and the process
    then aborts (SIGABRT, "terminate called without an active exception") after a successful
    run even with destroy_process_group() called (pytorch/pytorch#179291). By now every file is
    written and closed, so flushing and ``os._exit`` loses nothing.
    """
    if not _joined_process_group:
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@contextlib.contextmanager
def strategy_for(cfg: RunConfig, env: Placement | None) -> Iterator[Strategy]:
    """The strategy for this process, torn down (process group destroyed) however the run ends."""
    global _joined_process_group
    strategy = make_strategy(cfg, env)
    _joined_process_group = _joined_process_group or isinstance(strategy, DDPStrategy)
    try:
        yield strategy
    except BaseException as exc:
        # Free the failed run's locals (a DDP model among them) before its process group goes.
        traceback.clear_frames(exc.__traceback__)
        raise
    finally:
        strategy.close()

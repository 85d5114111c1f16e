"""Where a process trains before any process group exists: its place in a group, its device(s),
its CPU threads, and the run plan (mode, world size, effective batch and learning rate) that both
``--dry-run`` and the run itself use."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Protocol

import torch

from ..config import RunConfig
from ..config.sections import DeviceOptions, means_cpu
from ..errors import PhalanxError
from ..system.cores import available_cores
from .cluster import Placement, placement_from


def placement() -> Placement | None:
    """This process's place in a process group started by torchrun, srun, mpirun or an operator."""
    return placement_from(os.environ)


def elastic_restart_count(environ: dict[str, str] | None = None) -> int:
    """How often torchrun has restarted this worker group (0 on the first attempt)."""
    env = os.environ if environ is None else environ
    return int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def cpu_threads_per_worker(local_workers: int) -> int:
    """Cores / local workers: 2 workers x 2 threads on 2 cores ran 6x slower than 2 x 1."""
    return max(1, available_cores() // max(1, local_workers))


def tune_cpu_allocator() -> None:
    """Keep large CPU tensors' memory in the heap between steps (glibc malloc).

    By default glibc serves large allocations with mmap and hands freed memory back to the OS, so
    every training step page-faults its activation and gradient buffers in again. Measured here
    (benchmarks/, resnet18, 2 DDP workers on CPU): 5% of throughput. A fixed mmap threshold at
    glibc's maximum and a high trim threshold keep that memory mapped between steps. Where
    ``MALLOC_MMAP_THRESHOLD_`` is set (glibc's own variable), the user chose: nothing is changed.
    """
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:  # the user's own setting wins
        return
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 * 1024 * 1024)  # M_MMAP_THRESHOLD: glibc's 64-bit maximum
        libc.mallopt(-1, 512 * 1024 * 1024)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):  # not glibc (musl, ...): nothing to tune
        pass


def missing_gpus(gpu_ids: tuple[int, ...]) -> str | None:
    """What is wrong with ids that name no real device here, or None."""
    if means_cpu(gpu_ids):
        return None
    if not torch.cuda.is_available():
        return f"GPU {gpu_ids[0]} asked for, but CUDA is not available here; use --gpu-ids -1 (or no --gpu-ids) for CPU"
    count = torch.cuda.device_count()
    beyond = [i for i in gpu_ids if i >= count]
    if beyond:
        return f"GPU {beyond[0]} does not exist; this machine has {count} (ids 0-{count - 1})"
    return None


def check_gpu_ids(gpu_ids: tuple[int, ...]) -> None:
    """Refuse ids that name no real device, before anything is written."""
    missing = missing_gpus(gpu_ids)
    if missing:
        raise PhalanxError(missing, "--gpu-ids")


def inference_device(gpu_ids: tuple[int, ...]) -> torch.device:
    """``evaluate``/``predict``/``export``: the first id's GPU, checked, or the CPU."""
    if means_cpu(gpu_ids):
        return torch.device("cpu")
    check_gpu_ids(gpu_ids[:1])
    return torch.device("cuda", gpu_ids[0])


def local_rank_device(devices: DeviceOptions, local_rank: int, local_world_size: int) -> torch.device:
    """Local rank r trains on ``cuda:gpu_ids[r]`` (CUDA_VISIBLE_DEVICES is left alone), or the CPU."""
    if devices.uses_cpu:
        return torch.device("cpu")
    if local_rank >= len(devices.gpu_ids):
        raise PhalanxError(
            f"local rank {local_rank} has no GPU id: {len(devices.gpu_ids)} id(s) for "
            f"{local_world_size} workers on this node; give one --gpu-ids per worker",
            "--gpu-ids",
        )
    return torch.device("cuda", devices.gpu_ids[local_rank])


def worker_device(devices: DeviceOptions, env: Placement) -> torch.device:
    return local_rank_device(devices, env.local_rank, env.local_world_size)


class DeclaresDataParallel(Protocol):
    """What ``refuse_data_parallel`` reads of a task (``phalanx.tasks.base.Task``: a layer above)."""

    @property
    def name(self) -> str: ...

    @property
    def data_parallel_refused(self) -> str: ...


def refuse_data_parallel(mode: str, task: DeclaresDataParallel) -> None:
    """A plan's DataParallel refused for a task that declares it cannot train under it."""
    if mode == "dataparallel" and task.data_parallel_refused:
        raise PhalanxError(
            f"--task {task.name} cannot train under DataParallel: {task.data_parallel_refused}; use "
            "trainlaunch (DDP), one GPU a worker",
            "--gpu-ids",
        )


@dataclass(frozen=True)
class RunPlan:
    """Devices, backend, world size, effective batch and learning rate of one training process:
    computed once, used by ``--dry-run`` and by the run itself."""

    mode: str  # "single", "dataparallel" or "ddp"
    device: torch.device  # where the batch and the outputs live
    devices: tuple[torch.device, ...]  # DataParallel's devices; else (device,)
    backend: str | None  # DDP's process-group backend
    world_size: int
    devices_per_step: int  # devices that share an optimizer step: --scale-lr linear's factor
    effective_batch: int
    lr: float

    def describe(self) -> str:
        if self.mode == "ddp":
            return f"DDP on {self.device} ({self.backend}, world size {self.world_size})"
        if self.mode == "dataparallel":
            names = ", ".join(str(d) for d in self.devices)
            return f"DataParallel over {names} (output on {self.device}; each batch split between them)"
        return str(self.device)


def plan_run(cfg: RunConfig, env: Placement | None) -> RunPlan:
    """The plan of this process: a DDP worker of ``env``, DataParallel over several ids, or one device."""
    if env is None and cfg.devices.strategy == "fsdp":
        raise PhalanxError(
            "shards the networks over DDP workers: launch with trainlaunch (or under torchrun, SLURM or MPI)",
            "--strategy",
        )
    devices: tuple[torch.device, ...]
    if env is not None:
        device = worker_device(cfg.devices, env)
        backend = cfg.devices.backend or ("nccl" if device.type == "cuda" else "gloo")
        mode, devices, world, sharing = "ddp", (device,), env.world_size, env.world_size
    elif cfg.devices.uses_cpu or len(cfg.devices.gpu_ids) == 1:
        device = torch.device("cpu") if cfg.devices.uses_cpu else torch.device("cuda", cfg.devices.gpu_ids[0])
        mode, devices, world, sharing, backend = "single", (device,), 1, 1, None
    else:
        devices = tuple(torch.device("cuda", i) for i in cfg.devices.gpu_ids)
        mode, device, world, sharing, backend = "dataparallel", devices[0], 1, len(devices), None
    return RunPlan(
        mode,
        device,
        devices,
        backend,
        world,
        sharing,
        cfg.optim.batch_size * cfg.optim.grad_accum * world,
        cfg.schedule.effective_lr(cfg.optim.lr, sharing),
    )


def plan_report(cfg: RunConfig, plan: RunPlan, train_samples: int | None) -> list[str]:
    """The batch and learning-rate lines of ``--dry-run``, from the plan a process makes: one report
    for ``train --dry-run`` and for each worker of ``trainlaunch --dry-run``."""
    from ..data.sampling import steps_per_epoch

    steps = (
        ""
        if train_samples is None
        else f"; {steps_per_epoch(train_samples, cfg.optim.batch_size, plan.world_size, cfg.optim.grad_accum)} optimizer steps per epoch"
    )
    if cfg.schedule.max_steps:
        steps += f"; stops at optimizer step {cfg.schedule.max_steps} (--max-steps)"
    return [
        f"batch size: {cfg.optim.batch_size} per process, {plan.effective_batch} effective (x{cfg.optim.grad_accum} "
        f"accumulation x{plan.world_size} processes){steps}",
        f"learning rate: {plan.lr:g} (--lr {cfg.optim.lr:g}, --scale-lr {cfg.schedule.scale_lr}), {cfg.schedule.lr_schedule} schedule "
        f"over {cfg.schedule.epochs} epoch{'s' if cfg.schedule.epochs != 1 else ''}"
        + (f" to {cfg.schedule.min_lr:g}" if cfg.schedule.min_lr else "")
        + f", {cfg.schedule.warmup_epochs:g} warmup"
        + (
            f"; gradients clipped to {cfg.optim.clip_grad:g} ({'their total norm' if cfg.optim.clip_mode == 'norm' else 'each element'})"
            if cfg.optim.clip_grad
            else ""
        ),
    ]


def option_warnings(cfg: RunConfig, device_type: str, world_size: int) -> list[str]:
    """Options that do less than they seem to on these devices, said as a run starts."""
    said = []
    if cfg.optim.precision == "fp16" and device_type == "cpu":
        said.append(
            "--precision fp16 on the CPU trained about 50x slower than fp32 in phalanx's measurements; "
            "bf16 is the CPU's fast half precision"
        )
    if cfg.devices.sync_bn and world_size == 1:
        said.append(
            "--sync-bn normalises over the rows of several processes (trainlaunch's workers, a "
            "scheduler's tasks); in one process it changes nothing"
        )
    return said

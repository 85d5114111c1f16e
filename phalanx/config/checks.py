"""The checks of a run configuration: each field's own (``fields.check_fields``), and those across
options that no one field's bounds can say."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from . import registry
from ..errors import PhalanxError
from .fields import check_fields, flag

if TYPE_CHECKING:
    from . import RunConfig


def check_config(cfg: RunConfig) -> None:
    """Every field as its declaration says (types, choices, bounds, finite numbers), then the rules
    that join several options."""
    def bad(name: str, message: str) -> PhalanxError:
        return PhalanxError(message, flag(name))

    # Types, choices, finite numbers, and lists from JSON and YAML ("0,1", a lone 0) as tuples: the
    # one check every options dataclass goes through.
    check_fields(cfg)
    registry.check_name(cfg.task)
    object.__setattr__(cfg, "task_options", registry.resolve_options(cfg.task, cfg.task_options))
    _check_required(cfg)
    if not (cfg.data.val_crop_pct == 0 or 0.5 <= cfg.data.val_crop_pct <= 1.25):
        raise bad("val_crop_pct", f"must be in [0.5, 1.25], or 0 for auto (got {cfg.data.val_crop_pct})")
    if cfg.data.num_workers != "auto" and not cfg.data.num_workers.isdigit():
        raise bad("num_workers", f"must be a number of processes or 'auto' (got {cfg.data.num_workers!r})")
    if len(cfg.data.mean) != len(cfg.data.std):
        raise bad("mean" if cfg.data.mean else "std", f"--mean has {len(cfg.data.mean)} values, --std {len(cfg.data.std)}; give both, "
                  "one per channel")
    if any(s <= 0 for s in cfg.data.std):
        raise bad("std", f"must be positive (got {cfg.data.std})")
    _check_optim(cfg, bad)
    if not cfg.name or "/" in cfg.name or cfg.name in (".", ".."):
        raise bad("name", f"must be a plain directory name (got {cfg.name!r})")
    if cfg.data.dataset not in ("digits", "synthetic") and not cfg.data.dataroot:
        raise bad("dataroot", f"is required with --dataset {cfg.data.dataset}")
    if cfg.resume is not None and cfg.overwrite:
        raise bad("overwrite", "conflicts with --resume; pick one")
    if cfg.storage.remote_transfer is not None:
        from ..records.remote import parse_s3_url  # stdlib only at import

        parse_s3_url(cfg.storage.remote_transfer, "--remote-transfer")
    if cfg.devices.sync_bn and cfg.devices.uses_cpu and (cfg.network.compile or cfg.devices.strategy == "fsdp"):
        raise bad("compile" if cfg.network.compile else "strategy", "with --sync-bn on CPU workers is not built "
                  "yet (phalanx's own synchronised BatchNorm runs eagerly under DDP); train without one of them")
    if cfg.devices.backend == "nccl" and cfg.devices.uses_cpu:
        raise bad("backend", "nccl needs GPUs; give --gpu-ids, or use gloo on the CPU")
    if cfg.devices.strategy == "fsdp":
        _check_fsdp(cfg, bad)
    ids = cfg.devices.gpu_ids
    if len(set(ids)) != len(ids):
        raise bad("gpu_ids", f"lists an id twice ({' '.join(map(str, ids))}); give each GPU once")
    if -1 in ids and len(ids) > 1:
        raise bad("gpu_ids", "-1 (CPU) cannot be mixed with GPU ids")
    if any(i < -1 for i in ids):
        raise bad("gpu_ids", f"ids are >= 0, or -1 for CPU (got {min(ids)})")
    if len(ids) > 1 and cfg.optim.batch_size < len(ids):
        raise bad("batch_size", f"{cfg.optim.batch_size} is smaller than the {len(ids)} DataParallel devices; "
                  f"use at least {len(ids)}")


def _check_required(cfg: RunConfig) -> None:
    """Your own task's ``requires``: each general option it cannot run without, given."""
    if not registry.is_user_task(cfg.task):
        return  # (a built-in task refuses a missing --dataroot itself, saying what it reads)
    cls = registry.task_class(cfg.task)
    values = cfg.to_dict()
    for name in getattr(cls, "requires", ()):
        if name not in values:
            raise PhalanxError(f"{cls.__name__}.requires names '{name}', which is not a general option "
                               f"(they are the flags of `phalanx train --help`, spelt with underscores)", "--task")
        if values[name] in (None, "", ()):
            raise PhalanxError(f"is required by --task {cfg.task} (its `requires`)", flag(name))


def _check_optim(cfg: RunConfig, bad: Callable[[str, str], PhalanxError]) -> None:
    if len(cfg.optim.betas) != 2 or not all(0 <= b < 1 for b in cfg.optim.betas):
        raise bad("betas", f"must be two numbers in [0, 1) (got {','.join(map(str, cfg.optim.betas))})")
    if cfg.schedule.min_lr and cfg.schedule.lr_schedule != "cosine":
        raise bad("min_lr", f"is where the cosine schedule ends; --lr-schedule {cfg.schedule.lr_schedule} has no floor")
    if cfg.schedule.min_lr >= cfg.optim.lr:
        raise bad("min_lr", f"{cfg.schedule.min_lr:g} is not below --lr {cfg.optim.lr:g}")
    if cfg.optim.nesterov and (cfg.optim.optimizer != "sgd" or not cfg.optim.momentum):
        raise bad("nesterov", "is SGD's with a momentum: give --optimizer sgd and --momentum above 0"
                  if cfg.optim.optimizer == "sgd" else f"is SGD's; --optimizer {cfg.optim.optimizer} has none")


def _check_fsdp(cfg: RunConfig, bad: Callable[[str, str], PhalanxError]) -> None:
    """What --strategy fsdp does not do yet, refused before anything runs."""
    for name, on in (("ema_decay", cfg.optim.ema_decay), ("compile", cfg.network.compile)):
        if on:
            raise bad(name, "with --strategy fsdp is not built yet; use --strategy ddp")
    if cfg.devices.fsdp_checkpoints == "sharded" and (cfg.storage.remote_transfer or cfg.storage.remote_transfer_cmd):
        raise bad("fsdp_checkpoints", "uploading sharded checkpoints is not built yet; add --fsdp-checkpoints whole "
                  "to upload whole ones")

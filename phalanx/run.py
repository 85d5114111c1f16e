"""One training process from a ``RunConfig``: check everything, then create the run and fit.

Shared by ``phalanx train`` and by every DDP worker that ``phalanx trainlaunch`` starts.
"""

from __future__ import annotations

import contextlib
import os
import random
from typing import Any, Callable, Iterator

import torch
from torch import nn

from . import checkpoint, rundir
from .cluster import launcher_name
from .config import RunConfig
from .data import DataBundle, build_datasets
from .errors import PhalanxError, RunFailed
from .finetune import Backbone, load_weights
from .failures import hold_stop_signals, summarize, write_traceback
from .models import build_model, required_channels
from .optim import effective_lr
from .outputs import RunOutputs, new_run_id
from .parallel import Placement, Strategy, placement, elastic_restart_count, missing_gpus, strategy_for
from .preempt import Preempted, StopRequest
from .recipe import Recipe
from .sampling import steps_per_epoch
from .trainer import Trainer


def train_run(cfg: RunConfig) -> dict[str, Any]:
    env = placement()
    cfg = restart_config(cfg, elastic_restart_count())
    # Failures are reported inside the strategy too, before its process group is torn down: the
    # teardown gives torchrun time to kill this worker before it has said why it failed.
    with one_line_failures(cfg, env), strategy_for(cfg, env) as strategy, one_line_failures(cfg, env):
        # The trainer (and its DDP model) lives in _train's frame, so it is freed before the
        # process group is destroyed: a DDP reducer that outlives its group aborts at exit.
        return _train(cfg, strategy)


@contextlib.contextmanager
def one_line_failures(cfg: RunConfig, env: Placement | None) -> Iterator[None]:
    """A lost peer, a timeout, a bug: one line for the console, the traceback in a file."""
    try:
        yield
    except PhalanxError:
        raise
    except Exception as exc:
        hold_stop_signals()
        rank = env.rank if env else 0
        log = write_traceback(cfg.run_dir / "logs" / f"rank{rank}.log", exc, f"rank {rank}")
        where = f"; traceback in {log}" if log else ""
        raise RunFailed(summarize(exc, cfg.backend or _backend(cfg)) + where,
                        f"rank {rank}" if env else None) from exc


def restart_config(cfg: RunConfig, restart: int) -> RunConfig:
    """torchrun restarted the workers after a failure: continue from the run's latest checkpoint,
    whatever flags started it (``--overwrite`` would delete it; ``--resume PATH`` is older)."""
    if restart == 0:
        return cfg
    if cfg.resume not in (None, "auto") and not checkpoint.candidates(cfg.run_dir):
        return cfg  # the first attempt saved nothing yet: start again from PATH
    return cfg.replace(resume="auto", overwrite=False)


def describe_run(cfg: RunConfig) -> list[str]:
    """``train --dry-run``: what this process would do, checked as a run checks it, nothing written.
    GPUs that are not on this machine are warned about, not refused: a plan is most useful on a
    login node, before the job reaches its GPUs."""
    env = placement()
    lines = [f"launcher: {launcher_name(os.environ)}"]
    if env is not None:
        device = "cpu" if cfg.uses_cpu else f"cuda:{cfg.gpu_ids[env.local_rank % len(cfg.gpu_ids)]}"
        devices, world = f"DDP on {device}", env.world_size
    elif cfg.uses_cpu:
        devices, world = "cpu", 1
    elif len(cfg.gpu_ids) == 1:
        devices, world = f"cuda:{cfg.gpu_ids[0]}", 1
    else:
        world = 1
        devices = (f"DataParallel over {', '.join(f'cuda:{i}' for i in cfg.gpu_ids)} (output on cuda:"
                   f"{cfg.gpu_ids[0]}; each batch of {cfg.batch_size} split between them)")
    devices_sharing = world if env else 1 if cfg.uses_cpu else len(cfg.gpu_ids)
    data = build_datasets(cfg, required_channels(cfg.model))
    model = build_model(cfg.model, num_classes(cfg, data), data.in_channels)
    effective = cfg.batch_size * cfg.grad_accum * world
    lines += [f"devices: {devices}",
              f"batch size: {cfg.batch_size} per process, {effective} effective (x{cfg.grad_accum} accumulation x"
              f"{world} processes); {steps_per_epoch(len(data.train), cfg.batch_size, world, cfg.grad_accum)} "
              "optimizer steps per epoch",
              f"learning rate: {effective_lr(cfg, devices_sharing):g} (--lr {cfg.lr:g}, --scale-lr {cfg.scale_lr}), "
              f"{cfg.lr_schedule} schedule over {cfg.epochs} epochs, {cfg.warmup_epochs:g} warmup",
              f"data: {data.description}",
              f"model: {cfg.model} ({sum(p.numel() for p in model.parameters()):,} parameters, "
              f"{data.num_classes} classes)"]
    try:
        resume = rundir.plan(cfg)
        action = (f"resumes from {resume.path} (epoch {resume.state['epoch']})" if resume
                  else "replaces the run there" if cfg.overwrite and rundir.holds_a_run(cfg.run_dir) else "a new run")
    except PhalanxError as exc:
        action = f"a real run would stop here: {exc}"
    lines.append(f"run dir: {cfg.run_dir}: {action}")
    missing = missing_gpus(cfg.gpu_ids)
    if missing:
        lines.append(f"warning: --gpu-ids: {missing} (a real run refuses this)")
    return lines


def _backend(cfg: RunConfig) -> str:
    return "gloo" if cfg.uses_cpu else "nccl"


def _train(cfg: RunConfig, strategy: Strategy) -> dict[str, Any]:
    def say(line: str) -> None:
        if strategy.is_main:
            print(line, flush=True)

    # Every check first (run directory, data, model, weights): bad input writes nothing.
    resume = rundir.plan(cfg)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    data = build_datasets(cfg, required_channels(cfg.model))
    model = build_model(cfg.model, num_classes(cfg, data), data.in_channels)
    notes = [load_weights(model, cfg.weights, data.classes)] if cfg.weights and resume is None else []
    backbone = Backbone(model) if cfg.freeze_backbone else None
    if backbone is not None:
        notes.append(f"phalanx: {backbone.description}")
    recipe = Recipe(cfg, num_classes(cfg, data), backbone)
    outputs = RunOutputs(cfg, strategy.is_main)  # checks --remote-transfer(-cmd)
    # Ranks must all have looked at the run directory before rank 0 changes it.
    strategy.barrier()
    run_id = resume.state.get("run_id", new_run_id()) if resume else new_run_id()
    if strategy.is_main:
        rundir.create(cfg, resume)
    try:
        outputs.start(run_id)
        for line in notes:
            say(line)
        return _fit(cfg, strategy, data, model, recipe, outputs, run_id, resume, say)
    except Preempted:
        outputs.status("preempted")
        raise
    except BaseException:
        outputs.status("failed")
        raise
    finally:
        outputs.close()  # the last snapshot, and every upload sent or reported


def num_classes(cfg: RunConfig, data: DataBundle) -> int:
    if cfg.num_classes and cfg.num_classes < data.num_classes:
        raise PhalanxError(f"{cfg.num_classes} is fewer than the {data.num_classes} classes in the data",
                           "--num-classes")
    return cfg.num_classes or data.num_classes


def _fit(cfg: RunConfig, strategy: Strategy, data: DataBundle, model: nn.Module, recipe: Recipe,
         outputs: RunOutputs, run_id: str, resume: rundir.Resume | None, say: Callable[[str], None]) -> dict[str, Any]:
    with StopRequest() as stop:  # SIGTERM / Ctrl-C: checkpoint at the next step boundary, then stop
        trainer = Trainer(cfg, strategy, data, model, recipe, outputs, run_id, say, stop)
        say(f"phalanx: {data.description}; model {cfg.model}; {strategy.describe()}; "
            f"lr {trainer.base_lr:g}; run dir {cfg.run_dir}")
        if cfg.precision == "fp16" and strategy.device.type == "cpu":
            say("phalanx: warning: --precision fp16 on the CPU trained about 50x slower than fp32 in phalanx's "
                "measurements; bf16 is the CPU's fast half precision")
        if resume is not None:
            trainer.restore(resume.state)
            for line in resume_notes(cfg, resume, trainer):
                say(line)
        outputs.status("restarted" if elastic_restart_count() else "running", epoch=trainer.epoch,
                       step=trainer.step, world_size=strategy.world_size, devices=strategy.describe(),
                       samples_per_epoch=trainer.num_train, epochs=cfg.epochs)
        summary = trainer.fit()
    if "val_acc" in summary:
        left_out = f"; {len(data.skipped)} unreadable image(s) were left out (--skip-broken)" if data.skipped else ""
        say(f"phalanx: done: val_acc {100 * summary['val_acc']:.2f}% (best {100 * summary['best_val_acc']:.2f}%); "
            f"checkpoints in {cfg.run_dir}{left_out}")
    else:
        say(f"phalanx: nothing to do: {resume.path if resume else 'the run'} already has {cfg.epochs} epochs")
    return summary


def resume_notes(cfg: RunConfig, resume: rundir.Resume, trainer: Trainer) -> list[str]:
    """Where the run continues, and what changed since the checkpoint that the user should know."""
    state = resume.state
    restart = elastic_restart_count()
    where = (f"epoch {trainer.epoch + 1}, sample {trainer.position} of {trainer.num_train}" if trainer.position
             else f"epoch {trainer.epoch}")
    lines = [f"phalanx: resumed from {resume.path} after {where}"
             + (f" (elastic restart {restart})" if restart else "")]
    old_world, old_batch = state.get("world_size"), state.get("effective_batch")
    if old_batch is not None and old_batch != trainer.effective_batch:
        lines.append(f"phalanx: the world size changed ({old_world} -> {trainer.world_size} processes): effective "
                     f"batch {old_batch} -> {trainer.effective_batch}, learning rate {trainer.base_lr:g} "
                     f"(--scale-lr {cfg.scale_lr}); the sample order and the schedule continue where they were")
    old_epochs = state.get("config", {}).get("epochs")
    if old_epochs is not None and old_epochs != cfg.epochs and cfg.lr_schedule == "cosine" \
            and trainer.epoch < cfg.epochs:
        lines.append(f"phalanx: --epochs changed ({old_epochs} -> {cfg.epochs}): the cosine schedule now ends "
                     f"at epoch {cfg.epochs} and continues from this point of it")
    return lines

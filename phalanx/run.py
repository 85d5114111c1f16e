"""One training process from a ``RunConfig``: check everything, then create the run and fit.

Shared by ``phalanx train`` and by every DDP worker that ``phalanx trainlaunch`` starts.
"""

from __future__ import annotations

import random
from typing import Any, Callable

import torch
from torch import nn

from . import rundir
from .config import RunConfig
from .data import DataBundle, build_datasets
from .models import build_model, required_channels
from .parallel import Strategy, elastic_restart_count, strategy_for
from .outputs import RunOutputs, new_run_id
from .preempt import StopRequest
from .trainer import Trainer


def train_run(cfg: RunConfig) -> dict[str, Any]:
    if cfg.resume is None and elastic_restart_count() > 0:
        # torchrun restarted the workers after a failure: continue from the last checkpoint.
        cfg = cfg.replace(resume="auto")
    with strategy_for(cfg) as strategy:
        # The trainer (and its DDP model) lives in _train's frame, so it is freed before the
        # process group is destroyed: a DDP reducer that outlives its group aborts at exit.
        return _train(cfg, strategy)


def _train(cfg: RunConfig, strategy: Strategy) -> dict[str, Any]:
    def say(line: str) -> None:
        if strategy.is_main:
            print(line, flush=True)

    # Every check first (run directory, data, model): bad input writes nothing.
    resume = rundir.plan(cfg)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    data = build_datasets(cfg, required_channels(cfg.model))
    model = build_model(cfg.model, data.num_classes, data.in_channels)
    # From here on each global rank draws its own random stream (augmentation, dropout).
    torch.manual_seed(cfg.seed + strategy.rank)
    outputs = RunOutputs(cfg, strategy.is_main)  # checks --remote-transfer(-cmd)
    # Ranks must all have looked at the run directory before rank 0 changes it.
    strategy.barrier()
    run_id = resume.state.get("run_id", new_run_id()) if resume else new_run_id()
    if strategy.is_main:
        rundir.create(cfg, resume)
    try:
        outputs.start(run_id)
        return _fit(cfg, strategy, data, model, outputs, run_id, resume, say)
    finally:
        outputs.close()  # the last snapshot, and every upload sent or reported


def _fit(cfg: RunConfig, strategy: Strategy, data: DataBundle, model: nn.Module, outputs: RunOutputs,
         run_id: str, resume: rundir.Resume | None, say: Callable[[str], None]) -> dict[str, Any]:
    with StopRequest() as stop:  # SIGTERM / Ctrl-C: checkpoint at the next step boundary, then stop
        trainer = Trainer(cfg, strategy, data, model, outputs, run_id, say, stop)
        say(f"phalanx: {data.description}; model {cfg.model}; {strategy.describe()}; "
            f"lr {trainer.base_lr:g}; run dir {cfg.run_dir}")
        if resume is not None:
            trainer.restore(resume.state)
            where = f"epoch {trainer.epoch + 1}, batch {trainer.resume_batch}" if trainer.resume_batch \
                else f"epoch {trainer.epoch}"
            say(f"phalanx: resumed from {resume.path} after {where}")
        summary = trainer.fit()
    if "val_acc" in summary:
        say(f"phalanx: done: val_acc {100 * summary['val_acc']:.2f}% (best {100 * summary['best_val_acc']:.2f}%); "
            f"checkpoints in {cfg.run_dir}")
    else:
        say(f"phalanx: nothing to do: {resume.path if resume else 'the run'} already has {cfg.epochs} epochs")
    return summary

"""One training process from a ``RunConfig`` (``phalanx train``, each DDP worker of ``trainlaunch``):
check everything, then create the run and fit."""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from .. import checkpoint
from ..checkpoint import rundir
from ..config import RunConfig, registry
from ..config.sections import means_cpu
from ..data import close_loaders
from ..distributed.cluster import launcher_name
from ..distributed.devices import (
    Placement,
    elastic_restart_count,
    missing_gpus,
    option_warnings,
    placement,
    plan_report,
    plan_run,
    refuse_data_parallel,
)
from ..distributed.failures import hold_stop_signals, summarize, write_traceback
from ..distributed.strategies import strategy_for
from ..distributed.strategy import Strategy
from ..errors import EXIT_BAD_INPUT, PhalanxError, RunFailed
from ..models.weights import learnt_normalisation, weights_preview
from ..tasks.base import Declaration, Task, TaskData, check_declaration, dataset_size
from ..tasks.inference import inference_class
from .best import Best
from .memory_plan import check_batch_memory, memory_lines
from .outputs import RunOutputs, new_run_id
from .preempt import Preempted, StopRequest
from .single_rows import refuse_single_rows
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
        raise RunFailed(
            summarize(exc, cfg.devices.backend or _backend(cfg)) + where, f"rank {rank}" if env else None
        ) from exc


def restart_config(cfg: RunConfig, restart: int) -> RunConfig:
    """torchrun restarted the workers after a failure: continue from the run's latest checkpoint,
    whatever flags started it (``--overwrite`` would delete it; ``--resume PATH`` is older)."""
    if restart == 0:
        return cfg
    if cfg.resume not in (None, "auto") and not checkpoint.candidates(cfg.run_dir):
        return cfg  # the first attempt saved nothing yet: start again from PATH
    return cfg.replace(resume="auto", overwrite=False)


def build_task(cfg: RunConfig, mode: str = "") -> Task:
    """The run's task (a built-in or the user's class, by name), checked against the plan's ``mode``."""
    task: Task = registry.task_class(cfg.task)(cfg)
    refuse_data_parallel(mode, task)
    return task


def build_networks(cfg: RunConfig, task: Task) -> tuple[TaskData, dict[str, nn.Module]]:
    """The task's data and networks; every rank builds the same initial weights."""
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    data = task.build_data()
    models = task.build_models(data)
    return data, models


def remote_notes(cfg: RunConfig) -> list[str]:
    """DeepLIIF's guide has DDP users pass --remote True so that rank 0 pickles what visdom would
    show: phalanx always does. Alone, it copies nothing anywhere: say so, and what would."""
    if not cfg.storage.remote or cfg.storage.remote_transfer or cfg.storage.remote_transfer_cmd:
        return []
    return [
        f"phalanx: --remote True: snapshots go to {cfg.snapshot_dir} (watch them with `phalanx visualize "
        "--pickle_dir` there); to also copy them and the checkpoints elsewhere, add --remote-transfer-cmd "
        "MODULE.FUNCTION or --remote-transfer s3://BUCKET/PREFIX"
    ]


def describe_run(cfg: RunConfig) -> tuple[list[str], PhalanxError | None]:
    """``train --dry-run``: what this process would do, checked as a run checks it, nothing written,
    and where the run directory would stop a real run, why. GPUs that are not on this machine are
    warned about, not refused: a plan is most useful on a login node, before the job reaches its GPUs."""
    env = placement()
    plan = plan_run(cfg, env)  # the very plan a run makes: a device the run would refuse is refused here
    lines = [f"launcher: {launcher_name(os.environ)}", f"task: {cfg.task}", f"devices: {plan.describe()}"]
    data, checked, stop = describe_checks(cfg, plan.world_size, plan.mode, len(plan.devices))
    lines += [*plan_report(cfg, plan, dataset_size(data.train)), *checked]
    missing = missing_gpus(cfg.devices.gpu_ids)
    if missing:
        lines.append(f"warning: --gpu-ids: {missing} (a real run refuses this)")
    return lines, stop


def describe_checks(
    cfg: RunConfig, world_size: int, mode: str = "", replicas: int = 1
) -> tuple[TaskData, list[str], PhalanxError | None]:
    """What a dry run checks as the run would, nothing written: the task, its data and networks (bad
    input fails here as it would; their memory per rank under each strategy), and the run directory
    (said in the plan, and returned: the dry run then exits as the real run would, 2)."""
    check_batch_memory(cfg)
    if cfg.resume is None:
        cfg = learnt_normalisation(cfg)
    task = build_task(cfg, mode)
    data = task.build_data()
    try:
        # On the meta device: a plan counts parameters without allocating them (a --hidden-dim of a
        # million must not take the machine's memory in a dry run).
        with torch.device("meta"):
            models = task.build_models(data)
    except PhalanxError:
        raise
    except Exception:  # a network that cannot be built on meta: build it as the run will
        torch.manual_seed(cfg.seed)
        models = task.build_models(data)
    lines = [f"data: {data.description}"]
    for name, model in models.items():
        lines.append(
            f"network {name}: {type(model).__name__}, {sum(p.numel() for p in model.parameters()):,} parameters"
        )
    check_declaration(task, task.declare(data, models), data, models, bool(cfg.output.best_metric))
    inference_class(type(task))  # what evaluate, predict and export will use: a bad name is said now
    lines += memory_lines(cfg, models, world_size)
    resume, stop = None, None
    try:
        resume = rundir.plan(cfg)
        action = (
            f"resumes from {resume.path} ({_where(resume.state)})"
            if resume
            else "no checkpoint there: a new run (--resume auto)"
            if cfg.resume == "auto"
            else "replaces the run there"
            if cfg.overwrite and rundir.holds_a_run(cfg.run_dir)
            else rundir.REPLACED_NOTE
            if rundir.failed_before_a_checkpoint(cfg.run_dir)
            else "a new run"
        )
    except PhalanxError as exc:
        action, stop = f"a real run would stop here: {exc}", exc
    lines.append(f"run dir: {cfg.run_dir}: {action}")
    if stop is None and cfg.network.weights and resume is None:
        lines += [weights_with_note(cfg).removeprefix("phalanx: ")] if cfg.weights_with else []
        lines += weights_preview(task, models, cfg.network.weights, data)
    if stop is None:  # a real run stops at its run directory first
        refuse_single_rows(
            cfg, dataset_size(data.train), models, world_size, resume.state["position"] if resume else 0, replicas
        )
    return data, lines, stop


def _where(state: dict[str, Any]) -> str:
    """A checkpoint's place in training: "after epoch 2, step 90", or mid-epoch "in epoch 1 at sample
    96, step 3"."""
    if state["position"]:
        return f"in epoch {state['epoch'] + 1} at sample {state['position']}, step {state['step']}"
    return f"after epoch {state['epoch']}, step {state['step']}"


def _backend(cfg: RunConfig) -> str:
    return "gloo" if cfg.devices.uses_cpu else "nccl"


def _nothing_to_do(cfg: RunConfig, resume: rundir.Resume | None) -> str:
    """Why a resumed run has no step left to train (its epochs, or --max-steps reached), or ''."""
    if resume is None:
        return ""
    state, limit = resume.state, cfg.schedule.max_steps
    if state["epoch"] >= cfg.schedule.epochs and not state["position"]:
        return f"{resume.path} already has {state['epoch']} epoch{'s' if state['epoch'] != 1 else ''}; a larger --epochs trains on"
    if limit and state["step"] >= limit:
        return (
            f"{resume.path} is at step {state['step']}, --max-steps {limit}; a larger --max-steps (0: every "
            "epoch) trains on"
        )
    return ""


def _train(cfg: RunConfig, strategy: Strategy) -> dict[str, Any]:
    def say(line: str) -> None:
        if strategy.is_main:
            print(line, flush=True)

    # Every check first (run directory, task, data, networks, weights): bad input writes nothing.
    check_batch_memory(cfg)
    resume = rundir.plan(cfg)
    if resume is None:  # (a resumed run's configuration holds what this chose)
        cfg = learnt_normalisation(cfg)
    done = _nothing_to_do(cfg, resume)
    if done and not elastic_restart_count():  # nothing written; torchrun's restart after a failure ends the records
        assert resume is not None  # (only a resumed run can have nothing left to do)
        say(f"phalanx: nothing to do: {done}")
        return {"epochs": resume.state["epoch"]}
    task = build_task(cfg, strategy.plan.mode)
    data, models = build_networks(cfg, task)
    if not done:  # (a restart with nothing left to train ends the records at any world size)
        refuse_single_rows(
            cfg,
            dataset_size(data.train),
            models,
            strategy.world_size,
            resume.state["position"] if resume else 0,
            len(strategy.plan.devices),
        )
    notes = task.load_weights(models, cfg.network.weights, data) if cfg.network.weights and resume is None else []
    if notes and cfg.weights_with:
        notes.insert(0, weights_with_note(cfg))
    notes += task.notes() + remote_notes(cfg)
    declared = task.declare(data, models)
    check_declaration(task, declared, data, models, bool(cfg.output.best_metric))
    inference_class(type(task))  # what evaluate, predict and export will use: a bad name is said now
    best = Best(declared, cfg.output.best_metric)  # checks --best-metric
    outputs = RunOutputs(cfg, strategy.is_main)  # checks --remote-transfer(-cmd)
    # Ranks must all have looked at the run directory before rank 0 changes it.
    strategy.barrier()
    run_id = resume.state.get("run_id", new_run_id()) if resume else new_run_id()
    if cfg.resume is None and not cfg.overwrite and rundir.failed_before_a_checkpoint(cfg.run_dir):
        notes.insert(0, f"phalanx: {cfg.run_dir} {rundir.REPLACED_NOTE}")
    made = rundir.create(cfg, resume) if strategy.is_main else []
    try:
        with rundir.claimed(cfg.run_dir, strategy.is_main):  # a live run is never replaced as a failed one
            try:
                panes = task.panes(declared)
                outputs.start(run_id, panes, best.spec(declared, panes))
                if cfg.resume == "auto" and resume is None:
                    say(f"phalanx: --resume auto: no checkpoint in {cfg.run_dir}: starting a new run")
                for line in notes:
                    say(line)
                return _fit(cfg, strategy, task, declared, data, models, outputs, run_id, resume, say)
            except Preempted:
                outputs.status("preempted")
                raise
            except BaseException:
                outputs.status("failed")
                raise
            finally:
                outputs.close()  # the last snapshot, and every upload sent or reported
    except PhalanxError as exc:  # exit 2 writes nothing, also where the first step found the mistake
        if strategy.is_main and resume is None and exc.exit_code == EXIT_BAD_INPUT:
            rundir.remove_refused(cfg, made)
        raise


def _fit(
    cfg: RunConfig,
    strategy: Strategy,
    task: Task,
    declared: Declaration,
    data: TaskData,
    models: dict[str, nn.Module],
    outputs: RunOutputs,
    run_id: str,
    resume: rundir.Resume | None,
    say: Callable[[str], None],
) -> dict[str, Any]:
    with StopRequest() as stop:  # SIGTERM / Ctrl-C: checkpoint at the next step boundary, then stop
        trainer = Trainer(cfg, strategy, task, declared, data, models, outputs, run_id, say, stop)
        task_part = f"task {cfg.task}; " if cfg.task != registry.DEFAULT else ""
        workers = f"{trainer.num_workers} loader worker{'s' if trainer.num_workers != 1 else ''}"
        networks = (
            cfg.network.model if list(models) == ["model"] else ", ".join(models)
        )  # one whole model: --model's name
        say(
            f"phalanx: {task_part}{data.description}; model {networks}; "
            f"{strategy.describe()}; {workers}; lr {trainer.base_lr:g}; run dir {cfg.run_dir}"
        )
        for warning in option_warnings(cfg, strategy.device.type, strategy.world_size):
            say(f"phalanx: warning: {warning}")
        if resume is not None:
            trainer.restore(resume.state)
            for line in resume_notes(cfg, resume, trainer):
                say(line)
        outputs.status(
            "restarted" if elastic_restart_count() else "running",
            epoch=trainer.epoch,
            step=trainer.step,
            world_size=strategy.world_size,
            devices=strategy.describe(),
            samples_per_epoch=trainer.num_train,
            epochs=cfg.schedule.epochs,
        )
        try:
            summary = trainer.fit()
        finally:
            close_loaders(trainer.train_loader, trainer.val_loader)
    if "stopped_at_step" in summary:
        where = (
            f"{summary['position']} samples into epoch {summary['epochs'] + 1}"
            if summary["position"]
            else f"after epoch {summary['epochs']}"
        )
        say(
            f"phalanx: stopped at step {summary['stopped_at_step']} (--max-steps), {where}; --resume auto continues; "
            f"checkpoints in {cfg.run_dir}"
        )
        say(f"phalanx: time per step: {summary['step_times']} (mean over ranks; the dashboard's step-time pane)")
    elif "metrics" in summary:
        best = summary["best"]
        last = summary["metrics"][best["metric"]]
        left_out = f"; {len(data.skipped)} unreadable image(s) were left out (--skip-broken)" if data.skipped else ""
        say(
            f"phalanx: done: val_{best['metric']} {task.format_metric(best['metric'], last)} (best "
            f"{task.format_metric(best['metric'], best['value'])}); checkpoints in {cfg.run_dir}{left_out}"
        )
        say(f"phalanx: time per step: {summary['step_times']} (mean over ranks; the dashboard's step-time pane)")
    else:
        say(
            f"phalanx: nothing to do: {resume.path if resume else 'the run'} has trained every epoch (--epochs {cfg.schedule.epochs})"
        )
    return summary


def weights_with_note(cfg: RunConfig) -> str:
    return (
        f"phalanx: --weights {cfg.network.weights}: its own settings give {', '.join(cfg.weights_with)} "
        "(options not given here)"
    )


def resume_notes(cfg: RunConfig, resume: rundir.Resume, trainer: Trainer) -> list[str]:
    """Where the run continues, and what changed since the checkpoint that the user should know."""
    state = resume.state
    restart = elastic_restart_count()
    where = (
        f"in epoch {trainer.epoch + 1} at sample {trainer.position} of {trainer.num_train}"
        if trainer.position
        else f"after epoch {trainer.epoch}"
    )
    lines = [f"phalanx: resumed from {resume.path} {where}" + (f" (elastic restart {restart})" if restart else "")]
    if cfg.resumed_with:
        lines.append(
            f"phalanx: --resume: continuing with the run's own {', '.join(cfg.resumed_with)} (options not given here)"
        )
    old_world, old_batch = state.get("world_size"), state.get("effective_batch")
    if old_batch is not None and old_batch != trainer.strategy.plan.effective_batch:
        what = (
            f"the world size changed ({old_world} -> {trainer.world_size} processes)"
            if old_world != trainer.world_size
            else "--batch-size or --grad-accum changed"
        )
        lines.append(
            f"phalanx: {what}: effective "
            f"batch {old_batch} -> {trainer.strategy.plan.effective_batch}, learning rate {trainer.base_lr:g} "
            f"(--scale-lr {cfg.schedule.scale_lr}); the sample order and the schedule continue where they were"
        )
    old_ids = tuple(state.get("config", {}).get("gpu_ids") or ())
    if _devices(old_ids) != _devices(cfg.devices.gpu_ids):
        lines.append(
            f"phalanx: the checkpoint was trained on {_devices(old_ids)}; this run continues on "
            f"{_devices(cfg.devices.gpu_ids)}"
        )
    old_lr = state.get("config", {}).get("lr")
    if old_lr is not None and old_lr != cfg.optim.lr:
        lines.append(
            f"phalanx: --lr changed ({old_lr:g} -> {cfg.optim.lr:g}): the schedule continues from this point at it"
        )
    old_epochs = state.get("config", {}).get("epochs")
    if (
        old_epochs is not None
        and old_epochs != cfg.schedule.epochs
        and cfg.schedule.lr_schedule in ("cosine", "linear")
        and trainer.epoch < cfg.schedule.epochs
    ):
        lines.append(
            f"phalanx: --epochs changed ({old_epochs} -> {cfg.schedule.epochs}): the {cfg.schedule.lr_schedule} schedule now "
            f"ends at epoch {cfg.schedule.epochs} and continues from this point of it"
        )
    return lines


def _devices(gpu_ids: tuple[int, ...]) -> str:
    """--gpu-ids in words: "the CPU", "GPU 0", "GPUs 0, 1"."""
    if means_cpu(gpu_ids):
        return "the CPU"
    return f"GPU{'s' if len(gpu_ids) > 1 else ''} {', '.join(map(str, gpu_ids))}"

"""The task API: what a task declares, and what the trainer gives it.

A task owns its data, models, optimizers' parameter groups, training step, losses, validation
metrics, dashboard panes and what ``evaluate``/``predict``/``export`` do with a checkpoint. The
trainer owns progress, accumulation, precision, checkpoints, resume and the parallel strategy,
and calls the methods below the same way whatever the task.

The training step gets one micro-batch and a ``StepContext`` (``contract``; the trainer's is ``phalanx.train.context``):
- the common case returns its losses by name, ``{"loss": per_sample_losses}``, and the trainer
  does backward (scaled so that DDP's average is the mean over the step's samples), accumulation,
  ``no_sync``, the GradScaler and the optimizer step;
- a task that alternates updates (a GAN) sets ``manual_optimization = True`` and calls
  ``ctx.backward(loss, "discriminator")`` and ``ctx.step("discriminator")`` itself; ``ctx.frozen(name)``
  lends a network for a forward pass whose gradients must not reach it (the generator's step
  through the discriminator), outside DDP's bookkeeping.

A loss is per-sample (a 1-D tensor, one value per sample of the micro-batch: exact under DDP at
any world size) or a 0-dim mean over the micro-batch's samples (weighted by them).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..checkpoint import check_loadable
from ..config import registry
from ..data.sources import dataset_size
from ..errors import PhalanxError
from .contract import (
    Batch,
    Declaration,
    Evaluation,
    Pending,
    Plain,
    PlainRecord,
    RunContext,
    StepContext,
    StepLosses,
    TaskData,
    Visuals,
    pane,
)

__all__ = [
    "Batch",
    "Declaration",
    "Evaluation",
    "Pending",
    "Plain",
    "PlainRecord",
    "RunContext",
    "StepContext",
    "StepLosses",
    "Task",
    "TaskData",
    "Visuals",
    "check_step_losses",
    "dataset_size",
    "fixed_sample",
    "full_precision",
    "pane",
]

if TYPE_CHECKING:
    from ..config import RunConfig


def full_precision(tensor: torch.Tensor) -> torch.Tensor:
    """Autocast's half-precision outputs as float32 for metrics; float32 and float64 as they are."""
    return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor


def fixed_sample(length: int, count: int, seed: int) -> list[int]:
    """``count`` indices of ``range(length)``, chosen by the seed and sorted: the same samples shown
    every epoch, so the dashboard shows the outputs change as training goes."""
    order = list(range(length))
    random.Random(seed).shuffle(order)
    return sorted(order[:count])


class Task:
    """Subclass this for your own task (``--task package.module:Class``); the built-in tasks do.

    Declarations (class attributes):
    - ``Options``: a frozen dataclass of the task's own options (fields made with
      ``phalanx.tasks.option``); given with ``--task-option key=value`` or a ``task:`` section of
      ``--config``; the instance gets them as ``self.options``;
    - ``defaults``: general options this task gives other defaults (``{"lr": 2e-4, ...}``);
    - ``reads``: the general data and model options (``registry.DATA_OPTIONS``: ``dataroot``,
      ``image_size``, ``augment``, ``model``, ...) that the task reads from ``self.cfg.data`` and
      ``self.cfg.network``; any other of them given on the command line is refused, never silently
      ignored;
    - ``requires``: the general options the task cannot run without (``("dataroot",)``): a run
      without one is refused in one line before anything starts;
    - ``loss_names``: the named losses ``training_step`` returns, logged (averaged over ranks);
    - ``metrics``: the validation metrics that get panes and that ``--best-metric`` accepts
      (default: every metric ``validation_metrics`` makes of ``empty_sums()``);
    - ``primary_model``: the network ``predict``/``export`` use by default, and ``--weights``;
    - ``best_metric``: ``(validation metric, "max" | "min")`` that picks ``best.pt``;
    - ``manual_optimization``: the step calls ``ctx.backward``/``ctx.step`` itself;
    - ``find_unused_parameters``: DDP's option, for networks whose forward leaves parameters out;
    - ``data_parallel_refused``: why the task cannot train under DataParallel (several --gpu-ids in
      one process), if it cannot; trainlaunch's DDP, one GPU a worker, is unaffected;
    - ``ema_models``: the networks ``--ema-decay`` averages (default: the primary one);
    - ``Inference``: what ``evaluate``, ``predict`` and ``export`` do with the trained task, a class
      or its name (``"module:Class"``, ``".inference:Class"`` beside the declaring class's module)
      (``tasks.inference.Inference``: the base evaluates on the validation split and has no
      predict or export).
    The framework reads these through ``declare()`` once; a task whose names depend on its data
    (one generator per target) overrides ``declare`` instead of changing them on the instance.
    """

    name = ""
    Options: type | None = None
    defaults: dict[str, Plain] = {}
    reads: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    loss_names: tuple[str, ...] = ("loss",)
    primary_model = "model"
    best_metric: tuple[str, str] = ("loss", "min")
    manual_optimization = False
    find_unused_parameters = False
    data_parallel_refused = ""
    ema_models: tuple[str, ...] | None = None
    metrics: tuple[str, ...] | None = None
    Inference: type | str = ".inference:Inference"
    metric_labels: dict[str, str] = {}

    def __init_subclass__(cls, **kwargs: object) -> None:
        """A built-in task (its ``name`` in the registry) takes its ``defaults`` and ``reads`` from
        there, once for ``--help`` and the class alike; a subclass (your own task built on it)
        inherits them."""
        super().__init_subclass__(**kwargs)
        info = registry.builtin().get(cls.__dict__.get("name", ""))
        if info is not None:
            cls.defaults, cls.reads = info.defaults, info.reads

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.options = self.parse_options(cfg.task_options)

    @classmethod
    def parse_options(cls, given: Mapping[str, Plain]) -> object:
        """The task's options from plain data (a config's ``task_options``), typed and checked."""
        return registry.parse_options(cls.Options, given, cls.__name__, cls.__name__)

    # --- data, models, optimizers ------------------------------------------------------------
    def build_data(self) -> TaskData:
        raise NotImplementedError

    def build_models(self, data: TaskData) -> dict[str, nn.Module]:
        """The networks by name, on the CPU, before any wrapper; every rank builds the same weights
        (the trainer seeds torch before calling this). A loss module with buffers and no
        parameters (DeepLIIF's ``GANLoss``) belongs here too: moved to the device and checkpointed
        with the networks, never wrapped in DDP."""
        raise NotImplementedError

    def declare(self, data: TaskData, models: Mapping[str, nn.Module]) -> Declaration:
        """The task's declarations, once its data and networks exist (default: the class's)."""
        return Declaration(
            loss_names=tuple(self.loss_names),
            metrics=tuple(self.metrics or metrics_of(self)),
            primary_model=self.primary_model,
            best_metric=(*self.best_metric,),  # a list: a tuple
            ema_models=tuple(self.ema_models or (self.primary_model,)),
            metric_labels=MappingProxyType(dict(self.metric_labels)),
            manual_optimization=self.manual_optimization,
            find_unused_parameters=self.find_unused_parameters,
        )

    def param_groups(self, models: Mapping[str, nn.Module]) -> dict[str, list[dict[str, object]]]:
        """Each optimizer by name -> its parameter groups (``{"params": [...], "lr_mult": 1.0}``).
        Every optimizer follows the run's schedule from the base LR times its group's ``lr_mult``.
        Default: one optimizer, named after the primary model, over every trainable parameter; with
        ``manual_optimization``, one per network that has any (a GAN's generator and discriminator)."""

        def trainable(module: nn.Module) -> list[nn.Parameter]:
            return [p for p in module.parameters() if p.requires_grad]

        if self.manual_optimization:
            return {name: [{"params": trainable(m), "lr_mult": 1.0}] for name, m in models.items() if trainable(m)}
        return {self.primary_model: [{"params": [p for m in models.values() for p in trainable(m)], "lr_mult": 1.0}]}

    def load_weights(self, models: Mapping[str, nn.Module], spec: str, data: TaskData) -> list[str]:
        """``--weights``: load starting weights; returns lines that say what was loaded."""
        raise PhalanxError(f"--task {self.name or type(self).__name__} does not take --weights", "--weights")

    def notes(self) -> list[str]:
        """Lines said once at the start of a run (what was frozen, replaced, ...)."""
        return []

    def train_mode(self, models: Mapping[str, nn.Module]) -> None:
        """Put the networks in training mode (a frozen part may stay in eval mode)."""
        for model in models.values():
            model.train()

    # --- training ------------------------------------------------------------------------------
    def training_step(self, batch: Batch, ctx: StepContext) -> StepLosses:
        """One micro-batch: the named losses (per-sample, or 0-dim means), and any monitors it
        all-reduces beside the backward pass. Without manual optimization the trainer
        backpropagates ``"loss"``."""
        raise NotImplementedError

    def after_step(self, models: Mapping[str, nn.Module]) -> None:
        """After every optimizer step (a momentum teacher's update, ...)."""

    def state_dict(self) -> dict[str, Plain]:
        """Task state beyond the networks and optimizers that an exact resume needs."""
        return {}

    def load_state_dict(self, state: PlainRecord) -> None:
        pass

    # --- validation ----------------------------------------------------------------------------
    def empty_sums(self) -> dict[str, torch.Tensor]:
        """Zero tensors of the sums ``validation_step`` returns (a rank with no validation sample
        still takes part in the all-reduce)."""
        return {"loss": torch.zeros(()), "samples": torch.zeros(())}

    def validation_step(
        self, models: Mapping[str, nn.Module], batch: Batch, ctx: RunContext
    ) -> dict[str, torch.Tensor]:
        """Sums over one validation batch (same keys as ``empty_sums``); the trainer all-reduces them."""
        raise NotImplementedError

    def validation_metrics(self, sums: dict[str, torch.Tensor]) -> Evaluation:
        """Default: each sum but ``samples`` as a mean per validation sample."""
        count = float(sums["samples"])
        return Evaluation(
            {k: float(v) / max(count, 1.0) for k, v in sums.items() if k != "samples"}, {"samples": int(count)}
        )

    @torch.no_grad()
    def evaluate(self, models: Mapping[str, nn.Module], loader: Iterable[Batch], ctx: RunContext) -> Evaluation:
        """Every validation sample once, at any world size: sums per batch, one all-reduce."""
        sums = {k: v.to(ctx.device, torch.float64) for k, v in self.empty_sums().items()}
        for batch in loader:
            batch = ctx.to_device(batch)
            with ctx.autocast():
                found = self.validation_step(models, batch, ctx)
            for key, value in found.items():
                if key not in sums:  # else a bare KeyError after a whole epoch of training
                    raise PhalanxError(
                        f"{type(self).__name__}.validation_step returned {key!r}, which its "
                        f"empty_sums() does not declare ({', '.join(sums)}); declare every sum "
                        "there (a rank with no validation sample still all-reduces it)",
                        exit_code=1,
                    )
                sums[key] += value.detach().to(torch.float64)
        return self.validation_metrics(ctx.all_reduce_sums(sums))

    def epoch_records(self, evaluation: Evaluation, epoch: int) -> list[dict[str, Plain]]:
        """Records of an epoch's validation beyond its metrics (global rank 0 writes them)."""
        return []

    def epoch_warnings(self, train: dict[str, float], epoch: int) -> list[str]:
        """Warnings said after an epoch's console line, from its named training losses (averaged over
        the epoch and the ranks): a method's sign of collapse."""
        return []

    def summary(self, metrics: dict[str, float]) -> str:
        """The validation part of the epoch's console line."""
        return "  ".join(f"val_{k} {self.format_metric(k, v)}" for k, v in metrics.items())

    def format_metric(self, name: str, value: float) -> str:
        return f"{value:.4g}"

    # --- dashboard -----------------------------------------------------------------------------
    def panes(self, declared: Declaration) -> list[dict[str, Plain]]:
        """Line panes: each named loss and each validation metric on its own axes, labelled with
        ``metric_labels`` (the status pane's words) where it names them."""
        label = declared.label
        panes = [
            pane(f"train_{name}", f"train {label(name)} (mean over ranks)", label(name), "train", [(name, label(name))])
            for name in declared.loss_names
        ]
        return panes + [
            pane(f"val_{name}", f"validation {label(name)}", label(name), "val", [(name, label(name))])
            for name in declared.metrics
        ]

    def visuals(self, data: TaskData) -> Visuals | None:
        """What global rank 0 shows of each epoch: an object with ``record(models, epoch, ctx)``
        returning an ``images`` record (made with ``images_item``, ``png``, ``strip`` and
        ``denormalize`` from ``phalanx.tasks``), or None. ``record`` gets the bare networks in eval
        mode, after validation; the trainer puts them back in training mode."""
        return None

    # --- using a checkpoint --------------------------------------------------------------------
    def restore_info(self, info: PlainRecord) -> None:
        """What a checkpoint says the data resolved to, before ``build_models`` (inference builds
        no training data: ``build_models`` reads ``data.info`` only)."""


def check_step_losses(task: Task, losses: object, declared: Declaration) -> None:
    """The losses a step returns are those its task declares (``loss_names``): said at the first
    step in one line, not as a KeyError in a log, nor dropped unlogged without a word."""
    loss_names, manual = declared.loss_names, declared.manual_optimization
    wanted = set(loss_names) | ({"loss"} if not manual else set())
    got = set(losses) if isinstance(losses, dict) else set()
    name = type(task).__name__
    if not isinstance(losses, dict) or not wanted <= got:
        missing = ", ".join(sorted(wanted - got)) or "a dict"
        raise PhalanxError(
            f"{name}.training_step returned {sorted(got) if isinstance(losses, dict) else type(losses).__name__}"
            f" without {missing}: it returns a dict with every name of {name}.loss_names "
            f"({', '.join(loss_names)})" + ("" if manual else " and 'loss' (the one backward takes)")
        )
    undeclared = sorted(got - wanted)
    if undeclared:
        raise PhalanxError(
            f"{name}.training_step returned {', '.join(map(repr, undeclared))}, which {name}.loss_names "
            f"({', '.join(loss_names)}) does not declare, so it would never be logged: add it to "
            "loss_names, or leave it out of the dict"
        )


def check_declaration(
    task: Task, declared: Declaration, data: TaskData, models: Mapping[str, nn.Module], best_metric_given: bool
) -> None:
    """What a task declares against what it built, before the first step: a primary network, moving
    averages and a best metric that exist, sums that validation can start from, and data info that a
    checkpoint can hold (each was a KeyError, or a refusal at the first save, after a whole epoch)."""
    name = type(task).__name__
    built = ", ".join(models) or "none"
    if declared.primary_model not in models:
        raise PhalanxError(
            f"{name}.primary_model is {declared.primary_model!r}, a network build_models did not make "
            f"({built}): declare primary_model = the one predict, export and --weights use"
        )
    absent = [model for model in declared.ema_models if model not in models]
    if absent:
        raise PhalanxError(
            f"{name}.ema_models names {', '.join(map(repr, absent))}, which build_models did not make ({built})"
        )
    sums = task.empty_sums()
    if not isinstance(sums, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in sums.items()
    ):
        raise PhalanxError(
            f"{name}.empty_sums() returned {sums!r:.80}; it returns a dict of name -> zero tensor "
            "(torch.zeros(())), one per sum validation_step returns"
        )
    if type(task).validation_metrics is Task.validation_metrics and "samples" not in sums:
        raise PhalanxError(
            f"{name}.empty_sums() has no 'samples' ({', '.join(sums)}); the default validation_metrics "
            'divides each sum by it: add "samples": torch.zeros(()), and count them in validation_step'
        )
    metric = declared.best_metric[0]
    if not best_metric_given and metric not in declared.metrics:  # (the task's metrics or those of zero sums)
        raise PhalanxError(
            f"{name}.best_metric is {tuple(declared.best_metric)!r}, but its validation metrics are "
            f'{", ".join(declared.metrics)}: declare best_metric = (one of them, "max" or "min")'
        )
    check_loadable(data.info, "TaskData.info", PhalanxError)  # else refused at the first save


def metrics_of(task: Task) -> list[str]:
    """The metrics ``validation_metrics`` makes of ``empty_sums()``: a task's default ``metrics``."""
    try:  # names only: a task whose metrics need real sums declares ``metrics``
        names = list(task.validation_metrics(task.empty_sums()).metrics)
    except Exception:
        names = []
    return names or [task.best_metric[0]]


registry.register_task_base(Task)  # the registry, below the tasks, checks user classes against it

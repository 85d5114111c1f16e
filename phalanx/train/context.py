"""What the trainer lends a task: devices, precision and collectives (``DeviceContext``), and for a
training step the networks, backward and optimizer steps (``TrainingStepContext``): the trainer's
side of the task contract's ``RunContext`` and ``StepContext`` (``phalanx.tasks.contract``).

A task calls these and never the strategy, the GradScaler or torch.distributed itself, so the same
task runs in one process, under DataParallel and as a DDP worker.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from ..config.sections import OptimOptions
from ..data.sampling import MicroBatch, sample_order
from ..distributed.comm_clock import CommClock
from ..distributed.strategy import Strategy
from ..errors import PhalanxError
from .optim import clip_gradients
from .optim import step as step_optimizer

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class DeviceContext:
    def __init__(self, strategy: Strategy, precision: str, channels_last: bool):
        self.strategy = strategy
        self.device = strategy.device
        self.rank, self.world_size = strategy.rank, strategy.world_size
        self.amp_dtype = AMP_DTYPES.get(precision)
        self.float64 = precision == "fp64"
        self.channels_last = channels_last

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def to_device(self, batch: Any) -> Any:
        """A batch (tensors in tuples, lists and dicts) on this process's device; images (4-D
        floating tensors) channels-last when ``--channels-last`` is asked; floating tensors in
        float64 with ``--precision fp64``."""
        if isinstance(batch, torch.Tensor):
            batch = batch.to(self.device, non_blocking=True)
            if self.float64 and batch.is_floating_point():
                batch = batch.double()
            if self.channels_last and batch.dim() == 4 and batch.is_floating_point():
                batch = batch.contiguous(memory_format=torch.channels_last)
            return batch
        if isinstance(batch, (list, tuple)):
            moved = [self.to_device(item) for item in batch]
            return type(batch)(moved) if isinstance(batch, list) else tuple(moved)
        if isinstance(batch, dict):
            return {key: self.to_device(value) for key, value in batch.items()}
        return batch

    def all_reduce_sums(self, sums: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Each tensor summed over ranks (float64), in one collective (the keys and shapes are the
        same on every rank)."""
        return self.all_reduce_sums_later(sums).result()

    def all_reduce_sums_later(
        self, sums: dict[str, torch.Tensor], finish: Callable[[dict[str, torch.Tensor]], Any] | None = None
    ) -> PendingSums:
        """``all_reduce_sums`` started now and finished at ``result()``: in a training step, the
        collective runs beside the backward pass instead of stopping every rank mid-step (a
        monitor of the global batch, a centre for the next step). A step may return the
        ``PendingSums`` as a named loss: the trainer takes its ``result()`` after the backward."""
        keys = list(sums)
        flat = torch.cat([sums[k].detach().reshape(-1).to(self.device, torch.float64) for k in keys])
        return PendingSums(
            self.strategy.start_all_reduce_sum(flat),
            flat,
            {k: sums[k].shape for k in keys},
            finish,
            self.strategy.clock,
        )

    def all_gather(self, tensor: torch.Tensor, rows: int | None = None) -> tuple[torch.Tensor, int]:
        """Every rank's rows of ``tensor`` concatenated in rank order, and where this rank's begin.
        Gradients flow back to each rank's own rows, summed over every rank's use of them (the
        all-reduce in backward that a global-batch loss needs). ``rows``: how many of this rank's
        rows count (default: all)."""
        return self.strategy.all_gather_rows(tensor, tensor.shape[0] if rows is None else rows)

    def all_gather_objects(self, items: list[Any]) -> list[Any]:
        """Every rank's plain-data items, in rank order (detections to score once, ...)."""
        return self.strategy.all_gather_objects(items)


class PendingSums:
    """Sums on their way through an all-reduce: ``result()`` waits for them (then ``finish``)."""

    def __init__(
        self,
        work: Any,
        flat: torch.Tensor,
        shapes: dict[str, torch.Size],
        finish: Callable[[dict[str, torch.Tensor]], Any] | None,
        clock: CommClock,
    ):
        self.work, self.flat, self.shapes, self.finish, self.clock = work, flat, shapes, finish, clock
        self.value: Any = None
        self.done = False

    def result(self) -> Any:
        """The sums (or what ``finish`` makes of them), once: a second call returns the first's."""
        if not self.done:
            if self.work is not None:
                with self.clock.collective():
                    self.work.wait()
            self.done = True
            out, at = {}, 0
            for key, shape in self.shapes.items():
                size = shape.numel()
                out[key] = self.flat[at : at + size].view(shape)
                at += size
            self.value = self.finish(out) if self.finish else out
        return self.value


class TrainingStepContext(DeviceContext):
    """One micro-batch of training: set by the trainer before each ``training_step``."""

    def __init__(
        self,
        strategy: Strategy,
        optim: OptimOptions,
        channels_last: bool,
        models: Mapping[str, nn.Module],
        optimizers: Mapping[str, torch.optim.Optimizer],
        scalers: Mapping[str, torch.amp.GradScaler],
        manual: bool = True,
        task: str = "the task",
    ):
        super().__init__(strategy, optim.precision, channels_last)
        self.optim = optim
        self.manual, self.task = manual, task  # (whether the task's step may call backward and step itself)
        self.models = models
        self.optimizers, self.scalers = optimizers, scalers
        self.micro: MicroBatch | None = None
        self.epoch = 0  # the epoch being trained (1-based)
        self.progress = 0.0  # epochs of training done at the end of this micro-batch (fractional)
        self.epochs = 0  # the run's length in epochs (--epochs)
        self.stepped: set[str] = set()

    def begin(self, micro: MicroBatch, epoch: int, progress: float, epochs: int) -> None:
        self.micro, self.epoch, self.progress, self.epochs = micro, epoch, progress, epochs
        self.stepped = set()

    @property
    def samples(self) -> int:
        """Samples of this micro-batch that count on this rank (0: a padding sample, weighing nothing)."""
        return self.micro.real if self.micro else 0

    @property
    def ends_step(self) -> bool:
        return bool(self.micro and self.micro.ends_step)

    def _optimizer(self, name: str | None) -> str:
        if name is None:
            if len(self.optimizers) != 1:
                raise PhalanxError(f"ctx.backward needs an optimizer name ({', '.join(self.optimizers)})", "--task")
            return next(iter(self.optimizers))
        if name not in self.optimizers:
            raise PhalanxError(
                f"{self.task} has no optimizer '{name}' (its param_groups made "
                f"{', '.join(self.optimizers)}): param_groups returns one entry per optimizer the step "
                "names",
                "--task",
            )
        return name

    def _manual(self, call: str) -> None:
        if not self.manual:
            raise PhalanxError(
                f"{self.task}.training_step called ctx.{call}, which only a task with "
                "manual_optimization = True calls (it steps its optimizers in turn, as a GAN does); "
                f'declare manual_optimization = True in {self.task}, or return {{"loss": ...}} and '
                "let the trainer do backward and the step"
            )

    def backward(self, loss: torch.Tensor, optimizer: str | None = None) -> None:
        """Backpropagate a per-sample (1-D) or mean (0-dim) loss of this micro-batch, scaled so
        that DDP's average over ranks is the mean over the optimizer step's samples (a task with
        ``manual_optimization``)."""
        self._manual("backward")
        self.backward_loss(loss, optimizer)

    def backward_loss(self, loss: torch.Tensor, optimizer: str | None = None) -> None:
        """``backward``, for the trainer itself too (the ``"loss"`` of a task without manual optimization)."""
        name = self._optimizer(optimizer)
        micro = self.micro
        assert micro is not None  # (begin, before every step)
        total = loss.sum() if loss.dim() else loss * micro.real
        if not micro.real:
            total = total * 0.0  # a padding sample: every rank takes part in the all-reduce, weighing nothing
        scaled = total * micro.loss_scale(self.world_size)
        # (outside autocast; the gradient all-reduce's wait after the last gradient: communication)
        with torch.autocast(self.device.type, enabled=False), self.strategy.clock.backward(micro.ends_step):
            self.scalers[name].scale(scaled).backward()

    def step(self, optimizer: str | None = None) -> None:
        """Step an optimizer, if this micro-batch ends an optimizer step (with ``--grad-accum``,
        gradients accumulate until then), and clear its gradients (a task with ``manual_optimization``)."""
        self._manual("step")
        self.step_optimizer(optimizer)

    def step_optimizer(self, optimizer: str | None = None) -> None:
        """``step``, for the trainer itself too."""
        name = self._optimizer(optimizer)
        if not self.ends_step or name in self.stepped:
            return
        scaler = self.scalers[name]
        clip_gradients(self.optimizers[name], scaler, self.optim)
        step_optimizer(self.optimizers[name], scaler)
        scaler.update()
        self.optimizers[name].zero_grad(set_to_none=True)
        self.stepped.add(name)

    @contextlib.contextmanager
    def frozen(self, name: str) -> Iterator[nn.Module]:
        """A network for a forward pass whose gradients must not reach its weights (the generator's
        step through the discriminator): outside DDP's gradient bookkeeping, its parameters not
        requiring gradients until the block ends."""
        module = self.strategy.forward_only(self.models[name])
        params = [p for p in module.parameters() if p.requires_grad]
        for param in params:
            param.requires_grad_(False)
        try:
            yield module
        finally:
            for param in params:
                param.requires_grad_(True)

    def all_gather(self, tensor: torch.Tensor, rows: int | None = None) -> tuple[torch.Tensor, int]:
        # A rank whose share of this micro-batch is a padding sample contributes no rows.
        counted = (tensor.shape[0] if rows is None else rows) if self.samples else 0
        return self.strategy.all_gather_rows(tensor, counted)

    def all_gather_in_order(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's rows of this micro-batch (one per sample) in the order one process holding
        the whole micro-batch has them: where the order matters (a queue of keys), the same at any
        world size. Gradients flow as with ``all_gather``."""
        gathered, _ = self.all_gather(tensor)
        return gathered[sample_order(len(gathered), self.world_size)]

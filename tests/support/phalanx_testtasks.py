"""Tasks the tests hand to phalanx as ``--task phalanx_testtasks:NAME`` (tests/support on PYTHONPATH,
and examples/tasks for the worked example they extend).

They are ordinary user tasks. Environment variables only make them stop at a given step (a
scheduler's SIGTERM, at a point known in advance instead of a race with a timer) or write down what
training did (sample ids, learning rates), for tests to compare with a reference.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

import torch
from torch import nn

from phalanx.config.fields import option
from phalanx.data import SeededView
from phalanx.tasks import Task, TaskData
from phalanx.tasks.classify.task import ClassifyTask

try:  # the worked example, from examples/tasks (on PYTHONPATH in the tests that use it)
    from adversarial_autoencoder import AdversarialAutoencoder
except ImportError:  # pragma: no cover - only the tests of the example need it
    AdversarialAutoencoder = None


class StopAtStep:
    """Mixin: at training step $PHALANX_TEST_STOP_STEP on rank $PHALANX_TEST_STOP_RANK (default 0),
    the process sends itself SIGTERM, as a scheduler would. Each process stops once."""

    def training_step(self, batch, ctx):
        self._calls = getattr(self, "_calls", 0) + 1
        step = int(os.environ.get("PHALANX_TEST_STOP_STEP", "0"))
        if step and self._calls == step and str(ctx.rank) == os.environ.get("PHALANX_TEST_STOP_RANK", "0"):
            os.kill(os.getpid(), signal.SIGTERM)
        return super().training_step(batch, ctx)


def _record(lines: list[str]) -> None:
    folder = os.environ.get("PHALANX_TEST_RECORD")
    if folder:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"rank{os.environ.get('RANK', '0')}-{os.getpid()}.txt"), "a") as fh:
            fh.write("".join(line + "\n" for line in lines))


class _Indexed(torch.utils.data.Dataset):
    """A data set's samples with their index, so a task can write down what it trained on."""

    def __init__(self, base):
        self.base = base

    def __len__(self):
        return len(self.base)

    def __getitem__(self, index):
        return self.base[index], index


if AdversarialAutoencoder is not None:

    class StoppingAutoencoder(StopAtStep, AdversarialAutoencoder):
        """The worked example, stopped by a SIGTERM at a chosen step."""

    class RecordingAutoencoder(StopAtStep, AdversarialAutoencoder):
        """The worked example, writing down each training sample's index and each optimizer's LR."""

        def build_data(self):
            data = super().build_data()
            data.train = SeededView(_Indexed(data.train.base))
            return data

        def training_step(self, batch, ctx):
            images, indices = batch
            if ctx.samples:  # not a padding sample
                lrs = " ".join(f"{name}={opt.param_groups[0]['lr']!r}" for name, opt in sorted(ctx.optimizers.items()))
                _record([f"E{ctx.epoch} {lrs}"] + [f"T{ctx.epoch} {int(i)}" for i in indices])
            return super().training_step(images, ctx)


@dataclass(frozen=True)
class GatherOptions:
    gather: bool = option(True, "Negatives from every rank's samples (off: this rank's only).")
    dim: int = option(6, "Embedding size.")


class ScaledLoss(nn.Module):
    """A loss module with a buffer (its weight, 1) and no parameter."""

    def __init__(self):
        super().__init__()
        self.register_buffer("weight", torch.tensor(1.0, dtype=torch.float64))

    def forward(self, losses: torch.Tensor) -> torch.Tensor:
        return losses * self.weight


class GatherTask(Task):
    """A loss over the global batch: each sample's embedding is pulled away from every other
    sample's (a contrastive denominator), so its gradient reaches every rank's rows. Embeddings
    are centred by a running mean kept as task state (DINO's centre), which an exact resume must
    restore. Random float64 vectors; per-rank inputs differ, as real data does."""

    Options = GatherOptions
    defaults = {
        "optimizer": "sgd",
        "lr": 0.5,
        "momentum": 0.0,
        "weight_decay": 0.0,
        "lr_schedule": "constant",
        "precision": "fp64",
    }
    loss_names = ("loss",)
    primary_model = "encoder"
    best_metric = ("loss", "min")
    SAMPLES = 96

    def __init__(self, cfg):
        super().__init__(cfg)
        self.center = torch.zeros(self.options.dim, dtype=torch.float64)
        self.batch_mean = None

    def build_data(self):
        generator = torch.Generator().manual_seed(1234)
        points = torch.randn(self.SAMPLES, 5, generator=generator, dtype=torch.float64)
        return TaskData(SeededView(points[:80]), points[80:], "random vectors (80 train / 16 val)", info={})

    def build_models(self, data):
        # The criterion is a loss module with a buffer and no parameter, as DeepLIIF's GANLoss: it
        # goes beside the networks (moved, checkpointed, never wrapped in DDP) with no optimizer.
        return {"encoder": nn.Linear(5, self.options.dim), "criterion": ScaledLoss()}

    def losses(self, z_local: torch.Tensor, z_all: torch.Tensor, start: int, criterion: nn.Module) -> torch.Tensor:
        z_local, z_all = z_local - self.center.to(z_local), z_all - self.center.to(z_all)
        similarity = z_local @ z_all.T / 2.0
        own = torch.arange(len(z_local), device=z_local.device) + start
        similarity[torch.arange(len(z_local)), own] = float("-inf")  # a sample is not its own negative
        return criterion(torch.logsumexp(similarity, dim=1) + (z_local**2).sum(1) * 0.05)

    def training_step(self, points, ctx):
        z = ctx.models["encoder"](points)
        if self.options.gather:
            z_all, start = ctx.all_gather(z)
        else:
            z_all, start = z, 0
        self.batch_mean = z_all.detach().mean(0)
        return {"loss": self.losses(z, z_all, start, ctx.models["criterion"])}

    def after_step(self, models):
        self.center = 0.5 * self.center + 0.5 * self.batch_mean.cpu()

    def state_dict(self):
        return {"center": self.center.clone()}

    def load_state_dict(self, state):
        self.center = state["center"].clone()

    def validation_step(self, models, points, ctx):
        z = models["encoder"](points)
        return {"loss": self.losses(z, z, 0, models["criterion"]).sum(), "samples": torch.tensor(float(len(points)))}


class StoppingGatherTask(StopAtStep, GatherTask):
    """The gather task, stopped by a SIGTERM at a chosen step."""


class StoppingClassify(StopAtStep, ClassifyTask):
    """Classification, stopped by a SIGTERM at a chosen step."""


class AdamWithoutRate(GatherTask):
    """A task of yours whose optimizer is AdamW, with no rate of its own: torch's AdamW rate, not the
    general (SGD's) 0.1."""

    defaults = {"optimizer": "adamw", "precision": "fp64"}


class Incomplete(Task):
    """Declares a training step but no data or networks: refused before anything is written."""

    def training_step(self, batch, ctx):
        return {}


class RaisesInStep(GatherTask):
    """A bug in a user's task: rank 1 raises at its second step."""

    def training_step(self, points, ctx):
        self._steps = getattr(self, "_steps", 0) + 1
        if ctx.rank == 1 and self._steps == 2:
            raise ValueError("the test task raised at step 2")
        return super().training_step(points, ctx)


from phalanx.tasks.selfsupervised.byol import BYOLTask  # noqa: E402


class StoppingBYOL(StopAtStep, BYOLTask):
    """BYOL, stopped by a SIGTERM at a chosen step."""


from phalanx.tasks.selfsupervised.moco import MoCoTask  # noqa: E402


class StoppingMoCo(StopAtStep, MoCoTask):
    """MoCo, stopped by a SIGTERM at a chosen step."""


from phalanx.tasks.selfsupervised.dino import DINOTask  # noqa: E402


class StoppingDINO(StopAtStep, DINOTask):
    """DINO, stopped by a SIGTERM at a chosen step."""


class InfGradientAtStep(ClassifyTask):
    """Classification whose gradients become inf in training step $PHALANX_TEST_INF_STEP (a loss
    that stays finite, as an fp16 overflow in backward does). It writes down, as task state (in the
    checkpoint), the grad scaler's scale before each step and a checksum of the weights after it,
    so a test sees that the step was skipped and the scale halved."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.trace: list[list[float]] = []  # [step, scale before, weights' sum after]
        self._calls = 0

    def training_step(self, batch, ctx):
        self._calls += 1
        self._scale = float(ctx.scalers["model"].get_scale())
        losses = super().training_step(batch, ctx)
        if self._calls == int(os.environ.get("PHALANX_TEST_INF_STEP", "0")):
            losses["loss"].register_hook(lambda grad: torch.full_like(grad, float("inf")))
        return losses

    def after_step(self, models):
        checksum = sum(p.detach().double().sum().item() for p in models["model"].parameters())
        self.trace.append([float(self._calls), self._scale, checksum])

    def state_dict(self):
        return {"trace": torch.tensor(self.trace, dtype=torch.float64)}


class NumpyInInfo(ClassifyTask):
    """A task whose ``TaskData.info`` holds a numpy scalar, which no checkpoint could load back."""

    def build_data(self):
        import numpy

        data = super().build_data()
        data.info["scale"] = numpy.float64(0.5)
        return data


if AdversarialAutoencoder is not None:

    class PlainTrainSplit(AdversarialAutoencoder):
        """The worked example with its training split as a plain tensor: no (epoch, index) keys."""

        def build_data(self):
            data = super().build_data()
            data.train = data.train.base
            return data

    class UndeclaredSum(AdversarialAutoencoder):
        """Returns a validation sum (``PSNR_1``) that its ``empty_sums`` does not declare."""

        def validation_step(self, models, real, ctx):
            return {**super().validation_step(models, real, ctx), "PSNR_1": torch.zeros(())}

    class EvalModeVisuals(AdversarialAutoencoder):
        """Its pictures say whether every network was in eval mode when they were made."""

        def visuals(self, data):
            made = super().visuals(data)

            class Checked:
                def record(self, models, epoch, ctx):
                    record = made.record(models, epoch, ctx)
                    record["items"][0]["caption"] += f" in eval mode: {not any(m.training for m in models.values())}"
                    return record

            return Checked()

    class UndeclaredLoss(AdversarialAutoencoder):
        """Declares a loss (``G_total``) that its step does not return."""

        loss_names = (*AdversarialAutoencoder.loss_names, "G_total")

    class PerTargetMetric(AdversarialAutoencoder):
        """A metric (``PSNR_1``) beside the example's L1, with no ``metrics`` declared."""

        def empty_sums(self):
            return {**super().empty_sums(), "PSNR_1": torch.zeros(())}

        def validation_step(self, models, real, ctx):
            return {**super().validation_step(models, real, ctx), "PSNR_1": torch.tensor(float(len(real)))}

        def validation_metrics(self, sums):
            evaluation = super().validation_metrics(sums)
            evaluation.metrics["PSNR_1"] = float(sums["PSNR_1"]) / max(float(sums["samples"]), 1.0)
            return evaluation


if AdversarialAutoencoder is not None:  # a newcomer's mistakes writing a task (issue 64): each refused at once

    class NeedsDataroot(AdversarialAutoencoder):
        """Reads its images from --dataroot, and says it cannot run without one."""

        requires = ("dataroot",)
        reads = ("dataroot", "val_fraction")

    class NoPrimary(AdversarialAutoencoder):
        """Leaves ``primary_model`` at the base's "model", a network it does not build."""

        primary_model = Task.primary_model

    class NoBestMetric(AdversarialAutoencoder):
        """Leaves ``best_metric`` at the base's ("loss", "min"); its validation makes L1."""

        best_metric = Task.best_metric

    class FloatSums(AdversarialAutoencoder):
        """``empty_sums`` of Python floats, where validation adds tensors to them."""

        def empty_sums(self):
            return {"L1": 0.0, "samples": 0.0}

    class BackwardWithoutManual(AdversarialAutoencoder):
        """Steps its optimizers itself but forgot ``manual_optimization = True``."""

        manual_optimization = False

        def param_groups(self, models):
            return {name: [{"params": list(m.parameters()), "lr_mult": 1.0}] for name, m in models.items()}

    class MissingOptimizer(AdversarialAutoencoder):
        """Names an optimizer (discriminator) that its ``param_groups`` does not make."""

        def param_groups(self, models):
            return {"generator": [{"params": list(models["generator"].parameters()), "lr_mult": 1.0}]}

    class ExtraLoss(AdversarialAutoencoder):
        """Returns a loss (``G_total``) that its ``loss_names`` leaves out: it would never be logged."""

        def training_step(self, real, ctx):
            losses = super().training_step(real, ctx)
            return {**losses, "G_total": losses["G_GAN"] + losses["G_L1"]}


class NanFromTheData(ClassifyTask):
    """A classifier whose loss is nan from the first batch on (as an image of nan would make it)."""

    def training_step(self, batch, ctx):
        losses = super().training_step(batch, ctx)
        return {**losses, "loss": losses["loss"] * float("nan")}


class SlowData(ClassifyTask):
    """Classification whose training images each take 20 ms to load: its steps wait for their data
    (the step-time breakdown must say so)."""

    def build_data(self):
        import dataclasses
        import time

        data = super().build_data()

        class Slow(torch.utils.data.Dataset):
            takes_epoch = getattr(data.train, "takes_epoch", False)

            def __len__(self):
                return len(data.train)

            def __getitem__(self, key):
                time.sleep(0.02)
                return data.train[key]

        return dataclasses.replace(data, train=Slow())


class DataEndsEarly(ClassifyTask):
    """Classification whose data set raises StopIteration at its 40th image (a bug in a user's data
    set: a ``next()`` on an exhausted iterator), which a DataLoader takes for its end. The split that
    ends is ``$ENDS_EARLY``: train (unset), val, or none."""

    def build_data(self):
        import dataclasses
        import os

        data = super().build_data()
        split = os.environ.get("ENDS_EARLY", "train")
        if split == "none":
            return data
        whole = getattr(data, split)

        class EndsEarly(torch.utils.data.Dataset):
            takes_epoch, calls = getattr(whole, "takes_epoch", False), 0

            def __len__(self):
                return len(whole)

            def __getitem__(self, key):
                self.calls += 1
                if self.calls == 40:
                    raise StopIteration
                return whole[key]

        return dataclasses.replace(data, **{split: EndsEarly()})

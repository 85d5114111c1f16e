"""``--task sdg``: SDG, DeepLIIF's synthetic data generation (DeepLIIF 1.2.7's ``SDGModel``): the
modalities from one or more input panels, no segmentation.

A generator per modality (``G_1`` ... ``G_m``) takes the ``--inputs`` input panels together (their
channels concatenated, DeepLIIF's ``input_no``); a PatchGAN per modality (``D_i``) judges the inputs
| the modality. Each step, as ``SDGModel.optimize_parameters``: every discriminator (0.5 x real and
generated, weighted by ``--loss-d-weights``), then every generator: GAN + SmoothL1 x
``--lambda-l1`` + VGG19 perceptual loss x ``--lambda-feat``, weighted by ``--loss-g-weights``. The
networks and their files keep DeepLIIF's names (``latest_net_G_1.pth`` ...).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ...errors import PhalanxError
from ..base import Batch, Declaration, RunContext, StepContext, StepLosses, TaskData
from ..translate.task import TranslationSample, gan_loss
from .ext import DeepLIIFExtTask, translate_data
from .nets import discriminator, freeze_inert_biases, generator
from .options import SDGOptions
from .task import DeepLIIFTask, smooth_l1

if TYPE_CHECKING:
    from ...config import RunConfig


class SDGTask(DeepLIIFExtTask):
    name = "sdg"
    Options = SDGOptions  # type: ignore[assignment]  # (DeepLIIF's options and --inputs)
    options: SDGOptions  # type: ignore[assignment]
    deepliif_model = "SDG"
    layout_words = "DIR/train/*.png: the input panels, then each modality, side by side, as DeepLIIF reads them"

    def __init__(self, cfg: RunConfig):
        super().__init__(cfg)
        self.inputs = self.options.inputs
        self.seg = False

    def output_folder(self, t: int) -> str:
        return f"mod{t + 1}"  # deepliif test's names for SDG

    def targets_words(self) -> str:
        return f"{self.inputs} input panel(s), {self.targets - self.inputs + 1} modalities"

    def declare(self, data: TaskData, models: Mapping[str, nn.Module]) -> Declaration:
        return DeepLIIFTask.declare(self, data, models)  # DeepLIIF's losses, VGG's included, no segmentation

    # --- data: the --inputs input panels, then the modalities
    def expected_targets(self) -> int:
        m = self.options.modalities
        return self.options.inputs - 1 + m if m else 0

    def data_targets(self) -> int:
        return self.targets + self.inputs - 1

    def build_data(self) -> TaskData:
        data = translate_data(self)  # the first panel is the input; the other input panels are "targets" here
        modalities = self.targets - (self.inputs - 1)
        if modalities < 1:
            raise PhalanxError(
                f"{self.cfg.data.dataroot}: each sample holds {self.targets + 1} panel(s); SDG with --inputs "
                f"{self.inputs} needs at least one modality after them",
                "--inputs",
            )
        self.restore_info({**data.info, "modalities": modalities, "seg": False, "inputs": self.inputs})
        data.info.update(modalities=modalities, seg=False, inputs=self.inputs)
        return data

    def restore_info(self, info: dict[str, Any]) -> None:
        self.inputs = info.get("inputs", 1)
        super().restore_info({**info, "seg": False})

    def _weights(self, check_names: bool = True) -> dict[str, tuple[float, ...]]:
        names, wanted = self.options.modalities_names, self.inputs + self.modalities
        if names and len(names) != wanted:  # DeepLIIF's: each input panel's name, then each modality's
            raise PhalanxError(
                f"has {len(names)} name(s) where {self.inputs} input panel(s) and {self.modalities} modalities need "
                f"{wanted}",
                "--modalities-names",
            )
        return super()._weights(check_names=False)

    def split(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch as the data reads it (the first panel; the other panels) as SDG's: every input
        panel's channels together, and the modalities."""
        first, rest = batch
        k = self.inputs - 1
        return torch.cat([first, *rest[:, :k].unbind(1)], 1), rest[:, k:]

    # --- networks
    def build_models(self, data: TaskData) -> dict[str, nn.Module]:
        o, channels = self.options, data.info["channels"]
        models = self.build_generators(channels)
        for name in self.discriminator_names():
            models[name] = discriminator((self.inputs + 1) * channels, o.ndf, o.d_layers, o.norm)
        for model in models.values():
            freeze_inert_biases(model)
        return models

    def build_generators(self, channels: int) -> dict[str, nn.Module]:
        o = self.options
        models = {
            name: generator(o.net_g, self.inputs * channels, channels, o.ngf, o.norm, o.dropout, o.padding)
            for name in self.generator_names()
        }
        for model in models.values():
            freeze_inert_biases(model)
        return models

    # --- training
    def training_step(self, batch: Batch, ctx: StepContext) -> StepLosses:
        inputs, reals = self.split(batch)
        o, m, models = self.options, self.modalities, ctx.models
        w_g, w_d = self.weights["loss_g_weights"], self.weights["loss_d_weights"]
        fakes = self.generate(models, inputs)
        losses: dict[str, torch.Tensor] = {}
        d_total = inputs.new_zeros(len(inputs))
        for i in range(m):
            d, n = models[f"D_{i + 1}"], i + 1
            losses[f"D_fake_{n}"] = gan_loss(d(torch.cat([inputs, fakes[i].detach()], 1)), False, o.gan_mode)
            losses[f"D_real_{n}"] = gan_loss(d(torch.cat([inputs, reals[:, i]], 1)), True, o.gan_mode)
            d_total = d_total + (losses[f"D_fake_{n}"] + losses[f"D_real_{n}"]) * 0.5 * w_d[i]
        ctx.backward(d_total, "discriminator")
        ctx.step("discriminator")
        g_total = inputs.new_zeros(len(inputs))
        with contextlib.ExitStack() as stack:
            frozen = {name: stack.enter_context(ctx.frozen(name)) for name in self.discriminator_names()}
            for i, fake in enumerate(fakes):
                n = i + 1
                losses[f"G_GAN_{n}"] = gan_loss(frozen[f"D_{n}"](torch.cat([inputs, fake], 1)), True, o.gan_mode)
                losses[f"G_L1_{n}"] = smooth_l1(fake, reals[:, i]) * o.lambda_l1
                losses[f"G_VGG_{n}"] = (
                    self.perceptual(fake, reals[:, i]) * o.lambda_feat
                    if o.lambda_feat
                    else torch.zeros_like(losses[f"G_L1_{n}"])
                )
                g_total = g_total + (losses[f"G_GAN_{n}"] + losses[f"G_L1_{n}"] + losses[f"G_VGG_{n}"]) * w_g[i]
        ctx.backward(g_total, "generator")
        ctx.step("generator")
        return losses

    def validation_step(
        self, models: Mapping[str, nn.Module], batch: Batch, ctx: RunContext
    ) -> dict[str, torch.Tensor]:
        inputs, reals = self.split(batch)
        return self.output_sums(self.generate(models, inputs), reals)

    def visuals(self, data: TaskData) -> TranslationSample:
        sample = super().visuals(data)
        sample.samples = [self.split((a[None], b[None])) for a, b in sample.samples]
        sample.samples = [(a[0], b[0]) for a, b in sample.samples]
        return sample

    def loss_panes(self) -> list[dict[str, Any]]:
        return DeepLIIFTask.loss_panes(self)

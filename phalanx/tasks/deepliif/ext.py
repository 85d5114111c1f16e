"""``--task deepliif-ext``: DeepLIIFExt (DeepLIIF 1.2.7's ``DeepLIIFExtModel``), DeepLIIF for any
number of modalities, each with its own segmentation.

A generator per modality (``G_1`` ... ``G_m``, from the input) and, with the segmentation, one per
modality's segmentation (``GS_i``, from the input | generated modality 1 | generated modality i).
A PatchGAN per modality (``D_i``, input | modality) and per segmentation (``DS_i``, input | *real*
modality 1 | *real* modality i | segmentation). The networks and their files keep DeepLIIF's names
(``latest_net_G_1.pth`` ...): ``--weights DIR`` reads a DeepLIIFExt directory, ``export --format
deepliif-ext`` writes one.

Each step, as ``DeepLIIFExtModel.optimize_parameters``: every discriminator (0.5 x real and
generated; the modalities' with ``--gan-mode``, weighted by ``--loss-d-weights``; the
segmentations' with ``--gan-mode-s``, each 1/m), then every generator: GAN + SmoothL1 x
``--lambda-l1`` per modality weighted by ``--loss-g-weights``, and per segmentation GAN + SmoothL1,
each 1/m. As DeepLIIF's, the segmentation generators' GAN loss takes ``--gan-mode`` (their
discriminators ``--gan-mode-s``), and there is no perceptual loss.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ...errors import PhalanxError
from ..base import Batch, Declaration, StepContext, StepLosses, Task, TaskData, pane
from ..translate.task import TranslateTask, gan_loss
from .files import load_networks, named_files
from .nets import batch_statistics, check_vgg, discriminator, freeze_inert_biases, generator
from .options import DeepLIIFExtOptions
from .task import DeepLIIFTask, smooth_l1

if TYPE_CHECKING:
    from ...config import RunConfig


class DeepLIIFExtTask(DeepLIIFTask):
    name = "deepliif-ext"
    Options = DeepLIIFExtOptions
    Inference = ".inference:NetworkFilesInference"
    options: DeepLIIFExtOptions
    primary_model = "G_1"
    last_target_folder = ""
    deepliif_model = "DeepLIIFExt"  # train_opt.txt's model
    layout_words = (
        "DIR/train/*.png: the input, each modality, then each modality's segmentation side by side, "
        "as DeepLIIF reads them; or DIR/train/A/, B1/ ... Bn/"
    )

    def __init__(self, cfg: RunConfig):
        super().__init__(cfg)
        self.counts_cells = False  # DeepLIIF's cell counting reads DeepLIIF's one segmentation

    # --- names: DeepLIIF's (G_1 ..., GS_1 ...; losses *_1 ... and GS_*_1 ...)
    def suffix(self, t: int) -> str:
        return f"_{t % self.modalities + 1}" if t < self.modalities else f"_S{t - self.modalities + 1}"

    def output_folder(self, t: int) -> str:
        """``deepliif test``'s names for DeepLIIFExt: mod1 ..., Seg1 ..."""
        return f"mod{t + 1}" if t < self.modalities else f"Seg{t - self.modalities + 1}"

    def targets_words(self) -> str:  # (said once the data is read: self.targets is its panels after the input)
        return (
            f"{self.targets // 2} modalities and a segmentation of each" if self.seg else f"{self.targets} modalities"
        )

    def generator_names(self) -> list[str]:
        m = range(1, self.modalities + 1)
        return [f"G_{i}" for i in m] + ([f"GS_{i}" for i in m] if self.seg else [])

    def discriminator_names(self) -> list[str]:
        m = range(1, self.modalities + 1)
        return [f"D_{i}" for i in m] + ([f"DS_{i}" for i in m] if self.seg else [])

    def declare(self, data: TaskData, models: Mapping[str, nn.Module]) -> Declaration:
        m = range(1, self.modalities + 1)
        losses = [f"{loss}_{i}" for i in m for loss in ("G_GAN", "G_L1", "D_real", "D_fake")]
        losses += [f"{loss}_{i}" for i in m for loss in ("GS_GAN", "GS_L1", "DS_real", "DS_fake")] if self.seg else []
        return replace(
            Task.declare(self, data, models), loss_names=tuple(losses), ema_models=tuple(self.generator_names())
        )

    # --- data: the input, m modalities, then (with the segmentation) m segmentations
    def expected_targets(self) -> int:
        m = self.options.modalities
        return m * (2 if self.options.seg else 1)

    def build_data(self) -> TaskData:
        data = translate_data(self)
        if self.seg and self.targets % 2:
            raise PhalanxError(
                f"{self.cfg.data.dataroot}: each sample holds {self.targets} panel(s) after the input; DeepLIIFExt "
                "with the segmentation needs as many segmentations as modalities (or --no-seg)",
                "--dataroot",
            )
        modalities = self.targets // 2 if self.seg else self.targets
        self.restore_info({**data.info, "modalities": modalities, "seg": self.seg})
        data.info.update(modalities=modalities, seg=self.seg)
        return data

    def restore_info(self, info: dict[str, Any]) -> None:
        self.modalities, self.seg = info["modalities"], info["seg"]
        self.targets = self.modalities * (2 if self.seg else 1)
        self.counts_cells = False
        self.weights = self._weights()

    def _weights(self, check_names: bool = True) -> dict[str, tuple[float, ...]]:
        """DeepLIIF's defaults for DeepLIIFExt: every loss weight 1/m (one per modality)."""
        m, o = self.modalities, self.options
        weights = {
            "loss_g_weights": o.loss_g_weights or (1 / m,) * m,
            "loss_d_weights": o.loss_d_weights or (1 / m,) * m,
        }
        for name, values in weights.items():
            if len(values) != m:
                raise PhalanxError(
                    f"has {len(values)} weight(s) where {m} modalities need {m}", "--" + name.replace("_", "-")
                )
        names = o.modalities_names
        if check_names and names and len(names) != m + 1:
            raise PhalanxError(
                f"has {len(names)} name(s) where the input and {m} modalities need {m + 1}", "--modalities-names"
            )
        return weights

    # --- networks
    def build_models(self, data: TaskData) -> dict[str, nn.Module]:
        o, channels = self.options, data.info["channels"]
        models = self.build_generators(channels)
        for name in self.discriminator_names():  # D_i: input | modality; DS_i: input | 2 modalities | segmentation
            models[name] = discriminator((4 if name.startswith("DS") else 2) * channels, o.ndf, o.d_layers, o.norm)
        for model in models.values():
            freeze_inert_biases(model)
        return models

    def build_generators(self, channels: int) -> dict[str, nn.Module]:
        o = self.options
        models: dict[str, nn.Module] = {}
        for name in self.generator_names():
            if name.startswith("GS"):  # DeepLIIF's define_G default: reflection padding
                models[name] = generator(o.net_gs, 3 * channels, channels, o.ngf, o.norm, o.dropout, "reflect")
            else:
                models[name] = generator(o.net_g, channels, channels, o.ngf, o.norm, o.dropout, o.padding)
        for model in models.values():
            freeze_inert_biases(model)
        return models

    def load_weights(self, models: Mapping[str, nn.Module], spec: str, data: TaskData) -> list[str]:
        """``--weights DIR``: a DeepLIIFExt model directory (``latest_net_G_1.pth`` ...)."""
        folder = Path(spec)
        files = named_files(folder, self.generator_names(), self.discriminator_names())
        return load_networks(models, files, folder, self.discriminator_names(), "--weights")

    def generate(self, models: Mapping[str, nn.Module], inputs: torch.Tensor) -> list[torch.Tensor]:
        """Each modality, then each modality's segmentation from the input, generated modality 1
        and generated modality i (DeepLIIF's forward)."""
        with batch_statistics(models[name] for name in self.generator_names()):
            fakes = [models[f"G_{i + 1}"](inputs) for i in range(self.modalities)]
            if not self.seg:
                return fakes
            return fakes + [
                models[f"GS_{i + 1}"](torch.cat([inputs, fakes[0], fake], 1)) for i, fake in enumerate(fakes)
            ]

    # --- training
    def training_step(self, batch: Batch, ctx: StepContext) -> StepLosses:
        inputs, targets = batch  # (N, C, H, W), (N, modalities [+ segmentations], C, H, W)
        o, m, models = self.options, self.modalities, ctx.models
        w_g, w_d = self.weights["loss_g_weights"], self.weights["loss_d_weights"]
        outputs = self.generate(models, inputs)
        fakes, reals = outputs[:m], [targets[:, t] for t in range(self.targets)]
        # what each segmentation discriminator sees beside the segmentation: the input and real modalities
        seen = [torch.cat([inputs, reals[0], reals[i]], 1) for i in range(m)] if self.seg else []
        losses: dict[str, torch.Tensor] = {}
        d_total = inputs.new_zeros(len(inputs))
        for i in range(m):
            d, n = models[f"D_{i + 1}"], i + 1
            losses[f"D_fake_{n}"] = gan_loss(d(torch.cat([inputs, fakes[i].detach()], 1)), False, o.gan_mode)
            losses[f"D_real_{n}"] = gan_loss(d(torch.cat([inputs, reals[i]], 1)), True, o.gan_mode)
            d_total = d_total + (losses[f"D_fake_{n}"] + losses[f"D_real_{n}"]) * 0.5 * w_d[i]
        for i in range(m if self.seg else 0):
            d, n, seg = models[f"DS_{i + 1}"], i + 1, outputs[m + i]
            losses[f"DS_fake_{n}"] = gan_loss(d(torch.cat([seen[i], seg.detach()], 1)), False, o.gan_mode_s)
            losses[f"DS_real_{n}"] = gan_loss(d(torch.cat([seen[i], reals[m + i]], 1)), True, o.gan_mode_s)
            d_total = d_total + (losses[f"DS_fake_{n}"] + losses[f"DS_real_{n}"]) * 0.5 / m
        ctx.backward(d_total, "discriminator")
        ctx.step("discriminator")
        g_total = inputs.new_zeros(len(inputs))
        with contextlib.ExitStack() as stack:
            frozen = {name: stack.enter_context(ctx.frozen(name)) for name in self.discriminator_names()}
            for i, fake in enumerate(fakes):
                n = i + 1
                losses[f"G_GAN_{n}"] = gan_loss(frozen[f"D_{n}"](torch.cat([inputs, fake], 1)), True, o.gan_mode)
                losses[f"G_L1_{n}"] = smooth_l1(fake, reals[i]) * o.lambda_l1
                g_total = g_total + (losses[f"G_GAN_{n}"] + losses[f"G_L1_{n}"]) * w_g[i]
            for i in range(m if self.seg else 0):
                n, seg = i + 1, outputs[m + i]
                # DeepLIIF's: the segmentation generators' GAN loss in the modalities' mode
                losses[f"GS_GAN_{n}"] = gan_loss(frozen[f"DS_{n}"](torch.cat([seen[i], seg], 1)), True, o.gan_mode)
                losses[f"GS_L1_{n}"] = smooth_l1(seg, reals[m + i]) * o.lambda_l1
                g_total = g_total + (losses[f"GS_GAN_{n}"] + losses[f"GS_L1_{n}"]) / m
        ctx.backward(g_total, "generator")
        ctx.step("generator")
        return losses

    # --- dashboard
    def loss_panes(self) -> list[dict[str, Any]]:
        m = range(1, self.modalities + 1)
        segs = range(1, self.modalities + 1 if self.seg else 1)

        def traces(modality: str, segmentation: str) -> list[tuple[str, str]]:
            return [(f"{modality}_{i}", f"{modality}_{i}") for i in m] + [
                (f"{segmentation}_{i}", f"{segmentation}_{i}") for i in segs
            ]

        return [
            pane("train_G_GAN", "generator GAN loss (mean over ranks)", "GAN loss", "train", traces("G_GAN", "GS_GAN")),
            pane(
                "train_G_L1",
                "generator SmoothL1 loss x --lambda-l1",
                "SmoothL1 x lambda",
                "train",
                traces("G_L1", "GS_L1"),
            ),
            pane("train_D_real", "discriminator loss on real pairs", "GAN loss", "train", traces("D_real", "DS_real")),
            pane(
                "train_D_fake",
                "discriminator loss on generated pairs",
                "GAN loss",
                "train",
                traces("D_fake", "DS_fake"),
            ),
        ]


def translate_data(task: DeepLIIFTask) -> TaskData:
    """Translate's data as it is, for DeepLIIFExt and SDG (DeepLIIF's own checks name its one
    segmentation), and the perceptual loss's need of RGB."""
    data = TranslateTask.build_data(task)
    if task.options.lambda_feat > 0:
        if data.info["channels"] != 3:
            raise PhalanxError(
                f"{task.cfg.data.dataroot} holds grayscale images; DeepLIIF's VGG19 perceptual loss takes RGB: "
                "give RGB images, or train without it: --lambda-feat 0",
                "--lambda-feat",
            )
        check_vgg()
    return data

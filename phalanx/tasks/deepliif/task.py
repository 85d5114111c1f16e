"""``--task deepliif``: DeepLIIF's own model (Ghahremani et al. 2022; DeepLIIF 1.2.7's
``DeepLIIFModel``), trained with phalanx's guarantees.

From an IHC image, one generator per modality (hematoxylin, mpIF DAPI, Lap2, Ki67 by default:
``G1`` ... ``Gm``), and the segmentation as the weighted sum of ``GS0`` (from the input) and ``GSk``
(from generated modality k). A PatchGAN per modality (``Dk``, on input | modality) and per
segmentation source (``DSk``, on the input or the *real* modality k | segmentation, their logits
summed with the segmentation weights). The networks, their names and their files are DeepLIIF's,
so a DeepLIIF model directory loads (``--weights DIR``) and ``export`` writes one back.

Each step, as ``DeepLIIFModel.optimize_parameters``: every discriminator (real against generated,
0.5 x the two, weighted per modality by ``--loss-d-weights``), then every generator through the
updated discriminators: GAN + SmoothL1 x ``--lambda-l1`` + VGG19 perceptual loss x
``--lambda-feat`` per modality, GAN + SmoothL1 for the segmentation, weighted by
``--loss-g-weights``. The logged ``G_L1_k`` and ``G_VGG_k`` include their lambda, as DeepLIIF's.
One difference: DeepLIIF 1.2.7 weighs the segmentation's generator loss with the last *modality's*
weight (``loss_G_weights[modalities_no - 1]``, its loop variable); phalanx with the segmentation's
own (the last one). They agree whenever those two weights are equal, as with the defaults.
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
from ..base import Batch, Declaration, Evaluation, RunContext, StepContext, StepLosses, Task, TaskData, pane
from ..translate.nets import check_discriminator, check_generator, unet_size
from ..translate.task import TranslateTask, gan_loss
from .cells import count, deepliif_pixels, resolution_of
from .files import load_model_dir
from .nets import VGGLoss, batch_statistics, check_vgg, discriminator, freeze_inert_biases, generator
from .options import DeepLIIFOptions

if TYPE_CHECKING:
    from ...config import RunConfig

DEEPLIIF_NAMES = ("Hema", "DAPI", "Lap2", "Marker")  # what `deepliif test` names the 4 modalities' outputs
SEG_WEIGHTS_4 = (0.25, 0.15, 0.25, 0.1, 0.25)  # DeepLIIF's segmentation weights with 4 modalities
RESERVED_FOLDERS = ("Seg", "SegOverlaid", "SegRefined", "cells")  # predict's other outputs


class DeepLIIFTask(TranslateTask):
    name = "deepliif"
    Options = DeepLIIFOptions
    Inference = ".inference:DeepLIIFInference"  # (by name: the inference imports this module for its types)
    # (DeepLIIF's options are TranslateOptions' sibling, both GANOptions: the methods it inherits read those)
    options: DeepLIIFOptions  # type: ignore[assignment]  # (see above)
    primary_model = "G1"
    last_target_folder = "seg"
    layout_words = (
        "DIR/train/*.png: the input, each modality and the segmentation side by side, as DeepLIIF reads "
        "them; or DIR/train/A/, B1/ ... Bn/ and seg/"
    )

    def __init__(self, cfg: RunConfig):
        super().__init__(cfg)
        self.modalities = self.options.modalities or 4
        self.seg = self.options.seg
        self.targets = self.modalities + self.seg
        self.vgg: VGGLoss | None = None
        self.counts_cells = self.seg

    # --- names: DeepLIIF's (G1 ... Gm, GS0 ... GSm, D1 ..., DS0 ...; losses *_1 ... *_m, *_S)
    def suffix(self, t: int) -> str:
        return "_S" if t == self.modalities else f"_{t + 1}"

    def output_folder(self, t: int) -> str:
        return "Seg" if t == self.modalities else self.modality_names()[t + 1]

    def modality_names(self) -> list[str]:
        """The input's and each modality's names (DeepLIIF's ``modalities_names``; its defaults)."""
        if self.options.modalities_names:
            return list(self.options.modalities_names)
        if self.modalities == len(DEEPLIIF_NAMES):
            return ["IHC", *DEEPLIIF_NAMES]
        return ["input1", *(f"mod{i + 1}" for i in range(self.modalities))]

    def marker_folder(self) -> str | None:
        """The modality DeepLIIF classifies cells by: the first whose name ends in Marker (its
        ``find_marker_key``)."""
        return next((name for name in self.modality_names()[1:] if name.endswith("Marker")), None)

    def targets_words(self) -> str:
        return f"{self.modalities} modalities" + (" + segmentation" if self.seg else "")

    def generator_names(self) -> list[str]:
        return [f"G{i + 1}" for i in range(self.modalities)] + (
            [f"GS{i}" for i in range(self.modalities + 1)] if self.seg else []
        )

    def discriminator_names(self) -> list[str]:
        return [f"D{i + 1}" for i in range(self.modalities)] + (
            [f"DS{i}" for i in range(self.modalities + 1)] if self.seg else []
        )

    def declare(self, data: TaskData, models: Mapping[str, nn.Module]) -> Declaration:
        m = self.modalities
        losses = [f"{loss}_{i + 1}" for i in range(m) for loss in ("G_GAN", "G_L1", "G_VGG", "D_real", "D_fake")]
        losses += [f"{loss}_S" for loss in ("G_GAN", "G_L1", "D_real", "D_fake")] if self.seg else []
        return replace(
            Task.declare(self, data, models), loss_names=tuple(losses), ema_models=tuple(self.generator_names())
        )

    # --- data
    def expected_targets(self) -> int:
        return self.options.modalities + self.options.seg if self.options.modalities else 0

    def check_networks(self, size: int) -> None:
        for name, option in [(self.options.net_g, "--net-g")] + (
            [(self.options.net_gs, "--net-gs")] if self.seg else []
        ):
            check_generator(name, size, option)
            if (unet_size(name) or 32) < 32:  # its five fixed levels: unet_32 is DeepLIIF's smallest too
                raise PhalanxError(f"DeepLIIF's U-Nets start at unet_32 (got {name})", option)
        check_discriminator(self.options.d_layers, size)

    def network_info(self) -> dict[str, Any]:
        return {"net_g": self.options.net_g, "net_gs": self.options.net_gs}

    def crops(self) -> bool:
        return self.cfg.data.augment == "basic"  # DeepLIIF's default (auto): flips only

    def build_data(self) -> TaskData:
        data = super().build_data()  # sets self.targets from the data
        if self.options.lambda_feat > 0 and data.info["channels"] != 3:
            raise PhalanxError(
                f"{self.cfg.data.dataroot} holds grayscale images; DeepLIIF's VGG19 perceptual loss "
                "takes RGB: give RGB images, or train without it: --lambda-feat 0",
                "--lambda-feat",
            )
        if self.targets - self.seg < 1:
            raise PhalanxError(
                f"{self.cfg.data.dataroot}: each sample holds {self.targets} target(s); DeepLIIF's model "
                f"needs at least one modality{' and the segmentation (the last)' if self.seg else ''}",
                "--dataroot",
            )
        self.restore_info({**data.info, "modalities": self.targets - self.seg, "seg": self.seg})
        data.info.update(modalities=self.modalities, seg=self.seg)
        if self.options.lambda_feat > 0:  # after the data's own checks; training only: inference needs no VGG
            check_vgg()
        return data

    def restore_info(self, info: dict[str, Any]) -> None:
        self.modalities, self.seg = info["modalities"], info["seg"]
        self.targets = self.modalities + self.seg
        self.counts_cells = self.seg and info["channels"] == 3  # DeepLIIF's red/blue segmentation images
        self.weights = self._weights()

    def _weights(self) -> dict[str, tuple[float, ...]]:
        """DeepLIIF's defaults: the segmentation's 0.25, 0.15, 0.25, 0.1, 0.25 with 4 modalities, else
        equal; each loss weight 1 / (modalities + 1)."""
        m, o = self.modalities, self.options
        equal = (1 / (m + 1),) * (m + 1)
        weights = {
            "seg_weights": o.seg_weights or (SEG_WEIGHTS_4 if m == 4 else equal),
            "loss_g_weights": o.loss_g_weights or equal,
            "loss_d_weights": o.loss_d_weights or equal,
        }
        names = o.modalities_names
        if names and len(names) != m + 1:
            raise PhalanxError(
                f"has {len(names)} name(s) where the input and {m} modalities need {m + 1}", "--modalities-names"
            )
        taken = [name for name in names[1:] if name in RESERVED_FOLDERS]
        if taken:
            raise PhalanxError(
                f"{taken[0]} is the name of one of predict's own outputs; rename it", "--modalities-names"
            )
        for name, values in weights.items():
            wanted = m + 1  # DeepLIIF's count, with or without the segmentation (its last is unused without)
            given = getattr(o, name)
            if len(values) < wanted or (given and len(given) != wanted):  # a weight too many is no less a mistake
                raise PhalanxError(
                    f"has {len(values)} weight(s) where {m} modalities"
                    f"{' and the segmentation' if self.seg else ''} need {wanted}",
                    "--" + name.replace("_", "-"),
                )
        return weights

    # --- networks
    def build_models(self, data: TaskData) -> dict[str, nn.Module]:
        o, channels = self.options, data.info["channels"]
        models = self.build_generators(channels)
        for name in self.discriminator_names():
            models[name] = discriminator(2 * channels, o.ndf, o.d_layers, o.norm)
        for model in models.values():
            freeze_inert_biases(model)
        return models

    def build_generators(self, channels: int) -> dict[str, nn.Module]:
        """The generators alone (what predicting needs), in DeepLIIF's order of creation."""
        o = self.options
        models: dict[str, nn.Module] = {}
        for i in range(self.modalities):
            models[f"G{i + 1}"] = generator(o.net_g, channels, channels, o.ngf, o.norm, o.dropout, o.padding)
        for name in self.generator_names()[self.modalities :]:  # DeepLIIF pads its segmentation U-Nets by reflection
            models[name] = generator(o.net_gs, channels, channels, o.ngf, o.norm, o.dropout, "reflect")
        for model in models.values():
            freeze_inert_biases(model)
        return models

    def load_weights(self, models: Mapping[str, nn.Module], spec: str, data: TaskData) -> list[str]:
        """``--weights DIR``: a DeepLIIF model directory (``latest_net_G1.pth`` ... or ``G1.pt`` ...)."""
        return load_model_dir(models, Path(spec), self.generator_names(), self.discriminator_names(), self.modalities)

    def param_groups(self, models: Mapping[str, nn.Module]) -> dict[str, list[dict[str, Any]]]:
        """DeepLIIF's two optimizers: every generator's parameters, every discriminator's."""

        def trainable(names: list[str]) -> list[nn.Parameter]:
            return [p for name in names for p in models[name].parameters() if p.requires_grad]

        return {
            "generator": [{"params": trainable(self.generator_names())}],
            "discriminator": [{"params": trainable(self.discriminator_names())}],
        }

    def generate(self, models: Mapping[str, nn.Module], inputs: torch.Tensor) -> list[torch.Tensor]:
        """Each modality, then the segmentation: GS0 on the input and GSk on generated modality k,
        weighted and summed (DeepLIIF stacks them and sums, as here). In eval mode BatchNorm takes
        each batch's (tile's) statistics, as DeepLIIF's inference does."""
        fakes, parts = self.generate_parts(models, inputs)
        return fakes + ([self.weighted(parts)] if self.seg else [])

    def generate_parts(
        self, models: Mapping[str, nn.Module], inputs: torch.Tensor
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each modality, and each segmentation network's own output (GS0 first; none without
        the segmentation)."""
        with batch_statistics(models[name] for name in self.generator_names()):
            fakes = [models[f"G{i + 1}"](inputs) for i in range(self.modalities)]
            if not self.seg:
                return fakes, []
            return fakes, [models["GS0"](inputs)] + [models[f"GS{i + 1}"](fake) for i, fake in enumerate(fakes)]

    def weighted(self, parts: list[torch.Tensor]) -> torch.Tensor:
        seg_weights = self.weights["seg_weights"]
        return torch.stack([part * seg_weights[k] for k, part in enumerate(parts)]).sum(0)

    def test_outputs(
        self,
        models: Mapping[str, nn.Module],
        inputs: torch.Tensor,
        seg_weights: tuple[float, ...] | None = None,
        intermediate: bool = False,
    ) -> dict[str, torch.Tensor]:
        """What ``deepliif test`` computes of a tile (its ``run_dask``), by output folder: each
        modality; the segmentation networks on each generated modality, then on the input (not
        run where its weight is 0), weighted and summed in that order (training sums the input's
        first: the two sums differ in rounding); ``intermediate``: each segmentation network's own
        output too, as ``NAME_s`` (DeepLIIF's ``--seg-intermediate``)."""
        weights = self.weights["seg_weights"] if seg_weights is None else seg_weights
        names = self.modality_names()
        with batch_statistics(models[name] for name in self.generator_names()):
            fakes = [models[f"G{i + 1}"](inputs) for i in range(self.modalities)]
            outputs = {self.output_folder(i): fake for i, fake in enumerate(fakes)}
            if not self.seg:
                return outputs
            parts = {k + 1: models[f"GS{k + 1}"](fake) for k, fake in enumerate(fakes)}
            if weights[0] != 0:
                parts[0] = models["GS0"](inputs)
        outputs["Seg"] = torch.stack([part * weights[k] for k, part in parts.items()]).sum(0)
        if intermediate:
            outputs.update({f"{names[k]}_s": part for k, part in sorted(parts.items())})
        return outputs

    def judge_segmentation(
        self, discriminators: list[nn.Module], sources: list[torch.Tensor], segmentation: torch.Tensor
    ) -> torch.Tensor:
        """The segmentation discriminators' logits, each on its source | the segmentation, weighted
        and summed."""
        seg_weights = self.weights["seg_weights"]
        return torch.stack(
            [
                d(torch.cat([source, segmentation], 1)) * seg_weights[k]
                for k, (d, source) in enumerate(zip(discriminators, sources))
            ]
        ).sum(0)

    # --- training
    def perceptual(self, fake: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        if self.vgg is None:
            self.vgg = VGGLoss()
        self.vgg.to(device=fake.device, dtype=fake.dtype)
        return self.vgg(fake, real)

    def training_step(self, batch: Batch, ctx: StepContext) -> StepLosses:
        inputs, targets = batch  # (N, C, H, W), (N, modalities [+ segmentation], C, H, W)
        o, m, models = self.options, self.modalities, ctx.models
        w_g, w_d = self.weights["loss_g_weights"], self.weights["loss_d_weights"]
        fakes, parts = self.generate_parts(models, inputs)
        outputs = fakes + ([self.weighted(parts)] if self.seg else [])
        reals = [targets[:, t] for t in range(self.targets)]
        sources = [inputs] + reals[:m]  # what the segmentation discriminators see beside the segmentation
        losses: dict[str, torch.Tensor] = {}
        d_total: torch.Tensor | int = 0  # (a tensor once the first discriminator adds to it)
        for i in range(m):
            d = models[f"D{i + 1}"]
            losses[f"D_fake_{i + 1}"] = gan_loss(d(torch.cat([inputs, fakes[i].detach()], 1)), False, o.gan_mode)
            losses[f"D_real_{i + 1}"] = gan_loss(d(torch.cat([inputs, reals[i]], 1)), True, o.gan_mode)
            d_total = d_total + (losses[f"D_fake_{i + 1}"] + losses[f"D_real_{i + 1}"]) * 0.5 * w_d[i]
        if self.seg:
            judges = [models[f"DS{k}"] for k in range(m + 1)]
            losses["D_fake_S"] = gan_loss(
                self.judge_segmentation(judges, sources, outputs[m].detach()), False, o.gan_mode_s
            )
            losses["D_real_S"] = gan_loss(self.judge_segmentation(judges, sources, reals[m]), True, o.gan_mode_s)
            d_total = d_total + (losses["D_fake_S"] + losses["D_real_S"]) * 0.5 * w_d[m]
        assert isinstance(d_total, torch.Tensor)  # (one discriminator at least)
        ctx.backward(d_total, "discriminator")
        ctx.step("discriminator")
        g_total: torch.Tensor | int = 0
        with contextlib.ExitStack() as stack:  # every generator, through the discriminators as they are now
            frozen = {name: stack.enter_context(ctx.frozen(name)) for name in self.discriminator_names()}
            for i, fake in enumerate(fakes):
                losses[f"G_GAN_{i + 1}"] = gan_loss(frozen[f"D{i + 1}"](torch.cat([inputs, fake], 1)), True, o.gan_mode)
                losses[f"G_L1_{i + 1}"] = smooth_l1(fake, reals[i]) * o.lambda_l1
                losses[f"G_VGG_{i + 1}"] = (
                    self.perceptual(fake, reals[i]) * o.lambda_feat
                    if o.lambda_feat
                    else torch.zeros_like(losses[f"G_L1_{i + 1}"])
                )
                g_total = (
                    g_total + (losses[f"G_GAN_{i + 1}"] + losses[f"G_L1_{i + 1}"] + losses[f"G_VGG_{i + 1}"]) * w_g[i]
                )
            if self.seg:
                judges = [frozen[f"DS{k}"] for k in range(m + 1)]
                losses["G_GAN_S"] = gan_loss(self.judge_segmentation(judges, sources, outputs[m]), True, o.gan_mode_s)
                losses["G_L1_S"] = smooth_l1(outputs[m], reals[m]) * o.lambda_l1
                g_total = g_total + (losses["G_GAN_S"] + losses["G_L1_S"]) * w_g[m]
            g_total = g_total + self.distillation(inputs, outputs, parts, losses, ctx)
        assert isinstance(g_total, torch.Tensor)
        ctx.backward(g_total, "generator")
        ctx.step("generator")
        return losses

    def distillation(
        self,
        inputs: torch.Tensor,
        outputs: list[torch.Tensor],
        parts: list[torch.Tensor],
        losses: dict[str, torch.Tensor],
        ctx: StepContext,
    ) -> torch.Tensor | int:
        """More of the generators' loss (DeepLIIFKD's distillation); none here."""
        return 0

    # --- validation: translate's image metrics, and DeepLIIF's cell counts against the true ones
    def empty_sums(self) -> dict[str, torch.Tensor]:
        return {**super().empty_sums(), **({"cells_error": torch.zeros(())} if self.counts_cells else {})}

    def validation_step(
        self, models: Mapping[str, nn.Module], batch: Batch, ctx: RunContext
    ) -> dict[str, torch.Tensor]:
        inputs, targets = batch
        outputs = self.generate(models, inputs)
        sums = self.output_sums(outputs, targets)
        if self.counts_cells:
            m, resolution = self.modalities, resolution_of(self.cfg.data.image_size)
            marker = self.output_folder(m - 1) == "Marker"

            def counted(seg: torch.Tensor, markers: torch.Tensor) -> list[int]:
                return [
                    count(deepliif_pixels(s), deepliif_pixels(k) if marker else None, resolution)["num_total"]
                    for s, k in zip(seg, markers)
                ]

            found, truth = counted(outputs[m], outputs[m - 1]), counted(targets[:, m], targets[:, m - 1])
            sums["cells_error"] = torch.tensor(float(sum(abs(f - t) for f, t in zip(found, truth))))
        return sums

    def validation_metrics(self, sums: dict[str, torch.Tensor]) -> Evaluation:
        evaluation = super().validation_metrics(sums)
        if self.counts_cells:  # the mean absolute error of each image's cell count (DeepLIIF's postprocessing)
            evaluation.metrics["cell_count_error"] = float(sums["cells_error"]) / max(float(sums["samples"]), 1.0)
        return evaluation

    def summary(self, metrics: dict[str, float]) -> str:
        cells = metrics.get("cell_count_error")
        return super().summary(metrics) + (f"  val_cell_count_error {cells:.2f}" if cells is not None else "")

    def panes(self, declared: Declaration) -> list[dict[str, Any]]:
        cells = (
            [
                pane(
                    "val_cell_count_error",
                    "validation: cells counted in the segmentation, mean absolute error "
                    "against the true segmentation's count",
                    "cells per image",
                    "val",
                    [("cell_count_error", "|count - true count|")],
                )
            ]
            if self.counts_cells
            else []
        )
        return super().panes(declared) + cells

    # --- dashboard
    def loss_panes(self) -> list[dict[str, Any]]:
        per_target, m = self.per_target, self.modalities
        return [
            pane("train_G_GAN", "generator GAN loss (mean over ranks)", "GAN loss", "train", per_target("G_GAN")),
            pane(
                "train_G_L1",
                "generator SmoothL1 loss x --lambda-l1 (mean over ranks)",
                "SmoothL1 x lambda",
                "train",
                per_target("G_L1"),
            ),
            pane(
                "train_G_VGG",
                "generator VGG19 perceptual loss x --lambda-feat",
                "VGG loss x lambda",
                "train",
                per_target("G_VGG", m),
            ),
            pane("train_D_real", "discriminator loss on real pairs", "GAN loss", "train", per_target("D_real")),
            pane("train_D_fake", "discriminator loss on generated pairs", "GAN loss", "train", per_target("D_fake")),
        ]


def smooth_l1(fake: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Per sample: DeepLIIF's SmoothL1Loss (beta 1), the mean over pixels and channels."""
    return nn.functional.smooth_l1_loss(fake, real, reduction="none").flatten(1).mean(1)

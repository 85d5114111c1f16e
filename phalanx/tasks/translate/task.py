"""``--task translate``: paired image-to-image translation with GANs, DeepLIIF's job (pix2pix).

Per target image: a generator (U-Net or ResNet) and a PatchGAN discriminator conditioned on the
input. Each step updates every discriminator (real pairs against generated ones), then every
generator (fool the updated discriminators, plus lambda x L1 to the target), as pix2pix does.
Validation: per target, L1, PSNR and SSIM over every validation image once, at any world size.
``predict`` translates images of any size, tile by tile with blended overlaps.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.data import Dataset, Subset

from ... import records
from ...data import SeededView
from ...data.layout import train_dir, validation_dir
from ...data.pairs import PairFiles, PairTransform, Transformed, find_pairs
from ...data.sources import holdout_indices
from ...data.transforms import one_size
from ...errors import PhalanxError
from ...records.pictures import png, strip
from ..base import (
    Batch,
    Declaration,
    Evaluation,
    RunContext,
    StepContext,
    StepLosses,
    Task,
    TaskData,
    dataset_size,
    fixed_sample,
    full_precision,
    pane,
)
from .image_metrics import psnr, ssim
from .nets import build_discriminator, build_generator, check_discriminator, check_generator
from .options import GANOptions, TranslateOptions

if TYPE_CHECKING:
    from ...config import RunConfig

SHOWN = 4  # validation samples drawn each epoch


class TranslateTask(Task):
    name = "translate"
    Inference = ".inference:TranslateInference"  # (by name: the inference imports this module for its types)
    Options: type[GANOptions] = TranslateOptions
    manual_optimization = True
    primary_model = "generator"  # one target's name; several: generator1, ... (declare)
    best_metric = ("L1", "min")
    metric_labels = {"L1": "L1 error", "PSNR": "PSNR", "SSIM": "SSIM"}
    options: TranslateOptions

    def __init__(self, cfg: RunConfig):
        super().__init__(cfg)
        if cfg.data.normalize != "auto" or cfg.data.mean:
            raise PhalanxError(
                f"--task {self.name} works in [-1, 1], pix2pix's tanh outputs: leave --normalize and --mean/--std out",
                "--normalize" if cfg.data.normalize != "auto" else "--mean",
            )
        if cfg.data.augment not in ("auto", "basic", "none"):
            raise PhalanxError(
                f"--task {self.name} augments with random crops and flips (basic) or not at all (none); "
                f"got {cfg.data.augment}",
                "--augment",
            )
        self.targets = self.expected_targets() or 1

    # --- names: one target keeps pix2pix's, several get DeepLIIF's _1, _2, ...
    def suffix(self, t: int) -> str:
        return "" if self.targets == 1 else f"_{t + 1}"

    def net(self, kind: str, t: int) -> str:
        return kind if self.targets == 1 else f"{kind}{t + 1}"

    def generate(self, models: Mapping[str, nn.Module], inputs: torch.Tensor) -> list[torch.Tensor]:
        """Every target's output for a batch of inputs, in the targets' order (validation, the
        dashboard's pictures and predict's tiles all go through here)."""
        return [models[self.net("generator", t)](inputs) for t in range(self.targets)]

    def generator_names(self) -> list[str]:
        """The networks ``generate`` runs (what predict moves to its device and export writes)."""
        return [self.net("generator", t) for t in range(self.targets)]

    def output_folder(self, t: int) -> str:
        """Where ``predict`` writes target ``t``'s images."""
        return f"target{t + 1}"

    # --- what the data must hold, and the networks' sizes (DeepLIIF's task says its own)
    def expected_targets(self) -> int:
        """Targets per input the run expects (0: what the data holds)."""
        return self.options.targets

    def data_targets(self) -> int:
        """Panels after the input in each sample of the data (SDG's other input panels count)."""
        return self.targets

    last_target_folder = ""  # a plain layout's target folder after B1/, B2/, ... (DeepLIIF's seg/)
    layout_words = "DIR/train/*.png of input and target panels side by side, or DIR/train/A/ and DIR/train/B/"

    def targets_words(self) -> str:
        return f"{self.targets} target(s)"

    def check_networks(self, size: int) -> None:
        check_generator(self.options.generator, size)
        check_discriminator(self.options.d_layers, size)

    def network_info(self) -> dict[str, Any]:
        return {"generator": self.options.generator}

    def crops(self) -> bool:
        """Whether training augmentation crops (pix2pix's resize-and-crop) or only flips."""
        return self.cfg.data.augment != "none"

    def declare(self, data: TaskData, models: Mapping[str, nn.Module]) -> Declaration:
        """One generator per target (known once the data is read): the names follow the count."""
        losses = tuple(
            f"{loss}{self.suffix(t)}" for t in range(self.targets) for loss in ("G_GAN", "G_L1", "D_real", "D_fake")
        )
        return replace(
            super().declare(data, models),
            loss_names=losses,
            primary_model=self.net("generator", 0),
            ema_models=tuple(self.net("generator", t) for t in range(self.targets)),
        )

    # --- data and networks
    def build_data(self) -> TaskData:
        cfg = self.cfg
        size = one_size(cfg.data, self.name)
        if not cfg.data.dataroot:
            raise PhalanxError(
                f"--task {self.name} reads paired images: give --dataroot DIR ({self.layout_words})", "--dataroot"
            )
        root = Path(cfg.data.dataroot)
        if not root.is_dir():
            raise PhalanxError(f"{root} is not a directory", "--dataroot")
        if not train_dir(root).is_dir():
            raise PhalanxError(
                f"{root} has no train/ folder; expected {root}/train/*.png (aligned pairs) or "
                f"{root}/train/A/ and {root}/train/B/",
                "--dataroot",
            )
        train_pairs = find_pairs(
            train_dir(root), self.expected_targets(), cfg.data.skip_broken, self.last_target_folder
        )
        self.targets = train_pairs.targets
        skipped = dict(train_pairs.skipped)
        self.check_networks(size)
        flip = cfg.data.hflip
        augment, crop = cfg.data.augment != "none", self.crops()
        train_files: Dataset[Any] = PairFiles(train_pairs)
        if validation_dir(root).is_dir():
            val_pairs = find_pairs(validation_dir(root), self.targets, cfg.data.skip_broken, self.last_target_folder)
            skipped.update(val_pairs.skipped)
            val_files: Dataset[Any] = PairFiles(val_pairs)
            how = f"{validation_dir(root).name}/"
        else:
            train_index, val_index = holdout_indices(dataset_size(train_files), cfg.data.val_fraction, cfg.seed)
            train_files, val_files = Subset(train_files, train_index), Subset(train_files, val_index)
            how = f"{cfg.data.val_fraction:g} hold-out"
        prepare = PairTransform(size, train=False, flip=False)
        train = SeededView(
            train_files,
            PairTransform(size, train=True, flip=flip, crop=crop) if augment else prepare,
            cfg.seed,
            plain=Transformed(train_files, prepare),
        )
        channels = 1 if train_pairs.mode == "L" else 3
        gone = f"; {len(skipped)} sample(s) left out" if skipped else ""
        description = (
            f"{root} ({len(train)} train / {dataset_size(val_files)} val pairs from {how}, "
            f"{train_pairs.layout} layout, {self.targets_words()}, {size}x{size}"
            f"{self.augmentation_words(augment and crop, augment and flip)}{gone})"
        )
        info = {
            "targets": self.targets,
            "channels": channels,
            "size": size,
            "mode": train_pairs.mode,
            "layout": train_pairs.layout,
            "mean": [0.5] * channels,
            "std": [0.5] * channels,
            **self.network_info(),
        }
        return TaskData(train, Transformed(val_files, prepare), description, info, skipped=skipped)

    def restore_info(self, info: dict[str, Any]) -> None:
        self.targets = info["targets"]

    def build_models(self, data: TaskData) -> dict[str, nn.Module]:
        o, channels = self.options, data.info["channels"]
        models = {}
        for t in range(self.targets):
            models[self.net("generator", t)] = build_generator(
                o.generator, channels, channels, o.ngf, o.norm, o.dropout
            )
        for t in range(self.targets):
            models[self.net("discriminator", t)] = build_discriminator(2 * channels, o.ndf, o.d_layers, o.norm)
        return models

    def param_groups(self, models: Mapping[str, nn.Module]) -> dict[str, list[dict[str, Any]]]:
        """One optimizer for every generator and one for every discriminator, as DeepLIIF has."""
        return {
            kind: [{"params": [p for t in range(self.targets) for p in models[self.net(kind, t)].parameters()]}]
            for kind in ("generator", "discriminator")
        }

    @staticmethod
    def augmentation_words(crop: bool, flip: bool) -> str:
        return ", random crop + flip" if crop and flip else ", random crop" if crop else ", random flip" if flip else ""

    # --- training
    def gan_loss(self, logits: torch.Tensor, real: bool) -> torch.Tensor:
        return gan_loss(logits, real, self.options.gan_loss)

    def training_step(self, batch: Batch, ctx: StepContext) -> StepLosses:
        inputs, targets = batch  # (N, C, H, W), (N, T, C, H, W)
        fakes = [ctx.models[self.net("generator", t)](inputs) for t in range(self.targets)]
        losses: dict[str, torch.Tensor] = {}
        d_total: torch.Tensor | int = 0  # (a tensor once the first discriminator adds to it)
        for t, fake in enumerate(fakes):  # every discriminator: real pairs against generated ones
            discriminator = ctx.models[self.net("discriminator", t)]
            real_pair, fake_pair = torch.cat([inputs, targets[:, t]], 1), torch.cat([inputs, fake.detach()], 1)
            losses[f"D_real{self.suffix(t)}"] = self.gan_loss(discriminator(real_pair), True)
            losses[f"D_fake{self.suffix(t)}"] = self.gan_loss(discriminator(fake_pair), False)
            d_total = d_total + 0.5 * (losses[f"D_real{self.suffix(t)}"] + losses[f"D_fake{self.suffix(t)}"])
        assert isinstance(d_total, torch.Tensor)  # (one discriminator at least)
        ctx.backward(d_total, "discriminator")
        ctx.step("discriminator")
        g_total: torch.Tensor | int = 0
        with contextlib.ExitStack() as stack:  # every generator, through its discriminator as it is now
            judges = [stack.enter_context(ctx.frozen(self.net("discriminator", t))) for t in range(self.targets)]
            for t, fake in enumerate(fakes):
                losses[f"G_GAN{self.suffix(t)}"] = self.gan_loss(judges[t](torch.cat([inputs, fake], 1)), True)
                losses[f"G_L1{self.suffix(t)}"] = (fake - targets[:, t]).abs().flatten(1).mean(1)
                g_total = (
                    g_total
                    + losses[f"G_GAN{self.suffix(t)}"]
                    + self.options.lambda_l1 * losses[f"G_L1{self.suffix(t)}"]
                )
        assert isinstance(g_total, torch.Tensor)
        ctx.backward(g_total, "generator")
        ctx.step("generator")
        return losses

    # --- validation
    def empty_sums(self) -> dict[str, torch.Tensor]:
        sums = {f"{m}_{t}": torch.zeros(()) for t in range(self.targets) for m in ("L1", "PSNR", "SSIM")}
        return {**sums, "samples": torch.zeros(())}

    def validation_step(
        self, models: Mapping[str, nn.Module], batch: Batch, ctx: RunContext
    ) -> dict[str, torch.Tensor]:
        inputs, targets = batch
        return self.output_sums(self.generate(models, inputs), targets)

    def output_sums(self, outputs: list[torch.Tensor], targets: torch.Tensor) -> dict[str, torch.Tensor]:
        """L1, PSNR and SSIM of each target's outputs, summed over the batch."""
        sums: dict[str, torch.Tensor] = {"samples": torch.tensor(float(len(targets)))}
        for t, output in enumerate(outputs):
            fake = (full_precision(output) + 1) / 2  # [0, 1] intensities
            real = (full_precision(targets[:, t]) + 1) / 2
            sums[f"L1_{t}"] = (fake - real).abs().flatten(1).mean(1).sum()
            sums[f"PSNR_{t}"] = psnr(fake, real).sum()
            sums[f"SSIM_{t}"] = ssim(fake, real).sum()
        return sums

    def validation_metrics(self, sums: dict[str, torch.Tensor]) -> Evaluation:
        count = max(float(sums["samples"]), 1.0)
        per_target = {
            f"{m}{self.suffix(t)}": float(sums[f"{m}_{t}"]) / count
            for t in range(self.targets)
            for m in ("L1", "PSNR", "SSIM")
        }
        metrics = {**per_target}
        for m in ("L1", "PSNR", "SSIM"):  # the mean over targets (best.pt's L1)
            metrics[m] = sum(float(sums[f"{m}_{t}"]) for t in range(self.targets)) / count / self.targets
        return Evaluation(metrics, {"samples": int(float(sums["samples"]))})

    def summary(self, metrics: dict[str, float]) -> str:
        text = f"val_L1 {metrics['L1']:.4f}  val_PSNR {metrics['PSNR']:.2f} dB  val_SSIM {metrics['SSIM']:.4f}"
        if "ema_L1" in metrics:
            text += f"  ema_L1 {metrics['ema_L1']:.4f}"
        return text

    def format_metric(self, name: str, value: float) -> str:
        return f"{value:.2f} dB" if "PSNR" in name else f"{value:.4f}"

    # --- dashboard
    def per_target(self, prefix: str, targets: int | None = None) -> list[tuple[str, str]]:
        """A pane's traces: ``prefix`` of each target (of the first ``targets``)."""
        return [(f"{prefix}{self.suffix(t)}", f"{prefix}{self.suffix(t)}") for t in range(targets or self.targets)]

    def loss_panes(self) -> list[dict[str, Any]]:
        per_target = self.per_target
        return [
            pane("train_G_GAN", "generator GAN loss (mean over ranks)", "GAN loss", "train", per_target("G_GAN")),
            pane(
                "train_G_L1", "generator L1 loss (mean over ranks)", "L1, [-1, 1] images", "train", per_target("G_L1")
            ),
            pane("train_D_real", "discriminator loss on real pairs", "GAN loss", "train", per_target("D_real")),
            pane("train_D_fake", "discriminator loss on generated pairs", "GAN loss", "train", per_target("D_fake")),
        ]

    def panes(self, declared: Declaration) -> list[dict[str, Any]]:
        per_target, panes = self.per_target, self.loss_panes()
        validation = [
            ("L1", "validation L1 error", "L1, [0, 1] intensities"),
            ("PSNR", "validation PSNR", "PSNR (dB)"),
            ("SSIM", "validation SSIM", "SSIM"),
        ]
        for metric, title, ylabel in validation:
            traces = [(metric, "mean over targets")] if self.targets > 1 else [(metric, metric)]
            traces += per_target(metric) if self.targets > 1 else [(f"ema_{metric}", f"EMA {metric}")]
            panes.append(pane(f"val_{metric}", title, ylabel, "val", traces))
        return panes

    def visuals(self, data: TaskData) -> TranslationSample:
        shown = fixed_sample(dataset_size(data.val), SHOWN, self.cfg.seed)
        return TranslationSample(self, [data.val[i] for i in shown])


class TranslationSample:
    """Each epoch: the same validation inputs, each with its outputs and targets (input | output |
    target, per target)."""

    def __init__(self, task: TranslateTask, samples: list[tuple[torch.Tensor, torch.Tensor]]):
        self.task, self.samples = task, samples

    @torch.no_grad()
    def record(self, models: Mapping[str, nn.Module], epoch: int, ctx: RunContext) -> dict[str, Any]:
        if not self.samples:
            return {"kind": "images", "epoch": epoch, "items": []}
        inputs = torch.stack([a for a, _ in self.samples])
        with ctx.autocast():  # the networks are in eval mode
            outputs = [output.float().cpu() for output in self.task.generate(models, ctx.to_device(inputs))]
        items = []
        for i, (a, b) in enumerate(self.samples):
            first = a[: b.shape[1]]  # the input (SDG's several input panels: the first)
            panels = [first] + [x for t in range(self.task.targets) for x in (outputs[t][i], b[t])]
            caption = "input | " + " | ".join(
                f"output{self.task.suffix(t)} | target{self.task.suffix(t)}" for t in range(self.task.targets)
            )
            items.append(records.images_item(png((strip([p.float() for p in panels]) + 1) / 2), caption))
        return {"kind": "images", "epoch": epoch, "title": "validation: input | output | target", "items": items}


def gan_loss(logits: torch.Tensor, real: bool, mode: str) -> torch.Tensor:
    """Per sample: the mean over the patches of cross-entropy (vanilla) or squared error (lsgan)."""
    target = torch.full_like(logits, 1.0 if real else 0.0)
    if mode == "lsgan":
        loss = (logits - target) ** 2
    else:
        loss = nn.functional.binary_cross_entropy_with_logits(logits, target, reduction="none")
    return loss.flatten(1).mean(1)

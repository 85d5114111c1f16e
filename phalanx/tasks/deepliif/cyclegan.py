"""``--task cyclegan``: DeepLIIF 1.2.7's ``CycleGANModel``, unpaired translation from one domain
(``trainA/``) into each of m others (``trainB1/`` ... ``trainBm/``; ``unpaired``).

Per target domain i: a generator each way (``GA_i``: A to B_i; ``GB_i``: B_i to A) and a PatchGAN
judging each domain's images alone (``DA_i`` judges B_i's, ``DB_i`` A's). Each step, as
``CycleGANModel.optimize_parameters``, the generators first, through the discriminators as they
are: per domain (GAN + ``--lambda-feat`` x VGG19 between the generated image and the real, unpaired
one of its domain) x ``--loss-g-weights``, both ways, + ``--lambda-cycle`` x 1/m x the L1 of each
cycle (A -> B_i -> A, B_i -> A -> B_i); then the discriminators: 0.5 x (real + a generated image
from the image pool) x ``--loss-d-weights``, the real label ``1 - --label-smoothing``. Logged as
DeepLIIF logs them: ``G_A``, ``G_B``, ``cycle_A``, ``cycle_B``, ``D_A``, ``D_B`` (the domains
summed). Validation: each A image through each cycle, A -> B_i -> A, against itself (L1, PSNR,
SSIM: what an unpaired task can score). The networks and their files keep DeepLIIF's names
(``latest_net_GA_1.pth`` ...).

The image pool (``--pool-size`` 50, CycleGAN's) is each process's own, drawn from a generator of
the run's seed and the rank; it starts empty after a resume, as DeepLIIF's does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.data import Subset

from ...data.pairs import PairTransform, Transformed
from ...data.sampling import derive_seed
from ...data.sources import holdout_indices
from ...data.transforms import one_size
from ...errors import PhalanxError
from ..base import Batch, Declaration, RunContext, StepContext, StepLosses, Task, TaskData, pane
from ..translate.nets import check_discriminator, check_generator
from ..translate.task import TranslateTask, gan_loss
from .files import load_networks, named_files
from .nets import VGGLoss, batch_statistics, check_vgg, discriminator, freeze_inert_biases, generator
from .options import CycleGANOptions
from .unpaired import UnpairedImages, UnpairedView, find_unpaired

if TYPE_CHECKING:
    from ...config import RunConfig


class ImagePool:
    """CycleGAN's pool of generated images (``util/image_pool.py``): until it holds ``size``,
    each image is kept and returned; then, with probability 1/2, a kept one is returned in its place
    (and it is kept instead), else the image itself."""

    def __init__(self, size: int, draw: torch.Generator):
        self.size, self.draw, self.images = size, draw, []  # type: ignore[var-annotated]

    def query(self, images: torch.Tensor) -> torch.Tensor:
        if self.size == 0:
            return images
        returned = []
        for image in images.detach():
            if len(self.images) < self.size:
                self.images.append(image)
                returned.append(image)
            elif torch.rand((), generator=self.draw) > 0.5:
                at = int(torch.randint(self.size, (), generator=self.draw))
                returned.append(self.images[at])
                self.images[at] = image
            else:
                returned.append(image)
        return torch.stack(returned)


class CycleGANTask(TranslateTask):
    name = "cyclegan"
    Options = CycleGANOptions
    Inference = ".inference:CycleGANInference"
    options: CycleGANOptions  # type: ignore[assignment]  # (a GANOptions of its own)
    primary_model = "GA_1"
    deepliif_model = "CycleGAN"  # train_opt.txt's model
    seg = False
    layout_words = "DIR/trainA/ (the input domain) and DIR/trainB1/ ... trainB<m>/ (each target domain), unpaired"

    def __init__(self, cfg: RunConfig):
        super().__init__(cfg)
        self.targets = self.modalities = self.options.modalities or 1
        self.vgg: VGGLoss | None = None
        self.pools: dict[str, ImagePool] = {}

    # --- names: DeepLIIF's (GA_1 ..., GB_1 ..., DA_1 ..., DB_1 ...)
    def suffix(self, t: int) -> str:
        return f"_{t + 1}"

    def output_folder(self, t: int) -> str:
        return f"GA_{t + 1}"  # deepliif test's name for CycleGAN's outputs: the network's

    def targets_words(self) -> str:
        return f"{self.targets} target domain(s)"

    def expected_targets(self) -> int:
        return self.options.modalities

    def generator_names(self) -> list[str]:
        """The networks predict runs: A to each B."""
        return [f"GA_{t + 1}" for t in range(self.targets)]

    def network_names(self) -> dict[str, list[str]]:
        m = range(1, self.targets + 1)
        return {
            "generator": [f"GA_{i}" for i in m] + [f"GB_{i}" for i in m],
            "discriminator": [f"DA_{i}" for i in m] + [f"DB_{i}" for i in m],
        }

    def generate(self, models: Mapping[str, nn.Module], inputs: torch.Tensor) -> list[torch.Tensor]:
        """A -> each B; in eval mode BatchNorm takes each batch's statistics, as DeepLIIF's
        inference does (``disable_batchnorm_tracking_stats``)."""
        with batch_statistics(models[name] for name in self.generator_names()):
            return [models[name](inputs) for name in self.generator_names()]

    def declare(self, data: TaskData, models: Mapping[str, nn.Module]) -> Declaration:
        losses = ("G_A", "G_B", "cycle_A", "cycle_B", "D_A", "D_B")
        return replace(
            Task.declare(self, data, models),
            loss_names=losses,
            primary_model="GA_1",
            ema_models=tuple(self.network_names()["generator"]),
        )

    # --- data
    def build_data(self) -> TaskData:
        cfg, o = self.cfg, self.options
        size = one_size(cfg.data, self.name)
        if not cfg.data.dataroot:
            raise PhalanxError(
                f"--task {self.name} reads unpaired images: give --dataroot DIR ({self.layout_words})", "--dataroot"
            )
        root = Path(cfg.data.dataroot)
        if not root.is_dir():
            raise PhalanxError(f"{root} is not a directory", "--dataroot")
        train = find_unpaired(root, "train", o.modalities)
        if train is None:
            raise PhalanxError(f"{root} has no trainA/ ({self.layout_words})", "--dataroot")
        self.targets = self.modalities = len(train.b)
        check_generator(o.net_g, size, "--net-g")
        check_discriminator(o.d_layers, size)
        images = UnpairedImages(train, size)
        prepare = PairTransform(size, train=False, flip=False)
        val_files = find_unpaired(root, "val", self.targets)
        if val_files is not None:
            val: Any = Transformed(UnpairedImages(val_files, size), prepare)
            train_index, how = list(range(len(images))), "valA/"
        else:
            train_index, val_index = holdout_indices(len(images), cfg.data.val_fraction, cfg.seed)
            val = Subset(Transformed(images, prepare), val_index)
            how = f"a {cfg.data.val_fraction:g} hold-out of trainA/"
        train_view = UnpairedView(images, self.augment(size), cfg.seed, prepare, o.serial_pairs, train_index)
        channels = 1 if train.mode == "L" else 3
        if o.lambda_feat > 0:
            if channels != 3:
                raise PhalanxError(
                    f"{root} holds grayscale images; the VGG19 perceptual loss takes RGB: --lambda-feat 0",
                    "--lambda-feat",
                )
            check_vgg()
        self.weights = self._weights()
        description = (
            f"{root} ({len(train_view)} train from {len(train)} in trainA/, "
            f"{' / '.join(str(len(b)) for b in train.b)} in trainB1/ ..., {len(val)} val from {how}, {self.targets_words()}, {size}x{size}"
            f"{', random flip' if cfg.data.augment != 'none' and cfg.data.hflip else ''}"
            f"{', serial pairs' if o.serial_pairs else ', B drawn at random'})"
        )
        info = {
            "targets": self.targets,
            "channels": channels,
            "size": size,
            "mode": train.mode,
            "layout": "unpaired",
            "mean": [0.5] * channels,
            "std": [0.5] * channels,
            "net_g": o.net_g,
            "modalities": self.targets,
        }
        return TaskData(train_view, val, description, info)

    def augment(self, size: int) -> PairTransform:
        """DeepLIIF's default for CycleGAN: a flip shared by A and its partners (--augment none: none)."""
        if self.cfg.data.augment == "none":
            return PairTransform(size, train=False, flip=False)
        return PairTransform(size, train=True, flip=self.cfg.data.hflip, crop=self.cfg.data.augment == "basic")

    def restore_info(self, info: dict[str, Any]) -> None:
        self.targets = self.modalities = info["targets"]
        self.weights = self._weights()

    def _weights(self) -> dict[str, tuple[float, ...]]:
        m, o = self.targets, self.options
        weights = {
            "loss_g_weights": o.loss_g_weights or (1 / m,) * m,
            "loss_d_weights": o.loss_d_weights or (1 / m,) * m,
        }
        for name, values in weights.items():
            if len(values) != m:
                raise PhalanxError(
                    f"has {len(values)} weight(s) where {m} domain(s) need {m}", "--" + name.replace("_", "-")
                )
        return weights

    # --- networks
    def build_models(self, data: TaskData) -> dict[str, nn.Module]:
        o, channels = self.options, data.info["channels"]
        names = self.network_names()
        models = {
            name: generator(o.net_g, channels, channels, o.ngf, o.norm, o.dropout, o.padding)
            for name in names["generator"]
        }
        models.update({name: discriminator(channels, o.ndf, o.d_layers, o.norm) for name in names["discriminator"]})
        for model in models.values():
            freeze_inert_biases(model)
        return models

    def load_weights(self, models: Mapping[str, nn.Module], spec: str, data: TaskData) -> list[str]:
        """``--weights DIR``: a CycleGAN model directory (``latest_net_GA_1.pth`` ...)."""
        names, folder = self.network_names(), Path(spec)
        files = named_files(folder, names["generator"], names["discriminator"])
        return load_networks(models, files, folder, names["discriminator"], "--weights")

    def param_groups(self, models: Mapping[str, nn.Module]) -> dict[str, list[dict[str, Any]]]:
        return {
            kind: [{"params": [p for name in names for p in models[name].parameters() if p.requires_grad]}]
            for kind, names in self.network_names().items()
        }

    # --- training
    def gan(self, logits: torch.Tensor, real: bool) -> torch.Tensor:
        loss = gan_loss(logits, real, self.options.gan_mode)
        if real and self.options.label_smoothing:  # DeepLIIF's GANLoss: the real label 1 - smoothing
            target = torch.full_like(logits, 1 - self.options.label_smoothing)
            if self.options.gan_mode == "lsgan":
                loss = ((logits - target) ** 2).flatten(1).mean(1)
            else:
                loss = (
                    nn.functional.binary_cross_entropy_with_logits(logits, target, reduction="none").flatten(1).mean(1)
                )
        return loss

    def perceptual(self, fake: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        if not self.options.lambda_feat:
            return fake.new_zeros(len(fake))
        if self.vgg is None:
            self.vgg = VGGLoss()
        self.vgg.to(device=fake.device, dtype=fake.dtype)
        return self.vgg(fake, real) * self.options.lambda_feat

    def pool(self, name: str, ctx: RunContext) -> ImagePool:
        if name not in self.pools:
            draw = torch.Generator().manual_seed(derive_seed(self.cfg.seed, "image pool", name, ctx.rank))
            self.pools[name] = ImagePool(self.options.pool_size, draw)
        return self.pools[name]

    def training_step(self, batch: Batch, ctx: StepContext) -> StepLosses:
        real_a, real_bs = batch  # (N, C, H, W), (N, m, C, H, W): A and an unpaired image of each domain
        o, m, models = self.options, self.targets, ctx.models
        w_g, w_d = self.weights["loss_g_weights"], self.weights["loss_d_weights"]
        real_b = [real_bs[:, i] for i in range(m)]
        fake_b = [models[f"GA_{i + 1}"](real_a) for i in range(m)]
        rec_a = [models[f"GB_{i + 1}"](fake) for i, fake in enumerate(fake_b)]
        fake_a = [models[f"GB_{i + 1}"](real) for i, real in enumerate(real_b)]
        rec_b = [models[f"GA_{i + 1}"](fake) for i, fake in enumerate(fake_a)]
        zero = real_a.new_zeros(len(real_a))
        losses = {name: zero for name in ("G_A", "G_B", "cycle_A", "cycle_B", "D_A", "D_B")}
        with contextlib.ExitStack() as stack:  # the generators first, through the discriminators as they are
            judges = {name: stack.enter_context(ctx.frozen(name)) for name in self.network_names()["discriminator"]}
            for i in range(m):
                n = i + 1
                losses["G_A"] = (
                    losses["G_A"]
                    + (self.gan(judges[f"DA_{n}"](fake_b[i]), True) + self.perceptual(fake_b[i], real_b[i])) * w_g[i]
                )
                losses["G_B"] = (
                    losses["G_B"]
                    + (self.gan(judges[f"DB_{n}"](fake_a[i]), True) + self.perceptual(fake_a[i], real_a)) * w_g[i]
                )
                losses["cycle_A"] = losses["cycle_A"] + l1(rec_a[i], real_a) * o.lambda_cycle / m
                losses["cycle_B"] = losses["cycle_B"] + l1(rec_b[i], real_b[i]) * o.lambda_cycle / m
        ctx.backward(losses["G_A"] + losses["G_B"] + losses["cycle_A"] + losses["cycle_B"], "generator")
        ctx.step("generator")
        for i in range(m):  # then the discriminators, on generated images from the pools
            n = i + 1
            for side, d, real, fake in (
                ("D_A", f"DA_{n}", real_b[i], fake_b[i]),
                ("D_B", f"DB_{n}", real_a, fake_a[i]),
            ):
                # (a padding sample, which weighs nothing, stays out of the pool)
                pooled = self.pool(f"{side}{n}", ctx).query(fake) if ctx.samples else fake.detach()
                judged = self.gan(models[d](real), True) + self.gan(models[d](pooled), False)
                losses[side] = losses[side] + judged * 0.5 * w_d[i]
        ctx.backward(losses["D_A"] + losses["D_B"], "discriminator")
        ctx.step("discriminator")
        return losses

    # --- validation: each cycle, A -> B_i -> A, against A
    def validation_step(
        self, models: Mapping[str, nn.Module], batch: Batch, ctx: RunContext
    ) -> dict[str, torch.Tensor]:
        real_a, _ = batch
        back = [models[f"GB_{i + 1}"] for i in range(self.targets)]
        with batch_statistics(back):
            cycles = [net(fake) for net, fake in zip(back, self.generate(models, real_a))]
        return self.output_sums(cycles, real_a[:, None].expand(-1, self.targets, -1, -1, -1))

    def loss_panes(self) -> list[dict[str, Any]]:
        return [
            pane(
                "train_G",
                "generators' GAN (+ VGG) loss, each way (mean over ranks)",
                "loss",
                "train",
                [("G_A", "A -> B"), ("G_B", "B -> A")],
            ),
            pane(
                "train_cycle",
                "cycle L1 x --lambda-cycle",
                "L1 x lambda",
                "train",
                [("cycle_A", "A -> B -> A"), ("cycle_B", "B -> A -> B")],
            ),
            pane(
                "train_D",
                "discriminators' loss",
                "GAN loss",
                "train",
                [("D_A", "D_A (judges B)"), ("D_B", "D_B (judges A)")],
            ),
        ]


def l1(fake: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Per sample: the mean absolute difference (DeepLIIF's L1Loss, over the batch)."""
    return (fake - real).abs().flatten(1).mean(1)

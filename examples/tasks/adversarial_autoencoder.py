"""Your own task, worked through: an autoencoder with an adversary, on phalanx's built-in digits.

Two networks, two optimizers, updated alternately as pix2pix does: the discriminator learns to tell
real digits from reconstructed ones, then the generator (the autoencoder) learns to reconstruct
its input (L1) and to fool the discriminator. Run it from this folder:

    phalanx train --task adversarial_autoencoder:AdversarialAutoencoder --epochs 5 --name aae
    phalanx trainlaunch --task adversarial_autoencoder:AdversarialAutoencoder --use-torchrun "--nproc_per_node 2" --name aae-ddp
    phalanx train --task adversarial_autoencoder:AdversarialAutoencoder --task-option width=32 --name aae-wide
    phalanx predict --checkpoint checkpoints/aae digits/ --output reconstructed/
    phalanx export --checkpoint checkpoints/aae --output aae.ts

No normalisation layers: each sample's losses depend on that sample alone, so 2 DDP workers x B
train exactly what one process x 2B does (``--precision fp64`` shows it to rounding).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from phalanx.data import SeededView, load_digits
from phalanx.data.inputs import InputImages, output_names
from phalanx.data.sources import holdout_indices
from phalanx.tasks import Inference, Predictor, Task, TaskData, denormalize, images_item, option, png, strip

SHOWN = 8  # validation digits shown with their reconstructions each epoch


@dataclass(frozen=True)
class AutoencoderOptions:
    width: int = option(16, "Channels of the first layer of both networks.", metavar="N")
    lambda_l1: float = option(10.0, "Weight of the reconstruction (L1) loss against the adversarial one.")


def generator(width: int) -> nn.Module:
    """8x8 -> 4x4 -> 8x8, output in [-1, 1] like the inputs."""
    return nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1),
        nn.LeakyReLU(0.2),
        nn.Conv2d(width, 2 * width, 4, stride=2, padding=1),
        nn.LeakyReLU(0.2),
        nn.ConvTranspose2d(2 * width, width, 4, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(width, 1, 3, padding=1),
        nn.Tanh(),
    )


def discriminator(width: int) -> nn.Module:
    """A patch discriminator: one real/fake logit per 4x4 patch position."""
    return nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1),
        nn.LeakyReLU(0.2),
        nn.Conv2d(width, 2 * width, 4, stride=2, padding=1),
        nn.LeakyReLU(0.2),
        nn.Conv2d(2 * width, 1, 3, padding=1),
    )


def bce(logits: torch.Tensor, real: bool) -> torch.Tensor:
    """Per-sample binary cross-entropy of patch logits against all-real or all-fake."""
    target = torch.full_like(logits, 1.0 if real else 0.0)
    return nn.functional.binary_cross_entropy_with_logits(logits, target, reduction="none").flatten(1).mean(1)


def prepare(image: torch.Tensor) -> torch.Tensor:
    """A decoded grey image (1, H, W) of uint8 -> what the generator takes: 8x8 in [-1, 1]."""
    small = nn.functional.interpolate(image[None].float() / 255, size=(8, 8), mode="bilinear", antialias=True)
    return small[0] * 2 - 1


class AutoencoderInference(Inference):
    def predictor(self, paths: list[Path], opts, device: torch.device) -> Predictor:  # `phalanx predict`
        return Reconstruct(InputImages(paths, "L", prepare), paths, device, self.models["generator"], Path(opts.output))

    def export_modules(self) -> dict[str, tuple[nn.Module, torch.Tensor]]:  # `phalanx export` writes the generator
        return {"generator": (self.models["generator"], torch.zeros(2, 1, 8, 8))}


class Reconstruct(Predictor):
    """Each input image's reconstruction, as OUTPUT/<its name>.png (folders below the inputs' own kept)."""

    batch_size = 32  # every image is 8x8 once prepared

    def __init__(self, inputs, paths: list[Path], device: torch.device, generator: nn.Module, output: Path):
        super().__init__(inputs, paths, device)
        self.generator, self.output, self.names = generator.to(device), output, output_names(paths)

    def predict(self, indices: list[int], images: list[torch.Tensor], raws: list) -> None:
        rebuilt = self.generator(torch.stack(images).to(self.device, self.dtype)).float().cpu()
        for index, image in zip(indices, rebuilt):
            target = self.output / self.names[index]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(png(denormalize(image, [0.5], [0.5]), min_side=0))


class AdversarialAutoencoder(Task):
    Options = AutoencoderOptions
    defaults = {"optimizer": "adam", "betas": (0.5, 0.999), "lr": 1e-3, "weight_decay": 0.0}
    loss_names = ("G_GAN", "G_L1", "D_real", "D_fake")
    primary_model = "generator"
    best_metric = ("L1", "min")
    metric_labels = {"L1": "L1 reconstruction error"}
    reads = ("val_fraction",)  # its own digits: --dataroot, --image-size, --model ... are refused
    manual_optimization = True  # an optimizer per network, stepped in turn by training_step
    Inference = AutoencoderInference
    options: AutoencoderOptions

    def build_data(self) -> TaskData:
        images, _ = load_digits()  # the labels are not used: the task learns from images alone
        images = images * 2 - 1  # [0, 1] -> [-1, 1], the generator's output range
        train, val = holdout_indices(len(images), self.cfg.data.val_fraction, self.cfg.seed)
        return TaskData(
            SeededView(images[train]),
            images[val],
            f"built-in digits as images ({len(train)} train / {len(val)} val, 8x8)",
            info={"channels": 1, "size": 8, "mean": [0.5], "std": [0.5]},
        )

    def build_models(self, data: TaskData) -> dict[str, nn.Module]:
        return {"generator": generator(self.options.width), "discriminator": discriminator(self.options.width)}

    def training_step(self, real: torch.Tensor, ctx) -> dict[str, torch.Tensor]:
        fake = ctx.models["generator"](real)
        # The discriminator's step: real digits against reconstructions (no gradient to the generator).
        discriminator = ctx.models["discriminator"]
        d_real, d_fake = bce(discriminator(real), True), bce(discriminator(fake.detach()), False)
        ctx.backward(0.5 * (d_real + d_fake), "discriminator")
        ctx.step("discriminator")
        # The generator's step, through the discriminator as it is now, whose weights stay out of it.
        with ctx.frozen("discriminator") as judge:
            g_gan = bce(judge(fake), True)
        g_l1 = (fake - real).abs().flatten(1).mean(1)
        ctx.backward(g_gan + self.options.lambda_l1 * g_l1, "generator")
        ctx.step("generator")
        return {"G_GAN": g_gan, "G_L1": g_l1, "D_real": d_real, "D_fake": d_fake}

    def empty_sums(self) -> dict[str, torch.Tensor]:
        return {"L1": torch.zeros(()), "samples": torch.zeros(())}

    def validation_step(self, models, real: torch.Tensor, ctx) -> dict[str, torch.Tensor]:
        error = (models["generator"](real) - real).abs().flatten(1).mean(1)
        return {"L1": error.sum(), "samples": torch.tensor(float(len(real)))}  # the mean: sums / samples

    def visuals(self, data: TaskData) -> Reconstructions:
        return Reconstructions(data.val[:SHOWN])


class Reconstructions:
    """Each epoch: the same validation digits, each beside its reconstruction."""

    def __init__(self, images: torch.Tensor):
        self.images = images

    @torch.no_grad()
    def record(self, models, epoch: int, ctx) -> dict:  # the networks are in eval mode here
        rebuilt = models["generator"](ctx.to_device(self.images)).cpu()
        items = [
            images_item(
                png(strip([denormalize(a, [0.5], [0.5]), denormalize(b, [0.5], [0.5])])),
                f"digit {i}: input | reconstruction",
            )
            for i, (a, b) in enumerate(zip(self.images, rebuilt))
        ]
        return {
            "kind": "images",
            "epoch": epoch,
            "title": "validation digits and their reconstructions",
            "items": items,
        }

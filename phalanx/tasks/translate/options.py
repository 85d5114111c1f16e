"""``--task translate``'s own options, and what pix2pix's and DeepLIIF's GANs share (standard
library only)."""

from __future__ import annotations

from dataclasses import dataclass

from ...config.fields import check_fields, option


@dataclass(frozen=True)
class GANOptions:
    """What pix2pix's and DeepLIIF's GANs share."""

    ngf: int = option(64, "Filters in the generator's first layer.", metavar="N", above=0)
    ndf: int = option(64, "Filters in the discriminator's first layer.", metavar="N", above=0)
    d_layers: int = option(3, "Layers of the PatchGAN discriminator (3: 70x70 patches).", metavar="N", above=0)
    norm: str = option(
        "batch",
        "Normalisation in both networks (pix2pix's default: batch; instance or none make 2 DDP "
        "workers x B train exactly what one process x 2B does).",
        choices=("batch", "instance", "none"),
    )
    dropout: bool = option(True, "Dropout in the generator, as pix2pix (--no-dropout: deterministic networks).")
    lambda_l1: float = option(
        100.0, "Weight of the L1 loss of each generator against its GAN loss.", metavar="L", at_least=0
    )

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class TranslateOptions(GANOptions):
    generator: str = option(
        "unet_256",
        "Generator: unet_N, a U-Net for images whose sides are multiples of N "
        "(pix2pix's unet_64, unet_128, unet_256; unet_32 at --image-size 32), or resnet_Nblocks, "
        "a ResNet of N residual blocks (pix2pix's resnet_6blocks, resnet_9blocks).",
        metavar="NAME",
    )
    gan_loss: str = option(
        "vanilla", "GAN objective: vanilla (cross-entropy) or lsgan (least squares).", choices=("vanilla", "lsgan")
    )
    targets: int = option(
        0,
        "Target images per input; a generator and a discriminator each (0: what the data holds).",
        metavar="N",
        at_least=0,
    )

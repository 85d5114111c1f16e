"""``--task deepliif``'s own options: DeepLIIF's ``train`` defaults (standard library only)."""

from __future__ import annotations

from dataclasses import dataclass

from ...config.fields import bad_value, option
from ..translate.options import GANOptions


@dataclass(frozen=True)
class DeepLIIFOptions(GANOptions):
    """DeepLIIF's model (``deepliif train``'s defaults; its L1 is SmoothL1)."""

    d_layers: int = option(
        4, "Layers of the PatchGAN discriminator (DeepLIIF's --n-layers-d: 4).", metavar="N", above=0
    )
    modalities: int = option(
        0,
        "Translated modalities per input, a generator and a discriminator each (DeepLIIF's 4: "
        "hematoxylin, mpIF DAPI, Lap2, Ki67; 0: the data's panels less the input and the "
        "segmentation).",
        metavar="N",
        at_least=0,
    )
    seg: bool = option(
        True,
        "Also the segmentation: a generator from the input and one from each generated modality, "
        "weighted by --seg-weights (--no-seg: the modalities alone).",
    )
    modalities_names: tuple[str, ...] = option(
        (),
        "Names of the input and each modality, the input's first (DeepLIIF's --modalities-names): "
        "predict's output folders (default: IHC,Hema,DAPI,Lap2,Marker with 4 modalities, else "
        "input1,mod1,mod2,...; a modality named Marker is the marker the cells are classified by).",
        metavar="NAME[,NAME...]",
    )
    net_g: str = option(
        "resnet_9blocks",
        "The modalities' generators: resnet_Nblocks, a ResNet of N residual blocks "
        "(DeepLIIF's resnet_9blocks, resnet_6blocks), or unet_N (N: 32, 64, ... for N-pixel images).",
        metavar="NAME",
    )
    net_gs: str = option(
        "unet_512",
        "The segmentation generators (unet_512: 512-pixel images; unet_N or resnet_Nblocks).",
        metavar="NAME",
    )
    seg_weights: tuple[float, ...] = option(
        (),
        "Weights of the segmentation generators' outputs, the input's first "
        "(default: 0.25,0.15,0.25,0.1,0.25 with 4 modalities, else equal).",
        metavar="W[,W...]",
    )
    loss_g_weights: tuple[float, ...] = option(
        (), "Weights of each modality's generator loss, the segmentation's last (default: equal).", metavar="W[,W...]"
    )
    loss_d_weights: tuple[float, ...] = option(
        (),
        "Weights of each modality's discriminator loss, the segmentation's last (default: equal).",
        metavar="W[,W...]",
    )
    lambda_feat: float = option(
        100.0,
        "Weight of the VGG19 perceptual loss of each modality (0: off; above 0 it needs "
        "VGG19's ImageNet weights in torch's hub cache).",
        metavar="L",
        at_least=0,
    )
    gan_mode: str = option(
        "vanilla", "GAN objective of the modalities: vanilla (cross-entropy) or lsgan.", choices=("vanilla", "lsgan")
    )
    gan_mode_s: str = option("lsgan", "GAN objective of the segmentation.", choices=("vanilla", "lsgan"))
    padding: str = option(
        "zero",
        "Padding of the ResNet generators (DeepLIIF's train default: zero; reflect).",
        choices=("zero", "reflect"),
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if any(not name or "/" in name or name in (".", "..") for name in self.modalities_names):
            raise bad_value("modalities_names", "each name is a folder name: not empty, no '/'")
        if len(set(self.modalities_names)) != len(self.modalities_names):
            raise bad_value("modalities_names", "two modalities have the same name")
        for name in ("seg_weights", "loss_g_weights", "loss_d_weights"):
            if any(w < 0 for w in getattr(self, name)):
                raise bad_value(name, f"weights must not be negative (got {','.join(map(str, getattr(self, name)))})")


@dataclass(frozen=True)
class DeepLIIFExtOptions(DeepLIIFOptions):
    """DeepLIIFExt (``deepliif train --model DeepLIIFExt``'s defaults): no perceptual loss."""

    lambda_feat: float = option(
        0.0,
        "DeepLIIFExt has no perceptual loss (DeepLIIF builds its VGG19 and leaves it unused): 0 only.",
        metavar="L",
        at_least=0,
    )
    seg: bool = option(
        True,
        "Also a segmentation per modality, each from the input, the first modality and that modality "
        "(--no-seg: the modalities alone).",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lambda_feat:
            raise bad_value("lambda_feat", "DeepLIIFExt trains without a perceptual loss: leave --lambda-feat out")
        if self.seg_weights:
            raise bad_value("seg_weights", "DeepLIIFExt's segmentations are one per modality, not a weighted sum")


@dataclass(frozen=True)
class SDGOptions(DeepLIIFOptions):
    """SDG, DeepLIIF's synthetic data generation (``deepliif train --model SDG``'s defaults): the
    modalities from one or more input panels, no segmentation."""

    inputs: int = option(
        1,
        "Input panels per sample, first in each row of panels, given to every generator together "
        "(DeepLIIF's input_no; the modalities are the panels after them).",
        metavar="N",
        above=0,
    )
    seg: bool = option(False, "SDG has no segmentation: --no-seg only.")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.seg:
            raise bad_value("seg", "SDG translates only: it has no segmentation")
        if self.seg_weights:
            raise bad_value("seg_weights", "SDG has no segmentation")


@dataclass(frozen=True)
class DeepLIIFKDOptions(DeepLIIFOptions):
    """DeepLIIFKD, DeepLIIF's model distilled from a trained one (``deepliif train --model
    DeepLIIFKD``'s defaults)."""

    teacher: str = option(
        "",
        "The teacher: a DeepLIIF model directory (DeepLIIF's --model-dir-teacher), run as deepliif test "
        "runs it, its segmentation networks weighted equally, as DeepLIIF's distillation weighs them.",
        metavar="DIR",
    )
    kd_weight: float = option(
        10.0,
        "Weight of each KL divergence between the student's and the teacher's outputs (DeepLIIF's 10).",
        metavar="W",
        at_least=0,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.teacher:
            raise bad_value(
                "teacher", "DeepLIIFKD learns from a teacher: give --teacher DIR, a DeepLIIF model directory"
            )
        if not self.seg:
            raise bad_value("seg", "DeepLIIFKD distils the segmentation too: leave --no-seg out")
        if (self.gan_mode, self.gan_mode_s) != ("vanilla", "lsgan"):
            raise bad_value(
                "gan_mode" if self.gan_mode != "vanilla" else "gan_mode_s",
                "DeepLIIFKD's GAN losses are fixed: vanilla for the modalities, lsgan for the segmentation",
            )


@dataclass(frozen=True)
class CycleGANOptions(GANOptions):
    """DeepLIIF's CycleGAN (``deepliif train --model CycleGAN``'s defaults): unpaired translation
    from one domain into each of m others."""

    d_layers: int = option(
        4, "Layers of each PatchGAN discriminator (DeepLIIF's --n-layers-d: 4).", metavar="N", above=0
    )
    lambda_l1: float = option(
        100.0,
        "Not CycleGAN's: it has no target to compare with (its cycles' weight is --lambda-cycle).",
        metavar="L",
        at_least=0,
    )
    modalities: int = option(
        0, "Target domains, trainB1/ ... trainB<N>/ (0: every trainB<k>/ folder).", metavar="N", at_least=0
    )
    net_g: str = option(
        "resnet_9blocks",
        "The generators, both ways: resnet_Nblocks or unet_N (N: 32, 64, ... for N-pixel images).",
        metavar="NAME",
    )
    padding: str = option(
        "zero", "Padding of the ResNet generators (DeepLIIF's train default: zero).", choices=("zero", "reflect")
    )
    loss_g_weights: tuple[float, ...] = option(
        (), "Weight of each domain's generator losses, GAN and VGG, both ways (default: 1/m each).", metavar="W[,W...]"
    )
    loss_d_weights: tuple[float, ...] = option(
        (), "Weight of each domain's discriminator losses, both ways (default: 1/m each).", metavar="W[,W...]"
    )
    gan_mode: str = option("vanilla", "GAN objective: vanilla (cross-entropy) or lsgan.", choices=("vanilla", "lsgan"))
    label_smoothing: float = option(
        0.0,
        "The discriminators' real label is 1 - this (DeepLIIF's --label-smoothing).",
        metavar="E",
        at_least=0,
        below=1,
    )
    lambda_cycle: float = option(
        10.0,
        "Weight of each cycle's L1 loss, A -> B -> A and B -> A -> B (DeepLIIF's 10), x 1/m.",
        metavar="L",
        at_least=0,
    )
    lambda_feat: float = option(
        1.0,
        "Weight of the VGG19 perceptual loss between each generated image and an (unpaired) real one of "
        "its domain, as DeepLIIF's CycleGAN computes it (1; 0: off, else it needs VGG19's ImageNet weights).",
        metavar="L",
        at_least=0,
    )
    pool_size: int = option(
        50,
        "Generated images each discriminator pool keeps to judge (CycleGAN's image pool; 0: the newest only).",
        metavar="N",
        at_least=0,
    )
    serial_pairs: bool = option(
        False,
        "Pair A's image i with each B folder's image i (mod its count), as DeepLIIF's --serial-batches "
        "(default: a random B image each epoch).",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lambda_l1 != 100.0:
            raise bad_value("lambda_l1", "CycleGAN has no L1 loss to a target; its cycles' weight is --lambda-cycle")
        for name in ("loss_g_weights", "loss_d_weights"):
            if any(w < 0 for w in getattr(self, name)):
                raise bad_value(name, "weights must not be negative")

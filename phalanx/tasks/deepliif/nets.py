"""DeepLIIF's networks, module for module as DeepLIIF 1.2.7 builds them (``deepliif/models/
networks.py``), so that a DeepLIIF model directory's ``latest_net_*.pth`` loads key for key and an
exported one loads back into DeepLIIF: the ResNet and U-Net generators (pix2pix's, with DeepLIIF's
zero or reflection padding), the PatchGAN discriminator, and the VGG19 perceptual loss.

They differ from ``phalanx.tasks.translate.nets`` (pix2pix's as phalanx trains them) where DeepLIIF's files do:
a placeholder module where there is no normalisation, and a bias before every InstanceNorm. Such a
bias changes no output (the norm subtracts it) and gets a gradient of rounding noise, which Adam
turns into random steps; ``freeze_inert_biases`` keeps it as loaded instead.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from torch import nn

from ...errors import PhalanxError
from ..translate.nets import init_weights, norm_layer, unet_size

VGG_FILE = "vgg19-dcbb9e9d.pth"  # torchvision's ImageNet VGG19, as torch.hub caches it


def _norm(kind: str):
    make = norm_layer(kind)
    return make if make is not None else (lambda width: nn.Identity())


def resnet_generator(
    inputs: int, outputs: int, ngf: int, norm: str, dropout: bool, blocks: int, padding: str
) -> nn.Module:
    """DeepLIIF's ResnetGenerator (upsampling by transposed convolution)."""
    make_norm, bias = _norm(norm), norm == "instance"
    pad = nn.ReflectionPad2d if padding == "reflect" else nn.ZeroPad2d
    layers: list[nn.Module] = [pad(3), nn.Conv2d(inputs, ngf, 7, bias=bias), make_norm(ngf), nn.ReLU(True)]
    for i in range(2):
        width = ngf * 2**i
        layers += [nn.Conv2d(width, 2 * width, 3, stride=2, padding=1, bias=bias), make_norm(2 * width), nn.ReLU(True)]
    layers += [ResnetBlock(4 * ngf, padding, make_norm, dropout, bias) for _ in range(blocks)]
    for i in range(2, 0, -1):
        width = ngf * 2**i
        layers += [
            nn.ConvTranspose2d(width, width // 2, 3, stride=2, padding=1, output_padding=1, bias=bias),
            make_norm(width // 2),
            nn.ReLU(True),
        ]
    layers += [pad(3), nn.Conv2d(ngf, outputs, 7), nn.Tanh()]
    return Wrapped(nn.Sequential(*layers))


class Wrapped(nn.Module):
    """DeepLIIF's generators and discriminators keep their layers in ``self.model``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x)


class ResnetBlock(nn.Module):
    def __init__(self, width: int, padding: str, make_norm, dropout: bool, bias: bool):
        super().__init__()
        pad = [nn.ReflectionPad2d(1)] if padding == "reflect" else []
        inner = 0 if pad else 1
        layers = [*pad, nn.Conv2d(width, width, 3, padding=inner, bias=bias), make_norm(width), nn.ReLU(True)]
        layers += [nn.Dropout(0.5)] if dropout else []
        layers += [
            *([nn.ReflectionPad2d(1)] if pad else []),
            nn.Conv2d(width, width, 3, padding=inner, bias=bias),
            make_norm(width),
        ]
        self.conv_block = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv_block(x)


class UnetSkipConnectionBlock(nn.Module):
    def __init__(
        self,
        outer: int,
        inner: int,
        make_norm,
        bias: bool,
        *,
        inputs: int | None = None,
        submodule: nn.Module | None = None,
        outermost: bool = False,
        innermost: bool = False,
        dropout: bool = False,
    ):
        super().__init__()
        self.outermost = outermost
        down = nn.Conv2d(outer if inputs is None else inputs, inner, 4, stride=2, padding=1, bias=bias)
        if outermost:
            assert submodule is not None  # (every level but the innermost holds the inner ones)
            layers = [
                down,
                submodule,
                nn.ReLU(True),
                nn.ConvTranspose2d(2 * inner, outer, 4, stride=2, padding=1),
                nn.Tanh(),
            ]
        elif innermost:
            layers = [
                nn.LeakyReLU(0.2, True),
                down,
                nn.ReLU(True),
                nn.ConvTranspose2d(inner, outer, 4, stride=2, padding=1, bias=bias),
                make_norm(outer),
            ]
        else:
            assert submodule is not None
            layers = [
                nn.LeakyReLU(0.2, True),
                down,
                make_norm(inner),
                submodule,
                nn.ReLU(True),
                nn.ConvTranspose2d(2 * inner, outer, 4, stride=2, padding=1, bias=bias),
                make_norm(outer),
            ]
            layers += [nn.Dropout(0.5)] if dropout else []
        self.model = nn.Sequential(*layers)

    def forward(self, x):
        return self.model(x) if self.outermost else torch.cat([x, self.model(x)], 1)


def unet_generator(inputs: int, outputs: int, downs: int, ngf: int, norm: str, dropout: bool) -> nn.Module:
    """DeepLIIF's UnetGenerator: ``downs`` halvings (unet_512: 9), 8 x ngf filters below the fourth."""
    make_norm, bias = _norm(norm), norm == "instance"
    block = UnetSkipConnectionBlock(8 * ngf, 8 * ngf, make_norm, bias, innermost=True)
    for _ in range(downs - 5):
        block = UnetSkipConnectionBlock(8 * ngf, 8 * ngf, make_norm, bias, submodule=block, dropout=dropout)
    for outer in (4 * ngf, 2 * ngf, ngf):
        block = UnetSkipConnectionBlock(outer, 2 * outer, make_norm, bias, submodule=block)
    return Wrapped(
        UnetSkipConnectionBlock(outputs, ngf, make_norm, bias, inputs=inputs, submodule=block, outermost=True)
    )


def discriminator(inputs: int, ndf: int, layers: int, norm: str) -> nn.Module:
    """DeepLIIF's NLayerDiscriminator (``--net-d n_layers``, ``--n-layers-d``; 3 is pix2pix's 70x70)."""
    make_norm, bias = _norm(norm), norm == "instance"
    modules: list[nn.Module] = [nn.Conv2d(inputs, ndf, 4, stride=2, padding=1), nn.LeakyReLU(0.2, True)]
    width = ndf
    for n in range(1, layers + 1):
        wider = ndf * min(2**n, 8)
        modules += [
            nn.Conv2d(width, wider, 4, stride=2 if n < layers else 1, padding=1, bias=bias),
            make_norm(wider),
            nn.LeakyReLU(0.2, True),
        ]
        width = wider
    modules.append(nn.Conv2d(width, 1, 4, stride=1, padding=1))
    return init_weights(Wrapped(nn.Sequential(*modules)))


def generator(name: str, inputs: int, outputs: int, ngf: int, norm: str, dropout: bool, padding: str) -> nn.Module:
    """``resnet_Nblocks`` or ``unet_N`` (N pixels halved to 1: log2(N) levels), initialised as DeepLIIF's."""
    size = unet_size(name)
    if size is not None:
        return init_weights(unet_generator(inputs, outputs, int(math.log2(size)), ngf, norm, dropout))
    blocks = int(name[len("resnet_") : -len("blocks")])
    return init_weights(resnet_generator(inputs, outputs, ngf, norm, dropout, blocks, padding))


def freeze_inert_biases(net: nn.Module) -> int:
    """Freeze every bias that an InstanceNorm right after it subtracts again; the count frozen."""
    frozen = 0
    for module in net.modules():
        if isinstance(module, nn.Sequential):
            layers = list(module)
            for layer, following in zip(layers, layers[1:]):
                if isinstance(following, nn.InstanceNorm2d) and getattr(layer, "bias", None) is not None:
                    layer.bias.requires_grad_(False)
                    frozen += 1
    return frozen


@contextlib.contextmanager
def batch_statistics(models: Iterable[nn.Module]) -> Iterator[None]:
    """BatchNorm in eval mode normalising with each batch's own statistics, as DeepLIIF's inference
    does (its ``disable_batchnorm_tracking_stats`` drops the running statistics before predicting
    and serializing); they are put back after, unchanged."""
    saved = []
    for model in models:
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d) and not module.training and module.running_mean is not None:
                saved.append((module, module.running_mean, module.running_var))
                module.running_mean = module.running_var = None
    try:
        yield
    finally:
        for module, mean, var in saved:
            module.running_mean, module.running_var = mean, var


def without_running_statistics(net: nn.Module) -> nn.Module:
    """A network's BatchNorm made to normalise with each batch's statistics for good (a copy to
    trace, as ``deepliif serialize`` traces)."""
    for module in net.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.track_running_stats = False
            module.running_mean = module.running_var = None
    return net


# --- the perceptual loss ---------------------------------------------------------------------------
def vgg_path() -> Path:
    return Path(torch.hub.get_dir()) / "checkpoints" / VGG_FILE


def check_vgg() -> None:
    """``--lambda-feat`` above 0 needs VGG19's ImageNet weights where torch keeps them; never downloaded."""
    path = vgg_path()
    if not path.is_file():
        raise PhalanxError(
            f"DeepLIIF's perceptual loss needs VGG19's ImageNet weights: put {VGG_FILE} "
            f"(https://download.pytorch.org/models/{VGG_FILE}, 548 MB) in {path.parent} (TORCH_HOME "
            f"moves it), or train without it: --lambda-feat 0",
            "--lambda-feat",
        )


class VGGLoss(nn.Module):
    """DeepLIIF's perceptual loss, per sample: the L1 distance of VGG19's relu1_1, relu2_1, relu3_1,
    relu4_1 and relu5_1 features (weights 1/32 ... 1) between an output and its target, images in
    [-1, 1] as the generators make them (as DeepLIIF feeds them). Frozen; not a trained network."""

    weights = (1 / 32, 1 / 16, 1 / 8, 1 / 4, 1.0)
    cuts = (2, 7, 12, 21, 30)

    def __init__(self):
        super().__init__()
        from torchvision.models import vgg19

        features = vgg19().features[:30]
        state = torch.load(vgg_path(), map_location="cpu", weights_only=True, mmap=True)
        features.load_state_dict(
            {
                k[len("features.") :]: v
                for k, v in state.items()
                if k.startswith("features.") and int(k.split(".")[1]) < 30
            }
        )
        self.slices = nn.ModuleList(features[a:b] for a, b in zip((0,) + self.cuts, self.cuts))
        self.requires_grad_(False)

    def forward(self, fake: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        loss = fake.new_zeros(len(fake))
        for weight, block in zip(self.weights, self.slices):
            fake, real = block(fake), block(real)
            loss = loss + weight * (fake - real.detach()).abs().flatten(1).mean(1)
        return loss

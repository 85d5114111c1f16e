"""The networks of pix2pix (Isola et al. 2017), as ``pytorch-CycleGAN-and-pix2pix`` defines them and
DeepLIIF inherits them: a U-Net or ResNet generator and a PatchGAN discriminator, with batch,
instance or no normalisation, initialised from N(0, 0.02).

``unet_N`` downsamples log2(N) times, to 1x1 at N pixels: its input sides must be multiples of N
(``unet_256`` for 256-pixel crops, as pix2pix; ``unet_32`` for 32-pixel images).
"""

from __future__ import annotations

import functools
import math
import re

import torch
from torch import nn

from ...errors import PhalanxError

GENERATORS = ("unet_64", "unet_128", "unet_256", "resnet_6blocks", "resnet_9blocks")


def norm_layer(kind: str):
    """pix2pix's choices: BatchNorm (learnable, running statistics), InstanceNorm (neither), none."""
    if kind == "batch":
        return functools.partial(nn.BatchNorm2d, affine=True, track_running_stats=True)
    if kind == "instance":
        return functools.partial(nn.InstanceNorm2d, affine=False, track_running_stats=False)
    return None


def _bias(kind: str) -> bool:
    """A convolution followed by a normalisation gets no bias: BatchNorm has its own, and
    InstanceNorm subtracts every per-channel constant. (pix2pix keeps one before InstanceNorm; it
    computes nothing, its gradient is zero but for rounding, and Adam turns that rounding into
    random steps: two runs that sum a gradient in another order then drift apart by 1e-10.)"""
    return kind == "none"


class UnetBlock(nn.Module):
    """One level of the U-Net: down, the inner levels, up; the input is concatenated to the output
    (the skip connection), except at the outermost level."""

    def __init__(
        self,
        outer: int,
        inner: int,
        norm: str,
        *,
        inputs: int | None = None,
        submodule: nn.Module | None = None,
        outermost: bool = False,
        innermost: bool = False,
        dropout: bool = False,
    ):
        super().__init__()
        self.outermost = outermost
        make_norm, bias = norm_layer(norm), _bias(norm)
        inputs = outer if inputs is None else inputs
        down = nn.Conv2d(inputs, inner, 4, stride=2, padding=1, bias=bias)
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
            ]
            layers += [make_norm(outer)] if make_norm else []
        else:
            assert submodule is not None
            layers = [nn.LeakyReLU(0.2, True), down] + ([make_norm(inner)] if make_norm else [])
            layers += [
                submodule,
                nn.ReLU(True),
                nn.ConvTranspose2d(2 * inner, outer, 4, stride=2, padding=1, bias=bias),
            ]
            layers += ([make_norm(outer)] if make_norm else []) + ([nn.Dropout(0.5)] if dropout else [])
        self.model = nn.Sequential(*layers)

    def forward(self, x):
        return self.model(x) if self.outermost else torch.cat([x, self.model(x)], 1)


def unet(inputs: int, outputs: int, downs: int, ngf: int, norm: str, dropout: bool) -> nn.Module:
    """pix2pix's UnetGenerator: channels ngf, 2ngf, 4ngf, then 8ngf down to the 1x1 innermost level;
    dropout in the 8ngf-to-8ngf levels above the innermost one."""
    widths = [ngf * min(2**level, 8) for level in range(downs)]
    block = UnetBlock(widths[-2], widths[-1], norm, innermost=True)
    for level in range(downs - 2, 0, -1):
        both_widest = widths[level - 1] == widths[level] == 8 * ngf
        block = UnetBlock(widths[level - 1], widths[level], norm, submodule=block, dropout=dropout and both_widest)
    return UnetBlock(outputs, widths[0], norm, inputs=inputs, submodule=block, outermost=True)


class ResnetBlock(nn.Module):
    def __init__(self, width: int, norm: str, dropout: bool):
        super().__init__()
        make_norm, bias = norm_layer(norm), _bias(norm)
        layers: list[nn.Module] = [nn.ReflectionPad2d(1), nn.Conv2d(width, width, 3, bias=bias)]
        layers += ([make_norm(width)] if make_norm else []) + [nn.ReLU(True)] + ([nn.Dropout(0.5)] if dropout else [])
        layers += [nn.ReflectionPad2d(1), nn.Conv2d(width, width, 3, bias=bias)] + (
            [make_norm(width)] if make_norm else []
        )
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.block(x)


def resnet(inputs: int, outputs: int, blocks: int, ngf: int, norm: str, dropout: bool) -> nn.Module:
    """pix2pix's ResnetGenerator: a 7x7 convolution, two downsamplings, residual blocks, two
    upsamplings, a 7x7 convolution and tanh. Input sides: multiples of 4."""
    make_norm, bias = norm_layer(norm), _bias(norm)

    def normed(width):
        return [make_norm(width)] if make_norm else []

    layers: list[nn.Module] = [nn.ReflectionPad2d(3), nn.Conv2d(inputs, ngf, 7, bias=bias), *normed(ngf), nn.ReLU(True)]
    for i in range(2):
        width = ngf * 2**i
        layers += [nn.Conv2d(width, 2 * width, 3, stride=2, padding=1, bias=bias), *normed(2 * width), nn.ReLU(True)]
    layers += [ResnetBlock(4 * ngf, norm, dropout) for _ in range(blocks)]
    for i in range(2, 0, -1):
        width = ngf * 2**i
        layers += [
            nn.ConvTranspose2d(width, width // 2, 3, stride=2, padding=1, output_padding=1, bias=bias),
            *normed(width // 2),
            nn.ReLU(True),
        ]
    layers += [nn.ReflectionPad2d(3), nn.Conv2d(ngf, outputs, 7), nn.Tanh()]
    return nn.Sequential(*layers)


def patch_discriminator(inputs: int, ndf: int, layers: int, norm: str) -> nn.Module:
    """pix2pix's NLayerDiscriminator (70x70 receptive field with 3 layers): one real/fake logit per
    patch, no sigmoid (the loss takes logits)."""
    make_norm, bias = norm_layer(norm), _bias(norm)
    modules: list[nn.Module] = [nn.Conv2d(inputs, ndf, 4, stride=2, padding=1), nn.LeakyReLU(0.2, True)]
    width = ndf
    for n in range(1, layers + 1):
        wider = ndf * min(2**n, 8)
        stride = 2 if n < layers else 1
        modules += [nn.Conv2d(width, wider, 4, stride=stride, padding=1, bias=bias)]
        modules += ([make_norm(wider)] if make_norm else []) + [nn.LeakyReLU(0.2, True)]
        width = wider
    modules.append(nn.Conv2d(width, 1, 4, stride=1, padding=1))
    return nn.Sequential(*modules)


def init_weights(net: nn.Module, gain: float = 0.02) -> nn.Module:
    """pix2pix's 'normal' initialisation: convolutions N(0, gain), BatchNorm scales N(1, gain), biases 0."""
    for module in net.modules():
        if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d)):
            nn.init.normal_(module.weight, 0.0, gain)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.BatchNorm2d):
            nn.init.normal_(module.weight, 1.0, gain)
            nn.init.zeros_(module.bias)
    return net


def unet_size(name: str) -> int | None:
    match = re.fullmatch(r"unet_(\d+)", name)
    return int(match.group(1)) if match else None


def check_generator(name: str, image_size: int, option: str = "--generator") -> None:
    """A generator name pix2pix knows (or unet_N), and an image size it can take."""
    size = unet_size(name)
    if size is not None:
        if size < 4 or size & (size - 1):
            raise PhalanxError(f"unet_N needs N a power of two of at least 4 (got {name})", option)
        if image_size % size:
            raise PhalanxError(
                f"{name} halves its input {int(math.log2(size))} times: --image-size must be a multiple "
                f"of {size} (got {image_size}); or choose unet_{_largest_unet(image_size)}",
                option,
            )
        return
    match = re.fullmatch(r"resnet_(\d+)blocks", name)
    if not match:
        raise PhalanxError(
            f"must be unet_N (a U-Net for N-pixel images) or resnet_Nblocks (N residual blocks), as "
            f"{', '.join(GENERATORS)} (got {name!r})",
            option,
        )
    if image_size % 4:
        raise PhalanxError(
            f"{name} halves its input twice: --image-size must be a multiple of 4 (got {image_size})", option
        )


def check_discriminator(layers: int, image_size: int) -> None:
    """A PatchGAN of ``layers`` layers halves its input ``layers`` times, then its two last 4x4
    convolutions need 3 pixels (3 -> 2 -> 1 logit a patch); smaller, torch failed in the first step,
    after the run directory was made (``unet_16`` at 16 px with the default 3 layers)."""
    if not image_size:  # the data's own size: not known here
        return
    left = image_size
    for _ in range(layers):
        left //= 2  # a 4x4 convolution of stride 2, padding 1
    if left >= 3:
        return
    fits = [n for n in range(1, layers) if image_size // 2**n >= 3]
    # (a larger --image-size also fits, where the generator takes it: unet_N wants a multiple of N)
    hint = f"use --d-layers {fits[-1]}, or a larger --image-size" if fits else "use a larger --image-size"
    raise PhalanxError(
        f"{layers} layers halve the image {layers} times, leaving {left} pixel(s) of the 3 its last layers need "
        f"(--image-size {image_size}); {hint}",
        "--d-layers",
    )


def _largest_unet(image_size: int) -> int:
    size = 4
    while image_size % (size * 2) == 0 and size * 2 <= image_size:
        size *= 2
    return size


def build_generator(name: str, inputs: int, outputs: int, ngf: int, norm: str, dropout: bool) -> nn.Module:
    size = unet_size(name)
    if size is not None:
        return init_weights(unet(inputs, outputs, int(math.log2(size)), ngf, norm, dropout))
    resnet_blocks = re.fullmatch(r"resnet_(\d+)blocks", name)
    assert resnet_blocks is not None  # (check_generator: a U-Net's name or this)
    blocks = int(resnet_blocks.group(1))
    return init_weights(resnet(inputs, outputs, blocks, ngf, norm, dropout))


def build_discriminator(inputs: int, ndf: int, layers: int, norm: str) -> nn.Module:
    return init_weights(patch_discriminator(inputs, ndf, layers, norm))

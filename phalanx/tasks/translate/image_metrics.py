"""Image quality per image, for intensities in [0, 1]: PSNR and SSIM (translate's and DeepLIIF's
validation)."""

from __future__ import annotations

import torch
from torch import nn


def psnr(fake: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Per image, in dB, for intensities in [0, 1]."""
    mse = ((fake - real) ** 2).flatten(1).mean(1).clamp(min=1e-10)
    return 10 * torch.log10(1.0 / mse)


def ssim(
    fake: torch.Tensor, real: torch.Tensor, sigma: float = 1.5, k1: float = 0.01, k2: float = 0.03
) -> torch.Tensor:
    """Per image: SSIM (Wang et al. 2004) with an 11x11 Gaussian window (sigma 1.5), data range 1,
    averaged over the positions where the window fits and over channels (as scikit-image's
    ``structural_similarity(gaussian_weights=True, use_sample_covariance=False)``)."""
    channels, height, width = fake.shape[1:]
    size = min(11, height - (1 - height % 2), width - (1 - width % 2))  # an odd window that fits
    coords = torch.arange(size, dtype=fake.dtype, device=fake.device) - (size - 1) / 2
    gauss = torch.exp(-(coords**2) / (2 * sigma**2))
    gauss = gauss / gauss.sum()
    window = (gauss[:, None] * gauss[None, :]).expand(channels, 1, size, size).contiguous()

    def blur(x: torch.Tensor) -> torch.Tensor:
        return nn.functional.conv2d(x, window, groups=channels)

    mu_x, mu_y = blur(fake), blur(real)
    var_x = blur(fake * fake) - mu_x**2
    var_y = blur(real * real) - mu_y**2
    cov = blur(fake * real) - mu_x * mu_y
    c1, c2 = k1**2, k2**2
    index = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / ((mu_x**2 + mu_y**2 + c1) * (var_x + var_y + c2))
    return index.flatten(1).mean(1)

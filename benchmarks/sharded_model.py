"""The network of benchmarks/sharded.py, for `--model sharded_model:vit` (PYTHONPATH=benchmarks):
a ViT-Base (timm's VisionTransformer: 12 blocks of width 768, 85.8M weights) on 32 px images in
patches of 8, so that its weights and AdamW state (1.3 GiB) dominate and its compute stays small."""

import os

from timm.models.vision_transformer import VisionTransformer


def vit(num_classes, in_channels):
    depth = int(os.environ.get("SHARDED_DEPTH", "12"))  # the memory sweep's blocks (7.1M weights each)
    return VisionTransformer(
        img_size=32,
        patch_size=8,
        in_chans=in_channels,
        num_classes=num_classes,
        embed_dim=768,
        depth=depth,
        num_heads=12,
    )

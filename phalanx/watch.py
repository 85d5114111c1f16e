"""What global rank 0 shows of each epoch besides the losses: a fixed sample of validation images
with the model's predictions, as PNG bytes (plain data for the snapshots, which admit no arrays).
The same images every epoch, so the grid on the page shows the predictions change as training goes.
"""

from __future__ import annotations

import io
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

SAMPLE = 16
SHOWN_SIDE = 64  # small images are enlarged (nearest neighbour) to be seen


class ValidationSample:
    def __init__(self, val: Dataset, classes: list[str], mean: tuple[float, ...], std: tuple[float, ...]):
        count = min(SAMPLE, len(val))
        items = [val[i] for i in range(count)]  # the first images of the split: fixed for the run
        self.images = torch.stack([image for image, _ in items])
        self.labels = [classes[int(label)] for _, label in items]
        self.classes = classes
        shown = self.images * torch.tensor(std).view(-1, 1, 1) + torch.tensor(mean).view(-1, 1, 1)
        self.pngs = [_png(image) for image in shown.clamp(0, 1)]

    @torch.no_grad()
    def record(self, model: nn.Module, epoch: int, device: torch.device, prepare=lambda x: x) -> dict[str, Any]:
        was_training = model.training
        model.eval()
        predicted = model(prepare(self.images.to(device))).argmax(1).tolist()
        model.train(was_training)
        return {"kind": "images", "epoch": epoch, "items": [
            {"png": png, "label": label, "predicted": self.classes[p]}
            for png, label, p in zip(self.pngs, self.labels, predicted)]}


def _png(image: torch.Tensor) -> bytes:
    from PIL import Image

    pixels = (image * 255).round().byte()
    array = pixels[0].numpy() if pixels.shape[0] == 1 else pixels.permute(1, 2, 0).numpy()
    picture = Image.fromarray(array, "L" if pixels.shape[0] == 1 else "RGB")
    if max(picture.size) < SHOWN_SIDE:
        factor = SHOWN_SIDE // max(picture.size)
        picture = picture.resize((picture.width * factor, picture.height * factor), Image.NEAREST)
    buffer = io.BytesIO()
    picture.save(buffer, "PNG")
    return buffer.getvalue()

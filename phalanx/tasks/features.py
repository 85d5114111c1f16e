"""``predict --features``: a network's features of each image, for use outside phalanx (retrieval,
clustering, a classifier of your own): ``OUTPUT.npy``, one row per image, and the images' paths,
one a line in the same order, in ``OUTPUT.txt``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ..atomic import atomic_write, atomic_write_text
from ..data import loader_workers
from ..data.inputs import collate_inputs
from ..errors import PhalanxError
from ..progress import ProgressBar
from .base import full_precision


def check_features_output(output: str) -> None:
    if Path(output).suffix != ".npy":
        raise PhalanxError(f"must end in .npy: the features, one row per image, with the image list beside it in "
                           f".txt (got {Path(output).name})", "--output")


@torch.no_grad()
def write_features(network: nn.Module, images: Dataset, paths: list[Path], opts: Any, device: torch.device,
                   cfg: Any) -> tuple[int, list]:
    """Returns (images written, [(path, why it was skipped)]); writes nothing when no image could be read."""
    workers = loader_workers(cfg.replace(num_workers=opts.num_workers), 1,
                             torch.get_num_threads() if device.type == "cpu" else 1)
    loader = DataLoader(images, batch_size=opts.batch_size, num_workers=workers, collate_fn=collate_inputs)
    network = network.to(device).eval()
    rows, names, skipped = [], [], []
    bar = ProgressBar(len(loader), "features", opts.progress)
    for indices, batch, _, bad in loader:
        skipped += [(paths[i], why) for i, why in bad]
        if batch:
            rows.append(full_precision(network(torch.stack(batch).to(device))).flatten(1).float().cpu().numpy())
            names += [str(paths[i]) for i in indices]
        bar.update(len(indices) + len(bad), lambda: 0.0)
    bar.close()
    if names:
        output = Path(opts.output)
        features = np.concatenate(rows)
        atomic_write(output, lambda fh: np.save(fh, features))
        atomic_write_text(output.with_suffix(".txt"), "".join(name + "\n" for name in names))
    return len(names), skipped

"""What every contender shares: the model, the in-memory data, and how results are reported.

Each contender process writes one JSON object to the file named by $BENCH_RESULT (rank 0 only):
first_step_time (wall clock after the first optimizer step) and the steady-state window
(samples and seconds between the end of warm-up step W and the last step N).
"""

from __future__ import annotations

import json
import os

import torch

MODELS = ("smallcnn", "resnet18")


def build_model(name: str) -> torch.nn.Module:
    if name == "smallcnn":
        from phalanx.models import SmallCNN

        return SmallCNN(num_classes=10, in_channels=3)
    import torchvision

    return torchvision.models.get_model(name, weights=None, num_classes=10)


def synthetic(samples: int, seed: int = 0) -> torch.utils.data.TensorDataset:
    """Seeded random 3x32x32 images in [-1, 1] and labels: the same tensors phalanx makes."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.rand(samples, 3, 32, 32, generator=generator)
    labels = torch.randint(0, 10, (samples,), generator=generator)
    return torch.utils.data.TensorDataset((images - 0.5) / 0.5, labels)


def report(**values) -> None:
    with open(os.environ["BENCH_RESULT"], "w") as fh:
        json.dump(values, fh)


def write_results(name: str, results: dict, lines: list[str]) -> None:
    """benchmarks/results/<name>.json (every figure) and .md (the table), and the table printed."""
    from pathlib import Path

    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(results, indent=2))
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))

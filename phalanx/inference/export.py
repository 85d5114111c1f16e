"""``phalanx export``: a file that loads without phalanx and gives the checkpoint's logits.

``torchscript`` is traced (``torch.jit.load`` opens it); ``exported-program`` is ``torch.export``'s
format (``torch.export.load``), with a dynamic batch size. Both take normalised images of the
training size; how to prepare them, and the class names, go beside the file in ``FILE.json``.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch

from ..atomic import atomic_write, atomic_write_text
from ..errors import PhalanxError
from .model import load_trained
from .options import ExportOptions


def export(opts: ExportOptions) -> Path:
    trained = load_trained(opts.checkpoint, opts.ema)
    model = trained.model.cpu().eval()
    size = trained.pipeline.size
    example = torch.randn(2, trained.channels, size, size, generator=torch.Generator().manual_seed(0))
    output = Path(opts.output)
    try:
        if opts.format == "torchscript":
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # torch 2.10+ calls TorchScript deprecated
                program = torch.jit.trace(model, example)
                atomic_write(output, lambda fh: torch.jit.save(program, fh))
        else:
            batch = torch.export.Dim("batch", min=1, max=4096)
            program = torch.export.export(model, (example,), dynamic_shapes=({0: batch},))
            atomic_write(output, lambda fh: torch.export.save(program, fh))
    except PhalanxError:
        raise
    except Exception as exc:  # a model the tracer or exporter cannot follow
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise PhalanxError(f"cannot export {trained.config.model!r} as {opts.format} ({first[:200]})",
                           "--format") from None
    atomic_write_text(output.with_name(output.name + ".json"),
                      json.dumps({**trained.metadata(), "format": opts.format}, indent=2) + "\n")
    print(f"phalanx: wrote {output} and {output.name}.json ({opts.format}, {trained.config.model}, "
          f"{len(trained.classes)} classes, input {trained.channels}x{size}x{size})")
    return output

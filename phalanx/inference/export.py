"""``phalanx export``: files that load without phalanx and run a checkpoint's networks (a
classifier, a translation's generators, a self-supervised backbone, ...: the task says which).

``torchscript`` is traced (``torch.jit.load`` opens it); ``exported-program`` is ``torch.export``'s
format (``torch.export.load``), with a dynamic batch size. How to prepare inputs and what the
outputs mean go beside each file in ``FILE.json``. A task's own format (``registry.native_formats``)
writes another tool's model directory (its networks' files, which that tool loads).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from ..config import registry
from ..config.inference import ExportOptions
from ..errors import PhalanxError
from ..system.atomic import atomic_write, atomic_write_bytes, atomic_write_text
from .model import load_trained
from .outputs import check_export_files, check_place

SUFFIXES = {"torchscript": (".ts", ".pt", ".pth", ".torchscript", ".jit"), "exported-program": (".pt2",)}


def check_output(output: Path, fmt: str) -> None:
    """An extension the format does not write is refused, not ignored (``m.onnx`` is not TorchScript)."""
    if fmt in registry.native_formats():
        if output.suffix:
            raise PhalanxError(f"--format {fmt} writes a model directory, not a file ({output.name})", "--output")
        return
    if output.suffix.lower() in SUFFIXES[fmt]:
        return
    other = next((f for f, suffixes in SUFFIXES.items() if output.suffix.lower() in suffixes), None)
    hint = (
        f"that is --format {other}'s extension"
        if other
        else "phalanx does not write ONNX; export an exported-program and convert it with torch.onnx"
        if output.suffix.lower() == ".onnx"
        else f"{output.suffix or 'no extension'} is not one"
    )
    raise PhalanxError(f"--format {fmt} writes {', '.join(SUFFIXES[fmt])} files ({output.name}: {hint})", "--output")


def export(opts: ExportOptions) -> list[Path]:
    output = Path(opts.output)
    check_output(output, opts.format)
    check_place(output)
    trained = load_trained(opts.checkpoint, opts.ema)
    inference = trained.inference()
    if opts.format in registry.native_formats():
        return model_directory(output, inference.native_files(opts.format), opts, trained.config.task)
    scripted = inference.script_export
    if scripted and opts.format != "torchscript":
        raise PhalanxError(
            f"--task {trained.config.task} exports as torchscript only (scripted: its network takes a "
            "list of images, which torch.export cannot follow)",
            "--format",
        )
    modules = inference.export_modules()
    paths = {
        name: output if len(modules) == 1 else output.with_name(f"{output.stem}_{name}{output.suffix}")
        for name in modules
    }
    check_export_files(list(paths.values()), opts.checkpoint, opts.overwrite)
    written = []
    for name, (module, example) in modules.items():
        path = paths[name]
        if isinstance(example, torch.Tensor) and example.is_floating_point():  # a float64 run (--precision fp64)
            example = example.to(next((p.dtype for p in module.parameters()), example.dtype))
        _write(
            path,
            module.cpu().eval(),
            example,
            opts.format,
            trained.config.network.model if name == "model" else name,
            scripted,
        )
        meta = {
            **inference.export_metadata(),
            "network": name,
            "task": trained.config.task,
            "format": opts.format,
            "checkpoint": str(trained.path.resolve()),
            "input_shape": list(example.shape[1:]),
        }
        atomic_write_text(path.with_name(path.name + ".json"), json.dumps(meta, indent=2) + "\n")
        written.append(path)
        print(
            f"phalanx: wrote {path} and {path.name}.json ({opts.format}, {trained.config.task} {name}, "
            f"input {'x'.join(map(str, example.shape[1:]))})"
        )
    return written


def model_directory(
    folder: Path, files: dict[str, Callable[[], bytes]] | None, opts: ExportOptions, task: str
) -> list[Path]:
    """Another tool's own model directory (a task's ``--format``), each file written atomically; a
    directory that already holds one of them is left as it is without ``--overwrite``."""
    if files is None:
        raise PhalanxError(
            f"--format {opts.format} writes --task {opts.format}'s networks; this checkpoint's task is {task}",
            "--format",
        )
    if folder.exists() and not folder.is_dir():
        raise PhalanxError(f"{folder} exists and is not a directory", "--output")
    taken = [name for name in files if (folder / name).exists()]
    if taken and not opts.overwrite:
        raise PhalanxError(f"{folder / taken[0]} exists; --overwrite replaces the model files there", "--output")
    folder.mkdir(parents=True, exist_ok=True)
    made = {name: make() for name, make in files.items()}  # all made before any is written
    for name, data in made.items():
        atomic_write_bytes(folder / name, data)
    print(
        f"phalanx: wrote {len(files)} files to {folder} ({opts.format}'s model directory: "
        f"{', '.join(list(files)[:3])}, ...)"
    )
    return [folder / name for name in files]


def _write(
    path: Path, module: torch.nn.Module, example: torch.Tensor, fmt: str, what: str, scripted: bool = False
) -> None:
    """``scripted``: a network whose input is not one tensor (a detector's list of images) is
    scripted (``torch.jit.script``), not traced."""
    try:
        if fmt == "torchscript":
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # torch 2.10+ calls TorchScript deprecated
                warnings.simplefilter("ignore", torch.jit.TracerWarning)
                program = torch.jit.script(module) if scripted else torch.jit.trace(module, example)
                atomic_write(path, lambda fh: torch.jit.save(program, fh))
        else:
            batch = torch.export.Dim("batch", min=1, max=4096)
            program = torch.export.export(module, (example,), dynamic_shapes=({0: batch},))
            atomic_write(path, lambda fh: torch.export.save(program, fh))
    except PhalanxError:
        raise
    except Exception as exc:  # a model the tracer or exporter cannot follow
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise PhalanxError(f"cannot export {what!r} as {fmt} ({first[:200]})", "--format") from None

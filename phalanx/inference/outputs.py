"""Where ``evaluate``, ``predict`` and ``export`` write, checked before any work: the folder is there
and writable, the file is not the checkpoint being read, and a file already there is replaced only
when phalanx wrote it (``--overwrite`` for any other), so no command destroys what it did not make.

phalanx recognises its own files by what it writes in them: ``evaluate``'s results JSON by its keys,
an export by its ``FILE.json`` sidecar, ``predict``'s CSV by its header, its JSON lines and
detections by their keys, and features by the ``.npy`` and ``.txt`` that agree on the image count.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import PhalanxError

OPTION = "--output"
RESULTS_KEYS = {"checkpoint", "data", "task", "metrics"}
EXPORT_KEYS = {"network", "task", "format", "checkpoint"}
CSV_HEADER = "path,class,probability,top_k"
ROW_KEYS = {"path", "class", "probability", "top_k"}
DETECTION_KEYS = {"image_id", "category_id", "bbox", "score"}
MOST_READ = 256 << 20  # a JSON file larger than this is not read to recognise it (and is not ours)


def check_place(output: Path) -> None:
    """The folder a file goes in exists and is writable (else the work would be done for nothing)."""
    folder = output.parent
    if not folder.exists():
        raise PhalanxError(f"cannot write {output}: the folder {folder} does not exist", OPTION)
    if not folder.is_dir():
        raise PhalanxError(f"cannot write {output}: {folder} is not a folder", OPTION)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PhalanxError(f"cannot write {output}: the folder {folder} is not writable", OPTION)


def check_folder_place(output: Path) -> None:
    """A folder of outputs is made with its parents: the nearest folder that exists must be writable."""
    existing = next((p for p in (output, *output.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        raise PhalanxError(f"cannot make the folder {output}: {existing} is a file", OPTION)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PhalanxError(f"cannot write under {output}: the folder {existing} is not writable", OPTION)


def check_file(output: Path, checkpoint: str, overwrite: bool, ours: Callable[[Path], bool], what: str) -> None:
    """``output`` may be written: never the checkpoint; a file already there only if phalanx wrote it
    (``ours``) or with ``--overwrite``."""
    check_place(output)
    if not output.exists():
        return
    if output.is_dir():
        raise PhalanxError(f"{output} is a folder; give a file name", OPTION)
    if _same_file(output, Path(checkpoint)):
        raise PhalanxError(f"{output} is the checkpoint itself (--checkpoint); write {what} elsewhere", OPTION)
    if not overwrite and not ours(output):
        raise PhalanxError(
            f"{output} exists and is not {what} phalanx wrote; pass --overwrite to replace it, or choose another file",
            OPTION,
        )


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)  # links and hard links included
    except OSError:
        return False


def _json(path: Path) -> Any:
    try:
        if path.stat().st_size > MOST_READ:
            return None
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _first_line(path: Path) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.readline(1 << 16).rstrip("\r\n")
    except OSError:
        return ""


def evaluate_results(path: Path) -> bool:
    found = _json(path)
    return isinstance(found, dict) and RESULTS_KEYS <= found.keys()


def export_sidecar(path: Path) -> bool:
    found = _json(path)
    return isinstance(found, dict) and EXPORT_KEYS <= found.keys()


def exported_file(path: Path) -> bool:
    """A file ``export`` wrote: its ``FILE.json`` says so."""
    return export_sidecar(path.with_name(path.name + ".json"))


def predictions(path: Path) -> bool:
    """A file ``predict`` wrote (by its suffix: CSV, JSON lines, detections, features)."""
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return _first_line(path) == CSV_HEADER
    if suffix == ".jsonl":
        try:
            row = json.loads(_first_line(path))
        except ValueError:
            return False
        return isinstance(row, dict) and ROW_KEYS <= row.keys()
    if suffix == ".json":
        found = _json(path)
        return isinstance(found, list) and all(isinstance(d, dict) and DETECTION_KEYS <= d.keys() for d in found)
    if suffix in (".npy", ".txt"):
        return _features_pair(path)
    return False


def _features_pair(path: Path) -> bool:
    """``OUTPUT.npy`` (one row per image) and ``OUTPUT.txt`` (one image a line), agreeing on the count."""
    import numpy as np

    try:
        rows = np.load(path.with_suffix(".npy"), mmap_mode="r", allow_pickle=False).shape[:1]
        with open(path.with_suffix(".txt"), "rb") as fh:
            lines = sum(1 for _ in fh)
    except (OSError, ValueError):
        return False
    return rows == (lines,)


def check_predict_place(output: Path) -> None:
    """Where ``predict`` writes, before the model loads: a file's folder, or a folder of files."""
    if output.suffix:
        check_place(output)
    else:
        check_folder_place(output)


def check_apart(inputs: tuple[str, ...], output: Path) -> None:
    """A folder of outputs and the images it is made of stay apart: outputs written among the inputs
    would be read back as images by the next predict of that folder (and inputs inside the output
    folder would be mixed with what predict writes there)."""
    written = Path(os.path.realpath(output))
    for item in inputs:
        given = Path(os.path.realpath(item))
        if given.is_dir() and (written == given or given in written.parents):
            raise PhalanxError(
                f"{output} is inside the input folder {item}: the next predict of {item} would read "
                "these outputs back as images; write them to a folder outside it",
                OPTION,
            )
        if written in given.parents:
            raise PhalanxError(
                f"the input {item} is inside the output folder {output}: predict writes its own "
                "files there; give an output folder that holds no input",
                OPTION,
            )


def check_predict_files(output: Path, features: bool, checkpoint: str, overwrite: bool) -> None:
    """``predict``'s files: OUTPUT (and OUTPUT.txt beside features); a folder of per-image files is
    checked only for where it goes (each file in it has a name of phalanx's own)."""
    if not output.suffix and not features:
        check_folder_place(output)
        return
    files = [output, output.with_suffix(".txt")] if features or output.suffix == ".npy" else [output]
    for path in files:
        check_file(path, checkpoint, overwrite, predictions, "a predictions file")


def check_export_files(paths: list[Path], checkpoint: str, overwrite: bool) -> None:
    """Each exported file and its ``FILE.json``."""
    for path in paths:
        check_file(path, checkpoint, overwrite, exported_file, "an export")
        check_file(path.with_name(path.name + ".json"), checkpoint, overwrite, export_sidecar, "an export's sidecar")

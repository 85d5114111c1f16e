"""A folder's manifest: every image file with its size, mtime, label and whether it opens.

Checking every image of a 100,000-file folder one by one, on every rank, before each run took
minutes. The manifest keeps the result of each check in phalanx's cache (``$PHALANX_CACHE``, else
``$XDG_CACHE_HOME/phalanx``, else ``~/.cache/phalanx``; never in the data folder or the run), keyed
by the folder's absolute path. A run lists the folder (names, sizes, mtimes: fast), checks only
files that are new or changed since the manifest, in parallel, and writes the manifest back. The
first process to get there does the checking, under a file lock; every other rank reads its result.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..atomic import atomic_write_text
from ..cores import available_cores
from ..errors import PhalanxError

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}
VERSION = 1
PARALLEL_FROM = 256  # fewer files than this are checked in this process


@dataclass
class Scanned:
    classes: list[str]
    files: list[tuple[str, int, int, int]]  # (path relative to the split, size, mtime_ns, label)


@dataclass
class Checked:
    classes: list[str]
    paths: list[str]  # relative to the split folder, in scan order (class, then name)
    labels: list[int]
    broken: dict[str, str]  # path -> why it does not open


def cache_dir() -> Path:
    if os.environ.get("PHALANX_CACHE"):
        return Path(os.environ["PHALANX_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "phalanx"


def scan(split_dir: Path, classes: list[str] | None, unlabelled: bool = False) -> Scanned:
    """Class folders and their image files (recursively), with sizes and mtimes; no file is opened.
    ``unlabelled``: a folder of images without class folders is valid too (label -1 each)."""
    found = sorted(p.name for p in os.scandir(split_dir) if p.is_dir() and not p.name.startswith("."))
    if not found and unlabelled:
        images = [(rel, size, mtime, -1) for rel, size, mtime in _list_images(split_dir)]
        if images:
            return Scanned([], images)
    if not found and unlabelled:
        raise PhalanxError(f"{split_dir} has no images; expected {split_dir}/<images> or {split_dir}/<class>/<images>",
                           "--dataroot")
    if not found:
        raise PhalanxError(f"{split_dir} has no class folders; expected {split_dir}/<class>/<images>", "--dataroot")
    if classes is not None and found != classes:
        raise PhalanxError(f"{split_dir} has classes {found}, but train/ has {classes}", "--dataroot")
    with ThreadPoolExecutor(max_workers=8) as pool:  # listing and stat are I/O: threads overlap them
        per_class = list(pool.map(lambda name: _list_images(split_dir / name), found))
    files = []
    for label, (name, entries) in enumerate(zip(found, per_class)):
        if not entries:
            raise PhalanxError(f"class folder {split_dir / name} has no images ({', '.join(sorted(IMAGE_SUFFIXES))})",
                               "--dataroot")
        files += [(f"{name}/{rel}", size, mtime, label) for rel, size, mtime in entries]
    return Scanned(found, files)


def _list_images(folder: Path, prefix: str = "") -> list[tuple[str, int, int]]:
    entries = []
    with os.scandir(folder) as it:
        for entry in it:
            if entry.is_dir(follow_symlinks=True) and not entry.name.startswith("."):
                entries += _list_images(Path(entry.path), f"{prefix}{entry.name}/")
            elif os.path.splitext(entry.name)[1].lower() in IMAGE_SUFFIXES:
                stat = entry.stat()
                entries.append((prefix + entry.name, stat.st_size, stat.st_mtime_ns))
    return sorted(entries)


def check_file(path: str) -> str | None:
    """Why an image does not open (PIL reads its header and checks its structure), or None."""
    from PIL import Image

    try:
        with Image.open(path) as img:
            img.verify()
        return None
    except Exception as exc:
        return type(exc).__name__


def checked(split_dir: Path, classes: list[str] | None = None, unlabelled: bool = False) -> Checked:
    """Scan the folder and check every new or changed file, sharing results through the manifest."""
    scanned = scan(split_dir, classes, unlabelled)
    root = split_dir.resolve()
    cache = cache_dir() / f"manifest-{hashlib.sha256(str(root).encode()).hexdigest()[:24]}.json"
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        lock = open(cache.with_suffix(".lock"), "a")
    except OSError:  # no writable cache: check everything, keep nothing
        return _result(scanned, _check_all(root, scanned.files, {}))
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one process checks; the others wait and read its result
        known = _read(cache, root)
        results = _check_all(root, scanned.files, known)
        if results != {path: known.get(path) for path in results}:
            record = {"version": VERSION, "root": str(root), "files": results}
            try:
                atomic_write_text(cache, json.dumps(record, separators=(",", ":")))
            except PhalanxError:  # a full or read-only cache: the run goes on without it
                pass
    return _result(scanned, results)


def _read(cache: Path, root: Path) -> dict[str, list]:
    try:
        record = json.loads(cache.read_text())
        return record["files"] if record.get("version") == VERSION and record.get("root") == str(root) else {}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _check_all(root: Path, files: list[tuple[str, int, int, int]], known: dict[str, list]) -> dict[str, list]:
    """path -> [size, mtime_ns, why it does not open or None], checking only what changed."""
    results, todo = {}, []
    for rel, size, mtime, _ in files:
        entry = known.get(rel)
        if isinstance(entry, list) and len(entry) == 3 and entry[:2] == [size, mtime]:
            results[rel] = entry
        else:
            todo.append((rel, size, mtime))
    paths = [str(root / rel) for rel, _, _ in todo]
    cores = available_cores()
    if len(todo) >= PARALLEL_FROM and cores > 1:
        # fork: a child needs PIL only, and a fresh interpreter would import torch again
        with ProcessPoolExecutor(max_workers=cores, mp_context=multiprocessing.get_context("fork")) as pool:
            outcomes = list(pool.map(check_file, paths, chunksize=256))
    else:
        outcomes = [check_file(p) for p in paths]
    for (rel, size, mtime), why in zip(todo, outcomes):
        results[rel] = [size, mtime, why]
    return results


def _result(scanned: Scanned, results: dict[str, list]) -> Checked:
    paths, labels, broken = [], [], {}
    for rel, _, _, label in scanned.files:
        why = results[rel][2]
        if why is None:
            paths.append(rel)
            labels.append(label)
        else:
            broken[rel] = why
    return Checked(scanned.classes, paths, labels, broken)

"""Reading and decoding one small JPEG: phalanx's path against the read it replaced and torchvision's
own calls (~1 min on 2 cores, one thread).

    .venv/bin/python benchmarks/read_decode.py

Over the same 300 files of the 160x160 folder of ``benchmarks/loader.py`` (made if missing), the
best of 7 passes of each, the contenders interleaved: microseconds a file.
- reads: ``read(256 MiB + 1)`` (phalanx's read before 2026-11-27), ``read_bounded`` (now),
  torchvision's ``read_file``;
- read and decode: that old read with torchvision's ``decode_jpeg`` wrapper (phalanx before),
  ``read_bounded`` with the decoder op (phalanx now), ``read_file`` + ``decode_jpeg``.
Results: benchmarks/results/read_decode.{json,md}.
"""

from __future__ import annotations

import platform
import sys
import time
import warnings

import torch
from common import write_results
from loader import jpeg_folder

from phalanx.data import images

LIMIT = 256 * 1024 * 1024


def old_read(path) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(LIMIT + 1)


def old_read_and_decode(path) -> torch.Tensor:
    from torchvision.io import ImageReadMode, decode_jpeg

    data = old_read(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)


def torchvision_read_and_decode(path) -> torch.Tensor:
    from torchvision.io import decode_jpeg, read_file

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return decode_jpeg(read_file(str(path)))


def main() -> int:
    from torchvision.io import read_file

    torch.set_num_threads(1)
    files = sorted((jpeg_folder("small") / "train" / "class0").glob("*.jpg"))[:300]
    contenders = {
        "read: read(256 MiB + 1), before": old_read,
        "read: read_bounded, now": images.read_bounded,
        "read: torchvision read_file": lambda path: read_file(str(path)),
        "read and decode: phalanx before": old_read_and_decode,
        "read and decode: phalanx now": lambda path: images.decode(images.read_bounded(path), "RGB", 32, True),
        "read and decode: read_file + decode_jpeg": torchvision_read_and_decode,
    }
    for contender in contenders.values():  # warm: imports, the page cache
        for path in files:
            contender(path)
    best = {name: float("inf") for name in contenders}
    for _ in range(7):
        for name, contender in contenders.items():
            started = time.perf_counter()
            for path in files:
                contender(path)
            best[name] = min(best[name], (time.perf_counter() - started) / len(files) * 1e6)
    machine = f"{platform.machine()}, {platform.python_version()}, torch {torch.__version__}"
    lines = [
        f"{time.strftime('%Y-%m-%d')}, {machine}; 300 JPEGs of 160x160, best of 7 passes, one thread",
        "",
        "| contender | us a file |",
        "| --- | --- |",
    ]
    lines += [f"| {name} | {us:.1f} |" for name, us in best.items()]
    write_results("read_decode", {"date": time.strftime("%Y-%m-%d"), "machine": machine, "us_per_file": best}, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The program torchrun starts for each DDP worker: ``python -m phalanx.worker CONFIG_JSON``.

The configuration arrives as one argv element (JSON), exactly as the launcher built it. A worker
that refuses bad input writes the one-line reason to torchrun's error file (the launcher prints
it, naming the rank) and exits 2; any other exception is recorded with its traceback.
"""

from __future__ import annotations

import json
import os
import sys
import time

from .config import RunConfig
from .errors import PhalanxError
from .lifeline import die_with_parent


def _report(exc: PhalanxError) -> None:
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        with open(path, "w") as fh:
            json.dump({"message": str(exc), "timestamp": int(time.time())}, fh)
    else:  # started by hand: say it ourselves
        print(f"phalanx: {exc}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import record

    die_with_parent(os.getppid())  # SIGTERM when the launcher dies, even by SIGKILL: no orphans

    from .run import train_run

    argv = sys.argv[1:] if argv is None else argv
    try:
        cfg = RunConfig.from_json(argv[0])
        record(train_run)(cfg)
    except PhalanxError as exc:
        _report(exc)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    from .parallel import exit_process

    exit_process(main())

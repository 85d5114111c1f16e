"""The program torchrun starts for each DDP worker: ``python -m phalanx.launch.worker CONFIG_JSON``.

The configuration arrives as one argv element (JSON), exactly as the launcher built it. A worker
prints no traceback: it writes its one-line reason (and the traceback, as torch's own error
handler does) to torchrun's error file, and the launcher prints one line per failed rank. The
traceback is also in ``<run dir>/logs/rank<R>.log``, and in torchrun's ``--log_dir`` when given.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

from ..config import RunConfig
from ..distributed.processes import die_with_parent
from ..errors import EXIT_FAILED, PhalanxError, RunFailed


def _report(message: str, exc: BaseException) -> None:
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:  # started by hand: say it ourselves
        print(f"phalanx: {message}", file=sys.stderr)
        return
    # torch's ErrorHandler format, so torchrun and its tools read it as their own.
    info = {
        "py_callstack": "".join(traceback.format_exception(exc)),
        "timestamp": str(int(time.time())),
        "time_ns": time.time_ns(),
    }
    with open(path, "w") as fh:
        json.dump({"message": {"message": message, "extraInfo": info}}, fh)


def main(argv: list[str] | None = None) -> int:
    die_with_parent(os.getppid())  # SIGTERM when the launcher dies, even by SIGKILL: no orphans

    from ..train.run import train_run

    argv = sys.argv[1:] if argv is None else argv
    try:
        train_run(RunConfig.from_json(argv[0]))
    except RunFailed as exc:  # a signal (130/143), a failure with its log (1); the launcher names the rank
        _report(exc.message, exc)
        return exc.exit_code
    except PhalanxError as exc:  # bad input (2): the message names the option
        _report(str(exc), exc)
        return exc.exit_code
    except Exception as exc:  # only a bug in phalanx reaches here: still one line
        _report(f"{type(exc).__name__}: {exc}".splitlines()[0], exc)
        return EXIT_FAILED
    return 0


if __name__ == "__main__":
    from ..distributed.processes import exit_process

    exit_process(main())

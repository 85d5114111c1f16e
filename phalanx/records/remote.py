"""Copies of written files to remote storage, in the background.

Two kinds of destination: ``--remote-transfer s3://bucket/prefix`` (boto3, the standard AWS
credential chain, ``--s3-endpoint-url`` for S3-compatible stores) and ``--remote-transfer-cmd
module.function``, a user's function imported by name (never exec/eval) and called with the local
path. One background thread does the work so a training step never waits on the network; a
failure is retried with backoff, warned about, and summarised at the end; it never stops training.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..config.sections import parse_s3_url
from ..errors import PhalanxError
from ..system.plugins import import_user_module

Send = Callable[[Path, str], None]  # (local path, key relative to the run) -> None, raises on failure


def s3_client(endpoint_url: str | None):
    import boto3
    from botocore.config import Config

    # Short timeouts and no hidden retries: phalanx retries itself and must notice an outage.
    config = Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 1, "mode": "standard"})
    return boto3.client("s3", endpoint_url=endpoint_url, config=config)


def s3_sender(url: str, endpoint_url: str | None) -> Send:
    bucket, prefix = parse_s3_url(url, "--remote-transfer")
    client = s3_client(endpoint_url)

    def send(path: Path, key: str) -> None:
        client.upload_file(str(path), bucket, f"{prefix}/{key}" if prefix else key)

    return send


def import_function(spec: str, option: str) -> Callable:
    """``pkg.module.function`` -> the function, imported by name (nothing evaluated)."""
    module_name, _, func_name = spec.rpartition(".")
    if not module_name or not func_name.isidentifier():
        raise PhalanxError(f"expected module.function, got {spec!r}", option)
    module = import_user_module(module_name, option)
    func = getattr(module, func_name, None)
    if not callable(func):
        raise PhalanxError(f"module '{module_name}' has no function '{func_name}'", option)
    return func


def command_sender(spec: str) -> Send:
    func = import_function(spec, "--remote-transfer-cmd")
    return lambda path, key: func(str(path))


@dataclass
class Failure:
    key: str
    error: str


class Uploader:
    """A queue of files and one thread that sends them, retrying with exponential backoff.

    A path queued again before it was sent is sent once, in its newest version: the files are
    replaced atomically, so what is read is always a complete file. At the end of a run, what is
    still queued gets ``close_timeout`` seconds: storage that is down does not hold the run up for
    the whole backoff; what did not make it is listed.
    """

    def __init__(
        self,
        senders: list[Send],
        attempts: int = 5,
        backoff: float = 0.5,
        warn: Callable[[str], None] | None = None,
        close_timeout: float = 15.0,
    ):
        self.senders, self.attempts, self.backoff = senders, attempts, backoff
        self.close_timeout = close_timeout
        self.warn = warn or (lambda line: print(f"phalanx: warning: {line}", file=sys.stderr, flush=True))
        self.failed: dict[str, str] = {}  # file (key) -> why its newest copy did not make it
        self.keys: set[str] = set()  # every file submitted
        self._outage = False  # said "uploads failing" and not yet "resumed"
        self._deadline: float | None = None  # set by close()
        self._queue: queue.Queue[tuple[Path, str] | None] = queue.Queue()
        self._pending: set[tuple[Path, str]] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="phalanx-uploader", daemon=True)
        self._thread.start()

    @property
    def failures(self) -> list[Failure]:
        return [Failure(key, error) for key, error in sorted(self.failed.items())]

    def submit(self, path: Path, key: str) -> None:
        with self._lock:
            self.keys.add(key)
            if (path, key) in self._pending:
                return
            self._pending.add((path, key))
        self._queue.put((path, key))

    def close(self) -> list[Failure]:
        """Send what is queued (within ``close_timeout``), stop the thread, report what failed."""
        self._deadline = time.monotonic() + self.close_timeout
        self._queue.put(None)
        self._thread.join()
        if self.failed:
            self.warn(
                f"{len(self.failed)} of {len(self.keys)} file(s) not uploaded: "
                + "; ".join(f"{f.key} ({f.error})" for f in self.failures[:5])
            )
        return self.failures

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            path, key = item
            with self._lock:
                self._pending.discard(item)
            for send in self.senders:
                self._send_with_retries(send, path, key)

    def _past_deadline(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline

    def _send_with_retries(self, send: Send, path: Path, key: str) -> None:
        for attempt in range(1, self.attempts + 1):
            if attempt > 1 and self._past_deadline():
                self.failed[key] = f"not sent before the run ended ({self.failed.get(key, 'storage down')})"
                return
            try:
                send(path, key)
                self.failed.pop(key, None)  # a newer copy made it
                if self._outage:
                    self._outage = False
                    self.warn(f"uploads resumed ({key} sent)")
                return
            except Exception as exc:  # network, credentials, the user's function: never fatal
                error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
                self.failed[key] = error
                if not self._outage:  # say it at once, not only when the retries run out
                    self._outage = True
                    self.warn(f"uploads failing ({key}: {error}); retrying with backoff, training goes on")
                if attempt == self.attempts:
                    self.warn(f"upload of {key} failed after {attempt} attempts: {error}")
                    return
                pause = min(self.backoff * 2 ** (attempt - 1), 30.0)
                if self._deadline is not None:
                    pause = max(0.0, min(pause, self._deadline - time.monotonic()))
                time.sleep(pause)


def make_uploader(
    remote_transfer: str | None, remote_transfer_cmd: str | None, s3_endpoint_url: str | None
) -> Uploader | None:
    """Checked at start-up, before anything is written: a bad spec is one clear error."""
    senders = []
    if remote_transfer_cmd:
        senders.append(command_sender(remote_transfer_cmd))
    if remote_transfer:
        senders.append(s3_sender(remote_transfer, s3_endpoint_url))
    return Uploader(senders) if senders else None

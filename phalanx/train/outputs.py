"""What global rank 0 writes besides checkpoints, in one place: the metrics log, the loss
snapshots, and the copies of every written file sent to remote storage."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from ..checkpoint.rundir import METRICS, MetricsLog, read_metrics
from ..config import RunConfig
from ..records.remote import Uploader, make_uploader
from ..records.snapshots import SnapshotWriter
from ..system.atomic import atomic_write


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


class RunOutputs:
    """Rank 0 builds it with ``enabled=True``; on other ranks every method does nothing."""

    def __init__(self, cfg: RunConfig, enabled: bool):
        self.cfg, self.enabled = cfg, enabled
        self.metrics = MetricsLog(cfg.run_dir, enabled)
        # Built (and so checked) on every rank before anything is written: a bad
        # --remote-transfer-cmd is a one-line error, not a failure after the first epoch.
        uploader = make_uploader(
            cfg.storage.remote_transfer, cfg.storage.remote_transfer_cmd, cfg.storage.s3_endpoint_url
        )
        self.uploader: Uploader | None = uploader if enabled else None
        if uploader is not None and not enabled:
            uploader.close()
        self.snapshots: SnapshotWriter | None = None

    def start(self, run_id: str, panes: list[dict[str, Any]], best: dict[str, Any]) -> None:
        """Open the snapshot history: the metrics so far (a resumed run's, trimmed) and onwards,
        with the task's dashboard panes."""
        if not self.enabled:
            return
        self.snapshots = SnapshotWriter(
            directory=self.cfg.snapshot_dir,
            run_id=run_id,
            options=self.cfg.to_dict(),
            every_seconds=self.cfg.output.snapshot_every,
            on_written=lambda p: self._upload(p, f"pickle/{p.name}"),
            write_file=lambda path, data: atomic_write(path, lambda fh: fh.write(data)),
        )
        metrics = self.cfg.run_dir / METRICS
        history = read_metrics(metrics) if metrics.exists() else []
        self.snapshots.start([{"kind": "panes", "panes": panes, "best": best}, *history])

    def record(self, record: dict[str, Any], flush: bool = False) -> None:
        if not self.enabled:
            return
        self.metrics.write(record)
        if self.snapshots is not None:
            self.snapshots.add(record)
            if flush:
                self.snapshots.flush()

    def snapshot_only(self, record: dict[str, Any]) -> None:
        """A record for the dashboard that the metrics log (JSON) does not keep: image bytes."""
        if self.snapshots is not None:
            self.snapshots.add(record)

    def status(self, state: str, **details: Any) -> None:
        """The run's state for the dashboard (running, restarted, preempted, failed); best effort: a
        failing run's last words must not hide why it failed."""
        try:
            self.record({"kind": "status", "state": state, "time": time.time(), **details}, flush=True)
        except Exception:
            pass

    def files_written(self, paths: list[Path]) -> None:
        for path in paths:
            self._upload(path, path.name)

    def close(self) -> None:
        """Final snapshot, then wait for the uploads (each retried) and report failures."""
        if self.snapshots is not None:
            self.snapshots.flush()
        if self.uploader is not None:
            self.uploader.close()
            self.uploader = None

    def _upload(self, path: Path, key: str) -> None:
        if self.uploader is not None:
            # Keys keep the run's name: s3://bucket/prefix/<name>/latest.pt, .../<name>/pickle/...
            self.uploader.submit(path, f"{self.cfg.name}/{key}")

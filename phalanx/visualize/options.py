"""``phalanx visualize``'s options: the snapshot folders to plot, the visdom server, how often to look."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VisualizeOptions:
    pickle_dir: tuple[str, ...]
    server: str = "http://localhost"
    port: int = 8097
    interval: float = 2.0
    once: bool = False
    env: str | None = None
    s3_endpoint_url: str | None = None
    listen_all: bool = False
    visdom_log: str | None = None

"""``phalanx visualize``: loss snapshots -> a visdom server. The only module that imports visdom;
it never imports torch, so it runs anywhere the snapshots can be read (a laptop, another node).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import snapshots
from .errors import PhalanxError
from .lifeline import die_with_parent
from .snapshots import History

LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class VisualizeOptions:
    pickle_dir: str
    server: str = "http://localhost"
    port: int = 8097
    interval: float = 2.0
    once: bool = False
    env: str | None = None
    s3_endpoint_url: str | None = None
    listen_all: bool = False
    visdom_log: str | None = None


# --- reading snapshots -------------------------------------------------------------------------

class SnapshotSource:
    """Reads the segments of a pickle dir, caching unchanged files; warns once per bad file."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[Any, dict[str, Any] | None]] = {}  # name -> (version, segment)
        self.problems: dict[str, str] = {}  # bad file -> why, as last seen
        self._warned: set[tuple[str, Any]] = set()

    def _files(self) -> list[tuple[str, Any]]:
        """(segment file name, version) pairs; the version changes when the file does."""
        raise NotImplementedError

    def _read(self, name: str) -> bytes:
        raise NotImplementedError

    def history(self, warn: bool) -> History | None:
        segments = []
        for name, version in self._files():
            cached = self._cache.get(name)
            if cached is None or cached[0] != version:
                cached = (version, self._load(name, version, warn))
                self._cache[name] = cached
            if cached[1] is not None:
                segments.append(cached[1])
        return snapshots.assemble(segments)

    def _load(self, name: str, version: Any, warn: bool) -> dict[str, Any] | None:
        try:
            segment = snapshots.loads(self._read(name))
            self.problems.pop(name, None)
            return segment
        except FileNotFoundError:  # replaced or removed between listing and reading: next poll
            return None
        except Exception as exc:  # corrupt, partial, hostile: refuse it, keep going
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
            self.problems[name] = why
            if warn and (name, version) not in self._warned:
                self._warned.add((name, version))
                print(f"phalanx: warning: ignoring snapshot {name}: {why}", file=sys.stderr, flush=True)
            return None


class LocalSource(SnapshotSource):
    def __init__(self, directory: Path):
        super().__init__()
        if not directory.is_dir():
            raise PhalanxError(f"{directory} does not exist; training's global rank 0 creates it "
                               "(<checkpoints-dir>/<name>/pickle by default)", "--pickle-dir")
        self.directory = directory

    def _files(self) -> list[tuple[str, Any]]:
        found = []
        for path in self.directory.iterdir():
            if snapshots.SEGMENT_NAME.match(path.name):
                try:
                    stat = path.stat()
                except FileNotFoundError:
                    continue
                found.append((path.name, (stat.st_mtime_ns, stat.st_size, stat.st_ino)))
        return sorted(found)

    def _read(self, name: str) -> bytes:
        return (self.directory / name).read_bytes()


class S3Source(SnapshotSource):
    def __init__(self, url: str, endpoint_url: str | None):
        super().__init__()
        from .remote import parse_s3_url, s3_client

        self.bucket, prefix = parse_s3_url(url, "--pickle-dir")
        self.prefix = f"{prefix}/" if prefix else ""
        self.client = s3_client(endpoint_url)

    def _files(self) -> list[tuple[str, Any]]:
        found = []
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix)
        for page in pages:
            for obj in page.get("Contents", []):
                name = obj["Key"][len(self.prefix):]
                if snapshots.SEGMENT_NAME.match(name):
                    found.append((name, obj["ETag"]))
        return sorted(found)

    def _read(self, name: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=self.prefix + name)["Body"].read()


def open_source(opts: VisualizeOptions) -> SnapshotSource:
    if opts.pickle_dir.startswith("s3://"):
        return S3Source(opts.pickle_dir, opts.s3_endpoint_url)
    return LocalSource(Path(opts.pickle_dir))


# --- plotting ----------------------------------------------------------------------------------

class Plotter:
    """Three windows per run: train loss, validation loss/accuracy, learning rate. New points are
    appended; a new generation (a resume or restart) or a new run redraws from the history."""

    def __init__(self, viz: Any, env: str | None):
        self.viz, self.fixed_env = viz, env
        self.key: tuple[str, int] | None = None
        self.env = ""
        self.drawn = {"train": 0, "val": 0}

    def update(self, history: History) -> int:
        """Plot what is new; returns the number of points added."""
        train = [r for r in history.records if r.get("kind") == "train"]
        val = [r for r in history.records if r.get("kind") == "val"]
        key = (history.run_id, history.generation)
        if key != self.key or len(train) < self.drawn["train"] or len(val) < self.drawn["val"]:
            name = str(history.options.get("name", "run"))
            self.env = self.fixed_env or f"phalanx-{name}-{history.run_id}"
            self.key, self.drawn = key, {"train": 0, "val": 0}
        new_train, new_val = train[self.drawn["train"]:], val[self.drawn["val"]:]
        fresh = self.drawn["train"] == 0
        if new_train:
            x = [r["epoch_progress"] for r in new_train]
            self._line("train_loss", x, [r["loss"] for r in new_train], "loss", fresh,
                       title="train loss (mean over ranks)", xlabel="epoch")
            self._line("lr", x, [r["lr"] for r in new_train], "lr", fresh, title="learning rate", xlabel="epoch")
        if new_val:
            x = [r["epoch"] for r in new_val]
            first = self.drawn["val"] == 0
            self._line("val", x, [r["loss"] for r in new_val], "val loss", first,
                       title="validation", xlabel="epoch")
            self._line("val", x, [r["acc"] for r in new_val], "val accuracy", first, title="validation",
                       xlabel="epoch", add_trace=first)
        self.drawn = {"train": len(train), "val": len(val)}
        return len(new_train) + len(new_val)

    def _line(self, win: str, x: list, y: list, name: str, replace: bool, title: str, xlabel: str,
              add_trace: bool = False) -> None:
        opts = {"title": title, "xlabel": xlabel, "showlegend": True}
        update = "append" if (add_trace or not replace) else None
        self.viz.line(X=x, Y=y, win=win, env=self.env, name=name, update=update, opts=opts)


# --- the visdom server -------------------------------------------------------------------------

def _reachable(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except Exception:
        return False


class OwnedServer:
    """A visdom server this process started: logged to a file, health-checked, stopped on exit."""

    def __init__(self, opts: VisualizeOptions):
        from .visdom_assets import FIX, missing_assets

        missing = missing_assets()
        if missing:
            raise PhalanxError(f"visdom's page assets are missing ({len(missing)} files, e.g. {missing[0]}); "
                               f"visdom would try to download them; run: {FIX}", "--server")
        self.workdir = Path(tempfile.mkdtemp(prefix="phalanx-visdom-"))
        self.log_path = Path(opts.visdom_log) if opts.visdom_log else self.workdir / "visdom.log"
        args = [sys.executable, "-m", "visdom.server", "-port", str(opts.port),
                "-env_path", str(self.workdir / "envs")]
        if opts.listen_all:
            print("phalanx: warning: visdom listens on every interface and has no login by default: "
                  "anyone who reaches this port sees and can change the plots", file=sys.stderr)
        else:
            args.append("-bind_local")
        parent = os.getpid()
        with open(self.log_path, "ab") as log:
            # The server goes down with visualize, however visualize ends (even SIGKILL).
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         preexec_fn=lambda: die_with_parent(parent))
        try:
            self._wait_until_up(f"http://127.0.0.1:{opts.port}/")
        except BaseException:  # not up, or Ctrl-C/SIGTERM meanwhile: leave no server behind
            self.stop()
            raise

    def _wait_until_up(self, url: str) -> None:
        deadline = time.monotonic() + 60
        while not _reachable(url):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_path.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
                raise PhalanxError(f"the visdom server did not start ({tail[0][:200]}); log: {self.log_path}",
                                   "--port")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_server_if_needed(opts: VisualizeOptions) -> OwnedServer | None:
    """None when a server answers; else a server of our own on this machine."""
    host = opts.server.split("://", 1)[-1].split("/", 1)[0]
    owned = None
    if not _reachable(f"{opts.server}:{opts.port}/"):
        if host not in LOCAL_HOSTS:
            raise PhalanxError(f"no visdom server answers at {opts.server}:{opts.port}", "--server")
        if opts.once:  # a server we started would take the plots with it when --once exits
            raise PhalanxError(f"no visdom server answers at {opts.server}:{opts.port}; --once plots into "
                               "a running server (start one: python -m visdom.server)", "--server")
        owned = OwnedServer(opts)
        print(f"phalanx: started a visdom server at http://127.0.0.1:{opts.port} (log: {owned.log_path})",
              flush=True)
    return owned


def visdom_client(opts: VisualizeOptions) -> Any:
    import logging

    import visdom

    logging.getLogger("visdom").setLevel(logging.ERROR)  # its session chatter is not for users
    return visdom.Visdom(server=opts.server, port=opts.port, raise_exceptions=True,
                         use_incoming_socket=False, log_to_filename=None)


# --- the command -------------------------------------------------------------------------------

def _stop_on_sigterm() -> None:
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def visualize(opts: VisualizeOptions) -> int:
    _stop_on_sigterm()
    source = open_source(opts)
    if opts.once:
        history = source.history(warn=False)
        if history is None:
            problems = "; ".join(f"{n}: {w}" for n, w in sorted(source.problems.items())[:3])
            raise PhalanxError(f"no complete snapshot in {opts.pickle_dir}" + (f" ({problems})" if problems else ""),
                               "--pickle-dir")
    owned = None
    waiting_said = False
    try:
        owned = start_server_if_needed(opts)
        plotter = Plotter(visdom_client(opts), opts.env)
        while True:
            history = source.history(warn=True)
            if history is None and not waiting_said:
                print(f"phalanx: waiting for the first snapshot in {opts.pickle_dir}", flush=True)
                waiting_said = True
            elif history is not None:
                added = plotter.update(history)
                if added:
                    print(f"phalanx: {added} new point(s) in visdom env {plotter.env} "
                          f"({len(history.records)} records)", flush=True)
            if opts.once:
                print(f"phalanx: {opts.server}:{opts.port}/env/{plotter.env}", flush=True)
                return 0
            time.sleep(opts.interval)
    except KeyboardInterrupt:
        print("phalanx: visualize stopped", flush=True)
        return 0
    finally:
        if owned is not None:
            owned.stop()


def window_points(viz: Any, win: str, env: str) -> dict[str, tuple[list, list]]:
    """The points visdom holds for a window, per trace: {name: (x, y)} (used by tests and tools)."""
    data = json.loads(viz.get_window_data(win=win, env=env))
    return {trace.get("name", ""): (trace["x"], trace["y"]) for trace in data["content"]["data"]}

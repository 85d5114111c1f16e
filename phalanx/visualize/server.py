"""The visdom server: the one ``visualize`` plots into, or one it starts, owns and stops."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ..distributed.processes import die_with_parent
from ..errors import PhalanxError

LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


VISDOM, OTHER, NOBODY = "visdom", "another program", "nobody"


class ServerLost(Exception):
    """The visdom server stopped answering (its owner, another visualize, stopped it)."""


def who_answers(base: str) -> str:
    """VISDOM, OTHER or NOBODY at ``base`` (scheme://host:port). A GET of ``/`` is answered by any web
    server (``python3 -m http.server`` lists its folder): visdom alone answers a POST of
    ``/env_state`` with the JSON list of its envs."""
    request = urllib.request.Request(f"{base}/env_state", data=b"{}", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return VISDOM if isinstance(json.loads(response.read(10_000_000)), list) else OTHER
    except urllib.error.HTTPError:  # an answer, not visdom's
        return OTHER
    except (OSError, http.client.HTTPException):  # refused, reset, timed out: nobody there (yet)
        return NOBODY
    except ValueError:  # not JSON
        return OTHER


def answers_as_visdom(base: str) -> bool:
    return who_answers(base) == VISDOM


class OwnedServer:
    """A visdom server this process started: logged to a file, health-checked, stopped on exit, and
    its working folder (the log too, unless --visdom-log put it elsewhere) removed."""

    def __init__(self, port: int, listen_all: bool, visdom_log: str | None):
        from .assets import fix_command, missing_assets

        missing = missing_assets()
        if missing:
            raise PhalanxError(
                f"are missing ({len(missing)} files, e.g. {missing[0]}), and visdom would try to "
                f"download them; install them from the npm registry with: {fix_command()}",
                "visdom's page assets",
            )
        self.workdir = Path(tempfile.mkdtemp(prefix="phalanx-visdom-"))
        self.log_path = Path(visdom_log) if visdom_log else self.workdir / "visdom.log"
        args = [sys.executable, "-m", "visdom.server", "-port", str(port), "-env_path", str(self.workdir / "envs")]
        if listen_all:
            print(
                "phalanx: warning: visdom listens on every interface and has no login by default: "
                "anyone who reaches this port sees and can change the plots",
                file=sys.stderr,
            )
        else:
            args.append("-bind_local")
        parent = os.getpid()
        with open(self.log_path, "ab") as log:
            # The server goes down with visualize, however visualize ends (even SIGKILL).
            self.proc = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=lambda: die_with_parent(parent),
            )
        try:
            self._wait_until_up(f"http://127.0.0.1:{port}")
        except BaseException:  # not up, or Ctrl-C/SIGTERM meanwhile: leave no server behind
            self.stop()
            raise

    def _wait_until_up(self, url: str) -> None:
        deadline = time.monotonic() + 60
        while not answers_as_visdom(url):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_path.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
                raise PhalanxError(f"the visdom server did not start ({tail[0][:200]})", "--port")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_server_if_needed(
    server: str, port: int, once: bool, listen_all: bool, visdom_log: str | None
) -> OwnedServer | None:
    """None when a server answers; else a server of our own on this machine."""
    host = server.split("://", 1)[-1].split("/", 1)[0]
    answers = who_answers(f"{server}:{port}")
    if answers == VISDOM:
        return None
    if answers == OTHER:  # its answers would be taken for plots drawn (every POST got 501)
        where = f"port {port}" if host in LOCAL_HOSTS else f"port {port} of {host}"
        raise PhalanxError(f"{where} is held by a program that is not visdom; pick another --port", "--port")
    if host not in LOCAL_HOSTS:
        raise PhalanxError(f"no visdom server answers at {server}:{port}", "--server")
    if once:  # a server we started would take the plots with it when --once exits
        raise PhalanxError(
            f"no visdom server answers at {server}:{port}; --once plots into a running server "
            f"(start one: {sys.executable} -m visdom.server)",
            "--server",
        )
    owned = OwnedServer(port, listen_all, visdom_log)
    print(
        f"phalanx: started a visdom server at http://localhost:{port}"
        + (f" (log: {owned.log_path})" if visdom_log else ""),
        flush=True,
    )
    return owned


def visdom_client(server: str, port: int) -> Any:
    import logging

    # visdom imports torch when it can, for tensor arguments that visualize never passes: measured
    # 2 s and 500 MB of a process that only reads snapshots. Hide torch from that one import.
    hidden = "torch" not in sys.modules
    if hidden:
        sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises ImportError
    try:
        import visdom
    finally:
        if hidden:
            del sys.modules["torch"]

    logging.getLogger("visdom").setLevel(logging.ERROR)  # its session chatter is not for users
    return visdom.Visdom(
        server=server, port=port, raise_exceptions=True, use_incoming_socket=False, log_to_filename=None
    )

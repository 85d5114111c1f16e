"""Nothing from data or options is executed; visdom stays on loopback; the CLI never tracebacks."""

from __future__ import annotations

import ast
import signal
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import REPO, free_port, wait_until
from phalanx.config import FIELDS, flag

FORBIDDEN_CALLS = {"eval", "exec", "compile", "system", "popen", "loads", "load", "__import__"}


def test_phalanx_runs_no_shell_no_exec_no_eval_and_unpickles_nothing_unrestricted():
    offenders = []
    for path in sorted((REPO / "phalanx").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "shell":
                offenders.append(f"{path.name}:{node.lineno} shell=")
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                owner = getattr(func.value, "id", "") if isinstance(func, ast.Attribute) else ""
                if name in {"eval", "exec", "compile", "__import__"} and not owner:
                    offenders.append(f"{path.name}:{node.lineno} {name}()")
                if owner in {"os", "pickle"} and name in FORBIDDEN_CALLS:
                    offenders.append(f"{path.name}:{node.lineno} {owner}.{name}()")
    assert offenders == []


def _listening_address(port: int) -> str | None:
    """The local address a TCP socket listens on at ``port``, read from /proc (no traffic sent)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if int(hex_port, 16) == port and state == "0A":  # 0A: LISTEN
            return ".".join(str(int(address[i:i + 2], 16)) for i in (6, 4, 2, 0))
    return None


def _visualize_owning_a_server(pickle_dir: Path, *extra: str):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "phalanx.cli", "visualize", "--pickle_dir", str(pickle_dir),
                             "--port", str(port), *extra], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_until(lambda: _listening_address(port) is not None, 60, "the owned visdom server")
    return proc, port


def test_an_owned_visdom_server_listens_on_loopback_only_unless_asked(tmp_path):
    (tmp_path / "pickle").mkdir()
    proc, port = _visualize_owning_a_server(tmp_path / "pickle")
    try:
        assert _listening_address(port) == "127.0.0.1"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "visualize stopped" in out
    wait_until(lambda: _listening_address(port) is None, 30, "the server to stop with visualize")

    proc, port = _visualize_owning_a_server(tmp_path / "pickle", "--listen-all")
    try:
        assert _listening_address(port) == "0.0.0.0"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert "no login" in err


TRAIN_FLAGS = [flag(name) for name in FIELDS]
VALUES = st.one_of(st.text(max_size=12), st.integers(-10**6, 10**6).map(str),
                   st.floats(allow_nan=True, allow_infinity=True).map(str),
                   st.sampled_from(["-1", "0", "auto", "s3://", "a:b", "x.y", "''", '"', "--", "-h", "nan",
                                    "--nproc_per_node 2", "--nnodes 0", "1e309", "é", "\x00"]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(TRAIN_FLAGS + ["--use-torchrun", "--config"]), VALUES), max_size=4))
def test_random_option_values_never_traceback(tmp_path, capsys, pairs):
    from phalanx.cli import main

    argv = ["trainlaunch", "--dry-run", "--checkpoints-dir", str(tmp_path / "ck")]
    for option, value in pairs:
        argv += [option, value]
    code = main(argv)
    err = capsys.readouterr().err
    assert isinstance(code, int)
    assert "Traceback" not in err
    if code != 0:
        assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("phalanx: "), (argv, err)
    assert not (tmp_path / "ck").exists()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["--port", "--interval", "--server", "--env", "--pickle-dir"]), VALUES),
                max_size=3))
def test_random_visualize_options_never_traceback(tmp_path, capsys, pairs):
    from phalanx.cli import main

    argv = ["visualize", "--once", "--pickle-dir", str(tmp_path / "missing")]
    for option, value in pairs:
        if option != "--pickle-dir" or not value.startswith("s3://"):  # no S3 endpoint here
            argv += [option, value]
    code = main(argv)
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err and len(err.strip().splitlines()) == 1, (argv, err)

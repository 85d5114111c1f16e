"""`phalanx visualize` when things go wrong: a run visdom cannot draw, a pickle dir that is not there
yet, a run replaced in its folder, a port held by another program, a shared server that goes away.
Snapshots are written by hand (no training), into the session's one visdom server where it can be."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import free_port, wait_until
from test_visualize import client

from phalanx.records.snapshots import History, dumps, segment_name
from phalanx.system.atomic import atomic_write
from phalanx.visualize import window_points


def train_records(losses: list[float], epoch: int = 1) -> list[dict]:
    steps = len(losses)
    return [
        {
            "kind": "train",
            "epoch": epoch,
            "step": s + 1,
            "epoch_progress": epoch - 1 + (s + 1) / steps,
            "loss": loss,
            "lr": 0.1,
            "samples_per_s": 100.0,
            "time": 1000.0 + s,
        }
        for s, loss in enumerate(losses)
    ]


def confusion(classes: list[str], epoch: int = 1) -> dict:
    return {
        "kind": "confusion",
        "epoch": epoch,
        "classes": classes,
        "matrix": [[3 if i == j else 1 for j in range(len(classes))] for i in range(len(classes))],
    }


def write_run(
    pickle_dir: Path, records: list[dict], run_id: str = "r1", name: str = "run", generation: int = 1
) -> None:
    """One segment, written as training writes it (atomically, so a poll never reads half of it)."""
    pickle_dir.mkdir(parents=True, exist_ok=True)
    segment = {
        "schema": 3,
        "run_id": run_id,
        "generation": generation,
        "segment": 1,
        "sealed": False,
        "written_at": 0.0,
        "options": {"name": name},
        "records": records,
    }
    atomic_write(pickle_dir / segment_name(1), lambda fh: fh.write(dumps(segment)))


def start_visualize(tmp_path: Path, name: str, *args) -> tuple[subprocess.Popen, Path, Path]:
    out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
    with open(out, "w") as out_file, open(err, "w") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "phalanx.cli", "visualize", "--interval", "0.2", *map(str, args)],
            stdout=out_file,
            stderr=err_file,
            text=True,
        )
    return proc, out, err


def stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=60)


def points(port: int, win: str, env: str) -> dict:
    try:
        return window_points(client(port), win, env)
    except Exception:  # no such window (yet), or no server
        return {}


def test_a_one_class_run_plots_its_per_class_bar_beside_the_other_runs(tmp_path, visdom_server, phalanx):
    # visdom's bar() squeezed one class's single bar to a scalar and failed its own assertion.
    write_run(
        tmp_path / "one" / "pickle",
        [*train_records([0.5]), {"kind": "val", "epoch": 1, "loss": 0.1, "acc": 1.0}, confusion(["only"])],
        run_id="onecls",
        name="one",
    )
    write_run(
        tmp_path / "two" / "pickle", [*train_records([0.9, 0.7]), confusion(["a", "b"])], run_id="twocls", name="two"
    )
    shown = phalanx("visualize", "--pickle-dir", tmp_path, "--port", visdom_server, "--once")
    assert shown.code == 0, shown.err
    bars = json.loads(client(visdom_server).get_window_data(win="per_class", env="phalanx-one-onecls"))
    assert [(trace["x"], trace["y"]) for trace in bars["content"]["data"]] == [(["only"], [100.0])]
    assert points(visdom_server, "val_acc", "phalanx-one-onecls") == {"val accuracy": ([1], [100.0])}  # one point
    assert points(visdom_server, "train_loss", "phalanx-two-twocls") == {"loss": ([0.5, 1.0], [0.9, 0.7])}


def test_a_run_that_cannot_be_plotted_is_said_once_and_the_other_runs_keep_plotting(
    tmp_path, visdom_server, phalanx, monkeypatch
):
    from phalanx.visualize import _Signalled, follow
    from phalanx.visualize.plots import RunPlots

    write_run(tmp_path / "a_bad" / "pickle", train_records([1.0]), run_id="bad", name="a_bad")  # plotted first
    write_run(tmp_path / "b_good" / "pickle", train_records([0.9]), run_id="good", name="b_good")
    plot_lines = RunPlots._line

    def refuse_the_bad_run(self, win, *args, **kwargs):
        if "bad" in self.env:
            raise ValueError("a shape visdom refuses")
        return plot_lines(self, win, *args, **kwargs)

    polls = []

    def between_polls(seconds: float) -> None:  # the good run goes on; after three polls, Ctrl-C
        polls.append(seconds)
        write_run(
            tmp_path / "b_good" / "pickle",
            train_records([0.9, 0.8, 0.7][: len(polls) + 1]),
            run_id="good",
            name="b_good",
        )
        if len(polls) == 3:
            raise _Signalled(signal.SIGINT)

    monkeypatch.setattr(RunPlots, "_line", refuse_the_bad_run)
    monkeypatch.setattr(follow.time, "sleep", between_polls)
    shown = phalanx("visualize", "--pickle-dir", tmp_path, "--port", visdom_server)
    assert shown.code == 130, shown.err
    said = [line for line in shown.err.splitlines() if "cannot plot" in line]
    assert len(said) == 1 and "a_bad" in said[0] and "a shape visdom refuses" in said[0], shown.err
    assert points(visdom_server, "train_loss", "phalanx-b_good-good") == {"loss": ([1.0, 1.0, 1.0], [0.9, 0.8, 0.7])}


def test_elapsed_counts_the_time_trained_never_a_resume_that_had_nothing_to_do():
    from phalanx.visualize.plots import status_rows

    first = [
        {"kind": "status", "state": "running", "time": 995.0, "epoch": 0},
        *train_records([0.9, 0.8]),
        {"kind": "val", "epoch": 1, "loss": 0.5, "acc": 0.5},
        {"kind": "end"},
    ]
    no_op_resume = [{"kind": "status", "state": "running", "time": 1200.0, "epoch": 1}, {"kind": "end"}]
    rows = dict(status_rows(History("r", 2, {"name": "run", "epochs": 1}, first + no_op_resume)))
    assert rows["elapsed"] == "0m 06s"  # 995 -> 1001, the last point (it was "-4m 41s")
    resumed = [
        {"kind": "status", "state": "running", "time": 2000.0, "epoch": 1},
        *[
            {**r, "epoch": 2, "epoch_progress": r["epoch_progress"] + 1, "time": r["time"] + 1010}
            for r in train_records([0.7, 0.6])
        ],
    ]
    rows = dict(status_rows(History("r", 3, {"name": "run", "epochs": 3}, first + resumed)))
    assert rows["elapsed"] == "0m 17s"  # 6 s, then 2000 -> 2011; the hours in between were no training
    assert rows["state"] == "running"  # not the "end" of the run it resumed
    assert rows["time left (estimate)"] == "0m 11s"  # one more epoch at the resumed run's pace


def test_visualize_waits_for_a_pickle_dir_that_appears_later_and_drops_a_replaced_run(tmp_path, visdom_server):
    pickle_dir = tmp_path / "run" / "pickle"  # started before training has made it (DeepLIIF's guide)
    proc, out, err = start_visualize(tmp_path, "visualize", "--pickle-dir", pickle_dir, "--port", visdom_server)
    try:
        wait_until(lambda: f"waiting for {pickle_dir} to appear" in out.read_text(), 60, "the waiting message")
        write_run(pickle_dir, train_records([0.9, 0.8]), run_id="old", name="exp")
        wait_until(lambda: points(visdom_server, "train_loss", "phalanx-exp-old"), 60, "the first run plotted")
        # `train --overwrite`: the new run's writer starts a newer generation under a new run id
        write_run(pickle_dir, train_records([0.5]), run_id="new", name="exp", generation=2)
        wait_until(
            lambda: points(visdom_server, "train_loss", "phalanx-exp-new") == {"loss": ([1.0], [0.5])},
            60,
            "the new run plotted",
        )
        wait_until(lambda: "phalanx-exp-old" not in client(visdom_server).get_env_list(), 60, "the old page removed")
        index = json.loads(client(visdom_server).get_window_data(win="phalanx_runs", env="main"))["content"]
        assert "phalanx-exp-new" in index and "phalanx-exp-old" not in index
    finally:
        assert stop(proc) == 143, err.read_text()
    assert out.read_text().count("to appear") == 1 and "replaced the one shown" in out.read_text()


class QuietFileServer(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # its log would be taken for visualize's stderr
        pass


def test_a_port_held_by_another_program_is_refused_not_plotted_into(tmp_path, phalanx):
    write_run(tmp_path / "pickle", train_records([0.9]))
    other = ThreadingHTTPServer(("127.0.0.1", 0), partial(QuietFileServer, directory=str(tmp_path)))
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        port = other.server_address[1]
        shown = phalanx(
            "visualize", "--pickle-dir", tmp_path / "pickle", "--server", "http://127.0.0.1", "--port", port, "--once"
        )
    finally:
        other.shutdown()
        other.server_close()
    assert shown.code == 2 and shown.out == "", shown.out
    assert shown.err.strip() == (
        f"phalanx: --port: port {port} is held by a program that is not visdom; pick another --port"
    )


@pytest.mark.slow
def test_when_the_shared_servers_owner_stops_the_other_visualize_starts_a_server_and_redraws(tmp_path):
    port = free_port()
    write_run(tmp_path / "pickle", train_records([0.9, 0.8]), run_id="shared", name="exp")
    owner, owner_out, _ = start_visualize(tmp_path, "owner", "--pickle-dir", tmp_path / "pickle", "--port", port)
    survivor = None
    try:
        wait_until(lambda: "started a visdom server" in owner_out.read_text(), 90, "the owner's server")
        survivor, out, err = start_visualize(tmp_path, "survivor", "--pickle-dir", tmp_path / "pickle", "--port", port)
        wait_until(lambda: "new point(s)" in out.read_text(), 60, "the survivor to plot into the owner's server")
        assert "started a visdom server" not in out.read_text()
        assert stop(owner) == 143  # its server goes with it
        wait_until(lambda: "stopped answering" in err.read_text(), 60, "the survivor to notice")
        wait_until(
            lambda: points(port, "train_loss", "phalanx-exp-shared") == {"loss": ([0.5, 1.0], [0.9, 0.8])},
            90,
            "every point redrawn into a new server",
        )
        assert "started a visdom server" in out.read_text() and survivor.poll() is None
        assert err.read_text().count("stopped answering") == 1
    finally:
        stop(owner)
        if survivor is not None:
            assert stop(survivor) == 143


def test_a_remote_server_that_goes_away_is_one_line_and_an_exit():
    from phalanx.errors import RunFailed
    from phalanx.visualize import VisualizeOptions, _after_losing_the_server

    with pytest.raises(RunFailed, match=r"the visdom server at http://visdom-host:8097 stopped answering"):
        _after_losing_the_server(VisualizeOptions(pickle_dir=("x",), server="http://visdom-host"))


def test_a_stop_signal_while_a_run_is_plotted_stops_visualize_and_is_not_that_runs_failure():
    # Each run is plotted inside an `except Exception` (one run's failure is its own): SIGTERM and
    # Ctrl-C are BaseExceptions, so a signal that comes while a run is drawn still stops visualize.
    from phalanx.visualize import _Signalled
    from phalanx.visualize.follow import Follower

    follower = Follower.__new__(Follower)
    follower.failures_said, follower.plots, follower.compare, follower.check_url = {}, {}, None, "http://x"

    def signalled_while_plotting():
        raise _Signalled(signal.SIGTERM)

    with pytest.raises(_Signalled):
        follower._isolated("run", signalled_while_plotting)
    assert follower.failures_said == {}


def test_a_pane_names_its_window_kind_and_visualize_draws_it_from_the_kinds_table(tmp_path, visdom_server, phalanx):
    # Windows by kind: a task's panes name a kind (text, table, matrix, ...) and the record it draws;
    # the kinds are declared once (phalanx/records/windows.py), for the loader's checks and for visualize.
    from phalanx.records.windows import KINDS, window

    panes = [
        window("notes", "text", "notes"),
        window("scores", "table", "scores"),
        window("mistakes", "matrix", "mistakes between classes"),
    ]
    write_run(
        tmp_path / "kinds" / "pickle",
        [
            *train_records([0.5]),
            {"kind": "panes", "panes": panes},
            {"kind": "text", "epoch": 1, "text": "<b>not html</b>\nsecond line"},
            {"kind": "table", "epoch": 1, "rows": [["dice", 0.5], ["cells", 12]]},
            confusion(["a", "b"]),
        ],
        run_id="kinds",
        name="kinds",
    )
    shown = phalanx("visualize", "--pickle-dir", tmp_path, "--port", visdom_server, "--once")
    assert shown.code == 0, shown.err
    env = "phalanx-kinds-kinds"
    text = json.loads(client(visdom_server).get_window_data(win="notes", env=env))["content"]
    assert "&lt;b&gt;not html&lt;/b&gt;\nsecond line" in text  # escaped, its line break kept
    table = json.loads(client(visdom_server).get_window_data(win="scores", env=env))["content"]
    assert "<th style='text-align:left;padding-right:12px'>dice</th><td>0.5</td>" in table
    mistakes = json.loads(client(visdom_server).get_window_data(win="mistakes", env=env))
    assert mistakes["content"]["data"][0]["type"] == "heatmap"
    # The pane named the confusion record's window: the default confusion window is not drawn too.
    assert "confusion" not in client(visdom_server).get_window_data(env=env)
    with pytest.raises(ValueError, match="window kinds are"):
        window("x", "pie", "no such kind")
    assert set(KINDS) == {"lines", "matrix", "row_shares", "images", "table", "text"}


def test_a_record_a_window_draws_is_checked_by_its_kind_when_a_snapshot_loads():
    from phalanx import records

    records.check(0, {"kind": "text", "epoch": 1, "text": "fine"})
    for bad in (
        {"kind": "text", "epoch": 1, "text": 3},
        {"kind": "table", "epoch": 1, "rows": [["one"]]},
        {"kind": "confusion", "epoch": 1, "classes": ["a"], "matrix": [[1, 2]]},
        {"kind": "panes", "panes": [{"win": "w", "kind": "text"}]},
    ):
        with pytest.raises(ValueError):
            records.check(0, bad)

"""`phalanx visualize` against a real visdom server, and the page in a real headless Chromium."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import USER_MODELS, run_phalanx, wait_until
from phalanx.snapshots import SEGMENT_NAME
from phalanx.visualize import LocalSource, window_points



def snapshot_history(pickle_dir: Path):
    return LocalSource(pickle_dir).history(warn=False)


def client(port: int):
    import visdom

    return visdom.Visdom(server="http://127.0.0.1", port=port, raise_exceptions=True, use_incoming_socket=False)


def visdom_equals_history(port: int, env: str, history) -> bool:
    """For wait_until: the condition the tests assert, not a log line that comes before it."""
    try:
        assert_visdom_equals_history(port, env, history)
        return True
    except Exception:  # AssertionError, or the window does not exist yet
        return False


def assert_visdom_equals_history(port: int, env: str, history) -> None:
    viz = client(port)
    train = [r for r in history.records if r["kind"] == "train"]
    val = [r for r in history.records if r["kind"] == "val"]
    assert window_points(viz, "train_loss", env) == {"loss": ([r["epoch_progress"] for r in train],
                                                               [r["loss"] for r in train])}
    assert window_points(viz, "lr", env) == {"lr": ([r["epoch_progress"] for r in train], [r["lr"] for r in train])}
    assert window_points(viz, "val", env) == {
        "val loss": ([r["epoch"] for r in val], [r["loss"] for r in val]),
        "val accuracy": ([r["epoch"] for r in val], [r["acc"] for r in val])}


def test_visdom_holds_every_point_including_those_written_while_visualize_was_down(tmp_path, visdom_server):
    env = {**os.environ, **USER_MODELS, "PHALANX_TEST_DELAY": "0.01"}
    train = subprocess.Popen([sys.executable, "-m", "phalanx.cli", "train", "--model", "phalanx_testmodels:slow",
                              "--epochs", "4", "--log-every", "2", "--snapshot-every", "0.2", "--no-progress",
                              "--checkpoints-dir", str(tmp_path)], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pickle_dir = tmp_path / "experiment" / "pickle"
    try:
        wait_until(lambda: pickle_dir.is_dir(), 60, "the pickle dir")
        log = tmp_path / "visualize.out"
        with open(log, "w") as out_file:
            follower = subprocess.Popen([sys.executable, "-m", "phalanx.cli", "visualize", "--pickle_dir",
                                         str(pickle_dir), "--port", str(visdom_server), "--interval", "0.2"],
                                        text=True, stdout=out_file, stderr=subprocess.PIPE)
            history = None

            def plotted() -> bool:
                nonlocal history
                history = history or snapshot_history(pickle_dir)
                try:
                    return bool(window_points(client(visdom_server), "train_loss",
                                              f"phalanx-experiment-{history.run_id}")["loss"][0])
                except Exception:  # no snapshot, or no window yet
                    return False

            wait_until(plotted, 60, "visualize to plot")
            follower.send_signal(signal.SIGTERM)  # visualize goes away while training goes on
            _, err = follower.communicate(timeout=30)
        out = log.read_text()
        assert follower.returncode == 0, err
        assert train.poll() is None, "training should still be running"
        assert "new point(s) in visdom env" in out and "visualize stopped" in out
        assert train.wait(timeout=180) == 0
    finally:
        train.kill()
    history = snapshot_history(pickle_dir)
    assert [r["epoch"] for r in history.records if r["kind"] == "val"] == [1, 2, 3, 4]
    result = run_phalanx("visualize", "--pickle-dir", pickle_dir, "--port", visdom_server, "--once")
    assert result.code == 0, result.err
    env_name = f"phalanx-experiment-{history.run_id}"
    assert env_name in result.out
    assert_visdom_equals_history(visdom_server, env_name, history)


def test_a_resumed_run_is_redrawn_from_its_new_history(tmp_path, visdom_server, phalanx):
    common = ["--checkpoints-dir", tmp_path, "--no-progress", "--lr-schedule", "constant"]
    assert phalanx("train", "--epochs", 1, *common).code == 0
    pickle_dir = tmp_path / "experiment" / "pickle"
    assert run_phalanx("visualize", "--pickle_dir", pickle_dir, "--port", visdom_server, "--once").code == 0
    assert phalanx("train", "--epochs", 2, "--resume", "auto", *common).code == 0
    result = run_phalanx("visualize", "--pickle_dir", pickle_dir, "--port", visdom_server, "--once")
    assert result.code == 0, result.err
    history = snapshot_history(pickle_dir)
    assert history.generation == 2
    assert_visdom_equals_history(visdom_server, f"phalanx-experiment-{history.run_id}", history)


def test_visualize_refuses_what_it_cannot_read(tmp_path, phalanx):
    result = phalanx("visualize", "--pickle_dir", tmp_path / "nope", "--once")
    assert result.code == 2 and "--pickle-dir" in result.err and "does not exist" in result.err
    (tmp_path / "segment_000001.pkl").write_bytes(b"garbage")
    result = phalanx("visualize", "--pickle_dir", tmp_path, "--once")
    assert result.code == 2 and "no complete snapshot" in result.err
    assert len(result.err.strip().splitlines()) == 1


def test_visualize_does_not_import_torch(tmp_path):
    code = ("import sys; from phalanx.cli import main; "
            f"main(['visualize', '--pickle_dir', {str(tmp_path)!r}, '--once']); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    assert out.strip() == "False"


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(not _chromium() and not os.environ.get("CI"),
                    reason="Debian's chromium is not installed (scripts/setup.sh --test installs it)")
def test_the_page_in_a_real_browser_shows_the_loss_plot_with_every_point(tmp_path, visdom_server, phalanx):
    from playwright.sync_api import sync_playwright

    assert phalanx("train", "--epochs", 2, "--checkpoints-dir", tmp_path, "--no-progress").code == 0
    pickle_dir = tmp_path / "experiment" / "pickle"
    assert run_phalanx("visualize", "--pickle_dir", pickle_dir, "--port", visdom_server, "--once").code == 0
    history = snapshot_history(pickle_dir)
    train_points = sum(r["kind"] == "train" for r in history.records)
    url = f"http://127.0.0.1:{visdom_server}/env/phalanx-experiment-{history.run_id}"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=_chromium(), headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1200})
            page.goto(url)
            page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length >= 3", timeout=30000)
            plots = page.evaluate("""() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(el => ({
                title: (el.layout.title && (el.layout.title.text || el.layout.title)) || '',
                traces: el.data.map(t => ({name: t.name, points: t.x.length}))}))""")
            page.screenshot(path=str(tmp_path / "visdom.png"))
        finally:
            browser.close()
    loss = [p for p in plots if "train loss" in str(p["title"])]
    assert len(loss) == 1, plots
    assert loss[0]["traces"] == [{"name": "loss", "points": train_points}]
    val = [p for p in plots if "validation" in str(p["title"])][0]
    assert {t["name"]: t["points"] for t in val["traces"]} == {"val loss": 2, "val accuracy": 2}
    assert (tmp_path / "visdom.png").stat().st_size > 10_000
    assert all(SEGMENT_NAME.match(p.name) for p in pickle_dir.iterdir())


def test_visualize_waits_for_the_first_snapshot_then_plots(tmp_path, visdom_server, phalanx):
    pickle_dir = tmp_path / "later"
    pickle_dir.mkdir()
    log = tmp_path / "visualize.out"
    with open(log, "w") as out_file:
        follower = subprocess.Popen([sys.executable, "-m", "phalanx.cli", "visualize", "--pickle-dir", str(pickle_dir),
                                     "--port", str(visdom_server), "--interval", "0.2", "--env", "waiting"],
                                    stdout=out_file, stderr=subprocess.PIPE, text=True)
        try:
            wait_until(lambda: "waiting for the first snapshot" in log.read_text(), 60, "the waiting message")
            assert phalanx("train", "--epochs", 1, "--pickle-dir", pickle_dir, "--checkpoints-dir", tmp_path).code == 0
            history = snapshot_history(pickle_dir)  # the run has finished: its whole history
            wait_until(lambda: visdom_equals_history(visdom_server, "waiting", history), 60, "every point in visdom")
        finally:
            follower.send_signal(signal.SIGTERM)
            follower.communicate(timeout=30)
    assert follower.returncode == 0

"""`phalanx visualize` against a real visdom server, and the page in a real headless Chromium."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import USER_MODELS, gate, paused, release, run_phalanx, wait_until

from phalanx.records.snapshots import SEGMENT_NAME
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
    """Every line window holds exactly the snapshots' points."""
    viz = client(port)
    train = [r for r in history.records if r["kind"] == "train"]
    val = [r for r in history.records if r["kind"] == "val"]
    progress = [r["epoch_progress"] for r in train]
    assert window_points(viz, "train_loss", env) == {"loss": (progress, [r["loss"] for r in train])}
    assert window_points(viz, "lr", env) == {"lr": (progress, [r["lr"] for r in train])}
    assert window_points(viz, "throughput", env) == {"samples/s": (progress, [r["samples_per_s"] for r in train])}
    epochs = [r["epoch"] for r in val]
    assert window_points(viz, "val_loss", env) == {"val loss": (epochs, [r["loss"] for r in val])}
    assert window_points(viz, "val_acc", env) == {"val accuracy": (epochs, [100 * r["acc"] for r in val])}


@pytest.mark.slow
def test_visdom_holds_every_point_including_those_written_while_visualize_was_down(tmp_path, visdom_server):
    # Training pauses in its 30th step (of 180) until visualize has gone: still running then, on any machine.
    env = {**os.environ, **USER_MODELS, "PHALANX_TEST_DELAY": "0.01", **gate(tmp_path / "gate", 30)}
    train = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "phalanx.cli",
            "train",
            "--model",
            "phalanx_testmodels:slow",
            "--epochs",
            "4",
            "--log-every",
            "2",
            "--snapshot-every",
            "0.2",
            "--no-progress",
            "--checkpoints-dir",
            str(tmp_path),
        ],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    pickle_dir = tmp_path / "experiment" / "pickle"
    try:
        paused(tmp_path / "gate")
        log = tmp_path / "visualize.out"
        with open(log, "w") as out_file:
            follower = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "phalanx.cli",
                    "visualize",
                    "--pickle_dir",
                    str(pickle_dir),
                    "--port",
                    str(visdom_server),
                    "--interval",
                    "0.2",
                ],
                text=True,
                stdout=out_file,
                stderr=subprocess.PIPE,
            )
            history = None

            def plotted() -> bool:
                nonlocal history
                history = history or snapshot_history(pickle_dir)
                try:
                    return bool(
                        window_points(client(visdom_server), "train_loss", f"phalanx-experiment-{history.run_id}")[
                            "loss"
                        ][0]
                    )
                except Exception:  # no snapshot, or no window yet
                    return False

            wait_until(plotted, 60, "visualize to plot")
            wait_until(lambda: f"localhost:{visdom_server}/env/phalanx-experiment-" in log.read_text(), 30, "the URL")
            follower.send_signal(signal.SIGTERM)  # visualize goes away while training goes on
            _, err = follower.communicate(timeout=30)
        out = log.read_text()
        assert follower.returncode == 143, err  # SIGTERM, as the README's exit codes say
        assert train.poll() is None, "training should still be running"
        assert "visualize stopped by SIGTERM" in err and f"localhost:{visdom_server}/env/phalanx-experiment-" in out
        release(tmp_path / "gate")  # the rest of training is written while visualize is down
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


def test_visualize_does_not_import_torch(tmp_path, visdom_server, phalanx):
    # visdom itself would import torch if it could: a plot of a real run must not load it.
    assert phalanx("train", "--epochs", 1, "--checkpoints-dir", tmp_path, "--no-progress").code == 0
    code = (
        "import sys; from phalanx.cli import main; "
        f"code = main(['visualize', '--pickle_dir', {str(tmp_path / 'experiment/pickle')!r}, '--once', "
        f"'--port', '{visdom_server}']); print(code, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    assert out.strip().splitlines()[-1] == "0 False"


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def launch_chromium(pw):
    return pw.chromium.launch(
        executable_path=_chromium(),
        headless=True,
        args=[
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ],
    )


# Each visdom window's rectangle on the page (react-grid-layout's items), after the layout settles.
WINDOW_RECTS = """() => Array.from(document.querySelectorAll('.react-grid-item')).map(el => {
    const r = el.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; })"""


def settled_rects(page) -> list:
    """The windows' rectangles once react-grid-layout has stopped moving them (it animates items into
    place: a picture taken sooner shows them overlapping in flight)."""
    rects, deadline = None, time.monotonic() + 15
    while time.monotonic() < deadline:
        page.wait_for_timeout(300)
        now = page.evaluate(WINDOW_RECTS)
        if now == rects:
            return now
        rects = now
    raise AssertionError("the windows kept moving")


def assert_no_two_windows_overlap(page) -> int:
    """The dashboard's windows lie on a grid: no two rectangles intersect (at this page width)."""
    rects = settled_rects(page)
    for i, a in enumerate(rects):
        for b in rects[i + 1 :]:
            width, height = min(a[2], b[2]) - max(a[0], b[0]), min(a[3], b[3]) - max(a[1], b[1])
            assert width <= 1 or height <= 1, f"windows overlap: {a} and {b}"
    return len(rects)


PLOTS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(el => ({
    title: (el.layout.title && (el.layout.title.text || el.layout.title)) || '',
    xtitle: el.layout.xaxis && el.layout.xaxis.title && (el.layout.xaxis.title.text || el.layout.xaxis.title) || '',
    ytitle: el.layout.yaxis && el.layout.yaxis.title && (el.layout.yaxis.title.text || el.layout.yaxis.title) || '',
    traces: el.data.map(t => ({name: t.name, type: t.type, points: (t.x || t.z || []).length}))}))"""


@pytest.mark.slow
@pytest.mark.skipif(
    not _chromium() and not os.environ.get("CI"),
    reason="Debian's chromium is not installed (scripts/setup.sh --test installs it)",
)
def test_the_printed_url_shows_every_window_of_the_run_in_a_real_browser(tmp_path, visdom_server, phalanx):
    from playwright.sync_api import sync_playwright

    assert phalanx("train", "--epochs", 2, "--ema-decay", 0.9, "--checkpoints-dir", tmp_path, "--no-progress").code == 0
    pickle_dir = tmp_path / "experiment" / "pickle"
    shown = run_phalanx("visualize", "--pickle_dir", pickle_dir, "--port", visdom_server, "--once")
    assert shown.code == 0, shown.err
    history = snapshot_history(pickle_dir)
    url = f"http://localhost:{visdom_server}/env/phalanx-experiment-{history.run_id}"
    assert f"phalanx: experiment: {url}" in shown.out  # the exact page of the run
    train = sum(r["kind"] == "train" for r in history.records)
    with sync_playwright() as pw:
        browser = launch_chromium(pw)
        try:
            page = browser.new_page(viewport={"width": 1700, "height": 1500})
            page.goto(url)
            page.wait_for_function(
                "document.querySelectorAll('.js-plotly-plot').length >= 8 && "
                "document.querySelector('.phalanx-status') && "
                "document.querySelectorAll('.phalanx-images img').length == 16",
                timeout=30000,
            )
            plots = {p["title"]: p for p in page.evaluate(PLOTS)}
            status = page.inner_text(".phalanx-status")
            captions = page.eval_on_selector_all(".phalanx-images figcaption", "els => els.map(e => e.innerText)")
            assert assert_no_two_windows_overlap(page) == 10
            page.screenshot(path=str(tmp_path / "visdom.png"), full_page=True)  # the README's picture
            page.set_viewport_size({"width": 1280, "height": 1000})  # a laptop's width
            assert assert_no_two_windows_overlap(page) == 10
        finally:
            browser.close()
    if os.environ.get("PHALANX_SCREENSHOT"):  # the README's picture: PHALANX_SCREENSHOT=docs/visualize.png
        shutil.copy(tmp_path / "visdom.png", os.environ["PHALANX_SCREENSHOT"])
    assert plots["train loss (mean over ranks)"]["traces"] == [{"name": "loss", "type": "scatter", "points": train}]
    assert plots["train loss (mean over ranks)"]["ytitle"] == "cross-entropy loss"
    assert {t["name"]: t["points"] for t in plots["validation accuracy (top-1)"]["traces"]} == {
        "val accuracy": 2,
        "EMA val accuracy": 2,
    }
    assert plots["validation accuracy (top-1)"]["ytitle"] == "accuracy (%)"  # not the loss's axis
    assert {t["name"] for t in plots["validation loss"]["traces"]} == {"val loss", "EMA val loss"}
    assert plots["learning rate"]["traces"][0]["points"] == train
    assert plots["throughput (all ranks)"]["ytitle"] == "samples / s"
    steps = plots["time per step (mean over ranks, stacked)"]["traces"]
    assert [t["name"] for t in steps] == ["data", "+ compute", "+ communication", "+ optimizer", "+ logging"]
    assert all(t["points"] == train for t in steps)
    assert plots["confusion matrix, epoch 2"]["traces"][0]["type"] == "heatmap"
    assert plots["confusion matrix, epoch 2"]["traces"][0]["points"] == 10  # 10 x 10 classes
    assert plots["accuracy per class, epoch 2"]["traces"][0]["type"] == "bar"
    assert "finished" in status and "best validation accuracy" in status and "world size" in status
    expected = [r for r in history.records if r["kind"] == "images"][-1]["items"]
    assert captions == [f"{item['label']} \u2192 {item['predicted']}" for item in expected]
    assert all(SEGMENT_NAME.match(p.name) for p in pickle_dir.iterdir())


@pytest.mark.slow
def test_hostile_files_are_refused_within_seconds_in_bounded_memory_and_the_good_points_still_plot(
    tmp_path, visdom_server, phalanx
):
    import pickle

    assert phalanx("train", "--epochs", 1, "--checkpoints-dir", tmp_path, "--no-progress").code == 0
    pickle_dir = tmp_path / "experiment" / "pickle"
    good = (pickle_dir / "segment_000001.pkl").read_bytes()
    nested = [1]
    for _ in range(6):
        nested = [nested] * 100  # 10^12 leaves in 2 KB
    hostile = {
        "segment_000002.pkl": lambda p: p.write_bytes(pickle.dumps({"schema": 2, "records": nested}, protocol=4)),
        "segment_000003.pkl": lambda p: p.symlink_to("/dev/zero"),
        "segment_000004.pkl": lambda p: p.write_bytes(good[: len(good) // 2]),  # truncated
        "segment_000005.pkl": lambda p: os.mkfifo(p),
        "segment_000006.pkl": lambda p: p.symlink_to("/etc/hostname"),  # a link out of the pickle dir
        "segment_000007.pkl": lambda p: _sparse(p, 65 * 2**20),  # too large
    }
    # VmHWM: the peak resident memory of this program's own address space (ru_maxrss would count
    # the pages of pytest that the fork shared before exec).
    peak = (
        "import atexit, sys; atexit.register(lambda: print(next(line for line in open('/proc/self/status') "
        "if line.startswith('VmHWM')), file=sys.stderr)); from phalanx.cli import main; sys.exit(main())"
    )

    def visualize(env: str) -> tuple[subprocess.CompletedProcess, float, float]:
        started = time.monotonic()
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                peak,
                "visualize",
                "--pickle-dir",
                str(pickle_dir),
                "--port",
                str(visdom_server),
                "--once",
                "--env",
                env,
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        return done, time.monotonic() - started, int(done.stderr.rsplit("VmHWM:", 1)[1].split()[0]) / 1024

    _, clean_seconds, clean_mb = visualize("clean")  # the same program on the good segment alone: the baseline
    for name, make in hostile.items():
        make(pickle_dir / name)
    done, seconds, peak_mb = visualize("hostile")
    # /dev/zero read whole, or the bomb walked: memory runs out, or hours go by. Refused: about the baseline.
    assert seconds < 3 * clean_seconds + 10 and peak_mb < clean_mb + 100, (seconds, clean_seconds, peak_mb, clean_mb)
    for name in hostile:  # each refused file warned about once
        assert done.stderr.count(f"ignoring snapshot {name}") == 1, (name, done.stderr)
    assert "more than 2,000,000 values" in done.stderr and "not a regular file" in done.stderr
    assert "a link out of the pickle directory" in done.stderr and "more than 67,108,864" in done.stderr
    assert_visdom_equals_history(visdom_server, "hostile", snapshot_history(pickle_dir))


def test_runs_side_by_side_and_a_run_that_appears_later(tmp_path, visdom_server, phalanx):
    common = ["--epochs", 2, "--checkpoints-dir", tmp_path, "--no-progress"]
    assert phalanx("train", "--name", "plain", *common).code == 0
    assert phalanx("train", "--name", "smoothed", "--label-smoothing", 0.1, *common).code == 0
    log = tmp_path / "visualize.out"
    with open(log, "w") as out:
        follower = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "phalanx.cli",
                "visualize",
                "--pickle-dir",
                str(tmp_path),
                "--port",
                str(visdom_server),
                "--interval",
                "0.2",
            ],
            stdout=out,
            text=True,
        )
        try:
            wait_until(
                lambda: set(_traces(visdom_server, "compare_val_acc")) == {"plain", "smoothed"}, 60, "two runs compared"
            )
            assert phalanx("train", "--name", "later", "--lr", 0.05, *common).code == 0  # a third run, later
            expected = {}
            losses = {}
            for name in ("plain", "smoothed", "later"):
                val = [r for r in snapshot_history(tmp_path / name / "pickle").records if r["kind"] == "val"]
                expected[name] = ([1, 2], [100 * r["acc"] for r in val])
                losses[name] = tuple(r["loss"] for r in val)
            wait_until(lambda: _traces(visdom_server, "compare_val_acc") == expected, 60, "every run's every point")
        finally:
            follower.send_signal(signal.SIGINT)
            follower.wait(timeout=30)
    assert follower.returncode == 130
    assert len(set(losses.values())) == 3  # three different runs (losses: accuracies could tie)
    assert f"runs compared: http://localhost:{visdom_server}/env/phalanx-compare" in log.read_text()


def _sparse(path: Path, size: int) -> None:
    with open(path, "wb") as fh:
        fh.truncate(size)


def _traces(port: int, win: str) -> dict:
    try:
        return window_points(client(port), win, "phalanx-compare")
    except Exception:  # not drawn yet
        return {}


def test_a_schema_1_snapshot_still_plots(tmp_path, visdom_server):
    import pickle

    records = [
        {
            "kind": "train",
            "epoch": 1,
            "step": s,
            "epoch_progress": s / 4,
            "loss": 2.0 / s,
            "lr": 0.1,
            "samples_per_s": 100.0,
        }
        for s in range(1, 5)
    ] + [{"kind": "val", "epoch": 1, "loss": 0.5, "acc": 0.9}]
    segment = {
        "schema": 1,
        "run_id": "old",
        "generation": 1,
        "segment": 1,
        "sealed": False,
        "written_at": 0.0,
        "options": {"name": "old"},
        "records": records,
    }
    (tmp_path / "segment_000001.pkl").write_bytes(pickle.dumps(segment))
    shown = run_phalanx("visualize", "--pickle-dir", tmp_path, "--port", visdom_server, "--once")
    assert shown.code == 0, shown.err
    assert_visdom_equals_history(visdom_server, "phalanx-old-old", snapshot_history(tmp_path))


def test_visualize_waits_for_the_first_snapshot_then_plots(tmp_path, visdom_server, phalanx):
    pickle_dir = tmp_path / "later"
    pickle_dir.mkdir()
    log = tmp_path / "visualize.out"
    with open(log, "w") as out_file:
        follower = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "phalanx.cli",
                "visualize",
                "--pickle-dir",
                str(pickle_dir),
                "--port",
                str(visdom_server),
                "--interval",
                "0.2",
                "--env",
                "waiting",
            ],
            stdout=out_file,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_until(lambda: "waiting for the first snapshot" in log.read_text(), 60, "the waiting message")
            assert phalanx("train", "--epochs", 1, "--pickle-dir", pickle_dir, "--checkpoints-dir", tmp_path).code == 0
            history = snapshot_history(pickle_dir)  # the run has finished: its whole history
            wait_until(lambda: visdom_equals_history(visdom_server, "waiting", history), 60, "every point in visdom")
        finally:
            follower.send_signal(signal.SIGTERM)
            follower.communicate(timeout=30)
    assert follower.returncode == 143


def test_missing_page_assets_are_blamed_with_the_command_that_installs_them(tmp_path, monkeypatch):
    from conftest import free_port

    from phalanx.errors import PhalanxError
    from phalanx.visualize import assets as visdom_assets
    from phalanx.visualize.server import start_server_if_needed

    monkeypatch.setattr(visdom_assets, "missing_assets", lambda: ["js/plotly-plotly.min.js", "version.built"])
    with pytest.raises(PhalanxError) as refused:
        start_server_if_needed("http://localhost", free_port(), once=False, listen_all=False, visdom_log=None)
    assert str(refused.value).startswith("visdom's page assets: are missing (2 files")
    assert f"{sys.executable} -m phalanx.visualize.assets" in str(refused.value)  # the interpreter that has phalanx


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("npm"), reason="npm is not installed")
def test_the_assets_installer_prints_help_and_gives_up_quickly_without_a_registry(tmp_path, monkeypatch):
    from conftest import free_port

    from phalanx.visualize import assets as visdom_assets

    done = subprocess.run(
        [sys.executable, "-m", "phalanx.visualize.assets", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.startswith("usage: python -m phalanx.visualize.assets")
    root = tmp_path / "visdom"
    (root / "static").mkdir(parents=True)
    (root / "VERSION").write_text("0.2.4")
    monkeypatch.setenv("npm_config_registry", f"http://127.0.0.1:{free_port()}/")  # nobody answers there
    monkeypatch.setenv("npm_config_cache", str(tmp_path / "npm-cache"))  # nothing cached to fall back on
    # phalanx's two retries, after 0.2-0.5 s instead of npm's 10-20 s (the user's settings come first)
    monkeypatch.setenv("npm_config_fetch_retry_mintimeout", "200")
    monkeypatch.setenv("npm_config_fetch_retry_maxtimeout", "500")
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="npm pack failed"):
        visdom_assets.install(root, log=lambda line: None)
    assert time.monotonic() - started < 120


@pytest.mark.slow
@pytest.mark.skipif(
    not _chromium() and not os.environ.get("CI"),
    reason="Debian's chromium is not installed (scripts/setup.sh --test installs it)",
)
def test_your_own_tasks_named_losses_and_images_are_on_the_page_without_editing_visualize(tmp_path, visdom_server):
    from conftest import REPO
    from playwright.sync_api import sync_playwright

    example = REPO / "examples" / "tasks"
    trained = run_phalanx(
        "train",
        "--task",
        "adversarial_autoencoder:AdversarialAutoencoder",
        "--epochs",
        2,
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
        "--log-every",
        5,
        cwd=example,
    )
    assert trained.code == 0, trained.err
    pickle_dir = tmp_path / "experiment" / "pickle"
    shown = run_phalanx("visualize", "--pickle_dir", pickle_dir, "--port", visdom_server, "--once")
    assert shown.code == 0, shown.err
    history = snapshot_history(pickle_dir)
    train = [r for r in history.records if r["kind"] == "train"]
    url = f"http://localhost:{visdom_server}/env/phalanx-experiment-{history.run_id}"
    with sync_playwright() as pw:
        browser = launch_chromium(pw)
        try:
            page = browser.new_page(viewport={"width": 1700, "height": 1500})
            page.goto(url)
            page.wait_for_function(
                "document.querySelectorAll('.js-plotly-plot').length >= 8 && "
                "document.querySelectorAll('.phalanx-images img').length == 8",
                timeout=30000,
            )
            plots = {p["title"]: p for p in page.evaluate(PLOTS)}
            captions = page.eval_on_selector_all(".phalanx-images figcaption", "els => els.map(e => e.innerText)")
            status = page.inner_text(".phalanx-status")
            assert_no_two_windows_overlap(page)
        finally:
            browser.close()
    for loss in ("G_GAN", "G_L1", "D_real", "D_fake"):  # each named loss on its own labelled axes
        plot = plots[f"train {loss} (mean over ranks)"]
        assert plot["traces"] == [{"name": loss, "type": "scatter", "points": len(train)}] and plot["ytitle"] == loss
    lrs = plots["learning rate"]["traces"]  # one trace per optimizer, as metrics.jsonl has them
    assert [t["name"] for t in lrs] == ["lr (generator)", "lr (discriminator)"] and lrs[1]["points"] == len(train)
    validation = plots["validation L1 reconstruction error"]  # metric_labels name the pane and its axis
    assert validation["traces"][0]["points"] == 2 and validation["ytitle"] == "L1 reconstruction error"
    assert captions == [f"digit {i}: input | reconstruction" for i in range(8)]
    assert "best validation L1 reconstruction error" in status and "adversarial_autoencoder" in status


def test_the_servers_root_page_links_to_every_run(tmp_path, visdom_server, phalanx):
    # A DeepLIIF user opens http://localhost:8097 out of habit: visdom's main env lists the runs.
    for name in ("a", "b"):
        assert phalanx("train", "--name", name, "--epochs", 1, "--checkpoints-dir", tmp_path, "--no-progress").code == 0
    shown = run_phalanx("visualize", "--pickle-dir", tmp_path, "--port", visdom_server, "--once")
    assert shown.code == 0, shown.err
    page = json.loads(client(visdom_server).get_window_data(win="phalanx_runs", env="main"))["content"]
    for name in ("a", "b"):
        env = f"phalanx-{name}-{snapshot_history(tmp_path / name / 'pickle').run_id}"
        assert f'/env/{env}">{name}</a>' in page
    assert "/env/phalanx-compare" in page

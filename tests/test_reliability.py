"""Faults survived, with real processes: preemption, kills mid-write, corrupt files, a full disk,
a flaky S3 endpoint, a reader racing a writer, a hung worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import (
    USER_MODELS,
    free_port,
    gate,
    paused,
    processes_with,
    release,
    run_phalanx,
    start_phalanx,
    wait_until,
)

from phalanx.checkpoint.rundir import read_metrics
from phalanx.records.remote import Uploader
from phalanx.visualize import LocalSource

SLOW = {"PHALANX_TEST_DELAY": "0.02"}  # the test model sleeps this long per batch


def val_history(run: Path) -> list[tuple[int, float, float, float]]:
    return [
        (r["epoch"], r["loss"], r["acc"], r["train_loss"])
        for r in read_metrics(run / "metrics.jsonl")
        if r["kind"] == "val"
    ]


def in_epoch(run: Path, epoch: int) -> bool:
    metrics = run / "metrics.jsonl"
    return metrics.exists() and any(r["kind"] == "train" and r["epoch"] == epoch for r in read_metrics(metrics))


def train_records(run: Path) -> list[tuple[int, float, float]]:
    return [(r["step"], r["loss"], r["lr"]) for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"]


def assert_same_run(a: Path, b: Path) -> None:
    """Bitwise: the weights, each epoch's validation and train loss, and every logged step (none
    lost, none repeated) with its loss and learning rate."""
    wa, wb = torch.load(a / "latest.pt")["model"], torch.load(b / "latest.pt")["model"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert val_history(a) == val_history(b)
    assert train_records(a) == train_records(b)


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_preempted_train_checkpoints_and_resumes_to_the_same_result(tmp_path, phalanx, monkeypatch, sig, code):
    common = [
        "--model",
        "phalanx_testmodels:slow",
        "--epochs",
        3,
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
        "--log-every",
        1,
    ]
    # Paused in the 15th step of epoch 2 (of 45): signalled there, on any machine, then let go.
    cut = start_phalanx("train", "--name", "cut", *common, env=gate(tmp_path / "gate", 60))
    paused(tmp_path / "gate")
    cut.send_signal(sig)
    release(tmp_path / "gate")
    _, err = cut.communicate(timeout=60)
    assert cut.returncode == code, err
    last = err.strip().splitlines()[-1]
    assert f"stopped by {sig.name} at step" in last and "--resume auto" in last
    saved = torch.load(tmp_path / "cut/latest.pt")
    assert saved["epoch"] == 1 and saved["position"] == 15 * 32  # a mid-epoch checkpoint, at that step
    monkeypatch.setenv("PHALANX_TEST_DELAY", "0")  # the same computation, at full speed, in this process
    assert phalanx("train", "--name", "straight", *common).code == 0
    resumed = phalanx("train", "--name", "cut", "--resume", "auto", *common)
    assert resumed.code == 0, resumed.err
    assert "resumed from" in resumed.out and f"sample {saved['position']} of" in resumed.out
    assert_same_run(tmp_path / "straight", tmp_path / "cut")


def rank_draws(folder: Path) -> dict[str, list[str]]:
    """The random draws each rank's model made, in order, over all the processes in ``folder``."""
    draws: dict[str, list[str]] = {}
    for path in sorted(folder.iterdir(), key=lambda p: p.stat().st_mtime_ns):
        rank = path.stem.rsplit("rank", 1)[1]
        draws.setdefault(rank, []).extend(
            line.split()[1] for line in path.read_text().splitlines() if line.startswith("B ")
        )
    return draws


def test_a_run_that_fails_in_process_gives_the_caller_back_its_stop_signals(tmp_path, phalanx):
    # A failing run holds SIGTERM and SIGINT until its process exits (so each rank's report is whole).
    # Called in process (a script, a notebook, these tests), it once left them held: the caller's
    # Ctrl-C did nothing, and every process started after inherited the mask (a worker sent SIGTERM
    # trained on to its end).
    before = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    failed = phalanx(
        "train", "--model", "phalanx_testmodels:raises", "--epochs", 1, "--checkpoints-dir", tmp_path, "--no-progress"
    )
    assert failed.code == 1 and "boom from the test model" in failed.err, failed.err
    assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == before
    child = subprocess.run(
        [sys.executable, "-c", "import os, signal, time; os.kill(os.getpid(), signal.SIGTERM); time.sleep(30)"],
        timeout=60,
    )
    assert child.returncode == -signal.SIGTERM


def test_a_command_ends_without_finalising_torch_and_loses_nothing_of_what_an_exit_does(tmp_path):
    # phalanx ends with os._exit once torch is loaded (phalanx/distributed/processes.py: finalising torch took 0.5-1 s
    # after every command), after what the interpreter's exit does first: a user's thread that is
    # not a daemon finishes (here half a second after the exit began), exit functions run, and an
    # idle thread pool left alive is woken (joining its worker without the shutdown hooks hung).
    result = run_phalanx(
        "train",
        "--model",
        "phalanx_testmodels:exit_work",
        "--epochs",
        1,
        "--max-steps",
        2,
        "--checkpoints-dir",
        tmp_path,
        "--name",
        "run",
        "--no-progress",
        env={**USER_MODELS, "PHALANX_TEST_EXIT_DIR": str(tmp_path)},
        timeout=120,
    )
    assert result.code == 0, result.err
    assert (tmp_path / "thread.txt").read_text() == "written by a thread after the run"
    assert (tmp_path / "atexit.txt").read_text() == "written at exit"


@pytest.mark.slow
def test_sigterm_to_one_worker_stops_every_rank_at_one_step_and_the_resume_is_bitwise_the_same(tmp_path):
    # A scheduler may signal one process only: the ranks agree on a stop step, rank 0 saves it.
    common = [
        "--model",
        "phalanx_testmodels:recorder",
        "--epochs",
        3,
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
        "--log-every",
        1,
        "--use-torchrun",
        "--nproc_per_node 2",
    ]
    straight = run_phalanx(
        "trainlaunch",
        "--name",
        "straight",
        *common,
        env={**USER_MODELS, "PHALANX_TEST_RECORD": str(tmp_path / "rec-straight")},
    )
    assert straight.code == 0, straight.err
    cut = start_phalanx(
        "trainlaunch",
        "--name",
        "cut",
        *common,
        env={"PHALANX_TEST_RECORD": str(tmp_path / "rec-cut"), **gate(tmp_path / "gate", 30)},
    )
    try:
        paused(tmp_path / "gate", ranks=2)  # both ranks in the 8th step of epoch 2 (23 steps of 64)
        rank1 = [
            p
            for p in processes_with(str(tmp_path))
            if b"phalanx.launch.worker" in Path(f"/proc/{p}/cmdline").read_bytes()
            and b"RANK=1\x00" in Path(f"/proc/{p}/environ").read_bytes()
        ]
        assert len(rank1) == 1
        os.kill(rank1[0], signal.SIGTERM)
        release(tmp_path / "gate")
        _, err = cut.communicate(timeout=90)
    finally:
        cut.kill()
    assert cut.returncode == 143, err
    assert "stopped by SIGTERM at step" in err.strip().splitlines()[-1]
    assert torch.load(tmp_path / "cut/latest.pt")["position"] > 0
    resumed = run_phalanx(
        "trainlaunch",
        "--name",
        "cut",
        "--resume",
        "auto",
        *common,
        env={**USER_MODELS, "PHALANX_TEST_RECORD": str(tmp_path / "rec-cut")},
    )
    assert resumed.code == 0, resumed.err
    assert_same_run(tmp_path / "straight", tmp_path / "cut")
    # Each rank continued its own random stream: the same draws as without the interruption,
    # and different from the other rank's.
    straight_draws, cut_draws = rank_draws(tmp_path / "rec-straight"), rank_draws(tmp_path / "rec-cut")
    assert cut_draws == straight_draws
    assert straight_draws["0"] != straight_draws["1"]


KILL_DURING_SAVE = """
import os, sys, time
from pathlib import Path
import torch
from phalanx import checkpoint
state = checkpoint.load(Path(sys.argv[1]))
state["epoch"] = 999
def stuck_fsync(fd):  # the bytes are in the temporary file; the rename has not happened
    print("writing", flush=True)
    time.sleep(3600)
os.fsync = stuck_fsync
checkpoint.save([Path(sys.argv[1])], {k: v for k, v in state.items() if k not in ("format", "version")})
"""


@pytest.mark.slow
def test_sigkill_while_saving_leaves_the_previous_checkpoint_intact(tmp_path, phalanx):
    assert phalanx("train", "--epochs", 2, "--checkpoints-dir", tmp_path).code == 0
    latest = tmp_path / "experiment" / "latest.pt"
    before = latest.read_bytes()
    writer = subprocess.Popen([sys.executable, "-c", KILL_DURING_SAVE, str(latest)], stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline().strip() == "writing"
    writer.kill()
    writer.wait()
    assert latest.read_bytes() == before
    assert list(latest.parent.glob(".latest.pt.tmp-*")), "the killed writer's temporary is still there"
    resumed = phalanx("train", "--epochs", 3, "--resume", "auto", "--checkpoints-dir", tmp_path)
    assert resumed.code == 0, resumed.err
    assert torch.load(latest)["epoch"] == 3
    assert not list(latest.parent.glob(".*.tmp-*"))  # cleaned up by the next run


def test_a_corrupt_checkpoint_is_named_and_auto_falls_back_to_the_previous_one(tmp_path, phalanx):
    assert phalanx("train", "--epochs", 3, "--save-epoch-freq", 1, "--checkpoints-dir", tmp_path).code == 0
    latest = tmp_path / "experiment" / "latest.pt"
    latest.write_bytes(latest.read_bytes()[: latest.stat().st_size // 2])  # truncated
    named = phalanx("train", "--epochs", 4, "--resume", latest, "--checkpoints-dir", tmp_path)
    assert named.code == 2 and len(named.err.strip().splitlines()) == 1
    assert "latest.pt is unreadable" in named.err
    auto = phalanx("train", "--epochs", 4, "--resume", "auto", "--checkpoints-dir", tmp_path)
    assert auto.code == 0, auto.err
    assert "skipping checkpoint" in auto.err and "resumed from" in auto.out and "epoch_0003.pt" in auto.out
    assert [e for e, *_ in val_history(tmp_path / "experiment")] == [1, 2, 3, 4]


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MiB tmpfs: room for a few checkpoints of the small CNN, then ENOSPC."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()}); needs root")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.slow
def test_disk_full_is_a_clear_error_and_the_previous_files_stay_intact(small_disk):
    result = run_phalanx(
        "train", "--epochs", 20, "--save-epoch-freq", 1, "--checkpoints-dir", small_disk, "--no-progress"
    )
    assert result.code == 1, result.out
    last = result.err.strip().splitlines()[-1]
    assert "No space left on device" in last and last.startswith("phalanx: cannot ")
    assert "Traceback" not in result.err
    run = small_disk / "experiment"
    state = torch.load(run / "latest.pt")  # whole, and the newest that was completed
    assert 1 <= state["epoch"] < 20
    assert not list(run.rglob(".*.tmp-*"))
    history = LocalSource(run / "pickle").history(warn=False)
    assert history is not None and any(r["kind"] == "val" for r in history.records)


@pytest.mark.slow
def test_s3_endpoint_that_disappears_and_comes_back_gets_every_file_in_the_end(tmp_path, monkeypatch):
    import boto3
    from moto.server import ThreadedMotoServer

    for key, value in {
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    client = boto3.client("s3", endpoint_url=url)
    client.create_bucket(Bucket="flaky")
    proc = start_phalanx(
        "train",
        "--model",
        "phalanx_testmodels:slow",
        "--epochs",
        5,
        "--no-progress",
        "--snapshot-every",
        "0.2",
        "--checkpoints-dir",
        tmp_path,
        "--remote-transfer",
        "s3://flaky/runs",
        "--s3-endpoint-url",
        url,
    )
    run = tmp_path / "experiment"
    try:
        wait_until(lambda: client.list_objects_v2(Bucket="flaky").get("KeyCount", 0) >= 3, 120, "first uploads")
        server.stop()  # down during epochs 2-3
        wait_until(lambda: len(val_history(run)) >= 3, 120, "epoch 3")
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()  # back for the rest of the run
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
        server.stop()
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
    try:
        assert proc.returncode == 0, err
        assert "epoch 5/5" in out
        assert "uploads failing" in err  # the outage was reported when it began
        assert "uploads resumed" in err  # and its end
        assert "not uploaded" not in err  # nothing stayed missing
        for name in ("latest.pt", "best.pt", "pickle/segment_000001.pkl"):
            remote = client.get_object(Bucket="flaky", Key=f"runs/experiment/{name}")["Body"].read()
            assert remote == (run / name).read_bytes(), name
    finally:
        server.stop()


def test_uploads_that_never_succeed_are_reported_not_lost_silently(tmp_path):
    warnings = []

    def broken(path, key):
        raise ConnectionError("endpoint unreachable")

    uploader = Uploader([broken], attempts=3, backoff=0.0, warn=warnings.append)
    for name in ("a.pt", "b.pkl", "a.pt"):
        uploader.submit(tmp_path / name, name)
    failures = uploader.close()
    assert sorted(f.key for f in failures) == ["a.pt", "b.pkl"]
    assert sum("failed after 3 attempts" in w for w in warnings) >= 2
    assert warnings[-1].startswith("2 of 2 file(s) not uploaded") and "a.pt" in warnings[-1]  # files, not attempts


def test_storage_down_at_the_end_holds_the_run_up_at_most_close_timeout_seconds(tmp_path):
    warnings = []

    def down(path, key):
        raise ConnectionError("endpoint unreachable")

    # A backoff of minutes: any bound far below it separates "bounded by close_timeout" from "waited it out".
    uploader = Uploader([down], attempts=5, backoff=120.0, warn=warnings.append, close_timeout=1.0)
    for i in range(4):
        uploader.submit(tmp_path / f"{i}.pt", f"{i}.pt")
    started = time.monotonic()
    failures = uploader.close()
    assert time.monotonic() - started < 60  # without the bound: 4 files x (120 + 240 + 480 + 960 s) of backoff
    assert len(failures) == 4 and warnings[-1].startswith("4 of 4 file(s) not uploaded")


RACING_WRITER = """
import sys, os
from pathlib import Path
from phalanx.records import snapshots
from phalanx.system.atomic import atomic_write
snapshots.SEGMENT_RECORDS = 100
w = snapshots.SnapshotWriter(Path(sys.argv[1]), "race", {"name": "race"}, every_seconds=0.0,
                             on_written=lambda p: None,
                             write_file=lambda p, d: atomic_write(p, lambda fh: fh.write(d)))
w.start([])
for i in range(int(sys.argv[2])):
    w.add({"kind": "train", "epoch": 1, "step": i, "epoch_progress": i, "loss": 1.0 / (i + 1), "lr": 0.1})
"""


@pytest.mark.slow
def test_visualize_racing_a_fast_writer_never_reads_a_partial_or_lost_point(tmp_path):
    points = 3000
    writer = subprocess.Popen([sys.executable, "-c", RACING_WRITER, str(tmp_path), str(points)])
    source = LocalSource(tmp_path)
    seen, reads, partial = 0, 0, 0
    while True:
        finished = writer.poll() is not None
        history = source.history(warn=False)
        if history is not None:
            steps = [r["step"] for r in history.records]
            assert steps == list(range(len(steps)))  # a gapless prefix: nothing partial, nothing lost
            assert len(steps) >= seen  # never goes backwards
            seen, reads = len(steps), reads + 1
            partial += 0 < len(steps) < points
        if finished:
            break
    assert writer.returncode == 0
    assert seen == points and partial > 0  # it raced: some read came while the writer was mid-way
    assert source.problems == {}


@pytest.mark.slow
def test_a_hung_worker_ends_the_run_with_a_clear_error_instead_of_hanging(tmp_path):
    started = time.monotonic()
    result = run_phalanx(
        "trainlaunch",
        "--model",
        "phalanx_testmodels:hangs_on_rank1",
        "--dist-timeout",
        5,
        "--name",
        "hangrun",
        "--checkpoints-dir",
        tmp_path,
        "--use-torchrun",
        "--nproc_per_node 2",
        env={**USER_MODELS, **SLOW},
        timeout=240,
    )
    assert result.code == 1
    lines = result.err.strip().splitlines()
    assert "Traceback" not in result.err and all(line.startswith("phalanx: rank ") for line in lines), lines
    assert "a collective timed out" in result.err and "--dist-timeout" in result.err
    assert time.monotonic() - started < 900  # well below torch's default of 30 minutes: --dist-timeout 5 held
    wait_until(lambda: processes_with("hangrun") == [], 30, "no orphan worker")


def test_a_checkpoint_is_written_while_the_next_epoch_trains_and_holds_its_own_moment(tmp_path, phalanx, monkeypatch):
    """Epoch 1's checkpoint files are written on the writer thread while epoch 2 trains: their write
    waits here until epoch 2 has logged a step (a write in line with training would wait for ever:
    60 s fail it instead). They hold the state of the end of epoch 1: resumed, epoch 2 ends bitwise
    where the run did."""
    import shutil
    import threading

    from phalanx import checkpoint
    from phalanx.train import outputs

    stepped, writers, serialisers = threading.Event(), set(), set()
    write, record, serialise = checkpoint.write, outputs.RunOutputs.record, checkpoint.serialise

    def noted_serialise(state):  # the bytes are made where the epoch ends, on the training thread
        serialisers.add(threading.current_thread().name)
        return serialise(state)

    def held_write(paths, data):
        writers.add(threading.current_thread().name)
        if any(p.name == "epoch_0001.pt" for p in paths) and not stepped.wait(60):
            raise RuntimeError("epoch 2 never stepped while epoch 1's checkpoint was being written")
        write(paths, data)

    def noted(self, entry, flush=False):
        if entry.get("kind") == "train" and entry.get("epoch") == 2:
            stepped.set()
        return record(self, entry, flush)

    monkeypatch.setattr(checkpoint, "write", held_write)
    monkeypatch.setattr(checkpoint, "serialise", noted_serialise)
    monkeypatch.setattr(outputs.RunOutputs, "record", noted)
    common = ["--epochs", 2, "--save-epoch-freq", 1, "--log-every", 1, "--no-progress", "--checkpoints-dir", tmp_path]
    run = phalanx("train", *common)
    assert run.code == 0, run.err
    assert writers == {"phalanx-checkpoint"} and serialisers == {"MainThread"} and stepped.is_set()
    (tmp_path / "again").mkdir()
    shutil.copy(tmp_path / "experiment/epoch_0001.pt", tmp_path / "again/latest.pt")
    assert phalanx("train", "--name", "again", "--resume", "auto", *common).code == 0
    ours, theirs = (torch.load(tmp_path / name / "latest.pt")["model"] for name in ("experiment", "again"))
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)

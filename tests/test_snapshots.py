"""Snapshot files: segments, generations, atomic plain data, and a loader that runs nothing."""

from __future__ import annotations

import os
import pickle
import subprocess

import pytest

from phalanx.records import snapshots
from phalanx.records.snapshots import SnapshotWriter, UnsafeSnapshot, assemble, loads
from phalanx.visualize import LocalSource


def writer(tmp_path, run_id="run1", written=None):
    def write_file(path, data):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    return SnapshotWriter(
        tmp_path,
        run_id,
        {"name": "t"},
        every_seconds=0.0,
        on_written=(written.append if written is not None else lambda p: None),
        write_file=write_file,
    )


def rec(i, epoch=1):
    return {"kind": "train", "epoch": epoch, "step": i, "epoch_progress": i / 10, "loss": 1.0 / (i + 1), "lr": 0.1}


def test_every_point_survives_across_sealed_segments(tmp_path, monkeypatch):
    monkeypatch.setattr(snapshots, "SEGMENT_RECORDS", 3)
    written = []
    w = writer(tmp_path, written=written)
    w.start([])
    for i in range(8):
        w.add(rec(i))
    history = LocalSource(tmp_path).history(warn=False)
    assert [r["step"] for r in history.records] == list(range(8))
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"segment_00000{i}.pkl" for i in (1, 2, 3)]
    sealed = [loads(p.read_bytes())["sealed"] for p in sorted(tmp_path.iterdir())]
    assert sealed == [True, True, False]
    # A sealed segment is written once, when it fills, never again.
    assert sum(p.name == "segment_000001.pkl" for p in written) == 4  # empty start + 3 points


def test_a_resumed_run_starts_a_new_generation_that_replaces_the_history(tmp_path, monkeypatch):
    monkeypatch.setattr(snapshots, "SEGMENT_RECORDS", 3)
    w = writer(tmp_path)
    w.start([])
    for i in range(8):
        w.add(rec(i, epoch=1 + i // 4))
    resumed = writer(tmp_path)
    resumed.start([rec(i) for i in range(4)])  # the checkpoint was after epoch 1
    resumed.add(rec(99, epoch=2))
    history = LocalSource(tmp_path).history(warn=False)
    assert history.generation == 2
    assert [r["step"] for r in history.records] == [0, 1, 2, 3, 99]
    assert not (tmp_path / "segment_000003.pkl").exists()


def test_an_incomplete_generation_is_not_read_until_it_is_complete():
    seg = {"schema": 1, "run_id": "r", "options": {}}
    old = [
        dict(seg, generation=1, segment=1, sealed=True, records=[1, 2]),
        dict(seg, generation=1, segment=2, sealed=False, records=[3]),
    ]
    half_written = dict(seg, generation=2, segment=2, sealed=False, records=[9])
    assert assemble(old).records == [1, 2, 3]
    assert assemble(old + [half_written]) is None  # generation 2 lacks its segment 1 so far
    assert assemble([]) is None


class Evil:
    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(lambda marker: Evil(os.system, f"touch {marker}"), id="os.system"),
        pytest.param(lambda marker: Evil(eval, f"open({str(marker)!r}, 'w')"), id="builtins.eval"),
        pytest.param(lambda marker: Evil(subprocess.Popen, ["touch", str(marker)]), id="subprocess.Popen"),
        pytest.param(lambda marker: {"schema": 1, "records": [Evil(print, "hi")]}, id="nested-global"),
        pytest.param(lambda marker: __import__("torch").ones(2), id="torch-rebuild-helpers"),
        pytest.param(lambda marker: {1, 2}, id="set-needs-a-global"),
    ],
)
def test_hostile_pickles_are_refused_and_nothing_runs(tmp_path, payload):
    marker = tmp_path / "pwned"
    data = pickle.dumps(payload(marker), protocol=2)
    with pytest.raises(UnsafeSnapshot):
        loads(data)
    assert not marker.exists()


def test_a_bad_file_is_warned_about_once_and_the_good_ones_still_read(tmp_path, capsys):
    w = writer(tmp_path)
    w.start([rec(0)])
    (tmp_path / "segment_000002.pkl").write_bytes(pickle.dumps(Evil(os.system, "true")))
    source = LocalSource(tmp_path)
    for _ in range(3):
        assert [r["step"] for r in source.history(warn=True).records] == [0]
    err = capsys.readouterr().err
    assert err.count("ignoring snapshot segment_000002.pkl") == 1
    assert "os.system" in err or "posix.system" in err


def test_writer_refuses_non_plain_data(tmp_path):
    w = writer(tmp_path)
    w.start([])
    w.records.append({"loss": object()})
    with pytest.raises(UnsafeSnapshot):
        w.flush()


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(lambda: {"schema": 1, "records": [{1, 2}]}, id="set"),
        pytest.param(lambda: {"schema": 1, "records": [frozenset({1})]}, id="frozenset"),
        pytest.param(lambda: {"schema": 1, "records": [bytearray(b"x")]}, id="bytearray"),
    ],
)
def test_the_plain_data_check_refuses_what_the_unpickler_lets_through(payload):
    # Protocol 5 builds these with opcodes of their own, no global: only the plain-data check stops them.
    data = pickle.dumps(payload(), protocol=5)
    assert b"builtins" not in data
    with pytest.raises(UnsafeSnapshot, match="plain data only"):
        loads(data)


def test_a_shared_reference_bomb_is_refused_quickly():
    import time

    nested = [1]
    for _ in range(6):  # each level repeats the one below 100 times: 10^12 leaves in about 2 KB
        nested = [nested] * 100
    data = pickle.dumps({"schema": 1, "records": nested}, protocol=4)
    assert len(data) < 4096
    started = time.monotonic()
    with pytest.raises(UnsafeSnapshot, match="more than"):
        loads(data)
    assert time.monotonic() - started < 60  # refused early; unbounded, the walk would take hours


@pytest.mark.parametrize(
    "records",
    [
        pytest.param([1], id="record-not-a-mapping"),
        pytest.param([{"kind": "train", "epoch": 1, "step": 1, "loss": 0.5, "lr": 0.1}], id="train-without-progress"),
        pytest.param([{"kind": "val", "epoch": 1, "loss": "high", "acc": 0.5}], id="val-loss-not-a-number"),
    ],
)
def test_a_snapshot_of_the_wrong_shape_is_skipped_with_a_warning(tmp_path, capsys, records):
    w = writer(tmp_path)
    w.start([rec(0)])
    bad = {
        "schema": 1,
        "run_id": "run1",
        "generation": 1,
        "segment": 2,
        "sealed": False,
        "options": {},
        "records": records,
    }
    (tmp_path / "segment_000002.pkl").write_bytes(pickle.dumps(bad))
    with pytest.raises(ValueError):
        loads(pickle.dumps(bad))
    assert [r["step"] for r in LocalSource(tmp_path).history(warn=True).records] == [0]
    assert capsys.readouterr().err.count("ignoring snapshot segment_000002.pkl") == 1

"""``phalanx scale`` (a scaling analysis of the user's configuration, real torchrun workers) and
``--max-steps`` (what each of its points trains)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import snapshot_tree


def window(step: int, steps: int, seconds_a_step: float, samples_a_step: int, parts: tuple[float, ...]) -> dict:
    keys = ("step_data_s", "step_compute_s", "step_communication_s", "step_optimizer_s", "step_logging_s")
    return {
        "kind": "train",
        "step": step,
        "seconds": steps * seconds_a_step,
        "samples": steps * samples_a_step,
        **dict(zip(keys, parts)),
    }


def test_speedup_efficiency_and_the_breakdown_come_from_each_points_own_records():
    """A world size made slow by hand: 1 worker takes 0.1 s a step of 32 samples, 2 workers 0.125 s
    a step of 64 (weak scaling): 1.6x, 80% efficient, communication 16% of a step (as recorded), 20%
    of a step beyond 1 worker's. The warm-up's
    windows (a slow first step) are left out; windows of different lengths are weighed by steps."""
    from phalanx.launch.scale import Point, measure, median_point, table, verdict

    one = measure(
        Point("weak", 1, 32),
        [
            window(5, 5, 9.0, 32, (9, 0, 0, 0, 0)),
            window(10, 5, 0.1, 32, (0.01, 0.08, 0, 0.01, 0)),
            window(20, 10, 0.1, 32, (0.01, 0.08, 0, 0.01, 0)),
            {"kind": "val", "step": 20},
        ],
        5,
    )
    two = measure(
        Point("weak", 2, 32),
        [
            window(5, 5, 9.0, 64, (9, 0, 0, 0, 0)),
            window(8, 3, 0.125, 64, (0.01, 0.08, 0.02, 0.015, 0)),
            window(20, 12, 0.125, 64, (0.01, 0.08, 0.02, 0.015, 0)),
        ],
        5,
    )
    assert (one.rate, one.step_s) == (pytest.approx(320), pytest.approx(0.1))
    assert (two.rate, two.step_s) == (pytest.approx(512), pytest.approx(0.125))
    assert two.parts == pytest.approx(
        {"data": 0.01, "compute": 0.08, "communication": 0.02, "optimizer": 0.015, "logging": 0.0}
    )
    rows = table([one, two])
    assert rows[2].split()[:6] == ["weak", "2", "32", "512.0", "1.60x", "80%"], rows
    assert rows[2].split()[7:] == ["8%", "64%", "16%", "12%", "0%"], rows
    # A 2-worker point whose records show one process (a launcher that started separate ones) fails
    from phalanx.errors import RunFailed

    with pytest.raises(RunFailed, match="formed a group of 1, not 2"):
        measure(
            Point("weak", 2, 32),
            [
                {**window(5, 5, 0.1, 64, (0, 0, 0, 0, 0)), "world_size": 1},
                {**window(10, 5, 0.1, 64, (0, 0, 0, 0, 0)), "world_size": 1},
            ],
            5,
        )
    repeats = [Point("weak", 2, 32, rate) for rate in (3.0, 1.0, 2.0)]  # --repeats: each point's median repeat
    assert median_point(repeats) is repeats[2]
    assert (
        verdict([one, two]) == "2 workers (weak scaling): 1.60x, 80% efficient; communication 16% of a step; "
        "20% of a step beyond 1 worker's (communication, contention)"
    )
    slow_one = Point("weak", 1, 32, 64.0, one.step_s, one.parts)  # a loaded machine's 1-worker point
    assert verdict([slow_one, two]).endswith(
        "8.00x, 400% efficient; communication 16% of a step; 20% of a step "
        "beyond 1 worker's (communication, contention); above 100% efficient, "
        "the 1-worker point ran slow (a loaded machine?): --repeats 3 "
        "interleaves the points and takes each one's median"
    )
    assert "above 100%" not in verdict([one, two])


def test_scale_runs_the_world_sizes_it_says_and_touches_no_run(tmp_path, phalanx):
    """--dry-run lists the points; a real run (weak scaling, 1 and 2 gloo workers) measures each,
    writes its JSON, and leaves an existing run with the same --name and --checkpoints-dir as it was."""
    existing = tmp_path / "ck/experiment"
    assert phalanx("train", "--epochs", 1, "--checkpoints-dir", tmp_path / "ck", "--no-progress").code == 0
    before = snapshot_tree(existing)
    plan = phalanx("scale", "--workers", "2", "--scaling", "both", "--batch-size", 16, "--dry-run")
    assert plan.code == 0, plan.err
    assert [line.split(":")[0].strip() for line in plan.out.splitlines()[1:]] == [
        "weak scaling, 1 worker",
        "weak scaling, 2 workers",
        "strong scaling, 1 worker",
        "strong scaling, 2 workers",
    ]
    assert "--batch-size 8 per worker (global 16)" in plan.out.splitlines()[-1]
    odd = phalanx("scale", "--workers", "2", "--scaling", "strong", "--batch-size", 15)
    assert odd.code == 2 and odd.err.startswith("phalanx: --workers: strong scaling splits --batch-size 15")
    for bad in ("0", "two"):
        refused = phalanx("scale", "--workers", bad)
        assert refused.code == 2 and len(refused.err.strip().splitlines()) == 1, refused.err

    taken = phalanx("scale", "--scale-pickle-dir", existing / "pickle")
    assert taken.code == 2 and "holds snapshots already" in taken.err

    done = phalanx(
        "scale",
        "--workers",
        "2",
        "--scaling",
        "weak",
        "--steps",
        6,
        "--warmup-steps",
        3,
        "--checkpoints-dir",
        tmp_path / "ck",
        "--output",
        tmp_path / "scale.json",
        "--scale-pickle-dir",
        tmp_path / "dashboard",
    )
    assert done.code == 0, done.err
    found = json.loads((tmp_path / "scale.json").read_text())
    assert [(p["scaling"], p["workers"], p["batch"]) for p in found["points"]] == [("weak", 1, 32), ("weak", 2, 32)]
    one, two = found["points"]
    for p in found["points"]:  # samples/s x seconds a step: the global batch, if the steps were counted right
        assert p["rate"] * p["step_s"] == pytest.approx(32 * p["workers"], rel=1e-6), p
    speedup = two["rate"] / one["rate"]
    assert f"{speedup:.2f}x" in done.out and found["verdict"].startswith(f"2 workers (weak scaling): {speedup:.2f}x")
    assert snapshot_tree(existing) == before
    # the dashboard's table (what `phalanx visualize --pickle-dir` draws), from the same points
    from phalanx.records.snapshots import assemble, loads
    from phalanx.records.windows import drawn_windows

    history = assemble([loads(path.read_bytes()) for path in (tmp_path / "dashboard").glob("segment_*.pkl")])
    panes, table = [r for r in history.records if r["kind"] in ("panes", "table")]
    assert [w["win"] for w in drawn_windows(panes["panes"], {"table"})] == ["scale"]
    assert [row[0] for row in table["rows"]] == ["weak, 1 worker x 32", "weak, 2 workers x 32", "verdict"]
    assert table["rows"][1][1].startswith(f"{two['rate']:.1f} samples/s, {speedup:.2f}x")
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["experiment"]


def test_max_steps_stops_mid_epoch_with_a_checkpoint_that_resumes_bitwise(tmp_path, phalanx):
    """--max-steps 30 (of 45 a digits epoch) stops with latest.pt 960 samples into epoch 1, no
    validation (resumed at --max-steps 30, nothing to do, nothing written); --max-steps 45 ends epoch 1
    as any epoch ends; --resume auto then trains to the end, bitwise the straight run, and a limit
    already reached is nothing to do."""
    common = ["--epochs", 2, "--checkpoints-dir", tmp_path, "--no-progress"]
    assert phalanx("train", "--name", "straight", *common).code == 0
    stopped = phalanx("train", "--name", "cut", "--max-steps", 30, *common)
    assert stopped.code == 0, stopped.err
    assert "stopped at step 30 (--max-steps), 960 samples into epoch 1" in stopped.err + stopped.out
    saved = torch.load(tmp_path / "cut/latest.pt", weights_only=True)
    assert (saved["epoch"], saved["position"], saved["step"]) == (0, 960, 30)
    assert not (tmp_path / "cut/best.pt").exists()  # nothing validated
    written = {path: path.read_bytes() for path in (tmp_path / "cut").rglob("*") if path.is_file()}
    reached = phalanx("train", "--name", "cut", "--max-steps", 30, *common, "--resume", "auto")
    assert reached.code == 0 and "nothing to do: " in reached.out and "is at step 30, --max-steps 30" in reached.out
    assert {path: path.read_bytes() for path in (tmp_path / "cut").rglob("*") if path.is_file()} == written
    at_epoch_end = phalanx(
        "train", "--name", "cut", "--max-steps", 45, *common, "--resume", "auto"
    )  # 45: epoch 1's last
    assert at_epoch_end.code == 0 and "stopped at step 45 (--max-steps), after epoch 1" in at_epoch_end.out
    assert (tmp_path / "cut/best.pt").exists()  # an epoch's end as any other: validated
    assert phalanx("train", "--name", "cut", *common, "--resume", "auto").code == 0
    again = phalanx("train", "--name", "cut", *common, "--resume", "auto", "--max-steps", 30)  # reached long ago
    assert again.code == 0 and "nothing to do" in again.out and "stopped" not in again.out
    final = torch.load(tmp_path / "cut/latest.pt", weights_only=True)["model"]
    straight = torch.load(tmp_path / "straight/latest.pt", weights_only=True)["model"]
    assert all(torch.equal(final[k], straight[k]) for k in straight)

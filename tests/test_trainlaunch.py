"""`phalanx trainlaunch`: real torchrun processes on CPU/gloo."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import USER_MODELS, free_port, processes_with, records, run_phalanx, start_phalanx, wait_until
from phalanx.config import RunConfig
from phalanx.data import build_datasets
from phalanx.launch import describe, plan_launch
from phalanx.models import SmallCNN
from phalanx.parallel import DistEnv, cpu_threads_per_worker, worker_device
from phalanx.rundir import read_metrics

def test_two_cpu_workers_as_written_reach_95_percent_with_exact_validation(tmp_path):
    # The exact command of the issue, from a fresh directory (default ./checkpoints/experiment).
    result = run_phalanx("trainlaunch", "--use-torchrun", "--nproc_per_node 2", cwd=tmp_path)
    assert result.code == 0, result.err
    run = tmp_path / "checkpoints" / "experiment"
    val = records(run, "val")
    assert val[-1]["acc"] >= 0.95 and val[-1]["world_size"] == 2
    # 359 validation images over 2 ranks (180 + 179): each counted once, none padded twice.
    assert all(r["samples"] == 359 for r in val)
    end = records(run, "end")[-1]
    assert end["max_rank_divergence"] == 0.0  # every rank holds the same parameters
    assert f"({cpu_threads_per_worker(2)} threads per worker)" in result.out
    # The reported accuracy is exactly what one process computes from the saved weights.
    cfg = RunConfig()
    data = build_datasets(cfg, None)
    model = SmallCNN()
    model.load_state_dict(torch.load(run / "latest.pt")["model"])
    images = torch.stack([data.val[i][0] for i in range(len(data.val))])
    labels = torch.tensor([data.val[i][1] for i in range(len(data.val))])
    with torch.no_grad():
        acc = (model(images).argmax(1) == labels).sum().item() / len(labels)
    assert acc == pytest.approx(val[-1]["acc"], abs=1e-9)


def test_ddp_two_workers_equal_one_process_with_twice_the_batch(tmp_path, phalanx):
    common = ["--epochs", 1, "--lr-schedule", "constant", "--checkpoints-dir", tmp_path, "--no-progress"]
    ddp = run_phalanx("trainlaunch", "--name", "ddp", "--batch-size", 16, *common,
                      "--use-torchrun", "--nproc-per-node=2")
    assert ddp.code == 0, ddp.err
    single = phalanx("train", "--name", "single", "--batch-size", 32, *common)
    assert single.code == 0, single.err
    a = torch.load(tmp_path / "ddp/latest.pt")
    b = torch.load(tmp_path / "single/latest.pt")
    assert a["step"] == b["step"] == 45  # 1438 samples, 32 per step
    for key in a["model"]:
        assert torch.allclose(a["model"][key], b["model"][key], atol=1e-5, rtol=0), key


def test_worker_killed_mid_epoch_is_restarted_and_the_history_is_complete(tmp_path):
    proc = start_phalanx("trainlaunch", "--model", "phalanx_testmodels:slow", "--epochs", 4, "--name", "killrun",
                 "--checkpoints-dir", tmp_path, "--log-every", 2, "--no-progress",
                 "--use-torchrun", "--nproc_per_node 2 --max-restarts 1")
    metrics = tmp_path / "killrun" / "metrics.jsonl"
    try:
        # Mid-epoch 2: a checkpoint of epoch 1 exists and epoch 2 has begun.
        wait_until(lambda: metrics.exists() and any(r["kind"] == "train" and r["epoch"] == 2
                                                  for r in read_metrics(metrics)))
        workers = [p for p in processes_with("killrun") if b"phalanx.worker" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert len(workers) == 2
        os.kill(max(workers), signal.SIGKILL)
        out, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "resumed from" in out
    val_epochs = [r["epoch"] for r in records(tmp_path / "killrun", "val")]
    assert val_epochs == [1, 2, 3, 4]  # none lost, none repeated
    train_steps = [r["step"] for r in records(tmp_path / "killrun", "train")]
    assert train_steps == sorted(set(train_steps))
    assert torch.load(tmp_path / "killrun/latest.pt")["epoch"] == 4


def test_a_worker_that_raises_fails_the_launch_naming_the_rank(tmp_path):
    result = run_phalanx("trainlaunch", "--model", "phalanx_testmodels:fails_on_rank1", "--name", "boomrun",
                         "--checkpoints-dir", tmp_path, "--use-torchrun", "--nproc_per_node 2", env=USER_MODELS)
    assert result.code == 1
    last = result.err.strip().splitlines()[-1]
    assert last.startswith("phalanx: rank 1") and "boom from the test model on rank 1" in last
    time.sleep(0.5)
    assert processes_with("boomrun") == []  # no orphan worker


def test_sigterm_to_trainlaunch_stops_every_worker(tmp_path):
    proc = start_phalanx("trainlaunch", "--model", "phalanx_testmodels:slow", "--epochs", 50, "--name", "termrun",
                 "--checkpoints-dir", tmp_path, "--log-every", 2, "--use-torchrun", "--nproc_per_node 2")
    metrics = tmp_path / "termrun" / "metrics.jsonl"
    try:
        wait_until(lambda: metrics.exists() and metrics.stat().st_size > 0)
        assert len(processes_with("termrun")) >= 3  # the launcher and two workers
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    assert "SIGTERM" in err.strip().splitlines()[-1]
    time.sleep(0.5)
    assert processes_with("termrun") == []


def test_two_nodes_on_one_machine_train_one_run(tmp_path):
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = [start_phalanx("trainlaunch", "--epochs", 2, "--name", "multinode", "--checkpoints-dir", tmp_path,
                   "--no-progress", "--use-torchrun",
                   f"--nnodes 2 --node_rank {rank} --nproc_per_node 1 --rdzv-backend c10d "
                   f"--rdzv-endpoint {endpoint} --rdzv-id multinode-test")
             for rank in (0, 1)]
    outputs = [node.communicate(timeout=240) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    val = records(tmp_path / "multinode", "val")
    assert [r["world_size"] for r in val] == [2, 2]
    assert sum("val_acc" in out for out, _ in outputs) == 1  # only global rank 0 reports


def test_train_joins_a_process_group_set_up_by_an_outside_scheduler(tmp_path):
    # What a Kubernetes pod per rank or SLURM does: set the variables and run `phalanx train`.
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        procs.append(subprocess.Popen([sys.executable, "-m", "phalanx.cli", "train", "--epochs", "1",
                                       "--checkpoints-dir", str(tmp_path), "--no-progress"],
                                      env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outputs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert "DDP rank 0/2" in outputs[0][0] and outputs[1][0] == ""
    assert records(tmp_path / "experiment", "val")[0]["world_size"] == 2


def test_dry_run_prints_argv_world_devices_batch_and_lr(phalanx, tmp_path):
    result = phalanx("trainlaunch", "--dry-run", "--batch-size", 16, "--scale-lr", "linear",
                     "--checkpoints-dir", tmp_path, "--use-torchrun", "--nproc_per_node 2 --max-restarts 1")
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0].startswith("torchrun --nproc_per_node 2 --max-restarts 1 -m phalanx.worker '{")
    assert "world size: 2" in result.out
    assert "local rank 0: cpu" in result.out and "local rank 1: cpu" in result.out
    assert "16 per process, 32 effective" in result.out
    assert "learning rate: 0.2" in result.out
    assert not tmp_path.joinpath("experiment").exists()


def test_local_rank_r_uses_gpu_ids_r_without_cuda_visible_devices():
    # Pure mapping, no CUDA needed: --gpu-ids 2 --gpu-ids 3 puts local rank 0 on GPU 2, rank 1 on 3.
    cfg = RunConfig(gpu_ids=(2, 3))
    assert [worker_device(cfg, DistEnv(r, r, 2, 2)) for r in (0, 1)] == [torch.device("cuda", 2),
                                                                        torch.device("cuda", 3)]
    plan = plan_launch(cfg, "--nproc_per_node 2")
    report = describe(cfg, plan)
    assert "local rank 0: cuda:2" in report and "local rank 1: cuda:3" in report
    assert "backend nccl" in report[1]
    assert "CUDA_VISIBLE_DEVICES" not in " ".join(plan.torchrun_argv)


def test_config_reaches_the_workers_as_one_argv_element():
    cfg = RunConfig(name="it's \"quoted\" $(touch pwned) `id`", epochs=3)
    plan = plan_launch(cfg, "--nproc-per-node=2")
    assert plan.torchrun_argv[:3] == ["--nproc-per-node=2", "-m", "phalanx.worker"]
    assert RunConfig.from_json(plan.torchrun_argv[3]) == cfg


@pytest.mark.parametrize("torchrun, words", [
    ('--nproc_per_node "2', "No closing quotation"),
    ("--nproc_per_node 2 --no-such-option", "unrecognized arguments"),
    ("--nproc_per_node two", "torchrun says"),
    ("train.py", "torchrun's options only"),
    ("--nproc_per_node 2 -m other.module", "torchrun's options only"),
])
def test_bad_torchrun_strings_are_one_line_before_any_process(phalanx, tmp_path, torchrun, words):
    result = phalanx("trainlaunch", "--checkpoints-dir", tmp_path, "--use-torchrun", torchrun)
    assert result.code == 2
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and "--use-torchrun" in lines[0] and words in lines[0], result.err
    assert list(tmp_path.iterdir()) == []


def test_more_workers_than_gpu_ids_is_refused():
    from phalanx.errors import PhalanxError

    with pytest.raises(PhalanxError, match="3 workers per node but only 2 --gpu-ids"):
        plan_launch(RunConfig(gpu_ids=(0, 1)), "--nproc_per_node 3")


def test_nccl_on_cpu_conflicts(phalanx, tmp_path):
    result = phalanx("trainlaunch", "--backend", "nccl", "--checkpoints-dir", tmp_path)
    assert result.code == 2 and "--backend: nccl needs GPUs" in result.err


def test_train_and_trainlaunch_accept_the_same_training_options():
    from phalanx.cli import train, trainlaunch

    def options(command):
        return {opt for param in command.params for opt in param.opts + param.secondary_opts}

    launcher_only = {"--use-torchrun", "--dry-run"}
    assert options(train) == options(trainlaunch) - launcher_only
    assert len(options(train)) > 30


def test_without_use_torchrun_one_worker_per_gpu_id_or_one_cpu_worker(phalanx, tmp_path):
    result = phalanx("trainlaunch", "--dry-run", "--checkpoints-dir", tmp_path)
    assert result.code == 0 and result.out.startswith("torchrun --nproc-per-node 1 -m phalanx.worker")
    plan = plan_launch(RunConfig(gpu_ids=(0, 1, 2)), None)
    assert plan.torchrun_options == ["--nproc-per-node", "3"] and plan.nproc_per_node == 3


def test_a_single_process_checkpoint_resumes_under_ddp(tmp_path, phalanx):
    assert phalanx("train", "--epochs", 1, "--checkpoints-dir", tmp_path, "--no-progress").code == 0
    result = run_phalanx("trainlaunch", "--epochs", 2, "--resume", "auto", "--checkpoints-dir", tmp_path,
                         "--no-progress", "--use-torchrun", "--nproc_per_node 2")
    assert result.code == 0, result.err
    assert "resumed from" in result.out
    val = records(tmp_path / "experiment", "val")
    assert [(r["epoch"], r["world_size"]) for r in val] == [(1, 1), (2, 2)]

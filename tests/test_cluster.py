"""Schedulers for real: a one-node SLURM cluster (Debian's slurm-wlm and munge) started by the
test session on loopback, the sbatch scripts of examples/slurm/ (docs/clusters.md) submitted to it; and Open MPI's mpirun."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, USER_MODELS, free_port, gate, paused, records, release, wait_until

from phalanx.distributed.cluster import first_host, launcher_name, placement_from, tasks_on_node
from phalanx.errors import PhalanxError

TRAIN_SAMPLES = 1438


# --- which launcher, from the variables (no processes) --------------------------------------------

SLURM_TASK = {
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_NTASKS": "4",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_STEP_NODELIST": "gpu[07-08]",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
}


def test_an_srun_task_is_placed_from_slurms_variables():
    placement = placement_from(SLURM_TASK)
    assert (
        placement.launcher,
        placement.rank,
        placement.local_rank,
        placement.world_size,
        placement.local_world_size,
    ) == ("slurm", 3, 1, 4, 2)
    assert (placement.master_addr, placement.master_port) == ("gpu07", 15000 + 4242 % 20000)
    # Each step of a job its own port, step 0 the job's; the next job's step 0 is none of the steps'
    ports = [placement_from({**SLURM_TASK, "SLURM_STEP_ID": str(s)}).master_port for s in range(50)]
    assert ports[0] == 15000 + 4242 and len(set(ports)) == 50 and 15000 + 4243 not in ports
    assert placement_from({**SLURM_TASK, "MASTER_PORT": "29999"}).master_port == 29999


def test_torchrun_wins_over_slurm_and_mpi_wins_inside_an_allocation():
    torchrun = {
        **SLURM_TASK,
        "RANK": "1",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "node0",
        "MASTER_PORT": "29400",
        "TORCHELASTIC_RUN_ID": "job",
    }
    assert (placement_from(torchrun).launcher, placement_from(torchrun).rank) == ("torchrun", 1)
    # mpirun inside an sbatch allocation: every rank inherits the batch script's SLURM_PROCID=0.
    batch = {k: v for k, v in SLURM_TASK.items() if not k.startswith("SLURM_STEP")}
    mpi = {
        **batch,
        "SLURM_PROCID": "0",
        "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "MASTER_ADDR": "h",
        "MASTER_PORT": "1",
    }
    assert (placement_from(mpi).launcher, placement_from(mpi).rank, placement_from(mpi).world_size) == ("mpi", 1, 2)
    assert placement_from(batch) is None  # the batch script itself is no task of a step
    assert "not an srun task" in launcher_name(batch)
    pod = {"RANK": "2", "WORLD_SIZE": "4", "MASTER_ADDR": "svc", "MASTER_PORT": "23456"}
    assert (placement_from(pod).launcher, placement_from(pod).local_rank) == ("env", 0)


def test_mpi_without_a_rendezvous_address_says_how_to_give_one():
    with pytest.raises(PhalanxError, match="started by mpirun .Open MPI.: MASTER_ADDR is not set; export MASTER_ADDR"):
        placement_from({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"})


@pytest.mark.parametrize(
    "nodelist, host",
    [
        ("vm", "vm"),
        ("gpu[07-09,12],cpu3", "gpu07"),
        ("n[1-2]", "n1"),
        ("a1,a2", "a1"),
        ("rack2-n[003,005]", "rack2-n003"),
    ],
)
def test_the_first_host_of_a_node_list(nodelist, host):
    assert first_host(nodelist) == host


def test_tasks_per_node():
    assert [tasks_on_node("2(x3),1", n) for n in range(4)] == [2, 2, 2, 1] and tasks_on_node("4", 0) == 4


# --- a real one-node SLURM cluster ----------------------------------------------------------------

SLURM_BINARIES = ("slurmctld", "slurmd", "munged", "sbatch", "scontrol", "squeue")


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    missing = [b for b in SLURM_BINARIES if not shutil.which(b)]
    if missing:
        pytest.skip(
            f"Debian's slurm-wlm and munge are not installed ({', '.join(missing)} missing); "
            "scripts/setup.sh --test installs them as root"
        )
    import tempfile

    # munged wants every folder above its socket open to all (execute): not pytest's 0700 ones.
    lab = Path(tempfile.mkdtemp(prefix="phalanx-slurm-", dir="/tmp"))
    lab.chmod(0o711)
    for folder in ("state", "spool", "log", "munge"):
        (lab / folder).mkdir()
    (lab / "munge").chmod(0o711)
    host = socket.gethostname().split(".")[0]
    conf = lab / "slurm.conf"
    cpus = len(os.sched_getaffinity(0))  # what slurmd finds: a container may hold fewer than the machine
    conf.write_text(SLURM_CONF.format(lab=lab, host=host, cpus=cpus, ctld=free_port(), slurmd=free_port()))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    key = lab / "munge" / "munge.key"
    subprocess.run(["mungekey", "-c", "-k", str(key)], check=True, capture_output=True)
    key.chmod(0o600)
    subprocess.run(
        [
            "munged",
            f"--key-file={key}",
            f"--socket={lab}/munge/munge.socket",
            f"--pid-file={lab}/munge/munged.pid",
            f"--log-file={lab}/log/munged.log",
            f"--seed-file={lab}/munge/munged.seed",
        ],
        check=True,
        env=env,
    )
    daemons = [subprocess.Popen(["slurmctld", "-D"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)]
    wait_until(
        lambda: b"is UP" in subprocess.run(["scontrol", "ping"], env=env, capture_output=True).stdout, 60, "slurmctld"
    )
    daemons.append(subprocess.Popen(["slurmd", "-D"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
    wait_until(
        lambda: (
            subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=env, capture_output=True, text=True).stdout.strip()
            == "idle"
        ),
        60,
        "the node to be idle",
    )
    yield env
    subprocess.run(["scancel", "-u", "root"], env=env, capture_output=True)
    for daemon in reversed(daemons):
        daemon.terminate()
        daemon.wait(timeout=30)
    os.kill(int((lab / "munge/munged.pid").read_text()), 15)
    shutil.rmtree(lab, ignore_errors=True)


SLURM_CONF = """\
ClusterName=phalanx-test
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld}
SlurmdPort={slurmd}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={lab}/munge/munge.socket,cred_expire=5
StateSaveLocation={lab}/state
SlurmdSpoolDir={lab}/spool
SlurmctldPidFile={lab}/slurmctld.pid
SlurmdPidFile={lab}/slurmd.pid
SlurmctldLogFile={lab}/log/slurmctld.log
SlurmdLogFile={lab}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
JobRequeue=1
KillWait=30
MailProg=/bin/true
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


def submit(
    slurm_env: dict, script: str, workdir: Path, *args: str, env: dict | None = None, sbatch: tuple[str, ...] = ()
) -> str:
    """sbatch an example script (examples/slurm, docs/clusters.md) from ``workdir``, as a user would (``sbatch``: sbatch's own options,
    ``args``: the script's); returns the job id."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{slurm_env['PATH']}"  # `phalanx` as installed
    done = subprocess.run(
        ["sbatch", "--parsable", *sbatch, str(REPO / "examples" / "slurm" / script), *args],
        cwd=workdir,
        env={**slurm_env, **USER_MODELS, "PATH": path, "PHALANX_GPU_IDS": "-1", **(env or {})},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip().split(";")[0]


def job_state(slurm_env: dict, job: str) -> str:
    shown = subprocess.run(["scontrol", "show", "job", job], env=slurm_env, capture_output=True, text=True).stdout
    return next((w.split("=", 1)[1] for w in shown.split() if w.startswith("JobState=")), "GONE")


def wait_for_job(slurm_env: dict, job: str, timeout: float = 240) -> str:
    wait_until(
        lambda: job_state(slurm_env, job) in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "GONE"),
        timeout,
        f"job {job} to end",
    )
    return job_state(slurm_env, job)


def assert_every_epoch_once(run: Path, epochs: int, world: int) -> None:
    val = records(run, "val")
    assert [r["epoch"] for r in val] == list(range(1, epochs + 1))
    assert all(r["world_size"] == world for r in val)
    for epoch in range(1, epochs + 1):
        assert sum(r["samples"] for r in records(run, "train") if r["epoch"] == epoch) == TRAIN_SAMPLES


@pytest.mark.slow
def test_srun_phalanx_train_forms_one_ddp_group(slurm, tmp_path):
    job = submit(slurm, "train.sbatch", tmp_path, "--epochs", "2", env={"PHALANX_CHECKPOINTS": str(tmp_path)})
    assert wait_for_job(slurm, job) == "COMPLETED", (tmp_path / f"phalanx-{job}.out").read_text()
    output = (tmp_path / f"phalanx-{job}.out").read_text()
    run = tmp_path / f"phalanx-{job}"
    assert_every_epoch_once(run, 2, world=2)
    assert output.count("phalanx: built-in digits") == 1 and "DDP rank 0/2" in output  # only rank 0 reports
    assert [p.name for p in run.iterdir() if p.suffix == ".pt"].count("latest.pt") == 1


@pytest.mark.slow
def test_srun_phalanx_trainlaunch_runs_one_torchrun_per_node(slurm, tmp_path):
    job = submit(
        slurm,
        "trainlaunch.sbatch",
        tmp_path,
        "--epochs",
        "1",
        env={"PHALANX_CHECKPOINTS": str(tmp_path), "PHALANX_NPROC": "2"},
    )
    assert wait_for_job(slurm, job) == "COMPLETED", (tmp_path / f"phalanx-{job}.out").read_text()
    assert_every_epoch_once(tmp_path / f"phalanx-launch-{job}", 1, world=2)


@pytest.mark.slow
def test_a_job_requeued_mid_run_resumes_with_nothing_lost(slurm, tmp_path):
    job = submit(
        slurm,
        "train.sbatch",
        tmp_path,
        "--epochs",
        "3",
        "--model",
        "phalanx_testmodels:slow",
        "--log-every",
        "1",
        env={"PHALANX_CHECKPOINTS": str(tmp_path), **gate(tmp_path / "gate", 30)},
    )
    run = tmp_path / f"phalanx-{job}"
    paused(tmp_path / "gate", ranks=2, timeout=240)  # both tasks in the 7th step of epoch 2
    subprocess.run(["scontrol", "requeue", job], env=slurm, check=True)  # SIGTERM to every task, then again
    release(tmp_path / "gate")  # the requeued job passes the gate: it stays open
    assert wait_for_job(slurm, job, timeout=300) == "COMPLETED"
    output = (tmp_path / f"phalanx-{job}.out").read_text()  # both runs: --open-mode=append
    assert "stopped by SIGTERM at step" in output
    assert "resumed from" in output
    assert_every_epoch_once(run, 3, world=2)
    steps = [r["step"] for r in records(run, "train")]
    assert steps == list(range(1, steps[-1] + 1))  # every step once: none lost, none repeated


@pytest.mark.slow
def test_phalanx_scale_in_an_allocation_runs_each_world_size_as_an_srun_step(slurm, tmp_path):
    # 2 tasks: 1 worker in the batch script's process, 2 as an srun step that forms one group (a
    # point whose records show another world size fails the run); the scratch, under the checkpoints
    # directory, is gone afterwards.
    job = submit(
        slurm,
        "scale.sbatch",
        tmp_path,
        "--scaling",
        "weak",
        "--steps",
        "3",
        "--warmup-steps",
        "2",
        env={"PHALANX_CHECKPOINTS": str(tmp_path / "ck")},
        sbatch=("--ntasks=2",),
    )
    output = tmp_path / f"phalanx-scale-{job}.out"
    assert wait_for_job(slurm, job) == "COMPLETED", output.read_text()
    said = output.read_text()
    assert "weak 1 worker(s) (one process)" in said and "weak 2 worker(s) (srun)" in said, said
    found = json.loads((tmp_path / f"scale-{job}.json").read_text())
    assert [(p["scaling"], p["workers"]) for p in found["points"]] == [("weak", 1), ("weak", 2)]
    assert found["verdict"].startswith("2 workers (weak scaling)")
    assert list((tmp_path / "ck").iterdir()) == []


def test_scale_in_an_allocation_plans_its_sizes_from_its_tasks(phalanx, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_NTASKS", "6")
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    plan = phalanx("scale", "--scaling", "weak", "--dry-run")
    assert plan.code == 0, plan.err
    assert "in SLURM job 77 (6 tasks; 1 worker: one process; more: srun steps of its tasks)" in plan.out
    assert [line.split(":")[0].strip() for line in plan.out.splitlines()[1:]] == [
        f"weak scaling, {n} worker{'s' if n > 1 else ''}" for n in (1, 2, 4, 6)
    ]
    refused = phalanx("scale", "--workers", "8", "--dry-run")
    assert refused.code == 2 and "8 workers but this SLURM allocation has 6 task(s)" in refused.err
    monkeypatch.setenv("SLURM_STEP_ID", "0")  # an srun task is not an allocation's batch script: this machine
    assert "through torchrun" in phalanx("scale", "--dry-run").out


# --- Open MPI -------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(
    not shutil.which("mpirun"),
    reason="Debian's openmpi-bin is not installed (scripts/setup.sh --test installs it as root)",
)
def test_mpirun_starts_two_phalanx_train_processes_that_form_one_group(tmp_path):
    base = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"]
    argv = [
        sys.executable,
        "-m",
        "phalanx.cli",
        "train",
        "--epochs",
        "1",
        "--checkpoints-dir",
        str(tmp_path),
        "--no-progress",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    refused = subprocess.run(base + argv, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0
    assert "phalanx: environment: started by mpirun (Open MPI): MASTER_ADDR is not set" in refused.stderr
    assert "Traceback" not in refused.stderr and not (tmp_path / "experiment").exists()
    done = subprocess.run(
        base + ["-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={free_port()}"] + argv,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    assert "DDP rank 0/2" in done.stdout and done.stdout.count("phalanx: done") == 1
    assert [r["world_size"] for r in records(tmp_path / "experiment", "val")] == [2]

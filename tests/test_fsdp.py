"""``--strategy fsdp`` (torch's FSDP2 over gloo on the CPU, real torchrun processes): each rank holds
its share of every network's weights and optimizer state, the training is the one process's and
the hand-written loop's (float64), and checkpoints hold the networks whole, so a run resumes at
another world size under either strategy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import reference
import torch
from conftest import REPO, USER_MODELS, records, run_phalanx
from test_equivalence import reference_weights, weights


@pytest.mark.slow
def test_each_rank_holds_half_of_every_network_and_a_checkpoint_holds_them_whole(tmp_path):
    """A torchvision ResNet-18 and translate's U-Net and PatchGAN on 2 ranks: each rank's weights
    and Adam state are half of the network's (as the shards are cut: within a few percent for
    small layers), and the state gathered for a checkpoint (rank 0 keeps it, rank 1 drops it) loads
    back into fresh sharded networks. Validation sees rank 0's BatchNorm statistics on every rank,
    as under DDP. A block's weights stay gathered after its forward with
    --no-reshard-after-forward only; under --precision bf16 a block runs in bfloat16 and its
    gradients are averaged in float32. The weights are sharded on the CPU workers' mesh where the
    machine has an accelerator (said to be CUDA here: the GPU machine's failure of 2026-11-27)."""
    env = {**os.environ, **USER_MODELS, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node=2",
            "--standalone",
            str(REPO / "tests/support/fsdp_ranks.py"),
            str(tmp_path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in (0, 1)]
    assert [found["mesh_devices"] for found in ranks] == [{"cpu"}, {"cpu"}]  # not the accelerator's (CUDA's)
    for name in ("resnet18", "G", "D"):
        held = [found[name]["weights"] for found in ranks]
        assert sum(held) == ranks[0][name]["total"], name
        assert all(0.45 < h / ranks[0][name]["total"] < 0.55 for h in held), (name, held)
        assert [found[name]["optimizer"] for found in ranks] == [2 * h for h in held], name  # Adam's two moments
        whole = ranks[0][name]["whole"]["model"]
        assert all(torch.is_tensor(v) for v in whole.values())
        reloaded = ranks[0][name]["reloaded"]
        assert all(torch.equal(whole[k], reloaded[k]) for k in whole), name
        moments = ranks[0][name]["whole"]["optimizer"]["state"]
        assert (
            sum(v.numel() for s in moments.values() for k, v in s.items() if k != "step") == 2 * ranks[0][name]["total"]
        ), name
        dropped = [
            k for k, v in ranks[1][name]["whole"]["model"].items() if v is None
        ]  # rank 1 keeps no gathered weight
        assert dropped == ranks[1][name]["parameters"], name
    own, validated = zip(*(found["resnet18"]["statistics"] for found in ranks))
    assert not torch.equal(own[0], own[1])  # each rank's batch moved its statistics its own way...
    assert torch.equal(validated[0], own[0]) and torch.equal(validated[1], own[0])  # ...validation takes rank 0's
    assert [found["gathered_after_forward"] for found in ranks] == [{True: False, False: True}] * 2
    mixed = ranks[0]["mixed"]  # --precision bf16: gathered in bfloat16, kept and averaged in float32
    assert mixed["gathered"] == (torch.bfloat16, torch.bfloat16) and mixed["kept"] == {torch.float32}
    for name, mean in mixed["means"].items():
        assert torch.equal(mixed["grads"][name], mean), name
    assert any(not torch.equal(m.bfloat16().float(), m) for m in mixed["means"].values())  # a bf16 average would differ


@pytest.mark.slow
def test_fsdp_trains_what_the_hand_written_loop_does_and_resumes_at_another_world_size_or_preempted(tmp_path, phalanx):
    """float64: 2 FSDP workers x 16 equal the hand-written loop on batches of 32 (1e-12) for two
    epochs, each worker writing its half of every checkpoint. Its epoch-1 checkpoint resumes in one
    process and in 2 DDP workers, and one process's in 2 FSDP workers with accumulation (and
    --no-reshard-after-forward, --fsdp-checkpoints whole): each continues as the loop does with that
    epoch's global batch. The sharded run is preempted mid-epoch and resumed on the way. `phalanx
    consolidate` makes one file that evaluates as the run's last validation did."""
    import phalanx_testmodels

    common = [
        "--model",
        "phalanx_testmodels:double",
        "--epochs",
        2,
        "--batch-size",
        16,
        "--save-epoch-freq",
        1,
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
    ]
    # A SIGTERM to rank 0 in the 30th step of epoch 1 (of 45): every rank stops at one step, each
    # saves its shard, and the resumed run ends where the loop does. Shards no checkpoint names (a
    # write cut short, an old save) are gone after the resumed run's first save.
    stopping = ["--task", "phalanx_testtasks:StoppingClassify"]  # classify, and a SIGTERM at a chosen step
    sharded = [
        "trainlaunch",
        "--name",
        "fsdp",
        "--strategy",
        "fsdp",
        *stopping,
        *common,
        "--use-torchrun",
        "--nproc-per-node=2",
    ]
    stopped = run_phalanx(*sharded, env={**USER_MODELS, "PHALANX_TEST_STOP_STEP": "30"})
    assert stopped.code == 143 and "stopped by SIGTERM at step 30" in stopped.err, stopped.err
    assert "FSDP rank 0/2" in stopped.out
    assert 0 < torch.load(tmp_path / "fsdp/latest.pt", weights_only=True)["position"] < 1438
    for leftover in (".writing", "epoch0000-step00000001"):
        (tmp_path / "fsdp/shards" / leftover).mkdir()
        (tmp_path / "fsdp/shards" / leftover / "__0_0.distcp").write_bytes(b"cut short")
    resumed = run_phalanx(*sharded, "--resume", "auto", env=USER_MODELS)
    assert resumed.code == 0, resumed.err
    expected = reference_weights(phalanx_testmodels.double, epochs=2, global_batch=32, lr=0.1)
    assert reference.max_difference(weights(tmp_path / "fsdp/latest.pt"), expected) < 1e-12
    # Each epoch's shards, one file per rank, each about half of the weights and optimizer state
    shards = sorted((tmp_path / "fsdp/shards").iterdir())
    assert [d.name for d in shards] == ["epoch0001-step00000045", "epoch0002-step00000090"]
    for directory in shards:
        sizes = [(directory / f"__{rank}_0.distcp").stat().st_size for rank in (0, 1)]
        assert all(0.4 < size / sum(sizes) < 0.6 for size in sizes), sizes
    assert "model" not in torch.load(tmp_path / "fsdp/latest.pt", weights_only=True)  # in the shards alone

    single = phalanx("train", "--name", "single", "--grad-accum", 2, *common)
    assert single.code == 0, single.err
    for run, source in (("to-one", "fsdp"), ("to-ddp", "fsdp"), ("to-fsdp", "single")):
        (tmp_path / run).mkdir()
        shutil.copy(tmp_path / source / "epoch_0001.pt", tmp_path / run / "latest.pt")
        if source == "fsdp":  # a sharded checkpoint is its file and its shards
            shutil.copytree(
                tmp_path / "fsdp/shards/epoch0001-step00000045", tmp_path / run / "shards/epoch0001-step00000045"
            )
    one = phalanx("train", "--name", "to-one", *stopping, *common, "--resume", "auto")
    assert one.code == 0, one.err
    assert (
        reference.max_difference(
            weights(tmp_path / "to-one/latest.pt"),
            reference_weights(phalanx_testmodels.double, epochs=2, global_batch=[32, 16], lr=0.1),
        )
        < 1e-12
    )
    ddp = run_phalanx(
        "trainlaunch",
        "--name",
        "to-ddp",
        *stopping,
        *common,
        "--resume",
        "auto",
        "--use-torchrun",
        "--nproc-per-node=2",
        env=USER_MODELS,
    )
    assert ddp.code == 0, ddp.err
    assert reference.max_difference(weights(tmp_path / "to-ddp/latest.pt"), expected) < 1e-12
    two = run_phalanx(
        "trainlaunch",
        "--name",
        "to-fsdp",
        "--strategy",
        "fsdp",
        "--grad-accum",
        2,
        *common,
        "--no-reshard-after-forward",
        "--fsdp-checkpoints",
        "whole",
        "--resume",
        "auto",
        "--use-torchrun",
        "--nproc-per-node=2",
        env=USER_MODELS,
    )
    assert two.code == 0, two.err
    assert "model" in torch.load(tmp_path / "to-fsdp/latest.pt", weights_only=True)  # gathered whole by rank 0
    assert (
        reference.max_difference(
            weights(tmp_path / "to-fsdp/latest.pt"),
            reference_weights(phalanx_testmodels.double, epochs=2, global_batch=[32, 64], lr=0.1),
        )
        < 1e-12
    )

    made = phalanx("consolidate", "--checkpoint", tmp_path / "fsdp/latest.pt", "--output", tmp_path / "whole.pt")
    assert made.code == 0, made.err
    whole = torch.load(tmp_path / "whole.pt", weights_only=True)  # one file, the networks and Adam's state in it
    straight = weights(tmp_path / "fsdp/latest.pt")
    assert all(torch.equal(whole["model"][k], straight[k]) for k in straight) and "sharded" not in whole
    # its optimizer state numbered as the optimizer numbers it: the one process's (the same training) to rounding
    alone = torch.load(tmp_path / "single/latest.pt", weights_only=True)["optimizers"]["model"]
    assert [g["params"] for g in whole["optimizers"]["model"]["param_groups"]] == [
        g["params"] for g in alone["param_groups"]
    ]
    for index, moments in alone["state"].items():
        assert reference.max_difference(whole["optimizers"]["model"]["state"][index], moments) < 1e-12, index
    # a sharded checkpoint copied in part is one line, for inference and for a resume alike
    shutil.copytree(tmp_path / "fsdp", tmp_path / "part", ignore=shutil.ignore_patterns("pickle", "metrics.jsonl"))
    (tmp_path / "part/shards/epoch0002-step00000090/__1_0.distcp").unlink()
    for command in (
        ["evaluate", "--checkpoint", tmp_path / "part/latest.pt"],
        ["train", "--name", "part", *stopping, *common, "--epochs", 3, "--resume", "auto"],
    ):
        broken = phalanx(*command)
        assert broken.code == 2 and len(broken.err.strip().splitlines()) == 1, broken.err
        assert "epoch0002-step00000090 do not load: __1_0.distcp is missing" in broken.err, broken.err
    evaluated = phalanx("evaluate", "--checkpoint", tmp_path / "whole.pt", "--output", tmp_path / "eval.json")
    assert evaluated.code == 0, evaluated.err
    last = records(tmp_path / "fsdp", "val")[-1]
    assert json.loads((tmp_path / "eval.json").read_text())["metrics"]["acc"] == pytest.approx(last["acc"], abs=1e-9)


def test_fsdp_outside_a_process_group_or_with_what_it_lacks_is_one_line(phalanx):
    alone = phalanx("train", "--strategy", "fsdp", "--epochs", 1)
    assert alone.code == 2 and alone.err.startswith("phalanx: --strategy: shards the networks over DDP workers")
    for option in (["--ema-decay", 0.9], ["--compile"]):
        refused = phalanx("trainlaunch", "--strategy", "fsdp", *option, "--use-torchrun", "--nproc-per-node=2")
        assert refused.code == 2 and "with --strategy fsdp is not built yet" in refused.err, refused.err
        assert len(refused.err.strip().splitlines()) == 1


def test_dry_run_says_what_each_rank_holds_under_each_strategy(phalanx):
    """Counted from the parameters: the built-in SmallCNN with Adam (weights, gradients, two
    moments), whole on each rank under ddp, a quarter on each of 4 under fsdp, plus what is
    gathered whole while it runs: its two largest blocks (the first Linear layer and the second
    convolution; it has no weights outside its blocks) with their gradients."""
    from phalanx.models import SmallCNN

    weights = sum(p.numel() for p in SmallCNN(10, 1).parameters())
    whole, largest = weights * 4 * 4, ((64 * 16 * 128 + 128) + (32 * 64 * 9 + 64)) * 4 * 2
    plan = phalanx(
        "trainlaunch", "--dry-run", "--strategy", "fsdp", "--optimizer", "adam", "--use-torchrun", "--nproc-per-node=4"
    )
    assert plan.code == 0, plan.err
    assert (
        f"memory per rank for weights, gradients and optimizer state (adam; activations not counted): ddp "
        f"{whole / 2**20:.2f} MiB; fsdp over 4 ranks {-(-whole // 4) / 2**20:.2f} MiB + up to {largest / 2**20:.2f} "
        "MiB gathered whole while a network runs"
    ) in plan.out, plan.out
    mixed = phalanx(
        "trainlaunch",
        "--dry-run",
        "--strategy",
        "fsdp",
        "--optimizer",
        "adam",
        "--precision",
        "bf16",
        "--use-torchrun",
        "--nproc-per-node=4",
    )
    assert f"+ up to {largest / 2 / 2**20:.2f} MiB gathered" in mixed.out, mixed.out  # blocks gathered in bfloat16


def test_activation_checkpointing_keeps_only_block_inputs_and_trains_the_same():
    """--activation-checkpointing on a network of blocks with BatchNorm and dropout (float64): the
    gradients, the BatchNorm statistics and the random draws are those of the plain network,
    bitwise, while the tensors kept for backward outside the recomputed blocks are a fraction."""
    from torch import nn

    from phalanx.distributed.blocks import checkpoint_activations

    def network():
        torch.manual_seed(0)

        def block(a, b):
            return nn.Sequential(nn.Conv2d(a, b, 3, padding=1), nn.BatchNorm2d(b), nn.ReLU(), nn.Dropout(0.3))

        return nn.Sequential(block(3, 8), block(8, 8), block(8, 8), nn.Flatten(), nn.Linear(8 * 8 * 8, 4)).double()

    def kept_bytes(model):
        kept = []

        def pack(tensor):
            kept.append(tensor.numel() * tensor.element_size())
            return tensor

        torch.manual_seed(1)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            loss = model(torch.randn(6, 3, 8, 8, dtype=torch.float64)).square().mean()
        loss.backward()
        return sum(kept)

    plain, recomputed = network(), checkpoint_activations(network())
    whole, kept = kept_bytes(plain), kept_bytes(recomputed)
    assert kept < whole / 4, (kept, whole)
    for (name, a), b in zip(plain.named_parameters(), recomputed.parameters()):
        assert torch.equal(a.grad, b.grad), name
    for (name, a), b in zip(plain.named_buffers(), recomputed.buffers()):
        assert torch.equal(a, b), name  # counted once: the second forward's update is put back


def test_consolidate_copies_a_whole_checkpoint_and_never_writes_over_a_file(tmp_path, phalanx):
    """The quick suite's `phalanx consolidate`: a whole checkpoint (no shards to read) comes out as
    it went in, loadable with plain torch.load; an existing --output is refused, untouched."""
    assert phalanx("train", "--epochs", 1, "--checkpoints-dir", tmp_path, "--no-progress", "--num-workers", 0).code == 0
    made = phalanx("consolidate", "--checkpoint", tmp_path / "experiment/latest.pt", "--output", tmp_path / "one.pt")
    assert made.code == 0 and "model whole, epoch 1" in made.out, made.err
    source, copy = (torch.load(p, weights_only=True) for p in (tmp_path / "experiment/latest.pt", tmp_path / "one.pt"))
    assert all(torch.equal(source["model"][k], copy["model"][k]) for k in source["model"])
    assert copy["optimizers"]["model"]["param_groups"] == source["optimizers"]["model"]["param_groups"]
    before = (tmp_path / "one.pt").read_bytes()
    again = phalanx("consolidate", "--checkpoint", tmp_path / "experiment/latest.pt", "--output", tmp_path / "one.pt")
    assert (
        again.code == 2 and "exists; give a new file name" in again.err and (tmp_path / "one.pt").read_bytes() == before
    )

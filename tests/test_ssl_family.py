"""The self-supervised family beyond SimCLR and BYOL (``--task moco``, ``dino``, ``swav``, ``simsiam``,
``barlowtwins``, ``vicreg``): each loss equal to Lightly's, exact under DDP (the global-batch losses gathered over two
gloo ranks; every method trained 2 workers x 16 against one process x 32 in float64, an epoch that
ends in a padding sample), MoCo's queue in the batch's order and resumed at another world size, and
the backbone served by predict, export and a classifier as SimCLR's is."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import reference
import torch
from conftest import REPO, USER_MODELS, records, run_phalanx


class _TaskInfo:
    """What build_models reads of a task's data: its info (one-channel 8x8 images, no labels)."""

    info = {"channels": 1, "size": 8, "classes": []}


SMALL = ["--image-size", 16, "--no-progress", "--projection-dim", 32, "--hidden-dim", 32, "--head-norm", "none"]
# MoCo's queue of 50 keys wraps inside a batch of 32: its order is one process's or the test fails.
# DINO: two local crops of 8 px beside the two global ones, and a small head. SwAV: a queue of 40
# features, full after 2 steps of 32 and in the codes of the 4 after them.
SIZES = {
    "moco": [*SMALL, "--queue-size", 50],
    "dino": [
        "--image-size",
        16,
        "--no-progress",
        "--output-dim",
        64,
        "--hidden-dim",
        32,
        "--bottleneck-dim",
        16,
        "--local-views",
        2,
    ],
    "swav": [*SMALL, "--prototypes", 30, "--local-views", 2, "--queue-length", 40, "--queue-start-epoch", 1],
    # BatchNorm in the projector, the predictor and the momentum teacher: exact with --sync-bn.
    # 163 images: a last batch of 3 (2 and 1 row a rank; BatchNorm cannot train on one image
    # in one process, so no padding sample here: test_trainlaunch.py has one with --sync-bn).
    "byol": [*SMALL, "--head-norm", "batch", "--sync-bn", "--synthetic-samples", 181],
    # Without normalisation its features grow some 20-fold a step at the default --lr (docs/gpu.md, On a
    # GPU): on random RGB images the weights then differ by 2e-10 in float64, rounding grown.
    "barlowtwins": [*SMALL, "--lr", 0.006],
}
# 161 training images: 5 steps of 32, then 1 image, which one rank of two trains and the other takes
# part in as a padding sample; 18 held out (validating 1,636 digits took 2 s of each run's 4 here).
PADDED = ["--dataset", "synthetic", "--synthetic-samples", 179, "--val-fraction", 0.1]
SYNTHETIC_180 = ["--dataset", "synthetic", "--synthetic-samples", 200, "--val-fraction", 0.1]  # 6 steps of 32


def embeddings(seed: int, rows: int = 7, dim: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(rows, dim, generator=generator, dtype=torch.float64, requires_grad=True) for _ in "ab")


def gradients_of(loss_fn, z1, z2):
    z1.grad = z2.grad = None
    loss = loss_fn(z1, z2)
    loss.backward()
    return loss.item(), *(None if z.grad is None else z.grad.clone() for z in (z1, z2))


def test_each_loss_equals_lightlys_in_one_process_with_its_gradient():
    from lightly.loss import BarlowTwinsLoss, NegativeCosineSimilarity, VICRegLoss

    from phalanx.tasks.selfsupervised import losses

    z1, z2 = embeddings(0)  # the losses are modules of their own: no run configuration
    vicreg, barlow = losses.VICRegLoss(), losses.BarlowTwinsLoss(redundancy_weight=0.01)
    for ours, theirs in (
        ((lambda a, b: vicreg(a, b)["loss"]), VICRegLoss()),
        ((lambda a, b: barlow(a, b)["loss"]), BarlowTwinsLoss(lambda_param=0.01)),
    ):
        mine, expected = gradients_of(ours, z1, z2), gradients_of(theirs, z1, z2)
        assert mine[0] == pytest.approx(expected[0], rel=1e-12)
        assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(mine[1:], expected[1:]))
    p1, p2 = embeddings(1)
    negative_cosine = NegativeCosineSimilarity()
    theirs = 0.5 * (negative_cosine(p1, z2.detach()) + negative_cosine(p2, z1.detach()))
    ours = losses.NegativeCosineLoss()(p1, p2, z1, z2).mean()
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-12)
    # The stop-gradient: the targets get no gradient, the predictions Lightly's.
    grads = torch.autograd.grad(ours, (p1, p2, z1, z2), allow_unused=True)
    assert grads[2] is None and grads[3] is None
    assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(grads[:2], torch.autograd.grad(theirs, (p1, p2))))


def test_moco_loss_and_queue_equal_lightlys_memory_bank_through_a_wrap():
    from lightly.loss import NTXentLoss

    from phalanx.config import RunConfig
    from phalanx.tasks.selfsupervised.moco import MoCoTask

    task = MoCoTask(RunConfig.flat(task="moco", task_options={"queue_size": 10, "projection_dim": 6}))
    theirs = NTXentLoss(temperature=0.1, memory_bank_size=(10, 6))
    theirs.memory_bank.bank = task.queue.clone()  # the same start: Lightly's is random too
    for seed in range(4):  # 4 keys a batch: 4, 8, then 2 fit and 2 are dropped, then 4 from the front
        query, key = embeddings(seed, rows=4)
        key = key.detach()
        mine = gradients_of(lambda q, k: task.criterion(q, k, task.queue.clone()).mean(), query, key)
        task.enqueue(key)
        expected = gradients_of(theirs, query, key)
        assert mine[0] == pytest.approx(expected[0], rel=1e-12) and torch.allclose(mine[1], expected[1], atol=1e-12)
        assert torch.equal(task.queue, theirs.memory_bank.bank) and task.queue_at == int(theirs.memory_bank.bank_ptr)
    assert task.queue_at == 4


def test_simsiams_monitor_from_all_reduced_sums_is_the_batchs_embedding_std():
    # The monitor is all-reduced as per-dimension sums (no gather of the rows): in one process it
    # equals the std of the batch's normalised embeddings computed directly; rows that collapsed
    # to one point give 0, not nan. A padding share counts no rows.
    from phalanx.config import RunConfig
    from phalanx.data.sampling import MicroBatch
    from phalanx.distributed.strategies import make_strategy
    from phalanx.tasks.selfsupervised.decorrelation import embedding_std, global_embedding_std
    from phalanx.train.context import TrainingStepContext

    ctx = TrainingStepContext(
        make_strategy(RunConfig.flat(task="simsiam"), None), RunConfig.flat(precision="fp64").optim, False, {}, {}, {}
    )
    z1, z2 = embeddings(3, rows=9, dim=5)
    ctx.begin(MicroBatch(list(range(9)), 9, 0, 9, 9, True), 1, 0.5, 1)
    monitor = global_embedding_std(ctx, z1, z2)
    expected = 0.5 * (embedding_std(z1) + embedding_std(z2))
    assert monitor.result().item() == pytest.approx(expected.item(), rel=1e-12) and monitor.result() is monitor.result()
    collapsed = z1[:1].detach().repeat(9, 1)
    assert 0 <= global_embedding_std(ctx, collapsed, collapsed).result().item() < 1e-6
    ctx.begin(MicroBatch([0], 0, 9, 10, 10, True), 1, 0.5, 1)  # a padding share
    assert global_embedding_std(ctx, z1[:1], z2[:1]).result().item() == 0


def test_dino_loss_and_centre_equal_lightlys_with_local_crops():
    from lightly.loss import DINOLoss

    from phalanx.config import RunConfig
    from phalanx.distributed.strategies import make_strategy
    from phalanx.tasks.selfsupervised.dino import DINOTask
    from phalanx.train.context import DeviceContext

    cfg = RunConfig.flat(task="dino", task_options={"output_dim": 6})
    task, ctx = DINOTask(cfg), DeviceContext(make_strategy(cfg, None), "fp64", False)
    theirs = DINOLoss(output_dim=6, warmup_teacher_temp=0.04, teacher_temp=0.04, student_temp=0.1, center_momentum=0.9)
    theirs.center = theirs.center.double()
    for seed in range(3):  # the centre moves between the calls: the later losses use it
        teacher = [t.detach() for t in embeddings(10 + seed, rows=5)]
        student = [*embeddings(20 + seed, rows=5), *embeddings(30 + seed, rows=5)]  # 2 global + 2 local crops
        # 1/16: exact in float32, as Lightly holds the temperature (torch.tensor(0.05) is not 0.05)
        loss, _ = task.criterion(teacher, student, task.center, 0.0625)
        mine = torch.autograd.grad(loss.mean(), student)
        task.update_center(torch.stack(teacher), ctx).result()
        expected = theirs(teacher, student, teacher_temp=0.0625)
        assert loss.mean().item() == pytest.approx(expected.item(), rel=1e-12)
        assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(mine, torch.autograd.grad(expected, student)))
        assert torch.allclose(task.center, theirs.center.flatten(), atol=1e-15)
    assert [task.teacher_temperature(e) for e in (1, 31)] == [0.04, 0.04]
    warm = DINOTask(RunConfig.flat(task="dino", task_options={"teacher_temp": 0.07, "warmup_teacher_temp_epochs": 4}))
    assert [round(warm.teacher_temperature(e), 6) for e in (1, 2, 4, 5)] == [0.04, 0.05, 0.07, 0.07]


def test_swav_codes_and_loss_equal_lightlys_with_local_crops():
    from lightly.loss import SwaVLoss

    from phalanx.tasks.selfsupervised.losses import SwAVLoss as OurSwAVLoss
    from phalanx.tasks.selfsupervised.losses import sinkhorn

    scores = [*embeddings(40, rows=6), *embeddings(41, rows=6)]  # 2 global crops, 2 local ones
    codes = [sinkhorn(s.detach(), 3, 0.05) for s in scores[:2]]
    assert torch.allclose(codes[0].sum(1), torch.ones(6, dtype=torch.float64), atol=1e-12)  # each sample's codes
    loss = OurSwAVLoss(temperature=0.1)(scores, codes).mean()
    mine = torch.autograd.grad(loss, scores)
    expected = SwaVLoss(temperature=0.1)(scores[:2], scores[2:])
    assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
    assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(mine, torch.autograd.grad(expected, scores)))


def test_swavs_queue_balances_the_codes_as_lightlys_queue_outputs_and_keeps_the_newest_features():
    """With --queue-length, the codes are balanced with the queue's scores (Lightly's
    ``queue_outputs``: same loss and gradients); the queue keeps the latest global batches' features
    newest first, and joins the codes from --queue-start-epoch once it is full."""
    from lightly.loss import SwaVLoss

    from phalanx.config import RunConfig
    from phalanx.tasks.selfsupervised.swav import SwAVTask

    task = SwAVTask(
        RunConfig.flat(task="swav", task_options={"temperature": 0.1, "queue_length": 5, "queue_start_epoch": 2})
    )
    scores = [*embeddings(50, rows=6), *embeddings(51, rows=6)]
    queued = embeddings(52, rows=5)
    codes = [task.codes(s.detach(), q.detach()) for s, q in zip(scores[:2], queued)]
    loss = task.criterion(scores, codes).mean()
    expected = SwaVLoss(temperature=0.1)(scores[:2], scores[2:], queue_outputs=[q.detach() for q in queued])
    assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
    assert all(
        torch.allclose(a, b, atol=1e-12)
        for a, b in zip(torch.autograd.grad(loss, scores), torch.autograd.grad(expected, scores))
    )
    assert not torch.allclose(codes[0], task.codes(scores[0].detach(), None))  # the queue changed the codes

    prototypes = torch.nn.Linear(3, 4, bias=False).double()
    first, second = (torch.arange(k, k + 9, dtype=torch.float64).reshape(3, 3) for k in (0, 9))
    task.enqueue([first, -first])
    assert task.queued == 3 and task.queued_scores(0, prototypes, epoch=2) is None  # not full yet
    task.enqueue([second, -second])
    assert task.queued == 5 and torch.equal(task.queue[0], torch.cat([second, first])[:5])
    assert torch.equal(task.queue[1], -task.queue[0])
    assert task.queued_scores(0, prototypes, epoch=1) is None  # before --queue-start-epoch
    assert torch.allclose(task.queued_scores(1, prototypes, epoch=2), prototypes(task.queue[1]))
    again = SwAVTask(RunConfig.flat(task="swav", task_options={"queue_length": 5}))
    again.load_state_dict(task.state_dict())
    assert torch.equal(again.queue, task.queue) and again.queued == 5


def step_context(models: dict, optimizers: dict | None = None):
    """A real training context of one process (no trainer): a micro-batch of 4 samples, epoch 1."""
    from phalanx.config import RunConfig
    from phalanx.data.sampling import MicroBatch
    from phalanx.distributed.strategies import make_strategy
    from phalanx.train.context import TrainingStepContext

    optimizers = optimizers or {}
    scalers = {name: torch.amp.GradScaler("cpu", enabled=False) for name in optimizers}
    ctx = TrainingStepContext(
        make_strategy(RunConfig.flat(), None),
        RunConfig.flat(precision="fp64").optim,
        False,
        models,
        optimizers,
        scalers,
    )
    ctx.begin(MicroBatch([0, 1, 2, 3], 4, 0, 4, 4, True), 1, 0.5, 2)
    return ctx


def test_a_moco_step_scores_its_queries_against_the_queue_before_its_keys_join_it():
    from lightly.loss import NTXentLoss

    from phalanx.config import RunConfig
    from phalanx.tasks.selfsupervised.moco import MoCoTask

    task = MoCoTask(RunConfig.flat(task="moco", task_options={"queue_size": 8, "projection_dim": 6, "hidden_dim": 6}))
    torch.manual_seed(0)
    models = {name: m.double() for name, m in task.build_models(_TaskInfo()).items()}
    views = [torch.randn(4, 1, 8, 8, dtype=torch.float64) for _ in "ab"]
    theirs = NTXentLoss(temperature=0.1, memory_bank_size=(8, 6))
    theirs.memory_bank.bank = task.queue.clone()
    query = task.embed(models, views[0])  # with its gradient: Lightly's bank takes keys from training calls only
    with torch.no_grad():
        key = models["teacher"](views[1])
    loss = task.training_step(views, step_context(models))["loss"]
    assert loss.mean().item() == pytest.approx(theirs(query, key).item(), rel=1e-12)
    assert torch.equal(task.queue, theirs.memory_bank.bank)  # then the keys joined it


def test_the_dino_teacher_sees_the_global_crops_only():
    from phalanx.config import RunConfig
    from phalanx.tasks.selfsupervised.dino import DINOTask

    task = DINOTask(RunConfig.flat(task="dino", task_options={"output_dim": 6, "hidden_dim": 8, "bottleneck_dim": 4}))
    torch.manual_seed(0)
    models = {name: m.double() for name, m in task.build_models(_TaskInfo()).items()}
    seen = []
    models["teacher"].register_forward_hook(lambda module, inputs, output: seen.append(tuple(inputs[0].shape)))
    views = [torch.randn(4, 1, 8, 8, dtype=torch.float64) for _ in range(2)]
    views += [torch.randn(4, 1, 4, 4, dtype=torch.float64) for _ in range(3)]  # local crops, smaller
    optimizers = {
        "student": torch.optim.SGD([*models["backbone"].parameters(), *models["projector"].parameters()], lr=0.1)
    }
    task.training_step(views, step_context(models, optimizers))
    assert seen == [(8, 1, 8, 8)]  # the two global crops, together (as DINO's multi-crop wrapper)


def test_gathered_rows_are_put_back_in_the_order_one_process_holds_them():
    from phalanx.data.sampling import plan_epoch, sample_order

    order = torch.randperm(23, generator=torch.Generator().manual_seed(0))
    for world in (1, 2, 3, 5):
        plans = [plan_epoch(order, 0, 4, world, rank) for rank in range(world)]
        for micro in zip(*plans):  # one global micro-batch: each rank's samples, gathered in rank order
            gathered = [i for m in micro if m.real for i in m.indices]
            assert [gathered[p] for p in sample_order(len(gathered), world)] == order[
                micro[0].start : micro[0].end
            ].tolist()


@pytest.mark.slow
def test_the_global_batch_losses_gathered_over_two_ranks_are_the_global_batchs(tmp_path):
    script = REPO / "tests/support/ssl_family_ranks.py"
    env = {**os.environ, **USER_MODELS, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node=2",
            "--standalone",
            str(script),
            str(tmp_path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    # VICReg: Lightly's gathered loss (invariance over this rank's rows, variance and covariance over
    # every rank's) has the gradient of ours (every term over the global batch), and the same mean.
    assert ranks[0]["vicreg_ours"] == ranks[1]["vicreg_ours"]
    assert ranks[0]["vicreg_ours"] == pytest.approx(np.mean([r["vicreg_theirs"] for r in ranks]), rel=1e-12)
    for found in ranks:
        assert all(
            torch.allclose(a, b, atol=1e-12) for a, b in zip(found["vicreg_our_grads"], found["vicreg_their_grads"])
        )
    # Barlow Twins: ours is one process's loss on the global batch, its gradient summed over the two
    # ranks' copies (2x; DDP's mean halves it). Lightly's gathered one standardises each rank's
    # embeddings by that rank's statistics: another loss.
    for found in ranks:
        assert found["barlow_ours"] == pytest.approx(found["barlow_one_process"], rel=1e-12)
        assert all(
            torch.allclose(a, 2 * b, atol=1e-12)
            for a, b in zip(found["barlow_our_grads"], found["barlow_one_process_grads"])
        )
        assert abs(found["barlow_lightly_gathered"] - found["barlow_ours"]) > 0.1 * found["barlow_ours"]
    # DINO and SwAV: per-sample losses of this rank's samples, equal to Lightly's distributed losses
    # with their gradients; the centre and the codes from the global batch (equal shares here, where
    # Lightly's averages of per-rank means are the global ones).
    for found in ranks:
        for method in ("dino", "swav"):
            assert found[f"{method}_ours"] == pytest.approx(found[f"{method}_theirs"], rel=1e-12)
            assert all(
                torch.allclose(a, b, atol=1e-12)
                for a, b in zip(found[f"{method}_our_grads"], found[f"{method}_their_grads"])
            )
        assert torch.allclose(*found["dino_centres"], atol=1e-15)
    assert torch.equal(ranks[0]["dino_centres"][0], ranks[1]["dino_centres"][0])
    assert ranks[0]["dino_ours"] != ranks[1]["dino_ours"]  # the ranks' embeddings differ


@pytest.mark.slow
@pytest.mark.parametrize("task", ["simclr", "byol", "moco", "dino", "swav", "simsiam", "barlowtwins", "vicreg"])
def test_two_workers_train_what_one_process_trains_in_float64_through_a_padding_sample(tmp_path, phalanx, task):
    # SimCLR once aborted here: a padding rank's zero loss skipped the gather's backward, a collective.
    common = [
        "--task",
        task,
        "--precision",
        "fp64",
        "--epochs",
        1,
        "--log-every",
        1,
        "--checkpoints-dir",
        tmp_path,
        *PADDED,
        *SIZES.get(task, SMALL),
    ]
    ddp = run_phalanx(
        "trainlaunch", "--name", "ddp", "--batch-size", 16, *common, "--use-torchrun", "--nproc-per-node=2"
    )
    assert ddp.code == 0, ddp.err
    assert phalanx("train", "--name", "single", "--batch-size", 32, *common).code == 0
    a, b = (torch.load(tmp_path / name / "latest.pt", weights_only=True)["models"] for name in ("ddp", "single"))
    assert max(reference.max_scaled_difference(a[n], b[n]) for n in a) < 1e-12
    states = [torch.load(tmp_path / name / "latest.pt", weights_only=True)["task_state"] for name in ("ddp", "single")]
    if task == "moco":
        assert (
            states[0]["queue_at"] == states[1]["queue_at"]
            and (states[0]["queue"] - states[1]["queue"]).abs().max() < 1e-12
        )
    if task == "dino":  # the centre of the global batch's teacher outputs; the last layer frozen in epoch 1
        assert (states[0]["center"] - states[1]["center"]).abs().max() < 1e-12 and states[0]["center"].abs().max() > 0
        assert torch.equal(a["projector"]["last_layer"], a["teacher"]["1.last_layer"])
        assert records(tmp_path / "single", "val")[-1]["view_loss"] > 0.01  # its own loss, not a near-0 alignment
        assert not torch.equal(a["projector"]["layers.0.weight"], a["teacher"]["1.layers.0.weight"])
    if task == "swav":  # the queue (full after 2 steps: in the codes of the next 4) the same in both
        assert states[0]["queued"] == states[1]["queued"] == 40
        assert (states[0]["queue"] - states[1]["queue"]).abs().max() < 1e-12
    if task == "swav":  # the prototypes frozen in epoch 1 (renormalised only) and unit vectors
        from phalanx.config import RunConfig
        from phalanx.train.run import build_networks, build_task

        cfg = RunConfig.from_json((tmp_path / "single" / "config.json").read_text())
        initial = build_networks(cfg, build_task(cfg))[1]["prototypes"].weight.detach().double()
        initial = initial / initial.norm(dim=1, keepdim=True)  # as the float64 run renormalised it
        assert (a["prototypes"]["weight"] - initial).abs().max() < 1e-12
        assert (a["prototypes"]["weight"].norm(dim=1) - 1).abs().max() < 1e-12
    two, one = records(tmp_path / "ddp", "train"), records(tmp_path / "single", "train")
    assert len(two) == len(one) == 6  # 5 steps of 32 and the last image
    for x, y in zip(two, one):
        assert {k: v for k, v in x.items() if k.startswith(("loss", "embedding"))} == pytest.approx(
            {k: v for k, v in y.items() if k.startswith(("loss", "embedding"))}, rel=1e-10
        )
    assert [r["knn_acc"] for r in records(tmp_path / "ddp", "val")] == [
        r["knn_acc"] for r in records(tmp_path / "single", "val")
    ]
    if task in ("simclr", "byol", "barlowtwins", "vicreg"):  # served by the same code as the others (SimCLR and
        return  # BYOL in tests/test_ssl.py); those with other networks to leave out are served here
    # The backbone serves as SimCLR's does: features from predict, TorchScript from export, and
    # the starting weights of a classifier.
    from conftest import write_digit_pngs

    images = write_digit_pngs(tmp_path / "digits", per_class=1) / "train"
    best = tmp_path / "single/best.pt"
    features = phalanx("predict", "--checkpoint", best, images, "--output", tmp_path / "f.npy")
    assert features.code == 0, features.err
    assert np.load(tmp_path / "f.npy").shape == (10, 128)  # smallcnn's features, the heads left out
    assert phalanx("export", "--checkpoint", best, "--output", tmp_path / "backbone.ts").code == 0
    probe = phalanx(
        "train",
        "--weights",
        best,
        "--freeze-backbone",
        "--epochs",
        1,
        "--checkpoints-dir",
        tmp_path,
        "--name",
        "probe",
        "--image-size",
        16,
        "--no-progress",
    )
    assert probe.code == 0 and f"a --task {task} run's backbone; its " in probe.out and "projector" in probe.out, (
        probe.err
    )


RESUMED_STATE = {
    "moco": (("queue_size", 50), ("projection_dim", 32), ("hidden_dim", 32)),
    "dino": (("output_dim", 64), ("hidden_dim", 32), ("bottleneck_dim", 16), ("local_views", 2)),
}


@pytest.mark.slow
@pytest.mark.parametrize("task", ["moco", "dino"])
def test_a_run_resumed_mid_epoch_is_the_straight_run_its_queue_or_centre_too(tmp_path, phalanx, monkeypatch, task):
    # MoCo's queue and DINO's centre are task state: without them in the checkpoint, the resumed run
    # would go on from a fresh queue or a zero centre (mutants in scripts/mutants.py). Float64: the
    # runs end within 1e-12.
    options = [item for name, value in RESUMED_STATE[task] for item in ("--task-option", f"{name}={value}")]
    common = [
        "--task",
        f"phalanx_testtasks:Stopping{'MoCo' if task == 'moco' else 'DINO'}",
        "--precision",
        "fp64",
        "--batch-size",
        32,
        *SYNTHETIC_180,
        "--epochs",
        2,
        "--image-size",
        16,
        "--no-progress",
        "--checkpoints-dir",
        tmp_path,
        *options,
    ]
    # The same class for both runs (StopAtStep stops nothing without its variable).
    assert phalanx("train", "--name", "straight", *common).code == 0
    monkeypatch.setenv("PHALANX_TEST_STOP_STEP", "4")  # mid-epoch: 6 steps an epoch
    assert phalanx("train", "--name", "cut", *common).code == 143
    monkeypatch.delenv("PHALANX_TEST_STOP_STEP")
    resumed = phalanx("train", "--name", "cut", "--resume", "auto", *common)
    assert resumed.code == 0 and "resumed from" in resumed.out and "in epoch 1" in resumed.out, resumed.out
    a, b = (torch.load(tmp_path / name / "latest.pt", weights_only=True) for name in ("cut", "straight"))
    assert max(reference.max_scaled_difference(a["models"][n], b["models"][n]) for n in a["models"]) < 1e-12
    state = "queue" if task == "moco" else "center"
    assert a["task_state"].get("queue_at") == b["task_state"].get("queue_at")
    assert (a["task_state"][state] - b["task_state"][state]).abs().max() < 1e-12


def queue_position(at: int, batches: list[int], size: int = 50) -> int:
    """Where MoCo's next key goes after ``batches`` of keys (a batch that reaches the end fills it
    and the next starts over at 0, as Lightly's memory bank does)."""
    for keys in batches:
        at = 0 if at + keys >= size else at + keys
    return at


@pytest.mark.slow
def test_moco_cut_by_two_workers_holds_one_process_queue_and_resumes_on_one(tmp_path, phalanx):
    # Another world size: 2 workers x 16 are stopped mid-epoch (SIGTERM at step 3 of 6); their
    # checkpoint holds what one process x 32 holds at that step (--max-steps 3): the weights and the
    # queue within 1e-12 (float64). One process x 16 (--batch-size is per process; the effective
    # batch halves) resumes it and fills the queue on from where the workers left it.
    options = [
        item
        for name, value in (*RESUMED_STATE["moco"], ("head_norm", "none"))
        for item in ("--task-option", f"{name}={value}")
    ]
    common = [
        "--task",
        "phalanx_testtasks:StoppingMoCo",
        "--precision",
        "fp64",
        *SYNTHETIC_180,
        "--epochs",
        2,
        "--image-size",
        16,
        "--no-progress",
        "--checkpoints-dir",
        tmp_path,
        "--log-every",
        1,
        *options,
    ]
    cut = run_phalanx(
        "trainlaunch",
        "--name",
        "cut",
        "--batch-size",
        16,
        *common,
        "--use-torchrun",
        "--nproc-per-node=2",
        env={**USER_MODELS, "PHALANX_TEST_STOP_STEP": "3"},
    )
    assert cut.code == 143, cut.err
    assert phalanx("train", "--name", "one", "--batch-size", 32, "--max-steps", 3, *common).code == 0
    a, b = (torch.load(tmp_path / name / "latest.pt", weights_only=True) for name in ("cut", "one"))
    assert a["position"] == b["position"] == 3 * 32 and a["world_size"] == 2
    assert max(reference.max_difference(a["models"][n], b["models"][n]) for n in a["models"]) < 1e-12
    assert a["task_state"]["queue_at"] == b["task_state"]["queue_at"] == queue_position(0, [32] * 3) == 32
    assert (a["task_state"]["queue"] - b["task_state"]["queue"]).abs().max() < 1e-12
    resumed = phalanx("train", "--name", "cut", "--batch-size", 16, "--resume", "auto", *common)
    assert resumed.code == 0 and "the world size changed (2 -> 1 processes)" in resumed.out, resumed.out + resumed.err
    after_the_cut = [16] * 5 + [4] + [16] * 11 + [4]  # micro-batches: the rest of epoch 1 (84 images), epoch 2
    final = torch.load(tmp_path / "cut/latest.pt", weights_only=True)["task_state"]
    assert final["queue_at"] == queue_position(32, after_the_cut) != queue_position(0, after_the_cut)  # not afresh


@pytest.mark.slow
def test_without_the_gather_two_workers_train_another_model(tmp_path, phalanx):
    # --no-gather: each rank's own batch statistics, what a plain DDP loop trains (not one process's).
    common = [
        "--task",
        "vicreg",
        "--no-gather",
        "--precision",
        "fp64",
        "--epochs",
        1,
        "--checkpoints-dir",
        tmp_path,
        *PADDED,
        *SMALL,
    ]
    ddp = run_phalanx(
        "trainlaunch", "--name", "ddp", "--batch-size", 16, *common, "--use-torchrun", "--nproc-per-node=2"
    )
    assert ddp.code == 0, ddp.err
    assert phalanx("train", "--name", "single", "--batch-size", 32, *common).code == 0
    a, b = (torch.load(tmp_path / name / "latest.pt", weights_only=True)["models"] for name in ("ddp", "single"))
    assert max(reference.max_difference(a[n], b[n]) for n in a) > 1e-6

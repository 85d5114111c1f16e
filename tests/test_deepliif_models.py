"""DeepLIIF's other models against DeepLIIF 1.2.7 itself (``deepliif_reference``), as
``test_deepliif`` checks DeepLIIF's own: DeepLIIF's ``DeepLIIFExtModel`` and ``SDGModel`` write
their networks' files; phalanx starts from them (``--weights DIR``) and trains 2 steps of 4 samples
in float64 as one process and as 2 DDP workers x 2; DeepLIIF's ``optimize_parameters`` takes the
same 2 steps. Every weight and the last step's losses agree (1e-10), DDP and one process within
1e-12. Then ``export --format deepliif`` writes the directory back, and DeepLIIF's own model loads
it (``load_networks``' state dicts, strict) and computes the outputs phalanx computes."""

from __future__ import annotations

import deepliif_reference as reference
import numpy as np
import pytest
import torch
from conftest import records, run_phalanx
from phalanx_testdata import deepliif_samples
from test_deepliif import SMALL, panels, random_vgg

from phalanx.errors import PhalanxError

# (task, DeepLIIF's model, its options, phalanx's options, modalities): 5 panels each
MODELS = {
    "deepliif-ext": ("ext", "DeepLIIFExtModel", dict(modalities_no=2, seg_gen=True, input_no=1), [], 2),
    "sdg": ("sdg", "SDGModel", dict(modalities_no=3, seg_gen=False, input_no=2), ["--inputs", 2], 3),
}


FLOAT64_TWO_STEPS = [  # 2 steps of the same 4 samples, float64, nothing random
    "--norm",
    "none",
    "--no-dropout",
    "--augment",
    "none",
    "--precision",
    "fp64",
    "--lr-schedule",
    "constant",
    "--epochs",
    2,
    "--log-every",
    1,
]


def train_both(phalanx, common: list, torch_home, checkpoints) -> tuple:
    """The run as 2 DDP workers x 2 (torchrun) and as one process x 4: the one process's result
    and each run's last networks."""
    ddp = run_phalanx(
        "trainlaunch",
        "--name",
        "ddp",
        "--batch-size",
        2,
        *common,
        "--use-torchrun",
        "--nproc-per-node=2",
        env={"TORCH_HOME": str(torch_home)},
    )
    assert ddp.code == 0, ddp.err
    single = phalanx("train", "--name", "single", "--batch-size", 4, *common)
    assert single.code == 0, single.err
    return single, {
        run: torch.load(checkpoints / run / "latest.pt", weights_only=True)["models"] for run in ("ddp", "single")
    }


def assert_same_weights(saved: dict, theirs: dict) -> None:
    """One process's networks within 1e-10 of DeepLIIF's (every network, every tensor), and 2 DDP
    workers' within 1e-12 of one process's."""
    assert sorted(saved["single"]) == sorted(theirs)
    for name, state in theirs.items():
        for key, value in state.items():
            ours = saved["single"][name][key]
            assert (ours - value).abs().max() < 1e-10, (name, key, (ours - value).abs().max())
            assert (saved["ddp"][name][key] - ours).abs().max() < 1e-12, (name, key)


def deepliif_model(kind: str, tmp_path, torch_home):
    module, cls, given, _, m = MODELS[kind]
    if not torch_home.exists():
        random_vgg(torch_home)  # DeepLIIF builds its VGG19 for both (SDG's perceptual loss uses it)
    opt = reference.options(
        ngf=4,
        ndf=4,
        net_g="resnet_2blocks",
        net_gs="unet_32",
        net_d="n_layers",
        net_ds="n_layers",
        n_layers_D=2,
        norm="none",  # (no normalisation: 2 workers x 2 samples is 4 samples exactly)
        no_dropout=True,
        checkpoints_dir=str(tmp_path),
        name=kind,
        seg_weights=[1 / m] * m,
        loss_G_weights=[0.2, 0.3, 0.5][:m] if m == 3 else [0.4, 0.6],
        loss_D_weights=[0.5, 0.2, 0.3][:m] if m == 3 else [0.7, 0.3],
        **given,
    )
    torch.manual_seed(0)
    model = getattr(getattr(reference.modules(), module), cls)(opt)
    for criterion in (model.criterionVGG, model.criterionGAN_mod, model.criterionGAN_seg):
        criterion.double()  # its GAN targets are float32 buffers
    (tmp_path / kind).mkdir(parents=True)
    model.save_networks("latest")
    return model, opt


def network(model, name: str) -> torch.nn.Module:
    """DeepLIIF's network ``G_1`` ...: its lists ``netG``, ``netGS``, ``netD``, ``netDS``."""
    kind, number = name.split("_")
    return getattr(model, f"net{kind}")[int(number) - 1]


def set_input(kind: str, model, samples: torch.Tensor) -> None:
    m = MODELS[kind][4]
    if kind == "sdg":
        k = samples.shape[1] - m
        model.set_input(
            {"A": [samples[:, i] for i in range(k)], "B": [samples[:, k + j] for j in range(m)], "A_paths": []}
        )
    else:
        model.set_input(
            {
                "A": samples[:, 0],
                "B": [samples[:, 1 + j] for j in range(m)],
                "BS": [samples[:, 1 + m + j] for j in range(m)],
                "A_paths": [],
            }
        )


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(MODELS))
def test_from_deepliifs_files_one_process_and_two_ddp_workers_train_what_deepliifs_own_step_does(
    tmp_path, phalanx, monkeypatch, kind
):
    torch_home = tmp_path / "torch"
    monkeypatch.setenv("TORCH_HOME", str(torch_home))
    model, opt = deepliif_model(kind, tmp_path, torch_home)
    for name in model.model_names:
        network(model, name).double()
    data = deepliif_samples(tmp_path / "data", size=32, per_split={"train": 4, "val": 2}, modalities=4, seg=False)
    weights = [
        f"--loss-g-weights={','.join(map(str, opt.loss_G_weights))}",
        f"--loss-d-weights={','.join(map(str, opt.loss_D_weights))}",
    ]
    common = [
        *SMALL,
        "--task",
        kind,
        *MODELS[kind][3],
        *weights,
        "--dataroot",
        data,
        *FLOAT64_TWO_STEPS,
        "--weights",
        tmp_path / kind,
        "--checkpoints-dir",
        tmp_path / "ck",
    ]
    single, saved = train_both(phalanx, common, torch_home, tmp_path / "ck")
    assert f"phalanx: weights: {len(model.model_names)} DeepLIIF networks (generators and discriminators)" in single.out

    samples = panels(data / "train")
    for _ in range(2):
        set_input(kind, model, samples)
        model.optimize_parameters()
    assert_same_weights(saved, {name: network(model, name).state_dict() for name in model.model_names})
    last = records(tmp_path / "ck" / "single", "train")[-1]
    for loss in model.loss_names:
        theirs = getattr(model, f"loss_{loss.rsplit('_', 1)[0]}")[int(loss.rsplit("_", 1)[1]) - 1]
        assert last[loss] == pytest.approx(float(theirs), rel=1e-9, abs=1e-12), loss

    # the trained networks back out in DeepLIIF's format: DeepLIIF's own model loads them, strict
    out = tmp_path / "exported"
    exported = phalanx(
        "export", "--checkpoint", tmp_path / "ck" / "single" / "latest.pt", "--format", "deepliif", "--output", out
    )
    assert exported.code == 0, exported.err
    assert sorted(p.name for p in out.glob("*.pth")) == sorted(f"latest_net_{n}.pth" for n in model.model_names)
    written = reference.modules().options.read_model_params(str(out / "train_opt.txt"))
    assert written["model"] == ("DeepLIIFExt" if kind == "deepliif-ext" else "SDG")
    assert int(written["modalities_no"]) == MODELS[kind][4] and int(written["input_no"]) == opt.input_no
    fresh, _ = deepliif_model(kind, tmp_path / "again", torch_home)
    for name in fresh.model_names:
        network(fresh, name).load_state_dict(torch.load(out / f"latest_net_{name}.pth", weights_only=True))
        network(fresh, name).double()
    for net in (fresh, model):
        set_input(kind, net, samples)
        with torch.no_grad():
            net.forward()
    outputs = ["fake_B", "fake_BS"] if kind == "deepliif-ext" else ["fake_B"]
    for name in outputs:
        for theirs, ours in zip(getattr(model, name), getattr(fresh, name), strict=True):
            assert (theirs - ours).abs().max() < 1e-8, name  # (phalanx's weights: DeepLIIF's to 1e-10)

    # predict writes deepliif test's names for them; SDG reads an image of its 2 input panels side by
    # side, split as DeepLIIF's inference splits it: each output is DeepLIIF's network's on the panels
    from PIL import Image

    image = tmp_path / "inputs.png"
    panel_count = 2 if kind == "sdg" else 1
    Image.open(data / "val" / "0000.png").crop((0, 0, 32 * panel_count, 32)).save(image)
    # (networks 2 steps from DeepLIIF's initialisation barely depend on their input: a copy of the
    # checkpoint with every convolution of G_1 6 times as steep makes its output tell panels apart)
    trained = torch.load(tmp_path / "ck" / "single" / "latest.pt", weights_only=True)
    for key, value in trained["models"]["G_1"].items():
        if value.dim() == 4:
            trained["models"]["G_1"][key] = value * 6
    checkpoint = tmp_path / "steep.pt"
    torch.save(trained, checkpoint)
    steep = network(model, "G_1")
    steep.load_state_dict(trained["models"]["G_1"])
    predicted = phalanx("predict", "--checkpoint", checkpoint, image, "--output", tmp_path / "p")
    assert predicted.code == 0, predicted.err
    folders = ["mod1", "mod2", "mod3"] if kind == "sdg" else ["Seg1", "Seg2", "mod1", "mod2"]
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == folders
    x = panels(tmp_path)[0]  # (panels, 3, 32, 32): the image read back
    with torch.no_grad():
        expected = (steep(torch.cat(list(x), 0)[None])[0] + 1) * 127.5
        flipped = (steep(torch.cat(list(x.flip(0)), 0)[None])[0] + 1) * 127.5
    written = torch.tensor(np.asarray(Image.open(tmp_path / "p" / "mod1" / "inputs.png").convert("RGB")))
    assert (written.permute(2, 0, 1).double() - expected).abs().max() <= 1.0
    assert panel_count == 1 or (flipped - expected).abs().max() > 20  # (the check can see the panels' order)

    # their directories are --weights, not checkpoints: one line that says so
    refused = phalanx("predict", "--checkpoint", out, data / "val" / "0000.png", "--output", tmp_path / "pred")
    assert refused.code != 0 and len(refused.err.strip().splitlines()) == 1, refused.err
    assert f"--task {kind} --weights DIR" in refused.err


def teacher_directory(out, modalities: int = 2) -> None:
    """A DeepLIIF model directory to distil from, written with DeepLIIF's own ``define_G`` and
    ``format_options``: ngf 64 (what DeepLIIF's test mode builds, whatever the file says), instance
    norm (a BatchNorm teacher normalises each rank's share of the batch under DDP, in DeepLIIF as
    in phalanx)."""
    networks = reference.modules().networks
    out.mkdir(parents=True)
    torch.manual_seed(3)
    nets = {
        f"G{k}": networks.define_G(3, 3, 64, "resnet_2blocks", "instance", False, "normal", 0.02, [], "zero")
        for k in range(1, modalities + 1)
    }
    nets.update(
        {
            f"GS{k}": networks.define_G(3, 3, 64, "unet_32", "instance", False, "normal", 0.02, [])
            for k in range(modalities + 1)
        }
    )
    for name, net in nets.items():
        torch.save(net.state_dict(), out / f"latest_net_{name}.pth")
    opt = reference.options(
        ngf=64,
        model="DeepLIIF",
        name=out.name,
        checkpoints_dir=str(out.parent),
        norm="instance",
        no_dropout=True,
        modalities_no=modalities,
        modalities_names=["IHC"] + [f"mod{k}" for k in range(1, modalities + 1)],
        seg_no=1,
        scale_size=32,
        netG="resnet_2blocks",
        net_g=["resnet_2blocks"] * modalities,
        net_gs=["unet_32"] * (modalities + 1),
        seg_weights=[0.5, 0.3, 0.2],
        load_iter=0,
        epoch="latest",
        mod_id_seg="S",
        verbose=False,
    )
    (out / "train_opt.txt").write_text(reference.modules().options.format_options(opt) + "\n")


@pytest.mark.slow
def test_distilled_from_a_deepliif_directory_one_process_and_two_ddp_workers_train_what_deepliifkd_does(
    tmp_path, phalanx, monkeypatch
):
    """DeepLIIFKD: DeepLIIF 1.2.7's ``DeepLIIFKDModel`` (run in its own process with the whole
    ``deepliif`` package, ``deepliif_kd_reference``) loads a teacher directory and writes its
    student's first networks; phalanx starts from them with the same teacher and trains 2 steps of
    4 samples in float64 as one process and as 2 DDP workers x 2, the KL terms over the whole
    batch's pixels as DeepLIIF takes them. Every weight within 1e-10 (DDP within 1e-12), every
    logged loss, the 6 divergences included, equal."""
    import subprocess
    import sys
    from pathlib import Path

    torch_home = tmp_path / "torch"
    monkeypatch.setenv("TORCH_HOME", str(torch_home))
    features = random_vgg(torch_home)
    teacher_directory(tmp_path / "teacher")
    data = deepliif_samples(tmp_path / "data", size=32, per_split={"train": 4, "val": 2}, modalities=2)
    opt = reference.options(
        model="DeepLIIFKD",
        model_dir_teacher=str(tmp_path / "teacher"),
        ngf=4,
        ndf=4,
        netG="resnet_2blocks",
        net_gs="unet_32",
        n_layers_D=2,
        norm="none",
        no_dropout=True,
        modalities_no=2,
        checkpoints_dir=str(tmp_path),
        name="student",
        seg_weights=[0.2, 0.5, 0.3],
        loss_G_weights=[1 / 3] * 3,  # (DeepLIIFKD weighs the segmentation's with the last modality's)
        loss_D_weights=[0.5, 0.2, 0.3],
    )
    spec = tmp_path / "spec.pt"
    torch.save(
        {"opt": vars(opt), "samples": panels(data / "train"), "vgg": features, "out": tmp_path / "theirs.pt"}, spec
    )
    script = Path(__file__).with_name("deepliif_kd_reference.py")
    done = subprocess.run([sys.executable, script, spec], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = torch.load(tmp_path / "theirs.pt", weights_only=False)

    common = [
        *SMALL,
        "--task",
        "deepliif-kd",
        "--teacher",
        tmp_path / "teacher",
        "--seg-weights=0.2,0.5,0.3",
        "--loss-d-weights=0.5,0.2,0.3",
        "--dataroot",
        data,
        *FLOAT64_TWO_STEPS,
        "--weights",
        tmp_path / "student",
        "--checkpoints-dir",
        tmp_path / "ck",
    ]
    single, saved = train_both(phalanx, common, torch_home, tmp_path / "ck")
    assert_same_weights(saved, theirs["states"])
    last = records(tmp_path / "ck" / "single", "train")[-1]
    kl = [f"G_KLDiv_{s}" for s in ("1", "2", "S0", "S1", "S2", "S")]
    assert all(theirs["losses"][name] > 0 for name in kl)
    logged = [name for name in last if name.startswith(("G_", "D_"))]
    # every loss phalanx logs: 10 of the modalities (VGG too), 4 of the segmentation, 6 divergences
    assert len(logged) == 20 and set(logged) <= set(theirs["losses"]), sorted(set(logged) - set(theirs["losses"]))
    for loss in logged:
        assert last[loss] == pytest.approx(theirs["losses"][loss], rel=1e-9, abs=1e-12), loss
    ddp_last = records(tmp_path / "ck" / "ddp", "train")[-1]
    for loss in kl:
        assert ddp_last[loss] == pytest.approx(last[loss], rel=1e-9), loss

    # a teacher that is no DeepLIIF directory, or makes other modalities: one line, before any step
    other = tmp_path / "other"
    other.mkdir()
    text = (tmp_path / "teacher" / "train_opt.txt").read_text()
    (other / "train_opt.txt").write_text(text.replace("modalities_no: 2", "modalities_no: 3"))
    assert "modalities_no: 3" in (other / "train_opt.txt").read_text()
    wide = tmp_path / "wide"  # a teacher whose segmentation networks need 64 px images
    wide.mkdir()
    (wide / "train_opt.txt").write_text(text.replace("'unet_32'", "'unet_64'"))
    assert "'unet_64'" in (wide / "train_opt.txt").read_text()
    for teacher, more, says in (
        (tmp_path / "data", [], "is not a DeepLIIF model directory"),
        (other, [], "makes 3 modalities"),
        (wide, [], "--image-size must be a multiple of 64"),
        (tmp_path / "teacher", ["--grad-accum", "2"], "would split the batch"),
    ):
        changed = [str(a) for a in common] + more
        changed[changed.index("--teacher") + 1] = str(teacher)
        bad = phalanx("train", "--name", "bad", "--batch-size", 4, *changed)
        assert bad.code == 2 and says in bad.err and len(bad.err.strip().splitlines()) == 1, bad.err
        assert not (tmp_path / "ck" / "bad").exists()


def unpaired_samples(root, counts=(4, 4, 3), val=2):
    """CycleGAN's layout from the DeepLIIF-shaped digits: ``trainA/`` and ``trainB1/``, ``trainB2/``
    of other counts (unpaired: B2's image i is not A's), and ``valA/``, ``valB1/``, ``valB2/``."""
    import shutil

    plain = root / "plain"
    deepliif_samples(
        plain, size=32, per_split={"train": max(counts), "val": val}, modalities=2, seg=False, layout="plain"
    )
    for split in ("train", "val"):
        for folder, count in zip(("A", "B1", "B2"), counts if split == "train" else (val,) * 3):
            names = sorted((plain / split / folder).iterdir())
            target = root / f"{split}{folder}"
            target.mkdir(parents=True)
            for path in names[len(names) - count :]:  # B2 from its second image: A's first has no partner
                shutil.copyfile(path, target / path.name)
    shutil.rmtree(plain)
    return root


def unpaired_tensors(root, split: str = "train") -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A's images and, for each, every B folder's image i mod its count (DeepLIIF's
    ``--serial-batches``), as [-1, 1] float64 tensors read with PIL."""
    import numpy as np
    from PIL import Image

    def read(folder):
        return [
            torch.tensor(np.asarray(Image.open(p).convert("RGB"), dtype=np.float32) / np.float32(127.5) - np.float32(1))
            .permute(2, 0, 1)
            .double()
            for p in sorted((root / folder).iterdir())
        ]

    a = read(f"{split}A")
    bs = [read(f"{split}B{k}") for k in (1, 2)]
    return torch.stack(a), [torch.stack([b[i % len(b)] for i in range(len(a))]) for b in bs]


@pytest.mark.slow
def test_cyclegan_from_deepliifs_files_one_process_and_two_ddp_workers_train_what_deepliifs_own_step_does(
    tmp_path, phalanx, monkeypatch
):
    """CycleGAN: DeepLIIF's own ``CycleGANModel`` (its image pool, label smoothing and unpaired
    VGG term; 2 target domains of other sizes than A's, paired serially) writes its networks'
    files; phalanx starts from them and trains 2 steps of 4 samples in float64, one process and 2
    DDP workers x 2, the generators' step first as DeepLIIF's; every weight within 1e-10 (DDP
    within 1e-12), every logged loss equal; the export loads back into DeepLIIF's model."""
    torch_home = tmp_path / "torch"
    monkeypatch.setenv("TORCH_HOME", str(torch_home))
    random_vgg(torch_home)
    opt = reference.options(
        model="CycleGAN",
        ngf=4,
        ndf=4,
        net_g="resnet_2blocks",
        net_d="n_layers",
        n_layers_D=2,
        norm="none",
        no_dropout=True,
        modalities_no=2,
        gan_mode="lsgan",
        label_smoothing=0.1,
        pool_size=50,
        BtoA=False,
        upsample="convtranspose",
        lambda_identity=0,
        loss_G_weights=[0.6, 0.4],
        loss_D_weights=[0.3, 0.7],
        checkpoints_dir=str(tmp_path),
        name="cyclegan",
    )
    torch.manual_seed(0)
    model = reference.modules().cyclegan.CycleGANModel(opt)
    for name in model.model_names:
        network(model, name).double()
    model.criterionGAN.double()
    model.criterionVGG.double()
    (tmp_path / "cyclegan").mkdir()
    model.save_networks("latest")
    data = unpaired_samples(tmp_path / "data")
    common = [
        *SMALL,
        "--task",
        "cyclegan",
        "--net-g",
        "resnet_2blocks",
        "--gan-mode",
        "lsgan",
        "--label-smoothing",
        0.1,
        "--serial-pairs",
        "--loss-g-weights=0.6,0.4",
        "--loss-d-weights=0.3,0.7",
        "--dataroot",
        data,
        *FLOAT64_TWO_STEPS,
        "--weights",
        tmp_path / "cyclegan",
        "--checkpoints-dir",
        tmp_path / "ck",
    ]
    common = [a for a in common if a not in ("--net-gs", "unet_32")]  # (SMALL's DeepLIIF segmentation)
    single, saved = train_both(phalanx, common, torch_home, tmp_path / "ck")
    assert "phalanx: weights: 8 DeepLIIF networks (generators and discriminators)" in single.out

    a, bs = unpaired_tensors(data)
    for _ in range(2):
        model.set_input({"A": a, "Bs": bs, "A_paths": []})
        model.optimize_parameters()
    assert_same_weights(saved, {name: network(model, name).state_dict() for name in model.model_names})
    last = records(tmp_path / "ck" / "single", "train")[-1]
    for loss in ("G_A", "G_B", "cycle_A", "cycle_B", "D_A", "D_B"):
        assert last[loss] == pytest.approx(float(getattr(model, f"loss_{loss}")), rel=1e-9, abs=1e-12), loss

    out = tmp_path / "exported"
    exported = phalanx(
        "export", "--checkpoint", tmp_path / "ck" / "single" / "latest.pt", "--format", "deepliif", "--output", out
    )
    assert exported.code == 0, exported.err
    written = reference.modules().options.read_model_params(str(out / "train_opt.txt"))
    assert written["model"] == "CycleGAN" and int(written["modalities_no"]) == 2
    for name in model.model_names:  # DeepLIIF's own networks load the files strictly: phalanx's weights
        network(model, name).load_state_dict(torch.load(out / f"latest_net_{name}.pth", weights_only=True))
        for key, value in network(model, name).state_dict().items():
            assert torch.equal(value, saved["single"][name][key]), (name, key)
    predicted = phalanx(
        "predict", "--checkpoint", tmp_path / "ck" / "single", data / "valA", "--output", tmp_path / "pred"
    )
    assert predicted.code == 0, predicted.err
    assert sorted(p.name for p in (tmp_path / "pred").iterdir()) == ["GA_1", "GA_2"]
    # evaluate scores the cycles A -> B_i -> A on valA/, as the run's validation did
    scored = phalanx(
        "evaluate", "--checkpoint", tmp_path / "ck" / "single" / "latest.pt", "--dataroot", data, "--no-progress"
    )
    assert scored.code == 0, scored.err
    validated = records(tmp_path / "ck" / "single", "val")[-1]
    mean = next(line for line in scored.out.splitlines() if line.startswith("mean"))
    assert float(mean.split()[1]) == pytest.approx(validated["L1"], abs=1e-4)


def test_the_image_pool_returns_new_images_until_full_then_swaps_half_of_them_for_kept_ones():
    """CycleGAN's ``ImagePool`` as DeepLIIF's ``util/image_pool.py`` behaves (its draws are
    Python's ``random``, phalanx's a seeded torch generator: the rule is compared, not the draws)."""
    from phalanx.tasks.deepliif.cyclegan import ImagePool

    pool = ImagePool(4, torch.Generator().manual_seed(0))
    first = torch.arange(4.0)[:, None]
    assert torch.equal(pool.query(first), first)  # filling: every image returned as it is
    swapped = 0
    for step in range(50):
        new = torch.full((3, 1), 100.0 + step)
        kept_before = torch.cat(pool.images).clone()
        returned = pool.query(new)
        kept_after = torch.cat(pool.images)
        for value in returned[:, 0]:
            # either the new image itself, or one the pool held, which the new one replaced
            assert value == new[0, 0] or value in kept_before
        swapped += int((returned[:, 0] != new[0, 0]).sum())
        assert len(pool.images) == 4 and (kept_after == new[0, 0]).sum() >= (returned[:, 0] != new[0, 0]).sum()
    assert 40 < swapped < 110  # about half of 150
    assert torch.equal(ImagePool(0, torch.Generator()).query(first), first)


def test_unpaired_partners_are_drawn_by_seed_epoch_and_index_and_serially_on_request(tmp_path):
    from phalanx.tasks.deepliif.unpaired import UnpairedImages, UnpairedView, find_unpaired

    data = unpaired_samples(tmp_path / "data", counts=(4, 4, 3))
    files = find_unpaired(data, "train", 0)
    assert files is not None and len(files) == 4 and [len(b) for b in files.b] == [4, 3]
    images = UnpairedImages(files, 32)

    def view(seed, serial=False):
        return UnpairedView(images, None, seed, lambda sample: sample, serial)

    drawn = [[view(7)[(epoch, i)][1] for i in range(4)] for epoch in (1, 2, 3)]
    again = [[view(7)[(epoch, i)][1] for i in range(4)] for epoch in (1, 2, 3)]
    assert all(torch.equal(x, y) for a, b in zip(drawn, again) for x, y in zip(a, b))  # the same draws
    assert not all(torch.equal(x, y) for x, y in zip(drawn[0] + drawn[1], drawn[1] + drawn[2]))  # epochs differ
    serial = [view(7, serial=True)[(1, i)][1] for i in range(4)]
    assert torch.equal(serial[3][1], images.read(files.b[1][0]))  # B2's image 3 mod 3
    (data / "trainB2" / "extra.png").write_bytes(b"not a png")
    with pytest.raises(PhalanxError, match="extra.png"):
        find_unpaired(data, "train", 0)
    with pytest.raises(PhalanxError, match="no trainB3/"):
        find_unpaired(data, "train", 3)

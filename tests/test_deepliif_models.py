"""DeepLIIF's other models against DeepLIIF 1.2.7 itself (``deepliif_reference``), as
``test_deepliif`` checks DeepLIIF's own: DeepLIIF's ``DeepLIIFExtModel`` and ``SDGModel`` write
their networks' files; phalanx starts from them (``--weights DIR``) and trains 2 steps of 4 samples
in float64 as one process and as 2 DDP workers x 2; DeepLIIF's ``optimize_parameters`` takes the
same 2 steps. Every weight and the last step's losses agree (1e-10), DDP and one process within
1e-12. Then ``export --format deepliif`` writes the directory back, and DeepLIIF's own model loads
it (``load_networks``' state dicts, strict) and computes the outputs phalanx computes."""

from __future__ import annotations

import deepliif_reference as reference
import pytest
import torch
from conftest import records, run_phalanx
from phalanx_testdata import deepliif_samples
from test_deepliif import SMALL, panels, random_vgg

# (task, DeepLIIF's model, its options, phalanx's options, modalities): 5 panels each
MODELS = {
    "deepliif-ext": ("ext", "DeepLIIFExtModel", dict(modalities_no=2, seg_gen=True, input_no=1), [], 2),
    "sdg": ("sdg", "SDGModel", dict(modalities_no=3, seg_gen=False, input_no=2), ["--inputs", 2], 3),
}


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
        "--weights",
        tmp_path / kind,
        "--checkpoints-dir",
        tmp_path / "ck",
        "--log-every",
        1,
    ]
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
    assert f"phalanx: weights: {len(model.model_names)} DeepLIIF networks (generators and discriminators)" in single.out

    samples = panels(data / "train")
    for _ in range(2):
        set_input(kind, model, samples)
        model.optimize_parameters()
    saved = {
        run: torch.load(tmp_path / "ck" / run / "latest.pt", weights_only=True)["models"] for run in ("ddp", "single")
    }
    assert sorted(saved["single"]) == sorted(model.model_names)
    for name in model.model_names:
        for key, value in network(model, name).state_dict().items():
            ours = saved["single"][name][key]
            assert (ours - value).abs().max() < 1e-10, (name, key, (ours - value).abs().max())
            assert (saved["ddp"][name][key] - ours).abs().max() < 1e-12, (name, key)
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

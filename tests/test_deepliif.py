"""``--task deepliif`` against DeepLIIF 1.2.7 itself (``deepliif_reference``): its networks' files
load into phalanx's and compute the same outputs; from the same files, one process and 2 DDP
workers train in float64 what DeepLIIF's own ``optimize_parameters`` does; both data layouts."""

from __future__ import annotations

import json
import warnings

import deepliif_reference as reference
import numpy as np
import pytest
import torch
from conftest import records, run_phalanx
from phalanx_testdata import deepliif_samples
from PIL import Image

from phalanx.errors import PhalanxError

SMALL = [
    "--task",
    "deepliif",
    "--image-size",
    32,
    "--net-g",
    "resnet_2blocks",
    "--net-gs",
    "unet_32",
    "--ngf",
    4,
    "--ndf",
    4,
    "--d-layers",
    2,
    "--no-progress",
]


def panels(folder) -> torch.Tensor:
    """Aligned DeepLIIF samples as [-1, 1] tensors (N, panels, 3, H, H), read with PIL alone (scaled
    in float32, as the data set hands them over, then widened)."""
    found = []
    for path in sorted(folder.glob("*.png")):
        pixels = np.asarray(Image.open(path).convert("RGB"), dtype=np.float32) / np.float32(127.5) - np.float32(1)
        side = pixels.shape[0]
        found.append([pixels[:, i * side : (i + 1) * side].transpose(2, 0, 1) for i in range(pixels.shape[1] // side)])
    return torch.tensor(np.array(found)).double()


def random_vgg_features() -> torch.nn.Sequential:
    """VGG19's features with seeded random weights (ImageNet's are not on this machine), given to
    DeepLIIF's Vgg19 (which would download ImageNet's)."""
    from torchvision.models.vgg import cfgs, make_layers

    torch.manual_seed(1)
    features = make_layers(cfgs["E"])[:30]
    for module in features:
        if isinstance(module, torch.nn.Conv2d):
            torch.nn.init.normal_(module.weight, 0, (2 / (9 * module.in_channels)) ** 0.5)
    reference.vgg_with(features)
    return features


def random_vgg(torch_home) -> torch.nn.Sequential:
    """The same features as the hub file phalanx reads, too."""
    features = random_vgg_features()
    folder = torch_home / "hub" / "checkpoints"
    folder.mkdir(parents=True)
    torch.save({f"features.{k}": v for k, v in features.state_dict().items()}, folder / "vgg19-dcbb9e9d.pth")
    return features


@pytest.mark.parametrize(
    "name, norm, padding, size, ngf",
    [
        ("resnet_9blocks", "batch", "zero", 32, 4),  # deepliif train's defaults
        ("resnet_6blocks", "instance", "reflect", 32, 4),
        ("unet_32", "none", "zero", 64, 4),
        ("unet_512", "batch", "zero", 512, 1),  # the segmentation generators' default, at its size
    ],
)
def test_deepliifs_files_load_into_phalanxs_networks_which_compute_the_same(tmp_path, name, norm, padding, size, ngf):
    from phalanx.tasks.deepliif.nets import discriminator, generator

    networks = reference.modules().networks
    torch.manual_seed(0)
    theirs = networks.define_G(3, 3, ngf, name, norm, False, "normal", 0.02, [], padding).double()
    ours = generator(name, 3, 3, ngf, norm, False, padding).double()
    torch.save(theirs.state_dict(), tmp_path / "latest_net_G1.pth")
    ours.load_state_dict(torch.load(tmp_path / "latest_net_G1.pth", weights_only=True))  # strict: key for key
    x = torch.rand(2, 3, size, size, dtype=torch.float64) * 2 - 1
    assert (ours(x) - theirs(x)).abs().max() < 1e-10
    layers = 4 if size >= 64 else 2  # DeepLIIF's n_layers_D 4 needs 64 px
    theirs_d = networks.define_D(6, 4, "n_layers", layers, norm).double()
    ours_d = discriminator(6, 4, layers, norm).double()
    ours_d.load_state_dict(theirs_d.state_dict())
    pair = torch.cat([x, x.flip(-1)], 1)
    assert (ours_d(pair) - theirs_d(pair)).abs().max() < 1e-10


@pytest.mark.slow
def test_from_deepliifs_files_one_process_and_two_ddp_workers_train_what_deepliifs_own_step_does(
    tmp_path, phalanx, monkeypatch
):
    """float64, instance norm, no dropout, the VGG loss on: DeepLIIF's model writes its files, phalanx
    starts from them (--weights DIR) and trains 2 steps of 4 samples as one process and as 2 DDP
    workers x 2; DeepLIIF's ``optimize_parameters`` takes the same 2 steps. Every weight and the
    last step's losses agree (1e-10), DDP and one process within 1e-12; the biases that an
    InstanceNorm cancels stay as loaded in phalanx (DeepLIIF's move by Adam's noise)."""
    from phalanx.tasks.deepliif.nets import freeze_inert_biases

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    random_vgg(tmp_path / "torch")
    opt = reference.options(
        ngf=4,
        ndf=4,
        netG="resnet_2blocks",
        net_gs="unet_32",
        n_layers_D=2,
        norm="instance",
        no_dropout=True,
        checkpoints_dir=str(tmp_path),
        name="deepliif",
    )
    torch.manual_seed(0)
    model = reference.modules().model.DeepLIIFModel(opt)
    nets = {name: getattr(model, f"net{name}").double() for name in model.model_names}
    for criterion in (model.criterionVGG, model.criterionGAN_mod, model.criterionGAN_seg):
        criterion.double()  # its GAN targets are float32 buffers
    (tmp_path / "deepliif").mkdir()
    model.save_networks("latest")
    start = {name: {k: v.clone() for k, v in net.state_dict().items()} for name, net in nets.items()}

    data = deepliif_samples(tmp_path / "data", size=32, per_split={"train": 4, "val": 2})
    common = [
        *SMALL,
        "--dataroot",
        data,
        "--norm",
        "instance",
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
        tmp_path / "deepliif",
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
        env={"TORCH_HOME": str(tmp_path / "torch")},
    )
    assert ddp.code == 0, ddp.err
    single = phalanx("train", "--name", "single", "--batch-size", 4, *common)
    assert single.code == 0, single.err
    assert "phalanx: weights: 18 DeepLIIF networks (generators and discriminators)" in single.out

    samples = panels(data / "train")
    for _ in range(2):
        model.set_input({"A": samples[:, 0], "B": [samples[:, k] for k in range(1, 6)], "A_paths": []})
        model.optimize_parameters()
    saved = {
        run: torch.load(tmp_path / "ck" / run / "latest.pt", weights_only=True)["models"] for run in ("ddp", "single")
    }
    for name, net in nets.items():
        ours = saved["single"][name]
        frozen = {key for key, _ in _named_frozen(name, opt, freeze_inert_biases)}
        for key, value in net.state_dict().items():
            if key in frozen:
                assert torch.equal(ours[key], start[name][key]), (name, key)
            else:
                assert (ours[key] - value).abs().max() < 1e-10, (name, key, (ours[key] - value).abs().max())
            assert (saved["ddp"][name][key] - ours[key]).abs().max() < 1e-12, (name, key)
    last = records(tmp_path / "ck" / "single", "train")[-1]
    for loss in [f"{kind}_{i}" for i in range(1, 5) for kind in ("G_GAN", "G_L1", "G_VGG", "D_real", "D_fake")] + [
        f"{kind}_S" for kind in ("G_GAN", "G_L1", "D_real", "D_fake")
    ]:
        assert last[loss] == pytest.approx(float(getattr(model, f"loss_{loss}")), rel=1e-9, abs=1e-12), loss


def _named_frozen(name, opt, freeze):
    """The parameters of DeepLIIF network ``name`` that phalanx freezes (a bias an InstanceNorm cancels)."""
    from phalanx.tasks.deepliif.nets import discriminator, generator

    if name.startswith("D"):
        net = discriminator(6, opt.ndf, opt.n_layers_D, opt.norm)
    else:
        arch = "resnet_2blocks" if name[1:].isdigit() else "unet_32"  # (DeepLIIF made opt.netG a list)
        net = generator(arch, 3, 3, opt.ngf, opt.norm, False, opt.padding if name[1:].isdigit() else "reflect")
    freeze(net)
    return [(k, p) for k, p in net.named_parameters() if not p.requires_grad]


@pytest.mark.slow
def test_plain_layout_trains_predicts_any_size_and_exports_a_directory_deepliif_loads(tmp_path, phalanx):
    """A, B1 ... B4, seg/ folders; predict writes DeepLIIF's output names at the image's own size;
    ``export --format deepliif`` writes files and a train_opt.txt that DeepLIIF's own option reader
    and ``DeepLIIFModel.load_networks`` take, and DeepLIIF's forward then computes phalanx's outputs."""
    from phalanx.inference.model import load_trained
    from phalanx.records.pictures import pixels
    from phalanx.tasks.deepliif.cells import count

    data = deepliif_samples(tmp_path / "data", size=32, per_split={"train": 8, "val": 2}, layout="plain")
    run = phalanx(
        "train",
        *SMALL,
        "--dataroot",
        data,
        "--lambda-feat",
        0,
        "--norm",
        "instance",
        "--epochs",
        1,
        "--batch-size",
        4,
        "--checkpoints-dir",
        tmp_path / "ck",
        "--name",
        "plain",
    )
    assert run.code == 0, run.err
    assert "plain layout, 4 modalities + segmentation" in run.out
    checkpoint = tmp_path / "ck" / "plain" / "latest.pt"
    trained = load_trained(str(checkpoint))
    val = {
        folder: torch.tensor(
            np.array([np.asarray(Image.open(p)) for p in sorted((data / "val" / folder).glob("*.png"))]),
            dtype=torch.float32,
        ).permute(0, 3, 1, 2)
        / 127.5
        - 1
        for folder in ("A", "B4", "seg")
    }
    with torch.no_grad():
        outputs = trained.task.generate(trained.models, val["A"])
    errors = [
        abs(
            count(pixels((s + 1) / 2), pixels((k + 1) / 2), "10x")["num_total"]
            - count(pixels((t + 1) / 2), pixels((u + 1) / 2), "10x")["num_total"]
        )
        for s, k, t, u in zip(outputs[4], outputs[3], val["seg"], val["B4"])
    ]
    assert records(tmp_path / "ck" / "plain", "val")[-1]["cell_count_error"] == sum(errors) / len(errors)
    table = phalanx("evaluate", "--checkpoint", checkpoint).out.splitlines()  # rows named as predict's folders
    assert [line.split()[0] for line in table[-6:]] == ["Hema", "DAPI", "Lap2", "Marker", "Seg", "mean"], table
    wide = tmp_path / "wide.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 56, 3), dtype=np.uint8)).save(wide)
    assert phalanx("predict", "--checkpoint", checkpoint, wide, "--output", tmp_path / "out").code == 0
    for folder in ("Hema", "DAPI", "Lap2", "Marker", "Seg", "SegOverlaid", "SegRefined"):
        assert Image.open(tmp_path / "out" / folder / "wide.png").size == (56, 40)
    counted = json.loads((tmp_path / "out" / "cells.json").read_text())
    seg, marker = (np.asarray(Image.open(tmp_path / "out" / folder / "wide.png")) for folder in ("Seg", "Marker"))
    overlaid, refined, theirs = reference.postprocessing().compute_final_results(
        np.asarray(Image.open(wide)), seg.astype(np.int64), marker, "10x"
    )
    assert counted == [{"image": "wide.png", **{k: theirs[k] for k in counted[0] if k != "image"}}]
    assert np.array_equal(np.asarray(Image.open(tmp_path / "out" / "SegOverlaid" / "wide.png")), overlaid)
    assert np.array_equal(np.asarray(Image.open(tmp_path / "out" / "SegRefined" / "wide.png")), refined)
    assert (tmp_path / "out" / "cells.csv").read_text().splitlines()[0].startswith("image,num_total,num_pos")
    with pytest.MonkeyPatch.context() as patch:
        predicts_a_slide_region_by_region_as_the_whole_image(tmp_path, phalanx, checkpoint, patch)

    with warnings.catch_warnings(record=True) as caught:  # a newcomer saw torch.jit.save's, 9 times
        warnings.simplefilter("always")
        exported = phalanx("export", "--checkpoint", checkpoint, "--format", "deepliif", "--output", tmp_path / "model")
    assert exported.code == 0 and not exported.err, exported.err
    assert not [w for w in caught if "torch" in w.filename], [str(w.message) for w in caught]
    with pytest.MonkeyPatch.context() as patch:  # refused before any network is traced (11 s of this test, once)
        import phalanx.tasks.deepliif.inference as native

        patch.setattr(native, "traced_bytes", lambda *args: pytest.fail("traced for a refused export"))
        again = phalanx("export", "--checkpoint", checkpoint, "--format", "deepliif", "--output", tmp_path / "model")
    assert again.code == 2 and again.err.strip() == (
        f"phalanx: --output: {tmp_path / 'model' / 'latest_net_G1.pth'} "
        "exists; --overwrite replaces the model files there"
    ), again.err
    ref = reference.modules()
    opt = ref.options.Options(path_file=str(tmp_path / "model" / "train_opt.txt"), mode="test")
    assert (opt.netG, opt.net_gs, opt.norm, opt.modalities_no) == ("resnet_2blocks", "unet_32", "instance", 4)
    opt.ngf = 4  # DeepLIIF's test mode takes ngf 64 (its released models') whatever train_opt.txt says
    opt.gpu_ids, opt.is_train, opt.use_dp, opt.preprocess, opt.remote_transfer_cmd = [], False, False, None, None
    model = ref.model.DeepLIIFModel(opt)
    model.load_networks("latest")
    x = torch.rand(2, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        for net in model.model_names:
            getattr(model, f"net{net}").eval()
        model.set_input({"A": x, "B": [x] * 5, "A_paths": []})
        model.forward()
        ours = trained.task.generate(trained.models, x)
    for k in range(4):
        assert (ours[k] - getattr(model, f"fake_B_{k + 1}")).abs().max() < 1e-5
    assert (ours[4] - model.fake_B_S).abs().max() < 1e-5
    for name in ("G1", "G4", "GS0", "GS4"):  # what `deepliif test` loads by default: serialized generators
        with torch.no_grad():
            scripted = torch.jit.load(str(tmp_path / "model" / f"{name}.pt"))(x)
            assert (scripted - trained.models[name](x)).abs().max() < 1e-5


def predicts_a_slide_region_by_region_as_the_whole_image(tmp_path, phalanx, checkpoint, monkeypatch):
    """A TIFF larger than --region-size is read, predicted and written region by region (tiled
    OME-TIFFs), each output equal pixel for pixel to the same image predicted whole, and its cells
    counted as the whole image's (``deepliif_slide_cells``). So that there are cells to count (a
    model trained for an epoch segments none), the segmentation and the marker are the networks'
    outputs plus cells where the input is red or blue enough, blobs that cross the regions' borders."""
    import tifffile

    from phalanx.tasks.deepliif.task import DeepLIIFTask

    test_outputs = DeepLIIFTask.test_outputs

    def with_cells(self, models, inputs, *args, **kwargs):
        outputs = test_outputs(self, models, inputs, *args, **kwargs)
        red, blue = (inputs[:, 0:1] > 0.6).to(inputs.dtype), (inputs[:, 2:3] > 0.6).to(inputs.dtype)
        outputs["Seg"] = outputs["Seg"] * 0.05 + torch.cat([red, -torch.ones_like(red), blue], 1) * 1.9 - 0.95
        outputs["Marker"] = outputs["Marker"] * 0.05 + inputs[:, 1:2].expand_as(outputs["Marker"]) * 0.9
        return outputs

    monkeypatch.setattr(DeepLIIFTask, "test_outputs", with_cells)
    rng = np.random.default_rng(1)
    # 160 x 150 in regions of 48 px (the 32 px tiles' stride of 24, twice): the last rows a strip of 16,
    # the last columns one of 6, each thinner than a tile past the tiles before it, where the whole
    # image's last tile reaches back; the rows' wider than the tiles' overlap of 8 (reading only the
    # overlap past a region would miss it), the columns' thinner (so would the region's own start)
    picture = np.kron(rng.integers(0, 256, (16, 15, 3), dtype=np.uint8), np.ones((10, 10, 1), dtype=np.uint8))
    picture = np.clip(picture.astype(int) + rng.integers(-20, 20, picture.shape), 0, 255).astype(np.uint8)
    (tmp_path / "whole").mkdir()
    (tmp_path / "slides").mkdir()
    Image.fromarray(picture).save(tmp_path / "whole" / "slide.png")
    tifffile.imwrite(
        tmp_path / "slides" / "slide.ome.tif", picture, tile=(32, 32), compression="zlib", photometric="rgb"
    )
    tifffile.imwrite(tmp_path / "slides" / "slide.tif", picture)  # would be written as slide.ome.tif too
    whole = phalanx("predict", "--checkpoint", checkpoint, tmp_path / "whole", "--output", tmp_path / "out-whole")
    assert whole.code == 0, whole.err
    twice = phalanx(
        "predict",
        "--checkpoint",
        checkpoint,
        tmp_path / "slides",
        "--region-size",
        64,
        "--output",
        tmp_path / "out-slide",
    )
    assert twice.code == 2 and "two slides would both be written as slide.ome.tif" in twice.err, twice.err
    (tmp_path / "slides" / "slide.tif").unlink()
    regions = phalanx(
        "predict",
        "--checkpoint",
        checkpoint,
        tmp_path / "slides",
        "--region-size",
        64,
        "--output",
        tmp_path / "out-slide",
    )
    assert regions.code == 0, regions.err
    for folder in ("Hema", "DAPI", "Lap2", "Marker", "Seg", "SegOverlaid", "SegRefined"):
        with tifffile.TiffFile(tmp_path / "out-slide" / folder / "slide.ome.tif") as tiff:
            assert tiff.is_ome and tiff.pages[0].is_tiled, folder
            written = tiff.asarray()
        assert np.array_equal(written, np.asarray(Image.open(tmp_path / "out-whole" / folder / "slide.png"))), folder
    slide, image = (json.loads((tmp_path / out / "cells.json").read_text()) for out in ("out-slide", "out-whole"))
    assert slide == [{**image[0], "image": "slide.ome.tif"}] and image[0]["num_total"] > 10, image
    assert sorted(p.name for p in (tmp_path / "out-slide").iterdir()) == sorted(
        ["Hema", "DAPI", "Lap2", "Marker", "Seg", "SegOverlaid", "SegRefined", "cells.csv", "cells.json"]
    )
    # --tiling blend: translate's tiling, region by region as whole, the same
    for out, source in (("blend-whole", tmp_path / "whole"), ("blend-slide", tmp_path / "slides")):
        blended = phalanx(
            "predict",
            "--checkpoint",
            checkpoint,
            source,
            "--region-size",
            64,
            "--tiling",
            "blend",
            "--output",
            tmp_path / out,
        )
        assert blended.code == 0, blended.err
    for folder in ("Hema", "Marker", "Seg"):
        written = tifffile.imread(tmp_path / "blend-slide" / folder / "slide.ome.tif")
        whole = np.asarray(Image.open(tmp_path / "blend-whole" / folder / "slide.png"))
        assert np.array_equal(written, whole), folder
        deepliif = np.asarray(Image.open(tmp_path / "out-whole" / folder / "slide.png"))
        assert not np.array_equal(whole, deepliif), folder  # the two tilings differ: the blend ran
    cut = tmp_path / "cut" / "cut.tif"  # a slide whose tiles end early: one line, nothing written
    cut.parent.mkdir()
    cut.write_bytes((tmp_path / "slides" / "slide.ome.tif").read_bytes()[:5000])
    failed = phalanx(
        "predict",
        "--checkpoint",
        checkpoint,
        cut,
        tmp_path / "whole",
        "--region-size",
        64,
        "--output",
        tmp_path / "out-cut",
    )  # skipped, the other image predicted
    assert (
        failed.code == 0
        and failed.err.startswith(f"phalanx: warning: skipped {cut}: cannot read it region by region (")
        and len(failed.err.splitlines()) == 1
    ), failed.err
    assert "1 image(s) predicted, 1 skipped" in failed.out
    assert not list((tmp_path / "out-cut").rglob("*.tif")) and not list((tmp_path / "out-cut").glob(".*"))
    assert (tmp_path / "out-cut" / "Seg" / "whole" / "slide.png").exists()


def test_bad_deepliif_input_is_named_in_one_line_before_training(tmp_path, phalanx, monkeypatch):
    from phalanx.tasks.deepliif.nets import generator

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "no-hub"))
    data = deepliif_samples(tmp_path / "data", size=32, per_split={"train": 2, "val": 1})
    other = tmp_path / "other"
    other.mkdir()
    for k in range(1, 5):  # generators of another width
        torch.save(
            generator("resnet_2blocks", 3, 3, 8, "batch", True, "zero").state_dict(), other / f"latest_net_G{k}.pth"
        )
    for k in range(5):
        torch.save(
            generator("unet_32", 3, 3, 8, "batch", True, "reflect").state_dict(), other / f"latest_net_GS{k}.pth"
        )
    (other / "train_opt.txt").write_text("                      ngf: 8\n")
    cases = [
        ([], "--lambda-feat", "vgg19-dcbb9e9d.pth"),
        (["--lambda-feat", 0, "--weights", tmp_path], "--weights", "no file for generator(s) G1"),
        (["--lambda-feat", 0, "--weights", other], "--weights", "its train_opt.txt says ngf 8"),
        (["--lambda-feat", 0, "--seg-weights", "0.5,0.5"], "--seg-weights", "need 5"),
        (["--lambda-feat", 0, "--loss-g-weights", "0.2,0.2,0.2,0.2,0.1,0.1"], "--loss-g-weights", "has 6"),
        (["--lambda-feat", 0, "--net-gs", "unet_16"], "--net-gs", "start at unet_32"),
        (["--lambda-feat", 0, "--modalities", 3], "--dataroot", "6 panels where 5 are expected"),
    ]
    for extra, option, words in cases:
        result = phalanx(
            "train", *SMALL, "--dataroot", data, "--checkpoints-dir", tmp_path / "ck", "--overwrite", *extra
        )
        assert result.code == 2 and option in result.err and words in result.err, (extra, result.err)
        assert len(result.err.strip().splitlines()) == 1 and "Traceback" not in result.err


def test_a_released_models_names_and_torchscript_files_load_as_deepliif_means_them(tmp_path):
    """DeepLIIF before 1.2 named the segmentation generators G51 ... G55 (from the input, then each
    modality; G50 ... where the input's was numbered 0); ``deepliif serialize`` writes TorchScript
    G1.pt ... without BatchNorm's running statistics: each lands in the network it is."""
    from phalanx.tasks.deepliif.files import load_model_dir
    from phalanx.tasks.deepliif.nets import generator

    networks = reference.modules().networks
    torch.manual_seed(0)
    old, scripted, zero = tmp_path / "old", tmp_path / "scripted", tmp_path / "zero"
    old.mkdir(), scripted.mkdir(), zero.mkdir()
    written = {}
    for k in range(1, 3):
        written[f"G{k}"] = networks.define_G(3, 3, 2, "resnet_2blocks", "batch", False, "normal", 0.02, [], "zero")
    for k in range(3):
        written[f"GS{k}"] = networks.define_G(3, 3, 2, "unet_32", "batch", False, "normal", 0.02, [])
    states = {name: {k: v.clone() for k, v in net.state_dict().items()} for name, net in written.items()}
    for name, net in written.items():
        old_name = name if name[1] != "S" else f"G3{int(name[2:]) + 1}"  # 2 modalities: G31 G32 G33
        torch.save(net.state_dict(), old / f"latest_net_{old_name}.pth")
        torch.save(net.state_dict(), zero / f"latest_net_{name if name[1] != 'S' else f'G3{name[2:]}'}.pth")  # G30 ...
        served = reference.disable_batchnorm_tracking_stats(net.eval())  # as `deepliif serialize` does
        torch.jit.trace(served, torch.zeros(1, 3, 32, 32)).save(str(scripted / f"{old_name}.pt"))
    for folder in (old, scripted, zero):
        models = {
            name: generator("resnet_2blocks" if name[1] != "S" else "unet_32", 3, 3, 2, "batch", False, "zero")
            for name in written
        }
        notes = load_model_dir(models, folder, list(written), ["D1", "D2", "DS0", "DS1", "DS2"], 2)
        assert "they start from DeepLIIF's initialisation" in notes[-1]
        # (these checks once sat inside the pytest.raises block below, after the raise: never run)
        for name, state in states.items():
            for key, value in state.items():
                if folder is scripted and key.endswith(("running_mean", "running_var")):
                    continue  # not in a serialized network: DeepLIIF's inference never reads them
                assert torch.equal(models[name].state_dict()[key], value), (folder.name, name, key)
    checkpoint = tmp_path / "latest.pt"  # a phalanx checkpoint given where a directory is taken: how to make one
    checkpoint.write_bytes(b"")
    with pytest.raises(
        PhalanxError,
        match=r"latest.pt is not a directory .*; `phalanx export --checkpoint .*latest.pt "
        r"--format deepliif --output DIR` writes one from a phalanx checkpoint$",
    ):
        load_model_dir(models, checkpoint, list(written), [], 2)


def cell_images(seed: int, side: int = 80) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A segmentation as DeepLIIF draws one (red: positive, blue: negative, on black), with cells
    that touch (a red and a blue disc merged), specks and small ones near the noise and size thresholds, faint
    ones near the colour threshold, rings (a hole inside a cell), green ones that are no cells, and
    cells cut by the border; a marker image with bright spots; the input."""
    rng = np.random.default_rng(seed)
    seg = np.zeros((side, side, 3), dtype=np.uint8)
    y, x = np.mgrid[0:side, 0:side]
    for _ in range(28):
        cy, cx, radius = rng.integers(-2, side + 2), rng.integers(-2, side + 2), rng.choice([1, 1.5, 2, 2.5, 3, 4, 6])
        inside = (y - cy) ** 2 + (x - cx) ** 2 <= radius**2
        if rng.random() < 0.15:
            inside &= (y - cy) ** 2 + (x - cx) ** 2 > (radius / 2) ** 2  # a ring
        level = rng.choice([255, 200, 125, 118, 90])  # some just above, some just below red + blue > 120
        colour = rng.choice(4)
        seg[inside] = [(level, 0, 0), (0, 0, level), (level, 0, level // 3), (level, 120, 0)][colour]
    for _ in range(8):  # specks of 1 or 2 pixels: noise below noise_thresh
        cy, cx = rng.integers(1, side - 2, 2)
        seg[cy, cx : cx + rng.integers(1, 3)] = (255, 0, 0)
    marker = np.clip(rng.normal(40, 30, (side, side, 3)), 0, 255).astype(np.uint8)
    for _ in range(6):
        marker[rng.integers(0, side), rng.integers(0, side)] = 250
    orig = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
    return seg, marker, orig


@pytest.mark.parametrize("seed", range(6))
def test_cell_counts_and_outlines_equal_deepliifs_compute_final_results(seed):
    from phalanx.tasks.deepliif.cells import count, resolution_of

    postprocessing = reference.postprocessing()
    seg, marker, orig = cell_images(seed)
    settings = [
        {},
        {"size_thresh": None},
        {"size_thresh": 6, "marker_thresh": 100},
        {"marker_thresh": "default"},
        {"seg_thresh": 150, "size_thresh_upper": 40},
        {"noise_thresh": 1},
    ]
    for given in settings:
        for resolution in ("40x", resolution_of(256), resolution_of(128)):
            # seg as int64: numba adds uint8 pixels in 64 bits; the plain-Python stand-in would wrap at 256
            overlaid, refined, theirs = postprocessing.compute_final_results(
                orig, seg.astype(np.int64), marker, resolution, **given
            )
            images = {"input": orig}
            ours = count(seg, marker, resolution, **given, images_of=images)
            assert ours == theirs, (seed, given, resolution)
            assert np.array_equal(images["overlaid"], overlaid) and np.array_equal(images["refined"], refined)
    assert count(seg, marker, "10x")["num_total"] > 5  # the images hold cells worth counting


@pytest.mark.parametrize("seed", range(2))
def test_a_slide_counted_block_by_block_equals_the_whole_image(tmp_path, seed):
    """Cells cut by block borders are joined and counted once, a hole spanning blocks stays inside
    its cell, background reaching the edge through other blocks stays background, and the
    thresholds come from the whole slide: the scoring and the outlines equal ``count`` on the
    whole image (itself equal to DeepLIIF's ``compute_final_results``, above) for blocks of any size."""
    from phalanx.data.slides import SlideOutputs
    from phalanx.tasks.deepliif.cells import count
    from phalanx.tasks.deepliif.slide_cells import SlideCells

    seg, marker, orig = cell_images(seed, side=96)
    y, x = np.mgrid[0:96, 0:96]
    distance = (y - 40) ** 2 + (x - 50) ** 2
    seg[(distance <= 22**2) & (distance > 15**2)] = (200, 0, 0)  # a ring across blocks, cells in its hole
    seg[64:66, :] = (0, 0, 255)  # a cell from edge to edge, cutting the background in two
    seg[72:, 20], seg[72:, 40], seg[72, 20:41] = (
        (255, 0, 0),
        (255, 0, 0),
        (255, 0, 0),
    )  # background only the bottom edge holds
    for step in range(30):  # cells joined only diagonally, across block borders
        seg[2 + step, 60 + step] = seg[30 - step, 20 + step] = (0, 0, 230)
    settings = [{}, {"marker_thresh": "default"}, {"size_thresh": None, "size_thresh_upper": 50}]
    for block in (13, 32, 96):
        outputs = SlideOutputs(tmp_path / f"scratch{block}", 96, 96)
        outputs.write("Seg", 0, 0, seg)
        outputs.write("Marker", 0, 0, marker)
        slide = SlideCells(outputs, "Seg", "Marker", block, seg_thresh=120, noise_thresh=4)
        for top, left, height, width in slide.blocks():
            slide.add_block(
                top, left, seg[top : top + height, left : left + width], marker[top : top + height, left : left + width]
            )
        found = slide.found()
        for given in settings:
            images = {"input": orig}
            theirs = count(seg, marker, "40x", **given, images_of=images)
            scoring, counted, positive = slide.score(
                found,
                "40x",
                given.get("size_thresh", "default"),
                given.get("marker_thresh"),
                given.get("size_thresh_upper"),
            )
            assert scoring == theirs, (block, given)
            slide.outline(
                found, counted, positive, lambda t, left, h, w: orig[t : t + h, left : left + w], "over", "refined"
            )
            assert np.array_equal(outputs.read("over", 0, 0, 96, 96), images["overlaid"]), (block, given)
            assert np.array_equal(outputs.read("refined", 0, 0, 96, 96), images["refined"]), (block, given)
    assert count(seg, marker, size_thresh=None)["num_total"] > 5  # cells worth counting


def test_in_eval_mode_batchnorm_takes_each_images_statistics_as_deepliifs_inference(tmp_path):
    """DeepLIIF predicts with its BatchNorm's running statistics dropped (``disable_batchnorm_tracking_stats``,
    run here from DeepLIIF's own source): phalanx's ``generate`` in eval mode computes what DeepLIIF's
    forward then computes, from the same files, and leaves the running statistics as they were."""
    from phalanx.config import RunConfig
    from phalanx.tasks.deepliif.task import DeepLIIFTask

    opt = reference.options(
        ngf=2,
        ndf=2,
        netG="resnet_2blocks",
        net_gs="unet_32",
        n_layers_D=2,
        no_dropout=True,
        checkpoints_dir=str(tmp_path),
        name="model",
        lambda_feat=0.0,
    )
    random_vgg_features()  # DeepLIIF's training model builds its VGG loss
    torch.manual_seed(0)
    (tmp_path / "model").mkdir()
    model = reference.modules().model.DeepLIIFModel(opt)
    model.save_networks("latest")
    task = DeepLIIFTask(
        RunConfig.flat(
            task="deepliif",
            image_size=32,
            task_options={
                "net_g": "resnet_2blocks",
                "net_gs": "unet_32",
                "ngf": 2,
                "ndf": 2,
                "d_layers": 2,
                "dropout": False,
                "lambda_feat": 0.0,
            },
        )
    )
    info = {"channels": 3, "modalities": 4, "seg": True}
    task.restore_info(info)
    ours = task.build_models(type("Data", (), {"info": info})())
    task.load_weights(ours, str(tmp_path / "model"), None)
    before = {k: v.clone() for k, v in ours["G1"].state_dict().items()}
    x = torch.rand(1, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        for net in ours.values():
            net.eval()
        outputs = task.generate(ours, x)
        for name in model.model_names_g + model.model_names_gs:
            reference.disable_batchnorm_tracking_stats(getattr(model, f"net{name}").eval())
        model.set_input({"A": x, "B": [x] * 5, "A_paths": []})
        model.forward()
    for k in range(4):
        assert (outputs[k] - getattr(model, f"fake_B_{k + 1}")).abs().max() < 1e-5
    assert (outputs[4] - model.fake_B_S).abs().max() < 1e-5
    assert all(torch.equal(v, ours["G1"].state_dict()[k]) for k, v in before.items())
    with torch.no_grad():  # the running statistics (0 and 1 here) give other outputs: the test can tell
        assert (ours["G1"](x) - outputs[0]).abs().max() > 1e-3

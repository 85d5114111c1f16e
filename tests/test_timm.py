"""``--model timm/NAME``: timm's zoo as timm's train.py users expect it: num_classes and in_chans
passed to create_model, ``--weights timm`` from the local Hugging Face cache (never downloaded),
and timm's pretrained configuration (mean, std, input size, crop_pct) taken where options say auto."""

from __future__ import annotations

import pytest
import torch
from conftest import records, write_digit_pngs

MODEL = "timm/test_resnet.r160_in1k"  # timm's own tiny test network: 0.4 M parameters
REPO_ID = "timm/test_resnet.r160_in1k"


def fake_hub_cache(root, state):
    """The Hugging Face cache layout that huggingface_hub reads, holding weights made here."""
    from safetensors.torch import save_file

    folder = root / f"models--{REPO_ID.replace('/', '--')}"
    (folder / "snapshots/0123abcd").mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs/main").write_text("0123abcd")
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "snapshots/0123abcd/model.safetensors"))


def test_a_timm_model_trains_with_its_pretrained_weights_and_configuration(tmp_path, phalanx, monkeypatch):
    import timm

    torch.manual_seed(1)
    pretrained = timm.create_model("test_resnet", num_classes=1000).state_dict()  # "ImageNet" weights, made here
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    missing = phalanx("train", "--model", MODEL, "--weights", "timm", "--epochs", 1, "--checkpoints-dir", tmp_path)
    assert missing.code == 2 and "phalanx does not download" in missing.err and "model.safetensors" in missing.err
    fake_hub_cache(hub, pretrained)
    root = write_digit_pngs(tmp_path / "data", per_class=6)
    result = phalanx(
        "train",
        "--model",
        MODEL,
        "--weights",
        "timm",
        "--freeze-backbone",
        "--dataroot",
        root,
        "--epochs",
        1,
        "--batch-size",
        16,
        "--no-hflip",
        "--checkpoints-dir",
        tmp_path,
        "--no-progress",
    )
    assert result.code == 0, result.err
    assert "2 replaced (another shape, trained anew: " in result.out  # the head, for 10 classes
    assert "fc.weight 1000x96 -> 10x96" in result.out and "fc.bias 1000 -> 10" in result.out
    assert "1 adapted to one input channel" in result.out  # the RGB stem, summed as timm does
    assert "160x160" in result.out  # timm's input size, where --image-size says auto
    saved = torch.load(tmp_path / "experiment/latest.pt", weights_only=True)
    assert saved["data"]["mean"] == [0.5] and saved["data"]["std"] == [0.5]  # timm's, for one channel
    assert saved["data"]["crop_pct"] == 0.95
    first = saved["model"]["conv1.0.weight"]
    assert first.shape[1] == 1  # in_chans: the grayscale digits' one channel
    assert torch.equal(first, pretrained["conv1.0.weight"].sum(1, keepdim=True))  # frozen: as loaded
    assert records(tmp_path / "experiment", "val")


def test_an_unknown_timm_model_is_one_line(phalanx, tmp_path):
    result = phalanx("train", "--model", "timm/resnet19", "--checkpoints-dir", tmp_path)
    assert result.code == 2 and "timm has no model 'resnet19'" in result.err and "timm/resnet18" in result.err


def test_drop_path_reaches_timms_and_torchvisions_stochastic_depth_and_is_refused_where_there_is_none(
    phalanx, monkeypatch
):
    # timm's --drop-path (drop_path_rate), torchvision's stochastic_depth_prob.
    import phalanx.tasks.classify.task as classify
    from phalanx.models import build_model

    timm_model = build_model(MODEL, 10, 3, drop_path=0.2)
    rates = [m.drop_prob for m in timm_model.modules() if type(m).__name__ == "DropPath"]
    assert rates and max(rates) == pytest.approx(0.2)  # rising over the blocks to the rate, as timm does
    assert not any(type(m).__name__ == "DropPath" for m in build_model(MODEL, 10, 3).modules())
    convnext = build_model("convnext_tiny", 10, 3, drop_path=0.3)
    depths = [m.p for m in convnext.modules() if type(m).__name__ == "StochasticDepth"]
    assert depths and max(depths) == pytest.approx(0.3)
    built = []
    monkeypatch.setattr(classify, "build_model", lambda *args: built.append(args) or build_model(*args))
    assert phalanx("train", "--model", MODEL, "--drop-path", 0.1, "--dry-run").code == 0
    assert built[-1][-1] == 0.1  # the run's model gets it
    refused = phalanx("train", "--model", "resnet18", "--drop-path", 0.1, "--dry-run")
    assert refused.code == 2 and refused.err.strip() == (
        "phalanx: --drop-path: --model resnet18 has no stochastic depth (timm/ models and torchvision's ConvNeXt, "
        "EfficientNet, Swin and MaxViT have)"
    ), refused.err

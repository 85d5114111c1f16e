"""Starting from trained weights: load them, start a classifier head of another size anew, freeze
the backbone, give the head its own learning rate.

``--weights`` takes a file (a torchvision-format state dict, or a phalanx checkpoint) or a
torchvision weights name, which must already be in torch's hub cache: phalanx never downloads.
Loading uses ``weights_only=True``; nothing in the file runs.
"""

from __future__ import annotations

import argparse
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from ..errors import PhalanxError

if TYPE_CHECKING:
    from ..config import RunConfig


class LoadsWeights(Protocol):
    """What ``weights_preview`` asks of a task: its ``load_weights`` (``phalanx.tasks.base.Task``'s,
    a layer above, so named by its shape; ``data`` its ``TaskData``)."""

    def load_weights(self, models: Mapping[str, nn.Module], spec: str, data: Any) -> list[str]: ...


OPTION = "--weights"
Stats = tuple[list[float], list[float]]  # a mean and a std, per channel


def weights_file(spec: str, model: str = "") -> Path:
    """The file behind ``--weights``: a path, a torchvision weights name found in torch's hub cache,
    or ``timm`` (a ``timm/NAME`` model's pretrained weights in the local Hugging Face cache)."""
    path = Path(spec)
    if path.is_file():
        return path
    if spec == "timm":
        return _timm_weights(model)
    if "_Weights." not in spec:
        raise PhalanxError(
            f"{spec} does not exist (a file, or a torchvision weights name such as ResNet18_Weights.IMAGENET1K_V1)",
            OPTION,
        )
    from torchvision.models import get_weight

    try:
        weights = get_weight(spec)
    except (ValueError, KeyError, AttributeError):
        raise PhalanxError(f"{spec} is not a torchvision weights name", OPTION) from None
    cached = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(weights.url)
    if not cached.is_file():
        raise PhalanxError(
            f"{spec} is not in torch's hub cache; phalanx does not download: put {weights.url} at {cached}", OPTION
        )
    return cached


def _timm_weights(model: str) -> Path:
    """A timm model's weights, from the Hugging Face cache ($HF_HUB_CACHE, else ~/.cache/huggingface/hub)
    only: phalanx never downloads."""
    from . import TIMM, timm_preferences

    if not model.startswith(TIMM):
        raise PhalanxError(f"'timm' loads a timm/NAME model's pretrained weights; --model is {model!r}", OPTION)
    preferences = timm_preferences(model)
    repo = (preferences or {}).get("hf_hub_id")
    if not repo:
        raise PhalanxError(f"timm has no pretrained weights for {model[len(TIMM) :]} on the Hugging Face hub", OPTION)
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.constants import HF_HUB_CACHE

    # Read now, not when huggingface_hub was imported: the environment may have changed since.
    cache = (
        os.environ.get("HF_HUB_CACHE")
        or (os.environ.get("HF_HOME") and os.path.join(os.environ["HF_HOME"], "hub"))
        or HF_HUB_CACHE
    )
    for filename in ("model.safetensors", "pytorch_model.bin"):
        found = try_to_load_from_cache(repo, filename, cache_dir=cache)
        if isinstance(found, str):
            return Path(found)
    folder = Path(cache) / f"models--{repo.replace('/', '--')}"
    raise PhalanxError(
        f"{repo} is not in the Hugging Face cache; phalanx does not download: put "
        f"https://huggingface.co/{repo}/resolve/main/model.safetensors at "
        f"{folder}/snapshots/<revision>/model.safetensors with the revision in {folder}/refs/main "
        f"(huggingface-cli download {repo} does both where there is internet)",
        OPTION,
    )


# The entry other tools' checkpoints keep their network in (timm: state_dict; torchvision's reference
# scripts: model). Lightning's state_dict prefixes each key with its module's attribute name: not taken.
OTHER_TOOLS = {"state_dict": "timm's checkpoint", "model": "a torchvision reference checkpoint"}
EMA_ENTRIES = ("state_dict_ema", "model_ema")  # their averaged weights, which --weights does not take


def _state_of(path: Path) -> tuple[dict[str, torch.Tensor], list[str] | None, str, Stats | None]:
    """The weights in a file, the classes they were trained on when a phalanx classification checkpoint
    says, what of a checkpoint of another task was taken (a self-supervised run's backbone), and the
    mean and std its inputs were normalised with (a phalanx checkpoint's)."""
    state: Any  # what the file holds, whatever it is, until checked below
    try:
        if path.suffix == ".safetensors":  # timm's and the hub's format: tensors only, nothing runs
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            # torchvision's reference scripts save their argparse arguments beside the weights:
            # a Namespace holds plain values and runs nothing when unpickled.
            with torch.serialization.safe_globals([argparse.Namespace]):
                state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # not a torch file, truncated, or a pickle with classes in it
        from ..checkpoint import unloadable

        raise PhalanxError(f"{path} does not load as weights: {unloadable(path, exc)}", OPTION) from None
    classes, note, stats = None, "", None
    if isinstance(state, dict) and state.get("format") == "phalanx-checkpoint":
        if state.get("sharded"):
            from ..checkpoint.sharded import load_whole

            state = load_whole(path, OPTION, optimizers=False)
        task = state.get("task")
        data = state.get("data") or {}
        stats = (list(data["mean"]), list(data["std"])) if data.get("mean") and data.get("std") else None
        # One whole network (formats 1 and 2 hold nothing else): its head ends in the data's classes.
        if list(state.get("models") or {"model": None}) == ["model"]:
            classes = (state.get("data") or {}).get("classes")
        else:  # another task's primary network (a backbone); the rest (heads, ...) stays behind
            others = sorted(set(state.get("models") or {}) - {"backbone", "model"})
            note = f" (a --task {task} run's backbone" + (f"; its {', '.join(others)} left out)" if others else ")")
        state = state["model"]
    elif isinstance(state, dict) and any(isinstance(state.get(key), dict) for key in OTHER_TOOLS):
        key = next(key for key in OTHER_TOOLS if isinstance(state.get(key), dict))
        others = sorted(k for k in state if k in EMA_ENTRIES)
        note = f" ({OTHER_TOOLS[key]}: its '{key}'" + (f"; its {', '.join(others)} left out)" if others else ")")
        state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise PhalanxError(f"{path} holds no state dict of tensors", OPTION)
    return {k.removeprefix("module."): v for k, v in state.items()}, classes, note, stats


def load_weights(
    model: nn.Module, spec: str, classes: list[str], model_spec: str = "", normalised: Stats | None = None
) -> str:
    """Load what fits; report what was loaded, replaced, left as built. A head trained on other
    classes starts anew: of another shape, or (a phalanx checkpoint tells) of other class names,
    whose rows would otherwise mean the wrong classes. ``normalised``: this run's mean and std, said
    beside a phalanx checkpoint's where they differ."""
    path = weights_file(spec, model_spec)
    state, trained_on, note, stats = _state_of(path)
    own = model.state_dict()
    head = f"{head_module(model)[0]}."
    other_classes = trained_on is not None and list(trained_on) != list(classes)
    fits = {
        k
        for k, v in state.items()
        if k in own and own[k].shape == v.shape and not (other_classes and k.startswith(head))
    }
    loaded = {k: state[k] for k in fits}
    # RGB weights for a one-channel input (grayscale data): summed over the colours, as timm adapts them.
    adapted = [
        k
        for k, v in state.items()
        if k in own
        and k not in fits
        and v.dim() == 4
        and own[k].dim() == 4
        and v.shape[1] == 3
        and own[k].shape[1] == 1
        and v.shape[0] == own[k].shape[0]
        and v.shape[2:] == own[k].shape[2:]
    ]
    loaded.update({k: state[k].sum(1, keepdim=True) for k in adapted})
    replaced = [k for k in state if k in own and k not in fits and k not in adapted]
    untouched = [k for k in own if k not in loaded and k not in replaced]
    loaded_count = len(loaded) - len(adapted)
    if not loaded:
        raise PhalanxError(f"no tensor in {path} fits this model (is it the --model it was trained with?)", OPTION)
    model.load_state_dict(loaded, strict=False)
    shapes = ", ".join(f"{k} {_shape(state[k])} -> {_shape(own[k])}" for k in replaced[:3])
    for_classes = [k for k in replaced if other_classes and k.startswith(head)]  # a stem of another shape is not
    why = (
        "trained on other classes, trained anew"
        if for_classes == replaced
        else "another shape, trained anew"
        if not for_classes
        else "the head's for other classes, the rest of another shape, trained anew"
    )
    return (
        f"phalanx: weights {path}{note}: {loaded_count} tensors loaded, {len(replaced)} replaced"
        + (f" ({why}: {shapes})" if replaced else "")
        + (f", {len(adapted)} adapted to one input channel (RGB weights summed, as timm does)" if adapted else "")
        + f", {len(untouched)} left as built, {len(set(state) - set(own))} unused"
        + _other_inputs(stats, normalised)
    )


def learnt_normalisation(cfg: RunConfig) -> RunConfig:
    """A new run whose --weights are a phalanx checkpoint, with --normalize auto (or weights) and no
    --mean/--std: its inputs normalised as the checkpoint's were (its data info), recorded in the
    run's configuration as ``--normalize weights`` and the statistics, so a resume never reads the
    file again (``_other_inputs`` says it)."""
    data = cfg.data
    if not cfg.network.weights or data.normalize not in ("auto", "weights") or data.mean:
        return cfg
    path = Path(cfg.network.weights)
    if not path.is_file() or path.suffix == ".safetensors":
        return cfg
    try:  # mapped, not read: only the small entries load
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # not a torch zip file: load_weights says why
        return cfg
    info = state.get("data") if isinstance(state, dict) and state.get("format") == "phalanx-checkpoint" else None
    if not isinstance(info, dict) or not info.get("mean") or not info.get("std"):
        return cfg
    return cfg.replace(
        normalize="weights", mean=tuple(float(v) for v in info["mean"]), std=tuple(float(v) for v in info["std"])
    )


def weights_preview(task: LoadsWeights, models: Mapping[str, nn.Module], spec: str, data: object) -> list[str]:
    """--dry-run: the task's ``load_weights`` into its networks built on the meta device (no memory
    taken): what would load, be replaced or left is said, and weights that fit nothing are refused,
    as in the run. Copies into meta tensors do nothing, which torch warns of once a tensor."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*meta parameter in the current model")
        return [note.removeprefix("phalanx: ") for note in task.load_weights(models, spec, data)]


def _other_inputs(own: Stats | None, run: Stats | None) -> str:
    """Where a phalanx checkpoint learnt on inputs normalised otherwise than this run's (with --weights,
    --normalize auto is ImageNet's; a self-supervised run's default is [-1, 1]): what to give. A
    newcomer's linear probe of a SimCLR backbone trained on ImageNet-normalised inputs unawares."""
    if own is None or run is None:
        return ""
    mean, std = (",".join(f"{v:.4g}" for v in values) for values in own)
    if _close(own, run):  # (--normalize auto takes them from the checkpoint)
        return f"; inputs normalised as the checkpoint's were (mean {mean}, std {std})"
    run_mean, run_std = (",".join(f"{v:.4g}" for v in values) for values in run)
    return (
        f"\nphalanx: --weights: the checkpoint learnt on inputs normalised with mean {mean}, std {std}; this "
        f"run's are mean {run_mean}, std {run_std}: give --mean {mean} --std {std} to feed it what it learnt on"
    )


def _close(a: Stats, b: Stats) -> bool:
    """The same statistics, but for the float rounding of a JSON round trip."""
    return len(a[0]) == len(b[0]) and all(abs(x - y) < 1e-6 for x, y in zip([*a[0], *a[1]], [*b[0], *b[1]]))


def _shape(tensor: torch.Tensor) -> str:
    return "x".join(map(str, tensor.shape))


def head_module(model: nn.Module) -> tuple[str, nn.Linear]:
    """The classifier head: the model's last Linear layer."""
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise PhalanxError("the model has no Linear layer to keep as the head", "--freeze-backbone")
    return linears[-1]


class ProbeNorm(nn.BatchNorm1d):
    """``--probe-norm``: the frozen features standardised before the head, BatchNorm without affine
    as MAE's linear probe; the head's own (its statistics train, the backbone's stay frozen)."""

    def __init__(self, features: int):
        super().__init__(features, affine=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Features of any leading shape, (batch, ..., features); a training batch of one row (the
        # remainder of an epoch) is standardised with the running statistics, which it leaves as they are.
        rows = x.reshape(-1, x.shape[-1])
        if self.training and len(rows) < 2:
            out = nn.functional.batch_norm(rows, self.running_mean, self.running_var, training=False, eps=self.eps)
        else:
            out = super().forward(rows)
        return out.reshape(x.shape)


def _parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    return (model.get_submodule(name.rpartition(".")[0]) if "." in name else model), name.rpartition(".")[2]


def insert_probe_norm(model: nn.Module) -> None:
    """The head (the last Linear layer) becomes ``Sequential(ProbeNorm, head)``."""
    name, head = head_module(model)
    parent, attr = _parent(model, name)
    setattr(parent, attr, nn.Sequential(ProbeNorm(head.in_features), head))


def backbone_of(model: nn.Module) -> tuple[nn.Module, int]:
    """A classifier without its head (the last Linear layer, with a --probe-norm before it),
    replaced by the identity, and its feature size."""
    name, head = head_module(model)
    parent, _ = _parent(model, name)
    if isinstance(parent, nn.Sequential) and isinstance(parent[0], ProbeNorm):
        name = name.rpartition(".")[0]
    parent, attr = _parent(model, name)
    setattr(parent, attr, nn.Identity())
    return model, head.in_features


class Backbone:
    """``--freeze-backbone``: everything but the head stops learning, BatchNorm statistics included
    (a --probe-norm's are the head's and train)."""

    def __init__(self, model: nn.Module):
        head_name, head = head_module(model)
        self.head = {id(p) for p in head.parameters()}
        for param in model.parameters():
            if id(param) not in self.head:
                param.requires_grad_(False)
        self.norms = [
            m
            for name, m in model.named_modules()
            if isinstance(m, nn.modules.batchnorm._NormBase)
            and not isinstance(m, ProbeNorm)
            and not name.startswith(head_name)
        ]
        self.description = f"backbone frozen, training {head_name} only"

    def train_mode(self) -> None:
        """After ``model.train()``: frozen BatchNorm layers keep their running statistics."""
        for norm in self.norms:
            norm.eval()


def param_groups(model: nn.Module, head_lr_mult: float) -> list[dict[str, Any]]:
    """Trainable parameters, the head's with its own LR multiplier when it differs."""
    params = [p for p in model.parameters() if p.requires_grad]
    if head_lr_mult == 1.0:
        return [{"params": params, "lr_mult": 1.0}]
    head = {id(p) for p in head_module(model)[1].parameters()}
    groups = [
        {"params": [p for p in params if id(p) not in head], "lr_mult": 1.0},
        {"params": [p for p in params if id(p) in head], "lr_mult": head_lr_mult},
    ]
    return [g for g in groups if g["params"]]

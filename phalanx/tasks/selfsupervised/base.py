"""Self-supervised pretraining, Lightly's job: what every method shares (``SelfSupervisedTask``);
each method is a module of its own (``simclr.py``, ``byol.py``, ``moco.py``, ``dino.py``, ``swav.py``,
``simsiam.py``, and Barlow Twins and VICReg in ``decorrelation.py``).

A backbone (any ``--model``, its last Linear layer removed) learns from two augmented views of each
image, no labels needed. SimCLR's NT-Xent takes its negatives from the global batch: embeddings
are all-gathered with gradients (``ctx.all_gather``), so 2 workers x B train what one process x
2B does. BYOL predicts a momentum teacher's embedding of the other view; the teacher is a network
without gradients, checkpointed and resumed exactly. Each epoch, the backbone is monitored as Lightly
benchmarks it: kNN accuracy (k=200, temperature 0.1, cosine similarity) of the validation images
against the labelled training images' features, gathered from every rank.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from ...data import Mapped, SeededView, dataset_labels, transforms
from ...data.sampling import ShardSampler
from ...data.sources import load
from ...errors import PhalanxError
from ...models import build_model, required_channels
from ...models.weights import backbone_of
from ..base import (
    Batch,
    Declaration,
    Evaluation,
    RunContext,
    Task,
    TaskData,
    dataset_size,
    fixed_sample,
    full_precision,
    pane,
)
from .options import MultiCropOptions, ViewOptions
from .view_batch import ViewRecipe
from .views import Indexed, ValidationViews, ViewSample, ViewSet, multi_crop, two_views

SHOWN = 8  # training images drawn each epoch with their two views


def gather_views(ctx: RunContext, z1: torch.Tensor, z2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Every rank's rows of both views in one all-gather (one collective, not two), with
    gradients; and where this rank's rows begin."""
    both, start = ctx.all_gather(torch.cat([z1, z2], dim=1))
    return both[:, : z1.shape[1]], both[:, z1.shape[1] :], start


def mlp(inputs: int, hidden: int, outputs: int, norm: str, hidden_layers: int = 1) -> nn.Module:
    """A projection (or prediction) head: (Linear, BatchNorm or none, ReLU) x ``hidden_layers``,
    then Linear (SimCLR's and BYOL's heads have one hidden layer; Barlow Twins', VICReg's and
    SimSiam's projectors two)."""
    layers: list[nn.Module] = []
    for index in range(hidden_layers):
        layers += [nn.Linear(inputs if index == 0 else hidden, hidden, bias=norm == "none")]
        layers += [nn.BatchNorm1d(hidden)] if norm == "batch" else []
        layers += [nn.ReLU(inplace=True)]
    return nn.Sequential(*layers, nn.Linear(hidden, outputs))


def knn_predict(
    features: torch.Tensor,
    bank: torch.Tensor,
    bank_labels: torch.Tensor,
    classes: int,
    k: int,
    temperature: float,
    exclude: torch.Tensor | None = None,
) -> torch.Tensor:
    """Lightly's kNN classifier (its benchmarks' knn_predict): cosine similarity to the bank's
    normalised features, the k most similar vote with weight exp(similarity / temperature).
    ``exclude``: the bank position of each feature itself (leave-one-out), or None."""
    similarity = features @ bank.T
    if exclude is not None:
        similarity[torch.arange(len(features)), exclude] = -math.inf
    weights, neighbours = similarity.topk(min(k, bank.shape[0] - (exclude is not None)), dim=1)
    votes = torch.zeros(len(features), classes, dtype=weights.dtype, device=weights.device)
    votes.scatter_add_(1, bank_labels[neighbours], (weights / temperature).exp())
    return votes.argmax(1)


# An epoch's mean embedding std below this share of 1/sqrt(dim) warns of a collapse. Measured on the
# built-in digits (16 px, heads of 32): SimSiam 0.74 of it, and MoCo with --head-norm batch 0.64-0.76;
# SimSiam without its stop-gradient 0.35, 0.10, 0.09 in its first three epochs; MoCo with its default
# head (no normalisation) 0.05-0.07, its InfoNCE loss at log(queue + 1) (2026-11-27).
COLLAPSED_STD = 0.2


class SelfSupervisedTask(Task):
    options: ViewOptions
    loss_label: str  # each method's words for its loss (the panes' axes)
    primary_model = "backbone"
    Inference = ".inference:SelfSupervisedInference"  # (by name: the inference imports this module)
    best_metric = ("knn_acc", "max")
    metrics = ("knn_acc", "view_loss")
    metric_labels = {"knn_acc": "kNN accuracy", "view_loss": "loss on validation views"}
    knn_note = ""  # build_data's warning where --knn-k reaches the labelled images
    view_loss_meaning = "2 - 2 cos between the embeddings of an image's two views"  # evaluate says it (view_loss)
    said_collapse = False  # a collapse is said once a process (a resumed run says it again)

    # --- data and networks
    def build_data(self) -> TaskData:
        cfg = self.cfg
        channels = required_channels(cfg.network.model)
        source = load(cfg.data, cfg.seed, channels, unlabelled=True)
        size = cfg.data.image_size or source.native_size
        stats = transforms.normalisation(cfg.data, cfg.network.weights, source.channels)
        if stats is None:
            raise PhalanxError("self-supervised tasks take imagenet, none, auto or --mean/--std", "--normalize")
        mean, std = stats
        blur = self.options.blur if self.options.blur >= 0 else (0.5 if size > transforms.SMALL else 0.0)
        self.views = ViewRecipe(size, source.channels, (cfg.data.crop_scale, 1.0), cfg.data.hflip, blur, mean, std)
        prepare = transforms.Prepare(size, size, mean, std)
        labels = dataset_labels(source.train)
        val_labels = dataset_labels(source.val)
        self.classes = list(source.classes)
        self.bank_source = (
            "train"
            if labels is not None and min(labels, default=-1) >= 0
            else "val"
            if val_labels is not None and min(val_labels, default=-1) >= 0
            else None
        )
        crops = self.training_views(size, source.channels, blur, mean, std)
        train = SeededView(source.train, crops, cfg.seed, plain=Mapped(source.train, prepare))
        self.bank = Indexed(Mapped(source.train, prepare)) if self.bank_source == "train" else None
        self.views = crops.global_views  # validation's two views are global crops too
        val = ValidationViews(source.val, self.views, prepare, cfg.seed)
        monitor = {
            "train": "kNN on the labelled training images",
            "val": "leave-one-out kNN within val",
            None: "no labels: no kNN",
        }[self.bank_source]
        voters = {"train": dataset_size(source.train), "val": dataset_size(source.val) - 1, None: 0}[self.bank_source]
        self.knn_note = _every_image_votes(self.options.knn_k, voters)
        views = crops.description or f"two views per image (crop scale {cfg.data.crop_scale:g}, blur {blur:g})"
        description = f"{source.description}; {views}; {monitor}"
        info = {
            "channels": source.channels,
            "size": size,
            "crop_pct": 1.0,
            "mean": list(mean),
            "std": list(std),
            "classes": self.classes,
            "features": None,
        }
        return TaskData(train, val, description, info, collate=crops.collate, skipped=source.skipped)

    def training_views(
        self, size: int, channels: int, blur: float, mean: tuple[float, ...], std: tuple[float, ...]
    ) -> ViewSet:
        """What a training sample becomes: its two views, or with multi-crop options (DINO, SwAV)
        two global crops and local ones."""
        o = self.options
        if isinstance(o, MultiCropOptions):
            return multi_crop(
                o.global_scale,
                o.local_views,
                o.local_size,
                o.local_scale,
                size,
                channels,
                self.cfg.data.hflip,
                blur,
                mean,
                std,
            )
        return two_views(self.views)

    def notes(self) -> list[str]:
        return [self.knn_note] if self.knn_note else []

    def restore_info(self, info: dict[str, Any]) -> None:
        self.classes = list(info.get("classes") or [])

    def backbone(self, info: dict[str, Any]) -> tuple[nn.Module, int]:
        model = build_model(
            self.cfg.network.model, max(2, len(info.get("classes") or [])), info["channels"], self.cfg.network.drop_path
        )
        return backbone_of(model)

    def declare(self, data: TaskData, models: Mapping[str, nn.Module]) -> Declaration:
        """Without labels there is no kNN accuracy: the loss on validation views picks best.pt."""
        declared = super().declare(data, models)
        return declared if self.bank_source else replace(declared, best_metric=("view_loss", "min"))

    def load_weights(self, models: Mapping[str, nn.Module], spec: str, data: TaskData) -> list[str]:
        from ...models.weights import load_weights

        return [load_weights(models["backbone"], spec, self.classes)]

    def embed(self, models: Mapping[str, nn.Module], views: torch.Tensor) -> torch.Tensor:
        return models["projector"](models["backbone"](views))

    # --- validation: the view loss, and kNN accuracy of the backbone's features
    def view_loss(self, models: Mapping[str, nn.Module], v1: torch.Tensor, v2: torch.Tensor) -> torch.Tensor:
        """Per sample: 2 - 2 cos between the embeddings of its two views (alignment; exact at any
        world size, unlike a loss whose value depends on how a batch is cut)."""
        z1, z2 = self.embed(models, v1), self.embed(models, v2)
        return 2 - 2 * nn.functional.cosine_similarity(z1, z2, dim=1)

    @torch.no_grad()
    def evaluate(self, models: Mapping[str, nn.Module], loader: Iterable[Batch], ctx: RunContext) -> Evaluation:
        backbone = models["backbone"]
        sums = {
            "view_loss": torch.zeros((), dtype=torch.float64, device=ctx.device),
            "samples": torch.zeros((), dtype=torch.float64, device=ctx.device),
        }
        features, labels, indices = [], [], []
        for v1, v2, plain, label, index in loader:
            v1, v2, plain = ctx.to_device(v1), ctx.to_device(v2), ctx.to_device(plain)
            with ctx.autocast():
                sums["view_loss"] += full_precision(self.view_loss(models, v1, v2)).double().sum()
                features.append(nn.functional.normalize(full_precision(backbone(plain)).double(), dim=1))
            sums["samples"] += len(label)
            labels.append(label.to(ctx.device))
            indices.append(index.to(ctx.device))
        metrics = {}
        feature_size = self.feature_size(models)
        local = (
            torch.cat(features) if features else torch.zeros(0, feature_size, dtype=torch.float64, device=ctx.device)
        )
        local_labels = torch.cat(labels) if labels else torch.zeros(0, dtype=torch.int64, device=ctx.device)
        local_index = torch.cat(indices) if indices else torch.zeros(0, dtype=torch.int64, device=ctx.device)
        correct = torch.zeros((), dtype=torch.float64, device=ctx.device)
        if self.bank_source is not None:
            if self.bank_source == "train":
                bank, bank_labels = self.bank_features(backbone, ctx, feature_size)
                exclude = None
            else:  # label-free train/: the other validation images are the bank
                bank, bank_labels, bank_index = self.gathered(ctx, local, local_labels, local_index)
                exclude = local_index
            predicted = knn_predict(
                local,
                bank,
                bank_labels,
                max(len(self.classes), 1),
                self.options.knn_k,
                self.options.knn_temperature,
                exclude,
            )
            correct = (predicted == local_labels).sum().double()
        totals = ctx.all_reduce_sums({**sums, "correct": correct})
        count = max(float(totals["samples"]), 1.0)
        metrics["view_loss"] = float(totals["view_loss"]) / count
        if self.bank_source is not None:
            metrics["knn_acc"] = float(totals["correct"]) / count
        return Evaluation(metrics, {"samples": int(float(totals["samples"]))})

    def feature_size(self, models: Mapping[str, nn.Module]) -> int:
        projector = models["projector"]
        first = next(m for m in projector.modules() if isinstance(m, nn.Linear))
        return first.in_features

    def gathered(
        self, ctx: RunContext, features: torch.Tensor, labels: torch.Tensor, index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every rank's rows in the order of the samples' indices: the same bank at any world size."""
        all_features, _ = ctx.all_gather(features)
        all_labels, _ = ctx.all_gather(labels[:, None].double())
        all_index, _ = ctx.all_gather(index[:, None].double())
        order = all_index[:, 0].argsort()
        # The position of each sample of this rank in the bank (for leave-one-out): its index.
        return all_features[order], all_labels[order, 0].long(), all_index[order, 0].long()

    def bank_features(
        self, backbone: nn.Module, ctx: RunContext, feature_size: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        labelled = self.bank
        assert labelled is not None  # (bank_source "train": the labelled training images)
        loader = DataLoader(
            labelled,
            batch_size=self.cfg.optim.batch_size,
            num_workers=0,
            sampler=ShardSampler(len(labelled), ctx.rank, ctx.world_size),
        )
        features, labels, indices = [], [], []
        for image, label, index in loader:
            with ctx.autocast():
                features.append(nn.functional.normalize(full_precision(backbone(ctx.to_device(image))).double(), dim=1))
            labels.append(label.to(ctx.device))
            indices.append(index.to(ctx.device))
        local = (
            torch.cat(features) if features else torch.zeros(0, feature_size, dtype=torch.float64, device=ctx.device)
        )
        empty = torch.zeros(0, dtype=torch.int64, device=ctx.device)
        bank, bank_labels, _ = self.gathered(
            ctx, local, torch.cat(labels) if labels else empty, torch.cat(indices) if indices else empty
        )
        return bank, bank_labels

    def epoch_warnings(self, train: dict[str, float], epoch: int) -> list[str]:
        """A collapse, said once (the first epoch of this process that shows it)."""
        found = None if self.said_collapse else self.collapse(train)
        if found is None:
            return []
        self.said_collapse = True
        return [f"epoch {epoch}: {found}"]

    def collapse(self, train: dict[str, float]) -> str | None:
        """What an epoch's mean training losses say of a collapse, or None: here the embeddings' std
        (``embedding_std``, where a method logs it) far below a spread's 1/sqrt(dim)."""
        std, dim = train.get("embedding_std"), getattr(self.options, "projection_dim", 0)
        if std is None or not dim or std >= COLLAPSED_STD / math.sqrt(dim):
            return None
        return (
            f"the embeddings' std is {std:.4f}, against about {1 / math.sqrt(dim):.4f} (1/sqrt({dim})) for "
            "embeddings spread over the sphere: they have collapsed towards one direction"
            + (
                "; try --head-norm batch (it kept MoCo and SimCLR from collapsing on the built-in digits)"
                if getattr(self.options, "head_norm", "") == "none"
                else ""
            )
        )

    def summary(self, metrics: dict[str, float]) -> str:
        text = f"val_view_loss {metrics['view_loss']:.4f}"
        if "knn_acc" in metrics:
            text += f"  val_knn_acc {100 * metrics['knn_acc']:.2f}%"
        return text

    def format_metric(self, name: str, value: float) -> str:
        return f"{100 * value:.2f}%" if "acc" in name else f"{value:.4f}"

    # --- dashboard
    def panes(self, declared: Declaration) -> list[dict[str, Any]]:
        health = [
            pane(
                f"train_{name}",
                f"{declared.label(name)} (mean over ranks)",
                declared.label(name),
                "train",
                [(name, name)],
            )
            for name in declared.loss_names
            if name != "loss"
        ]
        return [
            pane("train_loss", f"{self.name} loss (mean over ranks)", self.loss_label, "train", [("loss", "loss")]),
            *health,
            pane(
                "val_knn_acc",
                f"kNN accuracy of the backbone (k={self.options.knn_k})",
                "accuracy (%)",
                "val",
                [("knn_acc", "kNN accuracy"), ("ema_knn_acc", "EMA kNN accuracy")],
                percent=True,
            ),
            pane("val_view_loss", "loss on validation views", self.loss_label, "val", [("view_loss", "view loss")]),
        ]

    def visuals(self, data: TaskData) -> ViewSample:
        collate = data.collate
        assert collate is not None  # (build_data's: the views')
        return ViewSample(
            data.train,
            collate,
            fixed_sample(dataset_size(data.train), SHOWN, self.cfg.seed),
            data.info["mean"],
            data.info["std"],
        )


def _every_image_votes(k: int, voters: int) -> str:
    """A warning where --knn-k reaches the labelled images: each then votes for every validation
    image, the kNN accuracy nears the majority class's share whatever the features (a newcomer's 60
    labelled images at the default k of 200 gave 10%, where k 5 gave 80%)."""
    if not voters or k < voters:
        return ""
    return (
        f"phalanx: warning: --knn-k {k} reaches the {voters} labelled images the kNN accuracy votes with: every "
        f"one votes, and the accuracy says little of the features; a k well under {voters} ({max(1, voters // 5)}, "
        "say) measures them: in a new run, or `phalanx evaluate --knn-k K` of a checkpoint (a run keeps its k)"
    )

"""The sections of the run configuration, each a frozen dataclass of ``fields.option`` fields.

A helper takes the section it reads (``cfg.data``, ``cfg.optim``, ...), not the whole run. Option
names are unique across sections, so the command line, ``--config``, ``--print-config`` and the
JSON in checkpoints stay flat (``config.RunConfig.flat``). Each section checks its own fields when
it is made (types, choices, bounds, finite numbers); rules across sections are in
the checks of ``phalanx.config``. Standard library only (``phalanx --help`` must not pay for torch).
"""

from __future__ import annotations

import os
from dataclasses import Field, dataclass
from typing import Any, ClassVar, Protocol

from ..errors import PhalanxError
from .fields import check_fields, option


def means_cpu(gpu_ids: tuple[int, ...] | list[int]) -> bool:
    """``--gpu-ids``: none, or -1, is the CPU (the one place that says so, for training, the dry
    runs and inference alike)."""
    return not gpu_ids or tuple(gpu_ids) == (-1,)


DATASETS = ("digits", "folder", "mnist", "fashionmnist", "cifar10", "synthetic")
AUGMENTS = ("auto", "none", "basic", "trivialaugment", "randaugment", "autoaugment")


@dataclass(frozen=True)
class DataOptions:
    """What the task reads and how its images are prepared. (``cfg.data``)"""

    heading: ClassVar[str] = "Data"
    dataroot: str | None = option(
        None,
        "Data directory: for classification an ImageFolder "
        "layout (DIR/train/<class>/*.png, optional DIR/val/) or torchvision's files for "
        "--dataset; the other tasks' layouts are in docs/tasks.md.",
        identity=False,
        metavar="DIR",
    )
    dataset: str | None = option(
        None,
        "Dataset kind. Default: 'folder' with --dataroot, else the built-in 8x8 digits (offline).",
        choices=DATASETS,
    )
    download: bool = option(
        False, "Let torchvision download --dataset into --dataroot (needs internet).", identity=False
    )
    synthetic_samples: int = option(
        4096,
        "With --dataset synthetic: random RGB images in memory (for benchmarks: the data pipeline costs nothing).",
        metavar="N",
        at_least=2,
    )
    val_fraction: float = option(0.2, "Hold-out fraction when the data has no validation split.", above=0, below=1)
    image_size: int = option(
        0,
        "Train and evaluate on N x N images (0: the dataset's own size; 32 for "
        "folders). Images are resized by their shorter side and cropped, never squashed.",
        metavar="N",
        at_least=0,
    )
    augment: str = option(
        "auto",
        "Training augmentation: basic = random crop (pad-and-crop up to 64 px, random "
        "resized crop above) + horizontal flip; the policies add torchvision's. auto: basic for "
        "folders and CIFAR-10, none for the rest.",
        choices=AUGMENTS,
    )
    hflip: bool = option(
        True, "Random horizontal flips in augmentation (--no-hflip where a flip changes the label: digits, text)."
    )
    crop_scale: float = option(
        0.08,
        "Smallest area fraction of a random resized crop (images above 64 px).",
        metavar="FRACTION",
        above=0,
        at_most=1,
    )
    val_crop_pct: float = option(
        0.0,
        "Evaluate on the centre crop of an image resized to N / PCT (timm's "
        "crop_pct, 0.5 to 1.25; above 1 pads the crop with zeros, as torchvision's "
        "CenterCrop does; 0: 1.0 up to 64 px, 0.875 above).",
        metavar="PCT",
    )
    normalize: str = option(
        "auto",
        "Input normalisation: imagenet statistics, the training split's own "
        "(computed once, saved with the run), none, weights (the --weights phalanx checkpoint's "
        "own, recorded with the run), or auto (weights with --weights of a phalanx checkpoint, "
        "imagenet with other --weights, else [-1, 1]). --mean/--std override.",
        choices=("auto", "imagenet", "dataset", "none", "weights"),
    )
    mean: tuple[float, ...] = option(
        (), "Per-channel mean to normalise with (0.485,0.456,0.406; one value: every channel's).", metavar="M[,M...]"
    )
    std: tuple[float, ...] = option(
        (), "Per-channel standard deviation to normalise with (one value: every channel's).", metavar="S[,S...]"
    )
    num_workers: str = option(
        "auto",
        "DataLoader worker processes per training process (auto: the cores per "
        "local process that training leaves free).",
        identity=False,
        metavar="N|auto",
    )
    skip_broken: bool = option(False, "Skip unreadable images (named and counted) instead of refusing to start.")
    fast_decode: bool = option(
        True,
        "Decode JPEGs at reduced scale when the target is much smaller (within "
        "docs/training.md's tolerance of a full decode); --no-fast-decode for the full "
        "decode.",
        identity=False,
    )

    def __post_init__(self) -> None:
        if isinstance(self.num_workers, int) and not isinstance(self.num_workers, bool):
            object.__setattr__(self, "num_workers", str(self.num_workers))
        if self.dataset is None:
            object.__setattr__(self, "dataset", "folder" if self.dataroot else "digits")
        if (
            isinstance(self.dataroot, str) and self.dataroot
        ):  # recorded absolute: evaluate and workers may run from another directory
            object.__setattr__(self, "dataroot", os.path.abspath(self.dataroot))
        check_fields(self)


@dataclass(frozen=True)
class ModelOptions:
    """The network and how it runs. (``cfg.network``)"""

    heading: ClassVar[str] = "Model"
    model: str = option(
        "smallcnn",
        "'smallcnn', a torchvision model of the task's kind (resnet18, "
        "fasterrcnn_mobilenet_v3_large_320_fpn, ...), timm/NAME (timm's zoo), or "
        "'package.module:function' returning an nn.Module. Each task has its default.",
        metavar="NAME",
    )
    weights: str | None = option(
        None,
        "Start from these weights: a state dict or phalanx checkpoint file, or a "
        "torchvision weights name (ResNet18_Weights.IMAGENET1K_V1) found in torch's hub "
        "cache. A classifier head of another size starts anew.",
        identity=False,
        metavar="PATH|NAME",
    )
    drop_path: float = option(
        0.0,
        "Stochastic depth: the rate at which residual blocks are dropped in training "
        "(timm's --drop-path: a timm/ model's drop_path_rate; torchvision's "
        "stochastic_depth_prob, for the models that have it). 0: off.",
        metavar="RATE",
        at_least=0,
        below=1,
    )
    channels_last: bool = option(False, "Channels-last memory format for the model and its inputs.", identity=False)
    compile: bool = option(False, "torch.compile the model (slow first steps; see docs/benchmarks.md).", identity=False)
    activation_checkpointing: bool = option(
        False,
        "Keep no activations inside each block of every network (the "
        "blocks --strategy fsdp shards): recompute them in backward. Less "
        "memory, more compute; the same training.",
        identity=False,
    )

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class OptimOptions:
    """The optimizer, its step and its precision. (``cfg.optim``)"""

    heading: ClassVar[str] = "Optimisation"
    # Not identity options (a resume may change them, as it may the world size: 2 workers resumed in
    # one process keep their effective batch with --grad-accum 2; a run continued at a lower LR, as
    # timm's and torchvision's resumes allow); taken from the run when not given.
    batch_size: int = option(
        32,
        "Batch size of this process (under DataParallel: the batch all its GPUs share).",
        launch_help="Batch size per worker: the effective batch is BATCH_SIZE x --grad-accum x world size.",
        above=0,
        identity=False,
    )
    lr: float = option(
        0.1,
        "Learning rate (before --scale-lr). The default is smallcnn's on the built-in digits; "
        "tasks and torchvision classifiers set their own, --optimizer adam|adamw torch's 0.001 where "
        "the task's is SGD's (--dry-run shows the one used). A resume "
        "may change it: the schedule continues from where it was at the new rate.",
        above=0,
        identity=False,
    )
    optimizer: str = option("sgd", "Optimizer (every optimizer of the task).", choices=("sgd", "adam", "adamw"))
    momentum: float = option(0.9, "SGD momentum.", at_least=0)
    nesterov: bool = option(False, "Nesterov momentum (SGD; torchvision's --nesterov, timm's --opt nesterov).")
    betas: tuple[float, ...] = option((0.9, 0.999), "Adam's and AdamW's betas.", metavar="B1,B2")
    weight_decay: float = option(5e-4, "Weight decay.", at_least=0)
    norm_bias_decay: bool = option(
        True,
        "Decay biases and normalisation weights too (torchvision's default); "
        "--no-norm-bias-decay exempts every 1-D parameter, as timm's train.py does.",
    )
    grad_accum: int = option(
        1, "Accumulate gradients over N batches per optimizer step.", metavar="N", above=0, identity=False
    )
    clip_grad: float = option(
        0.0,
        "Clip each optimizer's gradients before its step (after --grad-accum's "
        "last micro-batch and, under DDP, the all-reduce): their total L2 norm to MAX with "
        "--clip-mode norm, each element to [-MAX, MAX] with value; 0: off. A resume may "
        "add or change it (a run that diverges).",
        metavar="MAX",
        at_least=0,
        identity=False,
    )
    clip_mode: str = option(
        "norm",
        "What --clip-grad bounds (timm's --clip-mode, Lightning's gradient_clip_algorithm).",
        choices=("norm", "value"),
        identity=False,
    )
    ema_decay: float = option(
        0.0,
        "Keep an exponential moving average of the weights (timm's model EMA), evaluated beside the model; 0: off.",
        metavar="D",
        at_least=0,
        below=1,
    )
    precision: str = option(
        "fp32",
        "Numeric precision (bf16/fp16 use autocast; fp16 adds a GradScaler on CUDA; "
        "fp64 trains every network and input in float64: slow, for checking that a run is "
        "exact).",
        choices=("fp32", "bf16", "fp16", "fp64"),
    )

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class ScheduleOptions:
    """How long training runs and how the learning rate moves over it. (``cfg.schedule``)"""

    heading: ClassVar[str] = "Schedule"
    epochs: int = option(5, "Number of epochs to train for (in total, counting resumed ones).", identity=False, above=0)
    lr_schedule: str = option(
        "cosine",
        "Learning-rate schedule after warmup (linear: constant, then a linear "
        "decay to zero over the last --lr-decay-epochs, as pix2pix).",
        choices=("cosine", "step", "constant", "linear"),
    )
    lr_decay_epochs: float = option(
        0.0,
        "With --lr-schedule linear: the epochs of the decay to zero (0: the second half of --epochs).",
        metavar="N",
        at_least=0,
    )
    lr_step_epochs: int = option(
        30, "With --lr-schedule step: multiply the LR by 0.1 every N epochs.", metavar="N", above=0
    )
    min_lr: float = option(
        0.0,
        "The learning rate the cosine schedule ends at (timm's --min-lr, torchvision's "
        "--lr-min; 0: to zero). Head groups keep their multiple of it. A resume may change it.",
        metavar="LR",
        at_least=0,
        identity=False,
    )
    warmup_epochs: float = option(0.0, "Linear learning-rate warmup, in epochs.", at_least=0)
    max_steps: int = option(
        0,
        "Stop at optimizer step N (counting resumed steps; 0: train all --epochs), saving "
        "latest.pt mid-epoch as a preempted run does: --resume auto continues. The learning rate "
        "keeps the schedule of --epochs.",
        identity=False,
        metavar="N",
        at_least=0,
    )
    scale_lr: str = option(
        "none",
        "'linear': multiply --lr by the number of devices that share a step (linear scaling rule).",
        choices=("none", "linear"),
        launch_help="'linear': multiply --lr by the world size (linear scaling rule).",
    )

    def __post_init__(self) -> None:
        check_fields(self)

    def effective_lr(self, lr: float, num_devices: int) -> float:
        """``--scale-lr linear``: the LR grows with the devices that share a step (Goyal et al., 2017)."""
        return lr * num_devices if self.scale_lr == "linear" else lr


@dataclass(frozen=True)
class DeviceOptions:
    """Where the processes train and how they talk. (``cfg.devices``)"""

    heading: ClassVar[str] = "Devices and processes"
    gpu_ids: tuple[int, ...] = option(
        (),
        "GPU to train on; several for DataParallel (0,1 or --gpu-ids 0 --gpu-ids 1). -1 or none: CPU.",
        metavar="ID[,ID...]",
        launch_help="GPU of each local worker: local rank r trains on the r-th id "
        "(0,1 or --gpu-ids 0 --gpu-ids 1). -1 or none: CPU workers.",
        identity=False,
    )  # a run resumes on other devices, as at another world size
    backend: str | None = option(
        None,
        "torch.distributed backend for DDP workers (default: nccl on CUDA, gloo on CPU).",
        choices=("nccl", "gloo"),
        identity=False,
    )
    dist_timeout: float = option(
        1800.0,
        "Seconds a DDP collective may wait before the run fails: a hung "
        "or lost worker ends the run instead of blocking it forever.",
        identity=False,
        metavar="SECONDS",
        above=0,
    )
    sync_bn: bool = option(
        False,
        "BatchNorm with the statistics of every rank's rows (torch's SyncBatchNorm on GPUs, phalanx's on CPU workers).",
    )
    strategy: str = option(
        "ddp",
        "How DDP workers hold the networks: ddp, a whole copy on each; fsdp, each worker "
        "a shard of every network's weights, gradients and optimizer state (torch's FSDP2), for "
        "networks that do not fit one device. The same training either way; checkpoints "
        "resume under either.",
        choices=("ddp", "fsdp"),
        identity=False,
    )
    fsdp_checkpoints: str = option(
        "sharded",
        "How --strategy fsdp saves: sharded, each worker writes its own "
        "shard (torch.distributed.checkpoint, into <run dir>/shards, which every worker "
        "must reach); whole, rank 0 gathers every network into one file (which must fit "
        "its memory). Either resumes at any world size under either strategy.",
        choices=("sharded", "whole"),
        identity=False,
    )
    reshard_after_forward: bool = option(
        True,
        "Under --strategy fsdp, free a block's gathered weights after its "
        "forward and gather them again for backward (--no-reshard-after-forward: "
        "keep them, less communication, more memory).",
        identity=False,
    )

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def uses_cpu(self) -> bool:
        return means_cpu(self.gpu_ids)


@dataclass(frozen=True)
class OutputOptions:
    """What a run keeps and shows. (``cfg.output``)"""

    heading: ClassVar[str] = "Output"
    best_metric: str | None = option(
        None,
        "The validation metric that picks best.pt (default: the task's: accuracy for classification).",
        identity=False,
        metavar="NAME",
    )
    val_every: int = option(
        1,
        "Validate every N epochs (the last epoch always): best.pt is picked among the "
        "validated epochs; training is the same whatever N.",
        identity=False,
        metavar="N",
        above=0,
    )
    save_epoch_freq: int = option(
        0, "Also keep a checkpoint every N epochs (0: only latest/best).", identity=False, metavar="N", at_least=0
    )
    pickle_dir: str | None = option(
        None,
        "Where global rank 0 writes loss snapshots for `phalanx visualize` (default: <run dir>/pickle).",
        identity=False,
        metavar="DIR",
    )
    snapshot_every: float = option(
        5.0,
        "Write a loss snapshot at most every N seconds (and at each epoch end).",
        identity=False,
        metavar="SECONDS",
        at_least=0,
    )
    log_every: int = option(
        10, "Log the train loss (averaged over ranks) every N optimizer steps.", identity=False, metavar="N", above=0
    )
    progress: bool = option(
        True, "Show progress on stderr: a bar on a terminal, else a line every --log-interval seconds.", identity=False
    )
    log_interval: float = option(
        30.0,
        "Without a terminal: a progress line every N seconds of an epoch (0: none).",
        identity=False,
        metavar="SECONDS",
        at_least=0,
    )

    def __post_init__(self) -> None:
        check_fields(self)


def parse_s3_url(url: str, option: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` -> (bucket, prefix without surrounding slashes)."""
    if not url.startswith("s3://") or not url[5:].split("/", 1)[0]:
        raise PhalanxError(f"expected s3://bucket/prefix, got {url!r}", option)
    bucket, _, prefix = url[5:].partition("/")
    return bucket, prefix.strip("/")


@dataclass(frozen=True)
class RemoteOptions:
    """Where snapshots and checkpoints are copied. (``cfg.storage``)"""

    heading: ClassVar[str] = "Remote storage"
    remote: bool = option(
        False,
        "DeepLIIF's --remote True|False, accepted as its multi-GPU guide writes it: "
        "phalanx always does what --remote True asks (global rank 0 writes pickled snapshots "
        "for `phalanx visualize`; training starts no visdom). Add --remote-transfer or "
        "--remote-transfer-cmd to copy snapshots and checkpoints elsewhere.",
        identity=False,
        valued=True,
        metavar="True|False",
    )
    remote_transfer: str | None = option(
        None,
        "Also upload snapshots and checkpoints to S3 (boto3, the standard AWS credential chain), in the background.",
        identity=False,
        metavar="s3://BUCKET/PREFIX",
    )
    remote_transfer_cmd: str | None = option(
        None,
        "Call your function with the path of each written snapshot and checkpoint (imported by name).",
        identity=False,
        metavar="MODULE.FUNCTION",
    )
    s3_endpoint_url: str | None = option(
        None, "S3-compatible endpoint (default: AWS, or AWS_ENDPOINT_URL).", identity=False, metavar="URL"
    )

    def __post_init__(self) -> None:
        check_fields(self)


class Section(Protocol):
    """What every section is: a dataclass with a ``--help`` heading."""

    heading: ClassVar[str]
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]


#: The sections in their order in ``--help``, by their attribute of ``RunConfig``.
SECTIONS: dict[str, type[Section]] = {
    "data": DataOptions,
    "network": ModelOptions,
    "optim": OptimOptions,
    "schedule": ScheduleOptions,
    "devices": DeviceOptions,
    "output": OutputOptions,
    "storage": RemoteOptions,
}

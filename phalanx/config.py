"""The run configuration: every training option, declared once.

``RunConfig`` is the one object that travels from the command line to the trainer and, as JSON, to
every DDP worker. ``cli.py`` generates the click options of ``train`` and ``trainlaunch`` from its
fields, so both commands accept exactly the same training options. The task's own options
(``tasks/options.py``) travel inside it, as ``task_options``. Standard library only: this module is
imported by ``phalanx --help``, which must not pay for torch.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import tasks
from .errors import PhalanxError
from .config_checks import check_config
from .fields import option, suggest

DATASETS = ("digits", "folder", "mnist", "fashionmnist", "cifar10", "synthetic")
AUGMENTS = ("auto", "none", "basic", "trivialaugment", "randaugment", "autoaugment")
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class RunConfig:
    # --- the run and where it lives
    task: str = option(tasks.DEFAULT, f"What to train: {tasks.names_help()}, or your own task as "
                       "package.module:Class (see the README's \"Your own task\"). Recorded in checkpoints: "
                       "evaluate, predict, export and --resume need no --task.", metavar="NAME")
    task_options: dict = option({}, "The task's own options (flags under the task's heading, --task-option for "
                                "your own task, or a task: section of --config).", cli=False)
    name: str = option("experiment", "Run name; files go to <checkpoints-dir>/<name>/.", identity=False)
    checkpoints_dir: str = option("./checkpoints", "Directory that holds run directories.",
                                  identity=False, metavar="DIR")
    resume: str | None = option(None, "Continue a run: a checkpoint path, or 'auto' for the latest "
                                "checkpoint in the run directory.", identity=False, metavar="PATH|auto")
    overwrite: bool = option(False, "Replace a previous run in the run directory.", identity=False)
    # --- data
    dataroot: str | None = option(None, "Data directory: for classification an ImageFolder "
                                  "layout (DIR/train/<class>/*.png, optional DIR/val/) or torchvision's files for "
                                  "--dataset; the other tasks' layouts are in the README.",
                                  identity=False, metavar="DIR")
    dataset: str | None = option(None, "Dataset kind. Default: 'folder' with --dataroot, else the "
                                 "built-in 8x8 digits (offline).", choices=DATASETS)
    download: bool = option(False, "Let torchvision download --dataset into --dataroot (needs internet).",
                            identity=False)
    synthetic_samples: int = option(4096, "With --dataset synthetic: random RGB images in memory (for "
                                    "benchmarks: the data pipeline costs nothing).", metavar="N", at_least=2)
    val_fraction: float = option(0.2, "Hold-out fraction when the data has no validation split.", above=0, below=1)
    image_size: int = option(0, "Train and evaluate on N x N images (0: the dataset's own size; 32 for "
                             "folders). Images are resized by their shorter side and cropped, never squashed.",
                             metavar="N", at_least=0)
    augment: str = option("auto", "Training augmentation: basic = random crop (pad-and-crop up to 64 px, random "
                          "resized crop above) + horizontal flip; the policies add torchvision's. auto: basic for "
                          "folders and CIFAR-10, none for the rest.", choices=AUGMENTS)
    hflip: bool = option(True, "Random horizontal flips in augmentation (--no-hflip where a flip changes the "
                         "label: digits, text).")
    crop_scale: float = option(0.08, "Smallest area fraction of a random resized crop (images above 64 px).",
                               metavar="FRACTION", above=0, at_most=1)
    val_crop_pct: float = option(0.0, "Evaluate on the centre crop of an image resized to N / PCT (timm's "
                                 "crop_pct, 0.5 to 1.25; above 1 pads the crop with zeros, as torchvision's "
                                 "CenterCrop does; 0: 1.0 up to 64 px, 0.875 above).", metavar="PCT")
    normalize: str = option("auto", "Input normalisation: imagenet statistics, the training split's own "
                            "(computed once, saved with the run), none, or auto (imagenet with --weights, else "
                            "[-1, 1]). --mean/--std override.", choices=("auto", "imagenet", "dataset", "none"))
    mean: tuple[float, ...] = option((), "Per-channel mean to normalise with (0.485,0.456,0.406).",
                                     metavar="M[,M...]")
    std: tuple[float, ...] = option((), "Per-channel standard deviation to normalise with.", metavar="S[,S...]")
    num_workers: str = option("auto", "DataLoader worker processes per training process (auto: the cores per "
                              "local process that training leaves free).", identity=False, metavar="N|auto")
    skip_broken: bool = option(False, "Skip unreadable images (named and counted) instead of refusing to start.")
    fast_decode: bool = option(True, "Decode JPEGs at reduced scale when the target is much smaller (within "
                               "the README's tolerance of a full decode); --no-fast-decode for the full "
                               "decode.", identity=False)
    # --- model
    model: str = option("smallcnn", "'smallcnn', a torchvision model of the task's kind (resnet18, "
                        "fasterrcnn_mobilenet_v3_large_320_fpn, ...), timm/NAME (timm's zoo), or "
                        "'package.module:function' returning an nn.Module. Each task has its default.",
                        metavar="NAME")
    weights: str | None = option(None, "Start from these weights: a state dict or phalanx checkpoint file, or a "
                                 "torchvision weights name (ResNet18_Weights.IMAGENET1K_V1) found in torch's hub "
                                 "cache. A classifier head of another size starts anew.", identity=False,
                                 metavar="PATH|NAME")
    channels_last: bool = option(False, "Channels-last memory format for the model and its inputs.",
                                 identity=False)
    compile: bool = option(False, "torch.compile the model (slow first steps; see the README's measurements).",
                           identity=False)
    # --- optimisation
    epochs: int = option(5, "Number of epochs to train for (in total, counting resumed ones).",
                         identity=False, above=0)
    batch_size: int = option(32, "Batch size of this process (under DataParallel: the batch all its GPUs "
                             "share).", launch_help="Batch size per worker: the effective batch is BATCH_SIZE x "
                             "--grad-accum x world size.", above=0)
    lr: float = option(0.1, "Learning rate (before --scale-lr).", above=0)
    optimizer: str = option("sgd", "Optimizer (every optimizer of the task).", choices=("sgd", "adam", "adamw"))
    momentum: float = option(0.9, "SGD momentum.", at_least=0)
    betas: tuple[float, ...] = option((0.9, 0.999), "Adam's and AdamW's betas.", metavar="B1,B2")
    weight_decay: float = option(5e-4, "Weight decay.", at_least=0)
    lr_schedule: str = option("cosine", "Learning-rate schedule after warmup (linear: constant, then a linear "
                              "decay to zero over the last --lr-decay-epochs, as pix2pix).",
                              choices=("cosine", "step", "constant", "linear"))
    lr_decay_epochs: float = option(0.0, "With --lr-schedule linear: the epochs of the decay to zero (0: the second "
                                    "half of --epochs).", metavar="N", at_least=0)
    lr_step_epochs: int = option(30, "With --lr-schedule step: multiply the LR by 0.1 every N epochs.",
                                 metavar="N", above=0)
    warmup_epochs: float = option(0.0, "Linear learning-rate warmup, in epochs.", at_least=0)
    scale_lr: str = option("none", "'linear': multiply --lr by the number of devices that share a step "
                           "(linear scaling rule).", choices=("none", "linear"),
                           launch_help="'linear': multiply --lr by the world size (linear scaling rule).")
    grad_accum: int = option(1, "Accumulate gradients over N batches per optimizer step.", metavar="N", above=0)
    ema_decay: float = option(0.0, "Keep an exponential moving average of the weights (timm's model EMA), "
                              "evaluated beside the model; 0: off.", metavar="D", at_least=0, below=1)
    best_metric: str | None = option(None, "The validation metric that picks best.pt (default: the task's: "
                                     "accuracy for classification).", identity=False, metavar="NAME")
    precision: str = option("fp32", "Numeric precision (bf16/fp16 use autocast; fp16 adds a GradScaler on CUDA; "
                            "fp64 trains every network and input in float64: slow, for checking that a run is "
                            "exact).", choices=("fp32", "bf16", "fp16", "fp64"))
    seed: int = option(0, "Random seed (runs are deterministic on CPU).")
    # --- devices
    gpu_ids: tuple[int, ...] = option((), "GPU to train on; several for DataParallel (0,1 or --gpu-ids 0 "
                                      "--gpu-ids 1). -1 or none: CPU.", metavar="ID[,ID...]",
                                      launch_help="GPU of each local worker: local rank r trains on the r-th id "
                                      "(0,1 or --gpu-ids 0 --gpu-ids 1). -1 or none: CPU workers.",
                                      identity=False)  # a run resumes on other devices, as at another world size
    backend: str | None = option(None, "torch.distributed backend for DDP workers (default: nccl "
                                 "on CUDA, gloo on CPU).", choices=("nccl", "gloo"), identity=False)
    dist_timeout: float = option(1800.0, "Seconds a DDP collective may wait before the run fails: a hung "
                                 "or lost worker ends the run instead of blocking it forever.",
                                 identity=False, metavar="SECONDS", above=0)
    sync_bn: bool = option(False, "Convert BatchNorm layers to SyncBatchNorm under DDP (GPUs only).")
    # --- output
    save_epoch_freq: int = option(0, "Also keep a checkpoint every N epochs (0: only latest/best).",
                                  identity=False, metavar="N", at_least=0)
    pickle_dir: str | None = option(None, "Where global rank 0 writes loss snapshots for `phalanx "
                                    "visualize` (default: <run dir>/pickle).", identity=False, metavar="DIR")
    snapshot_every: float = option(5.0, "Write a loss snapshot at most every N seconds (and at each "
                                   "epoch end).", identity=False, metavar="SECONDS", at_least=0)
    log_every: int = option(10, "Log the train loss (averaged over ranks) every N optimizer steps.",
                            identity=False, metavar="N", above=0)
    progress: bool = option(True, "Show progress on stderr: a bar on a terminal, else a line every "
                            "--log-interval seconds.", identity=False)
    log_interval: float = option(30.0, "Without a terminal: a progress line every N seconds of an epoch (0: none).",
                                 identity=False, metavar="SECONDS", at_least=0)
    # --- remote storage
    remote: bool = option(False, "DeepLIIF's --remote True|False, accepted as its multi-GPU guide writes it: "
                          "phalanx always does what --remote True asks (global rank 0 writes pickled snapshots "
                          "for `phalanx visualize`; training starts no visdom). Add --remote-transfer or "
                          "--remote-transfer-cmd to copy snapshots and checkpoints elsewhere.", identity=False,
                          valued=True, metavar="True|False")
    remote_transfer: str | None = option(None, "Also upload snapshots and checkpoints to S3 (boto3, the "
                                         "standard AWS credential chain), in the background.",
                                         identity=False, metavar="s3://BUCKET/PREFIX")
    remote_transfer_cmd: str | None = option(None, "Call your function with the path of each written "
                                             "snapshot and checkpoint (imported by name).",
                                             identity=False, metavar="MODULE.FUNCTION")
    s3_endpoint_url: str | None = option(None, "S3-compatible endpoint (default: AWS, or "
                                         "AWS_ENDPOINT_URL).", identity=False, metavar="URL")

    def __post_init__(self) -> None:
        if not isinstance(self.task_options, dict):
            raise PhalanxError(f"expected a mapping of option: value, got {self.task_options!r}", "--task-option")
        if isinstance(self.num_workers, int) and not isinstance(self.num_workers, bool):
            object.__setattr__(self, "num_workers", str(self.num_workers))
        if self.dataset is None:
            object.__setattr__(self, "dataset", "folder" if self.dataroot else "digits")
        if isinstance(self.dataroot, str) and self.dataroot:  # recorded absolute: evaluate and workers may run from another directory
            object.__setattr__(self, "dataroot", os.path.abspath(self.dataroot))
        check_config(self)

    # --- derived values
    @property
    def run_dir(self) -> Path:
        return Path(self.checkpoints_dir) / self.name

    @property
    def snapshot_dir(self) -> Path:
        return Path(self.pickle_dir) if self.pickle_dir else self.run_dir / "pickle"

    @property
    def uses_cpu(self) -> bool:
        return not self.gpu_ids or self.gpu_ids == (-1,)

    # --- plain-data round trip (saved beside the run, handed to workers)
    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for name, f in FIELDS.items():
            if f.type.startswith("tuple["):
                data[name] = list(data[name])
        return data

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps({"schema": SCHEMA_VERSION, "config": self.to_dict()}, indent=indent, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "RunConfig":
        return from_mapping(json.loads(text)["config"], source="config JSON")

    def identity(self) -> dict[str, Any]:
        """The options that decide what the run computes; compared on resume."""
        return {k: v for k, v in self.to_dict().items() if FIELDS[k].metadata["identity"]}

    def replace(self, **changes: Any) -> "RunConfig":
        return dataclasses.replace(self, **changes)


FIELDS = {f.name: f for f in dataclasses.fields(RunConfig)}

#: Headings of the --help pages: the first field of each group (fields are declared in groups).
SECTIONS = {"task": "Run", "dataroot": "Data", "model": "Model", "epochs": "Optimisation",
            "gpu_ids": "Devices and processes", "save_epoch_freq": "Output", "remote": "Remote storage"}


def section_of(name: str) -> str:
    heading = "Run"
    for field_name in FIELDS:
        heading = SECTIONS.get(field_name, heading)
        if field_name == name:
            return heading
    raise KeyError(name)


def split_keys(values: dict[str, Any], source: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Keys spelled ``batch-size`` or ``batch_size`` -> (general options, task options). A task's
    options may be given flat (as their flags are), under ``task_options``, or in a ``task:``
    mapping with the task's ``name``. Unknown keys name ``source``."""
    general: dict[str, Any] = {}
    task_values: dict[str, Any] = {}
    owners = tasks.option_owners()
    for key, value in values.items():
        name = str(key).replace("-", "_")
        if name == "task" and isinstance(value, dict):  # task: {name: translate, ngf: 32}
            section = {str(k).replace("-", "_"): v for k, v in value.items()}
            if "name" in section:
                general["task"] = section.pop("name")
            task_values.update(section)
        elif name == "task_options":
            if not isinstance(value, dict):
                raise PhalanxError("task_options must be a mapping of option: value", source)
            task_values.update({str(k).replace("-", "_"): v for k, v in value.items()})
        elif name in FIELDS:
            general[name] = value
        elif name in owners:
            task_values[name] = value
        else:
            raise PhalanxError(f"unknown option '{key}'{suggest(name, list(FIELDS) + list(owners))}", source)
    return general, task_values


def from_mapping(values: dict[str, Any], source: str) -> RunConfig:
    """Build a config from plain data, naming ``source`` in errors about unknown keys. Options not
    given take the task's defaults (``tasks.defaults_of``), then ``RunConfig``'s."""
    general, task_values = split_keys(values, source)
    task = general.get("task", tasks.DEFAULT)
    if not isinstance(task, str):
        raise PhalanxError(f"expected a task name, got {task!r}", "--task")
    tasks.check_name(task)
    defaults = {k: v for k, v in tasks.defaults_of(task, general).items() if k not in general}
    return RunConfig(**{**defaults, **general, "task_options": task_values})

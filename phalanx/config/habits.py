"""The flags users bring from timm's ``train.py``, torchvision's reference scripts and Lightning,
and what phalanx calls the same thing: an unknown option that one of them knows is answered with
phalanx's name for it, where click's spelling suggestion would guess from the letters alone
(``--amp``: "Did you mean '--name'?")."""

from __future__ import annotations

# Each tool's flag -> phalanx's way to say it. Only flags whose meaning phalanx has.
ELSEWHERE = {
    "--amp": "--precision bf16 (or fp16: autocast, with a GradScaler on CUDA)",
    "--amp-dtype": "--precision bf16 or --precision fp16",
    "--pretrained": "--weights NAME_OR_PATH (a torchvision weights name such as ResNet18_Weights.IMAGENET1K_V1, "
    "a state dict or a checkpoint)",
    "--initial-checkpoint": "--weights PATH",
    "--opt": "--optimizer sgd|adam|adamw",
    "--wd": "--weight-decay",
    "--sched": "--lr-schedule cosine|step|constant|linear",
    "--lr-scheduler": "--lr-schedule cosine|step|constant|linear",
    "--lr-step-size": "--lr-step-epochs",
    "--lr-warmup-epochs": "--warmup-epochs",
    "--lr-min": "--min-lr",
    "--aa": "--augment randaugment|autoaugment|trivialaugment",
    "--auto-augment": "--augment randaugment|autoaugment|trivialaugment",
    "--reprob": "--random-erasing P",
    "--random-erase": "--random-erasing P",
    "--model-ema": "--ema-decay D (e.g. 0.9998)",
    "--clip-grad-norm": "--clip-grad MAX",
    "--gradient-clip-val": "--clip-grad MAX",
    "--gradient-clip-algorithm": "--clip-mode norm|value",
    "--accumulate-grad-batches": "--grad-accum N",
    "--max-epochs": "--epochs",
    "--devices": "--gpu-ids (once per GPU: --gpu-ids 0 --gpu-ids 1; -1 for the CPU)",
    "--device": "--gpu-ids (an index per GPU; -1 for the CPU)",
    "--gpus": "--gpu-ids (once per GPU: --gpu-ids 0 --gpu-ids 1)",
    "-b": "--batch-size",
    "-j": "--num-workers",
    "--test-only": "phalanx evaluate --checkpoint PATH",
    "--data-dir": "--dataroot",
    "--data-path": "--dataroot",
    "--output-dir": "--checkpoints-dir (and --name for the run's folder)",
    "--print-freq": "--log-every",
    # DINO's and Lightly's names for the self-supervised options (a task's own: answered for that task)
    "--momentum-teacher": "--teacher-momentum",
    "--use-bn-in-head": "--head-norm batch",
    "--out-dim": "--output-dim",
    "--local-crops-number": "--local-views",
    "--memory-bank-size": "--queue-size",
    "--lambda-param": "--redundancy-weight",
    "--sim-coeff": "--invariance-weight",
    "--std-coeff": "--variance-weight",
    "--cov-coeff": "--covariance-weight",
    "--train-crop-size": "--image-size",
    "--torchcompile": "--compile",
    "--smoothing": "--label-smoothing",
    "--img-size": "--image-size",
    "--input-size": "--image-size",
    "--mixup": "--mixup-alpha",
    "--cutmix": "--cutmix-alpha",
    "--model-ema-decay": "--ema-decay",
    "--workers": "--num-workers",
}

# Lightning's and timm's precision names -> phalanx's.
PRECISIONS = {
    "amp": "bf16 or fp16",
    "bf16-mixed": "bf16",
    "16-mixed": "fp16",
    "16": "fp16",
    "bf16-true": "bf16",
    "32": "fp32",
    "32-true": "fp32",
    "64": "fp64",
    "64-true": "fp64",
    "float16": "fp16",
    "bfloat16": "bf16",
    "float32": "fp32",
    "float64": "fp64",
}


def option_hint(option: str, known: list[str], command: str, args: list[str]) -> str | None:
    """What phalanx calls an unknown ``option`` of ``phalanx command`` (as typed, perhaps with
    underscores), or None: only where that command has it, for the run's task (``--task`` in
    ``args``; a task's own option is no answer for another task)."""
    spelt = option.replace("_", "-")  # Lightning's flags (phalanx's own take either spelling)
    instead = ELSEWHERE.get(spelt, "")
    target = instead.split()[0] if instead else ""
    if not instead or spelt in known:
        return None
    if target.startswith("--"):
        from . import registry

        owners = registry.option_owners().get(target[2:].replace("-", "_"))
        task = next((b for a, b in zip(args, args[1:]) if a == "--task"), registry.DEFAULT)
        if target not in known or owners is not None and task not in owners:
            return None
    elif instead.startswith(f"phalanx {command} "):
        return None
    return f"No such option '{option}': phalanx's is {instead}"


# How many processes and nodes: torchrun's and Lightning's words, said where phalanx takes them.
LAUNCH_FLAGS = ("--nodes", "--nnodes", "--num-nodes", "--nproc-per-node", "--num-processes")
LAUNCH_HINTS = {
    "scale": "phalanx scale's world sizes are --workers N[,N...] (DDP workers on this machine, or srun steps in a "
    "SLURM allocation)",
    "trainlaunch": "it is torchrun's: give it inside --use-torchrun, as --use-torchrun \"--nnodes 2 --nproc-per-node 4 "
    '..."',
}


def launch_hint(option: str, command: str) -> str | None:
    """An unknown process or node count (torchrun's ``--nnodes``, Lightning's ``--num-nodes``): where
    ``phalanx command`` takes it, or which command does."""
    if option.replace("_", "-") not in LAUNCH_FLAGS:
        return None
    where = LAUNCH_HINTS.get(
        command, 'several processes or nodes are phalanx trainlaunch\'s: --use-torchrun "--nnodes N --nproc-per-node M"'
    )
    return f"No such option '{option}': {where}"


def task_of(args: list[str]) -> str:
    """The run's task as typed (``--task NAME`` or ``--task=NAME``), else the default."""
    from . import registry

    for before, arg in zip(["", *args], args):
        if arg.startswith("--task="):
            return arg.split("=", 1)[1]
        if before == "--task":
            return arg
    return registry.DEFAULT


def for_the_task(possibilities: list[str], args: list[str]) -> list[str]:
    """click's spelling suggestions less the options of other tasks than the run's (``--gan-mode``
    is no answer to a classifier's, or ``phalanx scale``'s, typo)."""
    from . import registry

    owners, task = registry.option_owners(), task_of(args)
    return [p for p in possibilities if task in owners.get(p.lstrip("-").replace("-", "_"), [task])]


def key_hint(name: str) -> str:
    """A configuration file's key of another tool (timm's ``opt``, ``img_size``): phalanx's key for it."""
    instead = ELSEWHERE.get("--" + name.replace("_", "-"), "")
    flag, _, rest = instead.partition(" ")
    if not flag.startswith("--"):
        return ""
    return f" (phalanx's is {flag[2:].replace('-', '_')}" + (f": {rest}" if rest else "") + ")"


def precision_hint(args: list[str]) -> str | None:
    """A refused ``--precision`` value that Lightning or timm would take, with phalanx's name for it."""
    for before, arg in zip(["", *args], args):
        value = arg.split("=", 1)[1] if arg.startswith("--precision=") else arg if before == "--precision" else None
        if value is not None and value.lower() in PRECISIONS:
            return f"--precision: '{value}' is phalanx's {PRECISIONS[value.lower()]} (one of fp32, bf16, fp16, fp64)"
    return None


def checkpoint_hint(error: Exception, args: list[str]) -> str | None:
    """A missing ``--checkpoint`` where a ``.pt`` file was typed without it (``phalanx evaluate
    best.pt``, as other tools take it): the option to write."""
    param = getattr(error, "param", None)
    if type(error).__name__ != "MissingParameter" or param is None or param.name != "checkpoint":
        return None
    ctx = getattr(error, "ctx", None)  # the options that take a value: a .pt after one is its value
    valued = {
        spelling
        for option in (ctx.command.params if ctx else [])
        if not getattr(option, "is_flag", True)
        for spelling in option.opts
    }
    typed = [
        arg
        for before, arg in zip(["", *args], args)
        if arg.endswith((".pt", ".pth")) and not arg.startswith("-") and before not in valued
    ]
    if not typed:
        return None
    return f"--checkpoint: the checkpoint is given as an option: --checkpoint {typed[0]}"

"""Deliberate bugs, and the test that must catch each one (run by hand, not in CI).

    .venv/bin/python scripts/mutants.py                 # every mutant, about 25 minutes on 2 cores
    .venv/bin/python scripts/mutants.py --only rank     # those whose name contains "rank"
    .venv/bin/python scripts/mutants.py --list
    .venv/bin/python scripts/mutants.py --check         # every mutant found where it says, no test run
    .venv/bin/python scripts/mutants.py --ref HEAD      # a commit, not the working tree (keep editing)

Each mutant changes one place of phalanx/ in a throwaway copy of the repository and runs the named
tests there (every process they start imports the copy). A mutant that passes its tests survived:
the suite cannot see that bug. docs/development.md (Mutants) gives the current score; the
target is that none survives.

A mutant names the code it changes by what it is, not by where it lives, so that moving a module
(``trainer.py`` into ``train/``, ``checkpoint.py`` into ``checkpoint/__init__.py``) leaves this
file alone. Its ``target`` is a qualified name as Python spells ``__qualname__``, without the module
and without ``<locals>``:

    "plan_epoch"                    a function
    "Trainer._train_epoch"          a method (nested classes and functions too: "Outer.Inner.method")
    "MicroBatch.loss_scale"         a property, or a class attribute ("SimCLRTask.loss_names")
    "MAX_FILE_BYTES"                a module-level assignment (a constant, a table): its statement

Every phalanx/**/*.py is parsed; the target must name exactly one definition in the whole package.
Where a name is defined in two modules, add ``@`` and the words of the module it lives in, as a run
of its dotted name: ``"main@predict"`` is ``main`` of ``phalanx.inference.predict`` (and still is
after a move to ``phalanx/inference/predict/__init__.py``); use it only where the name alone is
ambiguous. The definition's text, from its first decorator to its last line, whole lines, must hold
``before`` exactly once (it may span lines); that occurrence becomes ``after``. Run ``--check``
after a refactor: it says which targets are gone, ambiguous, or no longer hold their text.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "phalanx"
EQUIV = "tests/test_equivalence.py"
RELIABILITY = "tests/test_reliability.py"
LAUNCH = "tests/test_trainlaunch.py"
TASKS = "tests/test_tasks.py"


@dataclass(frozen=True)
class Mutant:
    name: str
    target: str  # a qualified name in phalanx/: "Class.method", "function", "CONSTANT"; "name@module" if ambiguous
    before: str  # an exact fragment of the target's text, found there once (it may span lines)
    after: str
    tests: tuple[str, ...]  # pytest node ids or -k expressions ("file::name", "file -k words")


@dataclass(frozen=True)
class Definition:
    qualname: str
    module: str  # dotted: phalanx.tasks.selfsupervised.simclr
    path: Path  # of its file, relative to the repository
    line: int  # its first line (a decorator's, if it has one)
    start: int  # its text is the file's [start:end], whole lines
    end: int


class Unresolved(Exception):
    """A mutant's target is gone, ambiguous, or does not hold its text once."""


def _module_name(path: Path) -> str:
    parts = path.with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _definitions_in(path: Path, text: str, found: dict[str, list[Definition]]) -> None:
    offsets = [0]
    for line in text.splitlines(keepends=True):
        offsets.append(offsets[-1] + len(line))
    module = _module_name(path)

    def add(name: str, node: ast.stmt) -> None:
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", ())])
        found[name].append(Definition(name, module, path, first, offsets[first - 1], offsets[node.end_lineno]))

    def names(target: ast.expr) -> list[str]:
        if isinstance(target, ast.Name):
            return [target.id]
        if isinstance(target, (ast.Tuple, ast.List)):
            return [name for element in target.elts for name in names(element)]
        return []  # an attribute or a subscript defines no name

    def visit(body: list, prefix: str, in_function: bool) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                add(prefix + node.name, node)
                visit(node.body, f"{prefix}{node.name}.", isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                if not in_function:  # a function's locals are no targets; its statements are its own
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for name in {name for target in targets for name in names(target)}:
                        add(prefix + name, node)
            else:  # if, try, with, for, match: their bodies define in the same scope
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, ast.stmt):
                        visit([child], prefix, in_function)
                    elif isinstance(child, (ast.excepthandler, ast.match_case)):
                        visit(child.body, prefix, in_function)

    visit(ast.parse(text, str(path)).body, "", False)


def definitions(root: Path) -> tuple[dict[str, list[Definition]], dict[Path, str]]:
    """Every definition of phalanx/ under ``root`` by qualified name, and the text of every file."""
    found: dict[str, list[Definition]] = defaultdict(list)
    texts = {}
    for file in sorted((root / PACKAGE).rglob("*.py")):
        path = file.relative_to(root)
        texts[path] = file.read_text()
        _definitions_in(path, texts[path], found)
    return found, texts


def _holders(before: str, found: dict[str, list[Definition]], texts: dict[Path, str]) -> str:
    """Where ``before`` is now: the innermost definitions that hold it (for the messages)."""
    places = []
    for path, text in texts.items():
        at = text.find(before)
        while at >= 0:
            around = [
                d
                for defs in found.values()
                for d in defs
                if d.path == path and d.start <= at and at + len(before) <= d.end
            ]
            inner = min(around, key=lambda d: d.end - d.start, default=None)
            places.append(f"{inner.qualname} ({path}:{inner.line})" if inner else f"{path} outside any definition")
            at = text.find(before, at + 1)
    if not places:
        return ""
    return f"; its text is in {', '.join(places)}" if len(places) <= 3 else f"; its text is in {len(places)} places"


def resolve(mutant: Mutant, found: dict[str, list[Definition]], texts: dict[Path, str]) -> tuple[Path, str]:
    """The file ``mutant`` changes and its text once changed; Unresolved says why not."""
    qualname, _, hint = mutant.target.partition("@")
    named = candidates = found.get(qualname, [])
    if hint:
        words = hint.split(".")
        candidates = [
            d
            for d in named
            if any(d.module.split(".")[i : i + len(words)] == words for i in range(len(d.module.split("."))))
        ]
    where = ", ".join(f"{d.path}:{d.line}" for d in candidates)
    if not candidates:
        others = f" (those named {qualname!r}: {', '.join(f'{d.path}:{d.line}' for d in named)})" if named else ""
        raise Unresolved(
            f"no definition {mutant.target!r} in {PACKAGE}/{others}" + _holders(mutant.before, found, texts)
        )
    if len(candidates) > 1:
        raise Unresolved(
            f"{mutant.target!r} names {len(candidates)} definitions ({where}); "
            "add @ and the module's name to choose one"
        )
    (definition,) = candidates
    text = texts[definition.path]
    span = text[definition.start : definition.end]
    count = span.count(mutant.before)
    if count == 1:
        changed = span.replace(mutant.before, mutant.after)
    else:
        laid_out = list(_layout_free(mutant.before).finditer(span)) if count == 0 else []
        if len(laid_out) != 1:
            raise Unresolved(
                f"{mutant.before!r} is in {mutant.target} ({where}) {count or len(laid_out)} times, not once"
                + (_holders(mutant.before, found, texts) if count == 0 and not laid_out else "")
            )
        (match,) = laid_out
        indent = len(mutant.before) - len(mutant.before.lstrip())  # (the match starts after the indentation)
        after = mutant.after[indent:] if mutant.after[:indent].isspace() else mutant.after
        changed = span[: match.start()] + after + span[match.end() :]
    return definition.path, text[: definition.start] + changed + text[definition.end :]


def _layout_free(before: str) -> re.Pattern[str]:
    """``before`` whatever the code's layout: any whitespace between its characters (a formatter
    that breaks a line or indents an argument) and a trailing comma before a closing bracket, so
    that reformatting, as a move, leaves the mutants as they are."""
    parts = [
        r"(?:,\s*)?" + re.escape(char) if char in ")]}" else re.escape(char) for char in before if not char.isspace()
    ]
    return re.compile(r"\s*".join(parts))


MUTANTS = [
    # --- the five that passed their named tests before (issue 17)
    Mutant(
        "no reshuffle between epochs",
        "Trainer._train_epoch",
        "epoch_order(total, self.cfg.seed, epoch)",
        "epoch_order(total, self.cfg.seed, 1)",
        (f"{EQUIV} -k float64_ddp_one_process",),
    ),
    Mutant(
        "metrics trimmed by epoch at resume",
        "trim_metrics",
        'if (r.get("step", 0) <= last_step if r.get("kind") == "train" else r.get("epoch", 0) <= last_epoch)]',
        'if r.get("epoch", 0) <= last_epoch]',
        (f"{RELIABILITY} -k preempted_train",),
    ),
    Mutant(
        "DDP device count forced to 1",
        "plan_run",
        'mode, devices, world, sharing = "ddp", (device,), env.world_size, env.world_size',
        'mode, devices, world, sharing = "ddp", (device,), env.world_size, 1',
        (f"{EQUIV} -k float64_ddp_one_process",),
    ),
    Mutant(
        "autocast never applied",
        "DeviceContext.autocast",
        "        if self.amp_dtype is None:",
        "        if True:",
        ("tests/test_train.py -k autocast",),
    ),
    Mutant(
        "plain-data check removed from the loader",
        "loads",
        "    _check_plain(segment)\n    if not isinstance(segment, dict)",
        "    if not isinstance(segment, dict)",
        ("tests/test_snapshots.py -k plain_data_check",),
    ),
    # --- DDP
    Mutant(
        "rank shares overlap",
        "plan_epoch",
        "order[micro_start + rank:micro_end:world_size]",
        "order[micro_start:micro_end:world_size]",
        ("tests/test_resume.py -k 2-workers-then-1",),
    ),
    Mutant(
        "loss not scaled by the world size",
        "MicroBatch.loss_scale",
        "return world_size / self.step_samples",
        "return 1 / self.step_samples",
        (f"{EQUIV} -k float64_ddp_one_process",),
    ),
    Mutant(
        "gradient sync on every micro-batch",
        "Trainer._micro_batch_scope",
        "            stack.enter_context(self.strategy.no_sync(model))",
        "            pass",
        (f"{EQUIV} -k accumulation",),
    ),
    Mutant(
        "logged loss from rank 0 only",
        "TrainLosses.log",
        "strategy.all_reduce_sum(torch.cat([self.window, riders])).tolist()",
        "torch.cat([self.window, riders]).tolist()",
        (f"{LAUNCH} -k mean_over", "tests/test_tasks.py -k named_losses"),
    ),
    Mutant(
        "divergence check blind",
        "max_difference_from_rank0",
        "    return worst.item()",
        "    return 0.0",
        (f"{LAUNCH} -k diverge",),
    ),
    Mutant(
        "every rank draws rank 0's stream",
        "Trainer._forward_backward",
        'derive_seed(self.cfg.seed, "train", self.rank, epoch, micro.start)',
        'derive_seed(self.cfg.seed, "train", 0, epoch, micro.start)',
        (f"{RELIABILITY} -k one_worker",),
    ),
    Mutant(
        "validation shards overlap",
        "ShardSampler.__init__",
        "self.indices = range(rank, length, world_size)",
        "self.indices = range(0, length, world_size)",
        (f"{LAUNCH} -k as_written",),
    ),
    Mutant(
        "a stop request is not agreed between ranks",
        "TrainLosses.log",
        "sums, count, stops, summed = reduced[:size - 1], reduced[size - 1], reduced[size], reduced[size + 1:]",
        "sums, count, stops, summed = reduced[:size - 1], reduced[size - 1], float(stopping), reduced[size + 1:]",
        (f"{RELIABILITY} -k one_worker",),
    ),
    Mutant(
        "loss not scaled by the world size, seen in float32",
        "MicroBatch.loss_scale",
        "return world_size / self.step_samples",
        "return 1 / self.step_samples",
        (f"{EQUIV} -k float32",),
    ),
    # --- the task API
    Mutant(
        "gather without the backward all-reduce",
        "GatherRows.backward",
        "            dist.all_reduce(padded)\n",
        "            pass\n",
        (f"{TASKS} -k all_gather",),
    ),
    Mutant(
        "a second optimizer not checkpointed",
        "RunState.state_dict",
        '"optimizers": {name: opt.state_dict() for name, opt in self.optimizers.items()},',
        '"optimizers": {name: opt.state_dict() for name, opt in self.optimizers.items() '
        "if name == self.task.primary_model},",
        (f"{TASKS} -k resumes_mid_epoch",),
    ),
    Mutant(
        "task state not restored",
        "RunState.load_state_dict",
        '        self.task.load_state_dict(state.get("task_state") or {})',
        "        pass",
        (f"{TASKS} -k task_state",),
    ),
    Mutant(
        "SimCLR's negatives from this rank only under DDP",
        "SimCLRTask.training_step",
        "        if self.options.gather:\n            all1, all2, start = gather_views(ctx, z1, z2)",
        "        if False:\n            all1, all2, start = gather_views(ctx, z1, z2)",
        ("tests/test_ssl_family.py -k padding and simclr",),
    ),
    Mutant(
        "SimCLR's gather without the backward all-reduce",
        "GatherRows.backward",
        "            dist.all_reduce(padded)\n",
        "            pass\n",
        ("tests/test_ssl_family.py -k padding and simclr",),
    ),
    Mutant(
        "BYOL's momentum teacher a copy of the student",
        "MomentumTeacherTask.after_step",
        '        ema_update(models["teacher"], nn.Sequential(models["backbone"], models["projector"]), decay)',
        '        ema_update(models["teacher"], nn.Sequential(models["backbone"], models["projector"]), 0.0)',
        ("tests/test_ssl.py -k byol_resumes",),
    ),
    Mutant(
        "an old checkpoint's momentum dropped by the upgrade",
        "_upgrade",
        '"optimizers": {"model": state["optimizer"]}',
        '"optimizers": {"model": {**state["optimizer"], "state": {}}}',
        (f"{TASKS} -k old_checkpoint_resumes",),
    ),
    Mutant(
        "networks (BYOL's teacher among them) validate in train mode",
        "Validator.evaluate",
        "        for model in models.values():\n            model.eval()\n        evaluation = self.task.evaluate(",
        "        evaluation = self.task.evaluate(",
        ("tests/test_ssl.py -k last_batch_of_one_image",),
    ),
    Mutant(
        "mAP of rank 0's shard only",
        "DetectTask.evaluate",
        'everything = ctx.all_gather_objects([("image", i) for i in seen] + [("box", r) for r in results])',
        'everything = [("image", i) for i in seen] + [("box", r) for r in results]',
        ("tests/test_dense.py -k any_world_size",),
    ),
    Mutant(
        "images without boxes dropped",
        "load_split",
        '    images = [image for image in images if image["file_name"] not in bad]',
        '    images = [image for image in images if image["file_name"] not in bad and boxes[image["id"]]]',
        ("tests/test_dense.py -k any_world_size",),
    ),
    Mutant(
        "validation sums not all-reduced",
        "Task.evaluate",
        "        return self.validation_metrics(ctx.all_reduce_sums(sums))",
        "        return self.validation_metrics(sums)",
        ("tests/test_dense.py -k segmenter_learns",),
    ),
    Mutant(
        "the generator's step reaches the discriminator's weights",
        "TrainingStepContext.frozen",
        "            param.requires_grad_(False)",
        "            pass",
        (f"{TASKS} -k hand_written",),
    ),
    Mutant(
        "predict --features writes the logits",
        "ClassifyInference.feature_inputs",
        "        return backbone_of(self.models[self.task.primary_model])[0], images",
        "        return self.models[self.task.primary_model], images",
        ("tests/test_inference.py -k features",),
    ),
    Mutant(
        "a detector's --weights loaded into a copy",
        "DetectTask.load_weights",
        'return [load_weights(models["detector"], spec, [c["name"] for c in self.categories])]',
        'return [load_weights(copy.deepcopy(models["detector"]), spec, [c["name"] for c in self.categories])]',
        ("tests/test_dense.py -k pretrained",),
    ),
    # --- resume and checkpoints
    Mutant(
        "mid-epoch position not restored",
        "Checkpointer.restore",
        'return Progress(state["epoch"], state["position"], state["step"])',
        'return Progress(state["epoch"], 0, state["step"])',
        ("tests/test_resume.py -k 1-then-2",),
    ),
    Mutant(
        "epoch loss sums not restored",
        "TrainLosses.restore",
        '[float(sums["losses"].get(name, 0.0)) for name in self.names] + [float(sums["samples"])]',
        "[0.0] * (len(self.names) + 1)",
        (f"{RELIABILITY} -k preempted_train",),
    ),
    Mutant(
        "best.pt follows the latest epoch",
        "Best.improves",
        'if self.value is None or (value > self.value if self.mode == "max" else value < self.value):',
        "if True:",
        ("tests/test_train.py -k best_pt",),
    ),
    Mutant(
        "checkpoints saved with module. prefixes",
        "Trainer.__init__",
        "self.parts = RunState(self.bare_models,",
        "self.parts = RunState(lambda: self.models,",
        ("tests/test_resume.py -k 2-workers-then-1",),
    ),
    Mutant(
        "write in place, no rename",
        "atomic_write",
        '    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")',
        "    tmp = path",
        (f"{RELIABILITY} -k sigkill_while_saving",),
    ),
    Mutant(
        "the schedule ignores --epochs changes",
        "lr_factor",
        "        span = schedule.epochs - warmup",
        "        span = 2 - warmup",
        ("tests/test_resume.py -k longer_cosine",),
    ),
    Mutant(
        "a fused step reads a gradient of another layout as the parameter's",
        "step",
        "                param.grad = torch.empty_like(param).copy_(grad)",
        "                pass",
        ("tests/test_optim.py -k another_layout",),
    ),
    Mutant(
        "optimizers never fused",
        "build_optimizer",
        "    return make(fused=True) if fusable else make()",
        "    return make()",
        ("tests/test_optim.py -k another_layout",),
    ),
    Mutant(
        "fused SGD meets a parameter without a momentum buffer",
        "step",
        '            if group.get("momentum") and optimizer.state[param].get("momentum_buffer") is None:',
        "            if False:",
        ("tests/test_optim.py -k late",),
    ),
    Mutant(
        "a resumed optimizer's momentum kept in the checkpoint's layout",
        "keep_implementation",
        "                    state[key] = torch.empty_like(param).copy_(value)",
        "                    pass",
        ("tests/test_optim.py -k switches_channels_last",),
    ),
    Mutant(
        "a resumed optimizer takes the checkpoint's implementation",
        "RunState.load_state_dict",
        "            keep_implementation(optimizer)",
        "            pass",
        (
            "tests/test_fsdp.py::test_fsdp_trains_what_the_hand_written_loop_does_and_resumes_at_another_world_size_or_preempted",
        ),
    ),
    # --- snapshots
    Mutant(
        "segments never sealed",
        "SnapshotWriter.flush",
        '"sealed": len(chunk) == SEGMENT_RECORDS,',
        '"sealed": False,',
        ("tests/test_snapshots.py -k sealed_segments",),
    ),
    Mutant(
        "readers mix generations",
        "assemble",
        'by_index = {s["segment"]: s for s in segments if s["generation"] == newest}',
        'by_index = {s["segment"]: s for s in segments}',
        ("tests/test_snapshots.py -k incomplete_generation",),
    ),
    Mutant(
        "no budget on nested data", "_check_plain", "        budget -= 1\n", "\n", ("tests/test_snapshots.py -k bomb",)
    ),
    # --- launch
    Mutant(
        "a worker's exit code is not passed on",
        "MEANINGFUL",
        "MEANINGFUL = (EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_TERMINATED)",
        "MEANINGFUL = ()",
        (f"{RELIABILITY} -k one_worker",),
    ),
    Mutant(
        "a restart keeps --overwrite",
        "restart_config",
        'return cfg.replace(resume="auto", overwrite=False)',
        'return cfg.replace(resume="auto")',
        (f"{LAUNCH} -k worker_killed",),
    ),
    Mutant(
        "workers outlive a killed launcher",
        "main@worker",
        "    die_with_parent(os.getppid())",
        "    pass",
        (f"{LAUNCH} -k sigkill",),
    ),
    # --- schedulers
    Mutant(
        "a batch script taken for an srun task",
        "placement_from",
        'if "SLURM_STEP_ID" in env and "SLURM_PROCID" in env:',
        'if "SLURM_PROCID" in env:',
        ("tests/test_cluster.py -k wins",),
    ),
    Mutant(
        "mpirun loses to SLURM's inherited variables",
        "placement_from",
        '    if "OMPI_COMM_WORLD_RANK" in env:',
        "    if False:",
        ("tests/test_cluster.py -k wins",),
    ),
    # --- data and recipes
    Mutant(
        "the manifest checks every file again",
        "_check_all",
        "if isinstance(entry, list) and len(entry) == 3 and entry[:2] == [size, mtime]:",
        "if False:",
        ("tests/test_loader.py -k manifest",),
    ),
    Mutant(
        "the same augmentation every epoch",
        "TrainView.__getitem__",
        "image, label = self.raw[index]\n        # torch's CPU generator only (augmentation runs on the CPU): a loader "
        "worker's stream,\n        # or the training process's, reseeded for this sample.\n        "
        'torch.default_generator.manual_seed(derive_seed(self.seed, "augment", epoch, index))',
        'image, label = self.raw[index]\n        torch.default_generator.manual_seed(derive_seed(self.seed, "augment", '
        "1, index))",
        ("tests/test_recipes.py -k seeded_per_sample",),
    ),
    Mutant(
        "frozen BatchNorm statistics still move",
        "Backbone.train_mode",
        "            norm.eval()",
        "            pass",
        ("tests/test_recipes.py -k fine_tuning",),
    ),
    Mutant(
        "the EMA starts over at resume",
        "RunState.load_state_dict",
        "ema.module.load_state_dict(saved_ema.get(name) or bare[name].state_dict())",
        "ema.module.load_state_dict(bare[name].state_dict())",
        ("tests/test_recipes.py -k ema",),
    ),
    Mutant(
        "a head trained on other classes is kept",
        "load_weights",
        "            and not (other_classes and k.startswith(head))}",
        "            }",
        ("tests/test_recipes.py -k other_classes",),
    ),
    Mutant(
        "a diverging run trains on",
        "TrainLosses.check_finite",
        "        if bad:\n",
        "        if False:\n",
        ("tests/test_train.py -k non_finite",),
    ),
    Mutant(
        "MixUp and CutMix silently off",
        "_mixer",
        "    if not options.mixup_alpha and not options.cutmix_alpha:",
        "    if True:",
        ("tests/test_recipes.py -k mixing",),
    ),
    Mutant(
        "random erasing silently off",
        "build",
        "    if random_erasing > 0:",
        "    if False:",
        ("tests/test_recipes.py -k mixing",),
    ),
    Mutant(
        "--num-workers ignored",
        "loader_workers",
        '    if num_workers != "auto":\n        return int(num_workers)',
        "",
        ("tests/test_train.py -k loader_worker",),
    ),
    Mutant(
        "loader workers not shared between local processes",
        "loader_workers",
        "available_cores() // max(1, local_processes) - training_threads",
        "available_cores() - training_threads",
        ("tests/test_loader.py -k num_workers_auto",),
    ),
    Mutant(
        "channels-last never reaches the model",
        "DeviceContext.to_device",
        "            if self.channels_last and batch.dim() == 4 and batch.is_floating_point():",
        "            if False:",
        ("tests/test_recipes.py -k channels_last",),
    ),
    # --- input pipeline
    Mutant(
        "visualize's stop signal an Exception a health check swallows",
        "_Signalled",
        "class _Signalled(BaseException):",
        "class _Signalled(Exception):",
        ("tests/test_security.py -k health_check", "tests/test_visualize_robust.py -k stop_signal_while"),
    ),
    Mutant(
        "generated images not bounded by memory",
        "_refuse_beyond",
        "    if nbytes > limit:",
        "    if False:",
        ("tests/test_cli.py -k dry_run_allocates",),
    ),
    Mutant(
        "the evaluation resize rounds instead of timm's floor",
        "Pipeline.evaluation_resize",
        "return math.floor(self.size / self.crop_pct)",
        "return round(self.size / self.crop_pct)",
        ("tests/test_recipes.py -k torchvisions_resize",),
    ),
    Mutant(
        "a crop above the resized image is not padded",
        "Prepare.geometry",
        "if self.crop > min(h, w):",
        "if False:",
        ("tests/test_recipes.py -k torchvisions_resize",),
    ),
    Mutant(
        "the evaluation crop fraction unbounded below",
        "check_config",
        "cfg.data.val_crop_pct == 0 or 0.5 <= cfg.data.val_crop_pct <= 1.25",
        "0 <= cfg.data.val_crop_pct <= 1.25",
        ("tests/test_recipes.py -k crop_fraction_outside",),
    ),
    Mutant(
        "grayscale folders read as RGB",
        "_image_folder",
        "channels is None and _grayscale(train_dir(root), found)",
        "False",
        ("tests/test_train.py -k image_folder_of_png",),
    ),
    Mutant(
        "JPEGs reduced to 1/8 scale",
        "decode",
        "img.draft(mode, (img.size[0] // DRAFT_REDUCTION, img.size[1] // DRAFT_REDUCTION))",
        "img.draft(mode, (img.size[0] // 8, img.size[1] // 8))",
        ("tests/test_loader.py -k within_tolerance",),
    ),
    # --- visualize
    Mutant(
        "a symlink out of the pickle dir is followed",
        "LocalSource._read",
        "        if not real.is_relative_to(self.root):",
        "        if False:",
        ("tests/test_visualize.py -k hostile",),
    ),
    Mutant(
        "a FIFO is read",
        "LocalSource._read",
        "            if not stat.S_ISREG(info.st_mode):",
        "            if False:",
        ("tests/test_visualize.py -k hostile",),
    ),
    # --- the self-supervised family
    Mutant(
        "MoCo's keys enqueued in rank order",
        "MoCoTask.training_step",
        "keys = ctx.all_gather_in_order(key)",
        "keys = ctx.all_gather(key)[0]",
        ("tests/test_ssl_family.py -k padding and moco",),
    ),
    Mutant(
        "MoCo's keys enqueued before the loss",
        "MoCoTask.training_step",
        "        loss = self.criterion(query, key, self.queue.clone())  # (the queue changes in place after this step)\n"
        "        keys = ctx.all_gather_in_order(key)  # the batch's keys, as one process would hold them\n"
        "        self.enqueue(keys)\n",
        "        keys = ctx.all_gather_in_order(key)\n        self.enqueue(keys)\n"
        "        loss = self.criterion(query, key, self.queue.clone())\n",
        ("tests/test_ssl_family.py -k moco_step",),
    ),
    Mutant(
        "DINO's teacher given the local crops",
        "DINOTask.training_step",
        "            teacher = self.teacher(ctx.models, views)",
        '            teacher = [ctx.models["teacher"](view) for view in views]',
        ("tests/test_ssl_family.py -k teacher_sees",),
    ),
    Mutant(
        "MoCo's queue not checkpointed",
        "MoCoTask.state_dict",
        'return {"queue": self.queue.detach().cpu().clone(), "queue_at": self.queue_at}',
        "return {}",
        ("tests/test_ssl_family.py -k resumed_mid_epoch and moco",),
    ),
    Mutant(
        "DINO's centre not checkpointed",
        "DINOTask.state_dict",
        'return {"center": self.center.detach().cpu().clone()}',
        "return {}",
        ("tests/test_ssl_family.py -k resumed_mid_epoch and dino",),
    ),
    Mutant(
        "DINO's centre from this rank's rows alone",
        "DINOTask.update_center",
        'return ctx.all_reduce_sums_later({"sum": rows.sum((0, 1)), "count": count}, move)',
        'return move({"sum": rows.sum((0, 1)).double(), "count": count.double()})',
        ("tests/test_ssl_family.py -k padding and dino",),
    ),
    Mutant(
        "DINO's last layer trains in its frozen epochs",
        "DINOTask.training_step",
        "        if ctx.epoch <= self.options.freeze_last_layer:",
        "        if False:",
        ("tests/test_ssl_family.py -k padding and dino",),
    ),
    Mutant(
        "a padding rank's SimCLR loss skips the gather",
        "SimCLRTask.training_step",
        '"loss": (all1.sum() + all2.sum()) * 0.0,',
        '"loss": (z1.sum() + z2.sum()) * 0.0,',
        ("tests/test_ssl_family.py -k padding and simclr",),
    ),
    Mutant(
        "Barlow Twins and VICReg on each rank's own batch",
        "GlobalBatchTask.training_step",
        "        if self.options.gather:  # every rank's rows",
        "        if False:  # every rank's rows",
        ("tests/test_ssl_family.py -k padding and barlowtwins",),
    ),
    Mutant(
        "SwAV's codes from this rank's scores alone",
        "SwAVTask.training_step",
        "everyone, start = ctx.all_gather(score.detach())",
        "everyone, start = score.detach(), 0",
        ("tests/test_ssl_family.py -k padding and swav",),
    ),
    Mutant(
        "SwAV's prototypes train in their frozen epochs",
        "SwAVTask.training_step",
        "        if ctx.epoch <= self.options.freeze_prototypes:",
        "        if False:",
        ("tests/test_ssl_family.py -k padding and swav",),
    ),
    Mutant(
        "SimSiam's stop-gradient dropped",
        "NegativeCosineLoss.forward",
        "_cosine(p1, z2.detach(), dim=1)",
        "_cosine(p1, z2, dim=1)",
        ("tests/test_ssl_family.py -k one_process_with",),
    ),
    Mutant(
        "--val-every skips the last epoch",
        "Trainer._fit",
        "validate = epoch % self.cfg.output.val_every == 0 or epoch == self.cfg.schedule.epochs",
        "validate = epoch % self.cfg.output.val_every == 0",
        ("tests/test_train_guards.py -k val_every",),
    ),
    Mutant(
        "the step-time breakdown loses the loader's wait",
        "StepTimes.lap",
        "        self.window[PARTS.index(part)] += now - self.mark",
        '        self.window[PARTS.index(part)] += 0.0 if part == "data" else now - self.mark',
        ("tests/test_train_guards.py -k step_time",),
    ),
    # --- the contract: declarations, config sections, window kinds
    Mutant(
        "translate declares its first target's names only",
        "TranslateTask.declare",
        'primary_model=self.net("generator", 0),',
        'primary_model="generator",',
        ("tests/test_contract.py -k declaration_follows",),
    ),
    Mutant(
        "a config's replace drops the changes",
        "RunConfig.replace",
        "return RunConfig.flat(**{**self.to_dict(), **changes})",
        "return RunConfig.flat(**self.to_dict())",
        ("tests/test_contract.py -k frozen_sections",),
    ),
    Mutant(
        "a pane's window drawn beside the kind's default",
        "drawn_windows",
        "and kind.record not in covered for d in kind.defaults]",
        "for d in kind.defaults]",
        ("tests/test_visualize_robust.py -k names_its_window_kind",),
    ),
    # --- --task deepliif against DeepLIIF's own model
    Mutant(
        "deepliif drops the input's segmentation weight",
        "DeepLIIFTask.weighted",
        "for k, part in enumerate(parts)]).sum(0)",
        "for k, part in enumerate(parts) if k]).sum(0)",
        ("tests/test_deepliif.py -k plain_layout",),
    ),
    Mutant(
        "deepliif drops the first modality's VGG term",
        "DeepLIIFTask.training_step",
        '+ losses[f"G_VGG_{i + 1}"]) * w_g[i]',
        '+ (losses[f"G_VGG_{i + 1}"] if i else 0)) * w_g[i]',
        ("tests/test_deepliif.py -k one_process_and_two_ddp",),
    ),
    Mutant(
        "deepliif's segmentation discriminators see the input for every source",
        "DeepLIIFTask.training_step",
        "sources = [inputs] + reals[:m]",
        "sources = [inputs] * (m + 1)",
        ("tests/test_deepliif.py -k one_process_and_two_ddp",),
    ),
    Mutant(
        "deepliif's biases before InstanceNorm train",
        "freeze_inert_biases",
        "layer.bias.requires_grad_(False)",
        "layer.bias.requires_grad_(True)",
        ("tests/test_deepliif.py -k one_process_and_two_ddp",),
    ),
    Mutant(
        "a released DeepLIIF model's G51 read as GS1",
        "phalanx_name",
        'return f"{kind}S{int(source) - first}"',
        'return f"{kind}S{(int(source) - first + 1) % (modalities + 1)}"',
        ("tests/test_deepliif.py -k released",),
    ),
    Mutant(
        "DeepLIIF's noise threshold off by one",
        "cells",
        "found = (sizes > noise_thresh)",
        "found = (sizes >= noise_thresh)",
        ("tests/test_deepliif.py -k cell_counts_and",),
    ),
    Mutant(
        "DeepLIIF's cells 4-connected",
        "cells",
        "structure=np.ones((3, 3), dtype=bool))",
        "structure=None)",
        ("tests/test_deepliif.py -k cell_counts_and",),
    ),
    Mutant(
        "DeepLIIF's size threshold from every region, noise included",
        "score",
        'size_thresh = default_size_thresh(found["size"], resolution)',
        'size_thresh = default_size_thresh(cells(seg, marker, seg_thresh, 0)["size"], resolution)',
        ("tests/test_deepliif.py -k cell_counts_and",),
    ),
    Mutant(
        "DeepLIIF's networks predict with BatchNorm's running statistics",
        "DeepLIIFTask.generate_parts",
        "with batch_statistics(models[name] for name in self.generator_names()):",
        "with contextlib.nullcontext():",
        ("tests/test_deepliif.py -k each_images_statistics",),
    ),
    Mutant(
        "a serialized DeepLIIF network without running statistics refused",
        "load_networks",
        'if path.suffix == ".pt":  # `deepliif serialize`',
        "if False:  # `deepliif serialize`",
        ("tests/test_deepliif.py -k released",),
    ),
    Mutant(
        "a slide's blocks never joined to the band above",
        "BlockComponents.add",
        "if top > 0:  # the band above",
        "if False:  # the band above",
        ("tests/test_deepliif.py -k block_by_block",),
    ),
    Mutant(
        "a slide's cells not joined diagonally across block borders",
        "BlockComponents.add",
        "shifts = (-1, 0, 1) if self.eight else (0,)",
        "shifts = (0,)",
        ("tests/test_deepliif.py -k block_by_block",),
    ),
    Mutant(
        "a slide's bottom edge not the slide's edge",
        "SlideCells.add_block",
        "edges += [labels[-1]] if top",
        "edges += [] if top",
        ("tests/test_deepliif.py -k block_by_block",),
    ),
    Mutant(
        "a slide's outlines drawn without the pixels around each block",
        "OUTLINE_REACH",
        "OUTLINE_REACH = 3",
        "OUTLINE_REACH = 0",
        ("tests/test_deepliif.py -k block_by_block",),
    ),
    Mutant(
        "a slide's regions predicted without the tiles that start before them",
        "TranslationPredictor.write_regions",
        "before = (-(-size // stride) - 1) * stride",
        "before = 0",
        ("tests/test_deepliif.py -k plain_layout",),
    ),
    Mutant(
        "a slide's regions predicted without the tiles' overlap after them",
        "after",
        "else min(total, end + overlap)",
        "else end",
        ("tests/test_deepliif.py -k plain_layout",),
    ),
    Mutant(
        "a slide's last regions predicted without the whole image's last tile",
        "after",
        "return total if total - size < end else",
        "return total if False else",
        ("tests/test_deepliif.py -k plain_layout",),
    ),
    # --- --strategy fsdp
    Mutant(
        "fsdp leaves the weights outside the blocks whole on every rank",
        "FSDPStrategy.wrap",
        "        fully_shard(model, **shard)\n",
        "        pass\n",
        ("tests/test_fsdp.py -k holds_half",),
    ),
    Mutant(
        "fsdp saves rank 0's shard for the whole network",
        "FSDPStrategy._gathered",
        "whole = state.full_tensor()",
        "whole = state.to_local()",
        ("tests/test_fsdp.py -k holds_half",),
    ),
    Mutant(
        "fsdp loads a checkpoint's optimizer state without cutting it into shards",
        "FSDPStrategy.local_optimizer_state",
        'return {**saved, "state": state}',
        "return saved",
        ("tests/test_fsdp.py -k resumes_at_another",),
    ),
    Mutant(
        "fsdp keeps in-place activations",
        "FSDPStrategy.wrap",
        "module.inplace = False",
        "pass",
        ("tests/test_translate.py -k float64",),
    ),
    Mutant(
        "a sharded resume leaves the optimizer state fresh",
        "restore",
        'if any(f"optimizers.{name}.state.{fqn}.{key}" in stored for key in values)}',
        "if False}",
        ("tests/test_fsdp.py -k resumes_at_another",),
    ),
    Mutant(
        "shards named by a checkpoint are removed",
        "collect",
        'named.add(state["sharded"].split("/")[-1])',
        "pass",
        ("tests/test_fsdp.py -k resumes_at_another",),
    ),
    Mutant(
        "shards no checkpoint names are kept",
        "collect",
        "if directory.name != WRITING and directory.name not in named:",
        "if False:",
        ("tests/test_fsdp.py -k resumes_at_another",),
    ),
    Mutant(
        "consolidate numbers an optimizer's parameters per group",
        "_numbered",
        'numbers = [index.setdefault(name, len(index)) for name in group["params"]]',
        'numbers = list(range(len(group["params"])))',
        ("tests/test_fsdp.py -k resumes_at_another",),
    ),
    Mutant(
        "fsdp averages bf16 gradients in bf16",
        "FSDPStrategy.wrap",
        "reduce_dtype=torch.float32",
        "reduce_dtype=None",
        ("tests/test_fsdp.py -k holds_half",),
    ),
    Mutant(
        "fsdp ignores --no-reshard-after-forward",
        "FSDPStrategy.wrap",
        "mesh=self.mesh(), reshard_after_forward=self.reshard_after_forward,",
        "mesh=self.mesh(),",
        ("tests/test_fsdp.py -k holds_half",),
    ),
    Mutant(
        "activation checkpointing updates BatchNorm's statistics twice",
        "_buffers_kept",
        "            buffer.detach().copy_(value)",
        "            pass",
        ("tests/test_fsdp.py -k activation",),
    ),
    Mutant(
        "activation checkpointing forgets the random draws",
        "checkpoint_activations",
        "checkpoint(block, context_fn=",
        "checkpoint(block, preserve_rng_state=False, context_fn=",
        ("tests/test_fsdp.py -k activation",),
    ),
    Mutant(
        "scale's speedup over the first point, not the 1-worker one",
        "speedup",
        "base = next(p for p in points if p.scaling == point.scaling and p.workers == 1)",
        "base = points[-1]",
        ("tests/test_scale.py -k own_records",),
    ),
    Mutant(
        "scale counts the warm-up",
        "measure",
        'windows = [r for r in train if r["step"] > warmup]',
        "windows = train",
        ("tests/test_scale.py -k own_records",),
    ),
    Mutant(
        "scale's strong scaling keeps the batch per worker",
        "plan@scale",
        'cfg.optim.batch_size if scaling == "weak" else cfg.optim.batch_size // w',
        "cfg.optim.batch_size",
        ("tests/test_scale.py -k touches_no_run",),
    ),
    Mutant(
        "--max-steps saves no checkpoint mid-epoch",
        "Trainer._fit",
        "                self.checkpointer.save_latest(self.progress())\n                break",
        "                break",
        ("tests/test_scale.py -k max_steps",),
    ),
    Mutant(
        "a run's loader workers left to the garbage collector",
        "_fit",
        "            close_loaders(trainer.train_loader, trainer.val_loader)",
        "            pass",
        ("tests/test_train.py -k loader_worker",),
    ),
    Mutant(
        "the dry run's memory counts one Adam moment",
        "optimizer_copies",
        'if cfg.optim.optimizer in ("adam", "adamw"):\n        return 2',
        'if cfg.optim.optimizer in ("adam", "adamw"):\n        return 1',
        ("tests/test_fsdp.py -k dry_run",),
    ),
    Mutant(
        "checkpoints written on the training thread",
        "CheckpointWriter.save",
        "self.thread.start()",
        "self.thread.run()",
        ("tests/test_reliability.py -k holds_its_own_moment",),
    ),
    Mutant(
        "SwAV's queue never joins the codes",
        "SwAVTask.queued_scores",
        "if not length or epoch < self.options.queue_start_epoch or self.queued < length:",
        "if True:",
        ("tests/test_ssl_family.py -k swavs_queue",),
    ),
    Mutant(
        "SwAV's queue keeps the oldest features",
        "SwAVTask.enqueue",
        "torch.cat([new, self.queue.to(new)], dim=1)",
        "torch.cat([self.queue.to(new), new], dim=1)",
        ("tests/test_ssl_family.py -k swavs_queue",),
    ),
    Mutant(
        "SwAV's queue filled with this rank's features only",
        "SwAVTask.training_step",
        "self.enqueue([ctx.all_gather_in_order(f.detach()) for f in features[:2]])",
        "self.enqueue([f.detach() for f in features[:2]])",
        ("tests/test_ssl_family.py -k padding_sample and swav",),
    ),
    Mutant(
        "a slide's thin last region read without the whole image's last tile",
        "start",
        "return max(0, min(begin - before, (total - size) // stride * stride))",
        "return max(0, begin - before)",
        ("tests/test_deepliif.py -k plain_layout",),
    ),
    Mutant(
        "a text window unescaped",
        "Text.draw",
        "{escape(record['text'][:100_000])}",
        "{record['text'][:100_000]}",
        ("tests/test_visualize_robust.py -k names_its_window_kind",),
    ),
    Mutant(
        "a resume takes nothing of its run",
        "saved_options",
        'saved = from_mapping(_saved_config(given["resume"], general)',
        "saved = from_mapping(None",
        ("tests/test_resume.py -k leaves_out",),
    ),
    Mutant(
        "a resume takes the identity options only",
        "_takes",
        '(FIELDS[name].metadata["identity"] or name in TAKEN_BEYOND_IDENTITY)',
        'FIELDS[name].metadata["identity"]',
        ("tests/test_resume.py -k leaves_out",),
    ),
    Mutant(
        "a resume takes the run's values that equal this command line's",
        "saved_options",
        "and value != alone[name]",
        "and True",
        ("tests/test_resume.py -k leaves_out",),
    ),
    Mutant(
        "a finished run's resume rewrites the run",
        "_nothing_to_do",
        'if state["epoch"] >= cfg.schedule.epochs and not state["position"]:',
        "if False:",
        ("tests/test_resume.py -k leaves_out",),
    ),
    Mutant(
        "a detector is let train under DataParallel",
        "refuse_data_parallel",
        'if mode == "dataparallel" and task.data_parallel_refused:',
        "if False:",
        ("tests/test_dense.py -k refuses_dataparallel",),
    ),
    Mutant(
        "a typed --task drops the --config file's task: section",
        "build_config",
        'merged[name] = {**file_task, "name": value}',
        "merged[name] = value",
        ("tests/test_newcomer.py -k config_file_errors",),
    ),
    Mutant(
        "a checkpoint by path continues over another run",
        "plan@rundir",
        "        if not cfg.overwrite:\n            _check_not_another_run(run_dir, resume)",
        "        pass",
        ("tests/test_resume.py -k never_continues",),
    ),
    Mutant(
        "a resume at its --max-steps trains and rewrites the run",
        "_nothing_to_do",
        'if limit and state["step"] >= limit:',
        "if False:",
        ("tests/test_scale.py -k max_steps",),
    ),
    Mutant(
        "windows escape nothing",
        "escape",
        "    return html.escape(text)",
        "    return text",
        ("tests/test_visualize_robust.py -k names_its_window_kind",),
    ),
    # --- --sync-bn on CPU workers (GlobalBatchNorm)
    Mutant(
        "sync-bn counts a padding sample's rows",
        "GlobalBatchNorm.forward",
        "counted = 0.0 if _padding else 1.0",
        "counted = 1.0",
        (f"{LAUNCH} -k gloo_ranks",),
    ),
    Mutant(
        "sync-bn's variance from this rank's rows",
        "GlobalBatchNorm.forward",
        "var = _all_reduce((centred * centred).sum(dims) * counted) / count",
        "var = (centred * centred).mean(dims)",
        (f"{LAUNCH} -k gloo_ranks",),
    ),
    Mutant(
        "sync-bn's backward keeps each rank's own gradient",
        "_SumOverRanks.backward",
        "return _summed_over_ranks(grad)",
        "return grad",
        (f"{LAUNCH} -k gloo_ranks",),
    ),
    Mutant(
        "sync-bn's statistics summed in bf16",
        "GlobalBatchNorm.forward",
        "values = x.to(torch.promote_types(x.dtype, torch.float32))",
        "values = x",
        (f"{LAUNCH} -k gloo_ranks",),
    ),
    Mutant(
        "sync-bn's running variance biased",
        "GlobalBatchNorm._track",
        "unbiased = var * count / (count - 1).clamp_min(1)",
        "unbiased = var",
        (f"{LAUNCH} -k gloo_ranks",),
    ),
    Mutant(
        "SimSiam's monitor from this rank's rows alone",
        "global_embedding_std",
        'return ctx.all_reduce_sums_later({**sums, "count": torch.tensor(float(rows))}, spread)',
        'return spread({**sums, "count": torch.tensor(float(rows), dtype=torch.float64)})',
        ("tests/test_ssl_family.py -k padding and simsiam",),
    ),
    Mutant(
        "the second view's rows not gathered",
        "gather_views",
        "return both[:, :z1.shape[1]], both[:, z1.shape[1]:], start",
        "return both[:, :z1.shape[1]], z2, start",
        ("tests/test_ssl_family.py -k padding and simclr",),
    ),
    Mutant(
        "rank 0's buffers never broadcast after a step",
        "DDPStrategy.after_step",
        "broadcast_from_rank0(models, self.clock)  # every network's, a momentum teacher's too",
        "pass",
        (f"{LAUNCH} -k late_in_backward",),
    ),
    Mutant(
        "the gradient all-reduce's wait after backward not counted",
        "TrainingStepContext.backward_loss",
        ", self.strategy.clock.backward(micro.ends_step):",
        ":",
        (f"{LAUNCH} -k late_in_backward",),
    ),
    Mutant(
        "the trainer never marks a padding micro-batch",
        "Trainer._micro_batch_scope",
        "        stack.enter_context(self.strategy.padding(not micro.real))\n",
        "",
        (f"{LAUNCH} -k cpu_workers_trains",),
    ),
    Mutant(
        "the fp16 range hint given in every precision",
        "diverged",
        'if precision == "fp16" else ""',
        'if precision else ""',
        ("tests/test_train.py -k diverg",),
    ),
    Mutant(
        "the probe's norm frozen with the backbone",
        "Backbone.__init__",
        "isinstance(m, nn.modules.batchnorm._NormBase) and not isinstance(m, ProbeNorm)",
        "isinstance(m, nn.modules.batchnorm._NormBase)",
        ("tests/test_ssl.py -k dinos_backbone",),
    ),
    Mutant(
        "features taken after the probe's norm",
        "backbone_of",
        "isinstance(parent[0], ProbeNorm)",
        "False",
        ("tests/test_inference.py -k probes_norm",),
    ),
    Mutant(
        "augmented training reads images normalised in place",
        "build_datasets",
        "in_place=augmented is None)",
        "in_place=True)",
        ("tests/test_loader.py -k in_memory",),
    ),
    Mutant(
        "the in-place split moves rows in the wrong order",
        "split_in_place",
        "order = torch.tensor(train_idx, dtype=torch.long)",
        "order = torch.tensor(train_idx, dtype=torch.long).flip(0)",
        ("tests/test_loader.py -k hold_out",),
    ),
    Mutant(
        "the probe's norm trains on a batch of one row",
        "ProbeNorm.forward",
        "if self.training and len(rows) < 2:",
        "if False:",
        ("tests/test_inference.py -k probes_norm_takes",),
    ),
    Mutant(
        "scale's srun steps started one task each",
        "run_point",
        "*srun_placement(point.workers, slurm_tasks_per_node(env))",
        "*srun_placement(1, slurm_tasks_per_node(env))",
        ("tests/test_cluster.py -k srun_step",),
    ),
    Mutant(
        "every srun step of a job rendezvouses at one port",
        "_from_slurm",
        '(_int(env, "SLURM_JOB_ID") + STEP_PORT_STRIDE * _int(env, "SLURM_STEP_ID", 0)) % 20000',
        '_int(env, "SLURM_JOB_ID") % 20000',
        ("tests/test_cluster.py -k placed_from",),
    ),
    Mutant(
        "scale ignores the allocation's task count",
        "plan@scale",
        "if tasks is not None and max(workers) > tasks:",
        "if False:",
        ("tests/test_cluster.py -k plans_its_sizes",),
    ),
    Mutant(
        "small JPEGs decoded at reduced scale",
        "decode",
        "min(size) >= max(DRAFT_REDUCTION * min_side, DRAFT_MIN_SIDE)",
        "min(size) >= DRAFT_REDUCTION * min_side",
        ("tests/test_loader.py -k fast_jpeg",),
    ),
    Mutant(
        "a last training batch of one image reaches BatchNorm1d",
        "_train",
        "refuse_single_rows(cfg, dataset_size(data.train), models, strategy.world_size,\n"
        '                           resume.state["position"] if resume else 0, len(strategy.plan.devices))',
        "None",
        ("tests/test_train_guards.py -k batchnorm1d",),
    ),
    Mutant(
        "a resume's first epoch at another world size not checked for single rows",
        "_train",
        'resume.state["position"] if resume else 0, len(strategy.plan.devices)',
        "0, len(strategy.plan.devices)",
        ("tests/test_train_guards.py -k batchnorm1d",),
    ),
    Mutant(
        "DataParallel's split not checked for single rows in a dry run",
        "describe_checks",
        "if resume else 0,\n                           replicas)",
        "if resume else 0)",
        ("tests/test_train_guards.py -k batchnorm1d",),
    ),
    Mutant(
        "DataParallel's smallest piece taken as an even split",
        "smallest_chunk",
        "return rows - piece * (-(-rows // piece) - 1)",
        "return rows // replicas",
        ("tests/test_train_guards.py -k dataparallels_smallest",),
    ),
    Mutant(
        "evaluate's header line left to each task",
        "evaluate@evaluate",
        """print(f"{results['checkpoint']} on {results['data']}\\n{inference.results_table(results)}")""",
        "print(inference.results_table(results))",
        ("tests/test_tasks.py -k trains_from_its_own_folder",),
    ),
    Mutant(
        "an elastic restart with nothing left to train leaves the run's last status failed",
        "_train",
        "if done and not elastic_restart_count():",
        "if done:",
        ("tests/test_resume.py -k leaves_out_from_the_run",),
    ),
    Mutant(
        "the manifest's check sized by the machine's cores, not the process's",
        "_check_all",
        "    cores = available_cores()",
        "    cores = os.cpu_count() or 1",
        ("tests/test_loader.py -k fewer_cores",),
    ),
    Mutant(
        "a PatchGAN's last layers given 2 pixels",
        "check_discriminator",
        "    if left >= 3:",
        "    if left >= 2:",
        ("tests/test_translate.py -k discriminator_check",),
    ),
    Mutant(
        "translate's discriminator not checked against the image size",
        "TranslateTask.check_networks",
        "        check_discriminator(self.options.d_layers, size)\n",
        "",
        ("tests/test_bad_input.py -k discriminator",),
    ),
    Mutant(
        "a task's shared options left under the heading of the task declaring them first",
        "Command.format_options",
        'section = registry.BUILTIN[task].heading if param.name in own else getattr(param, "section", GENERAL)',
        'section = getattr(param, "section", GENERAL)',
        ("tests/test_newcomer.py -k named_tasks_defaults",),
    ),
    Mutant(
        "no warning where every labelled image votes in the kNN accuracy",
        "_every_image_votes",
        "    if not voters or k < voters:",
        "    if True:",
        ("tests/test_ssl.py -k last_batch_of_one_image",),
    ),
    Mutant(
        "a probe of a phalanx checkpoint normalised otherwise says nothing",
        "_other_inputs",
        "    if own is None or run is None:",
        "    if True:",
        ("tests/test_ssl.py -k label_free_folder",),
    ),
    Mutant(
        "a dry run that found the run directory would stop the run exits 0",
        "train",
        "            raise stop  # the plan printed",
        "            pass  # the plan printed",
        ("tests/test_cli.py -k dry_run_says",),
    ),
    Mutant(
        "a dry run's resume names the epoch before a mid-epoch checkpoint",
        "_where",
        '    if state["position"]:\n',
        "    if False:\n",
        ("tests/test_cli.py -k dry_run_says",),
    ),
    Mutant(
        "--task bogus --help shows the general page",
        "Command.parse_args",
        "            registry.check_name(named)  # `--task bogus --help`",
        "            pass  # `--task bogus --help`",
        ("tests/test_newcomer.py -k named_tasks_defaults",),
    ),
    Mutant(
        "evaluate's --knn-k taken and ignored",
        "load_trained",
        "        cfg = cfg.replace(task_options={**cfg.task_options, **task_changes})",
        "        pass",
        ("tests/test_ssl.py -k last_batch_of_one_image",),
    ),
    Mutant(
        "a DataParallel resume's refusal suggests more processes",
        "refuse_single_rows",
        "        if resumed_rest:  # one process",
        "        if False:  # one process",
        ("tests/test_train_guards.py -k names_what_can_change",),
    ),
    Mutant(
        "the rest of a resumed epoch not counted",
        "_Cut.fewest_rows",
        "return min(whole, self.rows(train_samples - start, batch)) if 0 < start < train_samples else whole",
        "return whole",
        ("tests/test_train_guards.py -k batchnorm1d",),
    ),
    Mutant(
        "a padding sample counted as no row",
        "smallest_share",
        "return max(1, last_micro_batch(num_samples, batch_size, world_size) // world_size)",
        "return last_micro_batch(num_samples, batch_size, world_size) // world_size",
        ("tests/test_train_guards.py -k smallest_share",),
    ),
    Mutant(
        "a key of a --config file's task: section not located",
        "load_config_file",
        'lines.update({f"task.{k.value}": k.start_mark.line + 1 for k, _ in value.value})',
        "pass",
        ("tests/test_newcomer.py -k config_file_errors",),
    ),
    Mutant(
        "predict takes another task's option silently",
        "predict@predict",
        "if name in typed and name not in read]",
        "if False]",
        ("tests/test_bad_input.py -k another and tasks and option",),
    ),
    Mutant(
        "a user module not found says not where phalanx looked",
        "import_user_module",
        'if isinstance(exc, ModuleNotFoundError) and exc.name == top else ""',
        'if False else ""',
        ("tests/test_bad_input.py -k model and module and missing",),
    ),
    Mutant(
        "a failed run in process leaves the caller's stop signals held",
        "main@cli",
        "        restore_signal_mask(mask)",
        "        pass",
        (f"{RELIABILITY} -k gives_the_caller_back",),
    ),
    # --- the self-supervised views made a batch at a time
    Mutant(
        "the views' hue turned the other way",
        "_hue",
        "% 1.0 + shift[:, None, None]) % 1.0",
        "% 1.0 - shift[:, None, None]) % 1.0",
        ("tests/test_view_batch.py",),
    ),
    Mutant(
        "contrast blends with the batch's mean",
        "_contrast",
        "mean = (rows.sum(-1) / gray[0].numel())",
        "mean = (rows.sum(-1).mean() / gray[0].numel()).expand(len(gray))",
        ("tests/test_view_batch.py",),
    ),
    Mutant(
        "colour jitter in one fixed order",
        "_jitter",
        "chosen = (params[:, ORDER.start + position] == step).nonzero()",
        "chosen = (params[:, JITTER] * (step == position) > 0).nonzero()",
        ("tests/test_view_batch.py",),
    ),
    Mutant(
        "every view blurred with the first view's sigma",
        "ViewRecipe._blur",
        "(taps[None] / params[:, SIGMA, None]) ** 2",
        "(taps[None] / params[:1, SIGMA, None]) ** 2",
        ("tests/test_view_batch.py",),
    ),
    Mutant(
        "a tall image's centre crop of the wrong height",
        "_crop_box",
        "(width, int(round(width * 4 / 3))) if ratio < 3 / 4",
        "(width, int(round(width * 3 / 4))) if ratio < 3 / 4",
        ("tests/test_view_batch.py",),
    ),
    Mutant(
        "flips drawn but not made",
        "_flip",
        "    return views.flip(-1)",
        "    return views",
        ("tests/test_view_batch.py",),
    ),
    Mutant(
        "crops never reach the bottom or right edge",
        "_crop_box",
        "top, left = int(u_top * (height - h + 1)), int(u_left * (width - w + 1))",
        "top, left = int(u_top * (height - h)), int(u_left * (width - w))",
        ("tests/test_view_batch.py",),
    ),
    Mutant(
        "contrast's mean one float32 sum a view",
        "_contrast",
        "rows = gray.reshape(len(gray), -1, gray.shape[-1]).double().sum(-1)",
        "rows = gray.reshape(len(gray), 1, -1).sum(-1)",
        ("tests/test_view_batch.py",),
    ),
    Mutant(
        "the jitter's factors drawn over half their range",
        "ViewRecipe.draw",
        "params[JITTER:HUE + 1] = [1.0, 0.6 + 0.8 * b, 0.6 + 0.8 * c, 0.6 + 0.8 * s if colour else 1.0,",
        "params[JITTER:HUE + 1] = [1.0, 0.8 + 0.4 * b, 0.6 + 0.8 * c, 0.8 + 0.4 * s if colour else 1.0,",
        ("tests/test_view_batch.py",),
    ),
    Mutant(
        "larger 8-bit views made a batch at a time too",
        "ViewSet.__call__",
        "if made_by_pil(image, max(recipe.size for recipe, _ in self.groups)):",
        "if False:",
        ("tests/test_view_batch.py",),
    ),
    Mutant(
        "validation's larger 8-bit views made a batch at a time",
        "one_view",
        "return per_image(recipe)(image) if made_by_pil(image, recipe.size) else recipe(image)",
        "return recipe(image)",
        ("tests/test_view_batch.py",),
    ),
    Mutant(
        "2- and 4-channel 8-bit images given to PIL",
        "made_by_pil",
        "and size > SMALL and image.shape[0] in (1, 3)",
        "and size > SMALL",
        ("tests/test_view_batch.py",),
    ),
    Mutant(
        "a loader that ends early taken for the epoch's end",
        "EpochBatches.delivered",
        "if made < len(self.plan):",
        "if False:",
        ("tests/test_train_guards.py -k stopiteration",),
    ),
    Mutant(
        "a CPU quota not seen",
        "cpu_quota",
        "quotas = [limit for limit in limits if limit]",
        "quotas = []",
        ("tests/test_loader.py -k quota",),
    ),
    Mutant(
        "the smallest quota above a cgroup not taken",
        "_cpu_cgroup_directories",
        "directories += [leaf, *[p for p in leaf.parents if p == mount or mount in p.parents]]",
        "directories += [leaf]",
        ("tests/test_loader.py -k quota",),
    ),
    Mutant(
        "--image-size 0 let through to pix2pix's and the segmenter's resizes",
        "one_size",
        "if not data.image_size:",
        "if False:",
        ("tests/test_bad_input.py -k image-size-zero",),
    ),
    Mutant(
        "a command's exit does not wait for threads",
        "exit_process",
        "threading._shutdown()",
        "pass",
        (f"{RELIABILITY} -k finalising",),
    ),
    Mutant(
        "a command's exit skips the exit functions",
        "exit_process",
        "atexit._run_exitfuncs()",
        "pass",
        (f"{RELIABILITY} -k finalising",),
    ),
    Mutant(
        "mountinfo's escapes left as written",
        "_cpu_cgroup_directories",
        "fields = [_unescape(field) for field in line.split()]",
        "fields = line.split()",
        ("tests/test_loader.py -k cgroup_v2",),
    ),
    Mutant(
        "a cgroup namespace's root not taken off the process's path",
        "_cpu_cgroup_directories",
        'inner = path[len(root):] if path == root or path.startswith(root + "/") else path',
        "inner = path",
        ("tests/test_loader.py -k cgroup_v2",),
    ),
    Mutant(
        "one process's threads not capped by the quota",
        "Strategy.__init__",
        'if device.type == "cpu" and cpu_quota() and torch.get_num_threads() > available_cores():',
        "if False:",
        ("tests/test_loader.py -k quota",),
    ),
    Mutant(
        "every view made from the batch's first image",
        "ViewSet.collate",
        "crops = torch.cat([torch.stack([item.crops[group][view] for item in items])",
        "crops = torch.cat([torch.stack([items[0].crops[group][view] for item in items])",
        ("tests/test_view_batch.py",),
    ),
    Mutant(
        "a validation loader that ends early taken for the whole",
        "every_batch",
        "if made < len(loader):",
        "if False:",
        ("tests/test_train_guards.py -k stopiteration",),
    ),
    Mutant(
        "validation's loader not checked",
        "Validator.evaluate",
        "every_batch(self.loader)",
        "self.loader",
        ("tests/test_train_guards.py -k stopiteration",),
    ),
    Mutant(
        "evaluate's loader not checked",
        "evaluate@evaluate",
        'every_batch(loader, "evaluation")',
        "loader",
        ("tests/test_train_guards.py -k stopiteration",),
    ),
    Mutant(
        "DINO's collapse warned of at any entropy",
        "DINOTask.collapse",
        'if train["teacher_entropy"] < COLLAPSED * uniform:',
        "if False:",
        ("tests/test_ssl.py -k dinos_backbone_probed",),
    ),
    Mutant(
        "a collapse warned of every epoch",
        "SelfSupervisedTask.epoch_warnings",
        "        self.said_collapse = True\n",
        "        pass\n",
        ("tests/test_ssl.py -k dinos_backbone_probed",),
    ),
    Mutant(
        "an embedding collapse warned of at any std",
        "SelfSupervisedTask.collapse",
        "if std is None or not dim or std >= COLLAPSED_STD / math.sqrt(dim):",
        "if std is None or not dim:",
        ("tests/test_ssl.py -k linear_probe and simsiam",),
    ),
    Mutant(
        "an embedding collapse never warned of",
        "SelfSupervisedTask.collapse",
        "if std is None or not dim or std >= COLLAPSED_STD / math.sqrt(dim):",
        "if True:",
        ("tests/test_ssl.py -k moco_with_its_default",),
    ),
    Mutant(
        "a model directory's files made before it is checked",
        "model_directory",
        "taken = [name for name in files if (folder / name).exists()]",
        "taken = [name for name, make in files.items() if make() and (folder / name).exists()]",
        ("tests/test_deepliif.py -k plain_layout",),
    ),
    Mutant(
        "16-bit images clipped by PIL's conversion",
        "decode",
        "        if img.mode in WIDE_MODES:",
        "        if False:",
        ("tests/test_loader.py -k wider_than_8_bits",),
    ),
    Mutant(
        "floats scaled by an integer range",
        "eight_bit",
        'scale = 1.0 if array.dtype.kind == "f" else float(np.iinfo(array.dtype).max)',
        'scale = float(np.iinfo(np.uint16).max) if array.dtype.kind == "f" else float(np.iinfo(array.dtype).max)',
        ("tests/test_loader.py -k wider_than_8_bits",),
    ),
    Mutant(
        "VICReg's default learning rate Lightly's benchmark's",
        "SPECS@selfsupervised",
        '{"optimizer": "sgd", "lr": 0.03, "momentum": 0.9, "weight_decay": 5e-4}',
        '{"optimizer": "sgd", "lr": 0.06, "momentum": 0.9, "weight_decay": 5e-4}',
        ("tests/test_ssl.py -k vicreg_at_its_defaults",),
    ),
    Mutant(
        "one --mean value not given to every channel",
        "normalisation",
        "        if len(data.mean) == 1:",
        "        if False:",
        ("tests/test_train.py -k one_mean_and_std",),
    ),
    Mutant(
        "DeepLIIF's export lets TorchScript's warnings through",
        "traced_bytes",
        'warnings.simplefilter("ignore")  # TorchScript\'s deprecation (of trace and save) and tracer notes',
        "pass",
        ("tests/test_deepliif.py -k plain_layout",),
    ),
    Mutant(
        "a task option given as a flag and in --task-option",
        "build_config",
        "    if twice:  # which would",
        "    if False:  # which would",
        ("tests/test_bad_input.py -k task-option-and-its-flag",),
    ),
    Mutant(
        "--grad-accum fixed at a resume",
        "OptimOptions.grad_accum",
        'metavar="N", above=0,\n                             identity=False)',
        'metavar="N", above=0)',
        ("tests/test_resume.py -k grad_accum",),
    ),
    Mutant(
        "a resume's --grad-accum not the run's when not given",
        "TAKEN_BEYOND_IDENTITY",
        '"epochs", "batch_size", "grad_accum",',
        '"epochs", "batch_size",',
        ("tests/test_resume.py -k grad_accum",),
    ),
    Mutant(
        "scale's implausible efficiency not said",
        "verdict",
        "    if efficiency > IMPLAUSIBLE:",
        "    if False:",
        ("tests/test_scale.py -k not runs_the_world",),
    ),
    Mutant(
        "bad input every worker refused said once a rank",
        "_worker_failures",
        "    if code == EXIT_BAD_INPUT and all(",
        "    if False and all(",
        ("tests/test_bad_input.py -k launch-dataroot",),
    ),
    Mutant(
        "a config file's key beats a typed --task-option",
        "build_config",
        'merged["task_options"] = {**(merged.pop("task_options", None) or {}), **given}',
        'merged["task_options"] = {**(merged.get("task_options") or {}), **given}',
        ("tests/test_cli.py -k task_option_beats",),
    ),
    Mutant(
        "a config file's X: false named as --no-X",
        "_in_the_file",
        '    if name.startswith("no_") and name not in typed and name[3:] in (file_values or {}):',
        "    if False:",
        ("tests/test_cli.py -k task_option_beats",),
    ),
    Mutant(
        "a launch leaves its OMP_NUM_THREADS to its caller",
        "launch_environment",
        "        for name in added:\n            os.environ.pop(name, None)",
        "        for name in added[1:]:  # OMP_NUM_THREADS, wanted first, left set\n            os.environ.pop(name, None)",
        ("tests/test_bad_input.py -k launch-dataroot",),
    ),
    Mutant(
        "--clip-grad ignored",
        "TrainingStepContext.step_optimizer",
        "        clip_gradients(self.optimizers[name], scaler, self.optim)",
        "        pass",
        ("tests/test_equivalence.py -k clipped_gradients_and",),
    ),
    Mutant(
        "--clip-mode value clips the norm",
        "clip_gradients",
        '    if optim.clip_mode == "value":',
        "    if False:",
        ("tests/test_equivalence.py -k clipped_gradients_and",),
    ),
    Mutant(
        "FSDP clips each rank's shards by their own norm",
        "clip_gradients",
        "    torch.nn.utils.clip_grad_norm_(params, optim.clip_grad)",
        "    torch.nn.utils.clip_grads_with_norm_(params, optim.clip_grad, torch.nn.utils.get_total_norm(\n"
        "        [getattr(p.grad, '_local_tensor', p.grad) for p in params]))",
        ("tests/test_equivalence.py -k clipped_gradients_and",),
    ),
    Mutant(
        "gradients clipped per micro-batch",
        "TrainingStepContext.backward_loss",
        "            self.scalers[name].scale(scaled).backward()",
        "            self.scalers[name].scale(scaled).backward()\n            clip_gradients(self.optimizers[name], self.scalers[name], self.optim)",
        ("tests/test_equivalence.py -k clipped_gradients_and",),
    ),
    Mutant(
        "--no-norm-bias-decay decays the 1-D parameters",
        "without_decay_for_1d",
        '                              ([t for t in tensors if t.dim() <= 1], {"weight_decay": 0.0})):',
        "                              ([t for t in tensors if t.dim() <= 1], {})):",
        ("tests/test_equivalence.py -k clipped_gradients_and",),
    ),
    Mutant(
        "--nesterov ignored",
        "build_optimizer",
        "weight_decay=optim.weight_decay, nesterov=optim.nesterov)",
        "weight_decay=optim.weight_decay)",
        ("tests/test_equivalence.py -k clipped_gradients_and",),
    ),
    Mutant(
        "clipping the scaled gradient",
        "clip_gradients",
        "    scaler.unscale_(optimizer)",
        "    pass",
        ("tests/test_optim.py -k unscaled",),
    ),
    Mutant(
        "a resume forgets its --weights",
        "TAKEN_BEYOND_IDENTITY",
        '                         "weights")',
        "                         )",
        ("tests/test_resume.py -k fine_tune_resumed",),
    ),
    Mutant(
        "--min-lr ignored",
        "lr_factor",
        "        floor = min(schedule.min_lr / base_lr, 1.0)",
        "        floor = 0.0",
        ("tests/test_resume.py -k may_lower_the_learning_rate",),
    ),
    Mutant(
        "--min-lr read as a fraction of --lr",
        "lr_factor",
        "        floor = min(schedule.min_lr / base_lr, 1.0)",
        "        floor = min(schedule.min_lr, 1.0)",
        ("tests/test_resume.py -k may_lower_the_learning_rate",),
    ),
    Mutant(
        "Adam keeps the SGD task's rate",
        "defaults_of",
        "    return {**defaults, **optimizer_lr(defaults, given)}",
        "    return defaults",
        ("tests/test_newcomer.py -k reference_learning_rate",),
    ),
    Mutant(
        "an Adam task's own rate replaced too",
        "optimizer_lr",
        '(own in adaptive and "lr" in defaults):',
        "False:",
        ("tests/test_newcomer.py -k reference_learning_rate",),
    ),
    Mutant(
        "a checkpoint typed without --checkpoint: no hint",
        "checkpoint_hint",
        "    if not typed:\n        return None",
        "    if typed:\n        return None",
        ("tests/test_bad_input.py -k checkpoint-as-argument",),
    ),
    Mutant(
        "DINO's --head-norm ignored",
        "DINOTask.build_models",
        "o.output_dim, o.head_norm)",
        "o.output_dim)",
        ("tests/test_ssl.py -k linear_probe_beats and dino",),
    ),
    Mutant(
        "a resume compares an Adam run's rate with SGD's default",
        "saved_options",
        "        followed = registry.defaults_of(task, {**general, **taken})",
        "        followed = registry.defaults_of(task, general)",
        ("tests/test_resume.py -k may_lower_the_learning_rate",),
    ),
    Mutant(
        "--min-lr fixed at a resume",
        "TAKEN_BEYOND_IDENTITY",
        '"clip_mode", "min_lr",',
        '"clip_mode",',
        ("tests/test_resume.py -k may_lower_the_learning_rate",),
    ),
    Mutant(
        "predict --output - writes a file named -",
        "write_predictions",
        "    if output == STDOUT:\n        sys.stdout.write(text)",
        "    if False:\n        sys.stdout.write(text)",
        ("tests/test_inference.py -k predict_writes_every",),
    ),
    Mutant(
        "predict --output - says its count on stdout",
        "predict@predict",
        "file=sys.stderr if to_stdout else sys.stdout)",
        "file=sys.stdout)",
        ("tests/test_inference.py -k predict_writes_every",),
    ),
    Mutant(
        "SimCLR logs no embedding std (its collapse unsaid)",
        "SimCLRTask.loss_names",
        '    loss_names = ("loss", "embedding_std")\n',
        "",
        ("tests/test_ssl.py -k moco_with_its_default_head",),
    ),
    Mutant(
        "a collapse warning without its --head-norm hint",
        "SelfSupervisedTask.collapse",
        'if getattr(self.options, "head_norm", "") == "none" else ""',
        'if False else ""',
        ("tests/test_ssl.py -k moco_with_its_default_head",),
    ),
    Mutant(
        "FSDP shards on fully_shard's default mesh (the accelerator's)",
        "FSDPStrategy.wrap",
        "shard = _Sharding(mesh=self.mesh(), ",
        "shard = _Sharding(",
        ("tests/test_fsdp.py -k each_rank_holds_half",),
    ),
    Mutant(
        "one node keeps an older torchrun's port 29500",
        "run_workers",
        "    if plan.picks_port:\n        on_a_free_port(plan.args)",
        "    if False:\n        on_a_free_port(plan.args)",
        ("tests/test_trainlaunch.py -k older_torchrun",),
    ),
    Mutant(
        "a named --master-port takes a free one instead",
        "LaunchPlan.picks_port",
        '"--master", "--rdzv-endpoint"',
        '"--rdzv-endpoint"',
        ("tests/test_trainlaunch.py -k older_torchrun",),
    ),
    Mutant(
        "a taken port said as a wait to shorten",
        "_agent_failure",
        '    if "EADDRINUSE" in detail:',
        "    if False:",
        ("tests/test_trainlaunch.py -k rendezvous_that_fails",),
    ),
    Mutant(
        "torch 2.12's elastic rendezvous keeps the shared store",
        "store_sharing_fails_on_a_new_rank_0",
        "return version < (2, 13)",
        "return version < (2, 12)",
        ("tests/test_trainlaunch.py -k agents_shared_store",),
    ),
    Mutant(
        "the store-sharing variable left set after the launch",
        "launch_environment",
        "        for name in added:\n            os.environ.pop(name, None)",
        "        pass",
        ("tests/test_trainlaunch.py -k agents_shared_store",),
    ),
    Mutant(
        "a bare AssertionError of torchrun says not where",
        "_raised_at",
        'return f" at {frames[-1].filename',
        'return "" and f" at {frames[-1].filename',
        ("tests/test_trainlaunch.py -k agents_shared_store",),
    ),
    Mutant(
        "--sync-bn in one process unsaid",
        "option_warnings",
        "    if cfg.devices.sync_bn and world_size == 1:",
        "    if False:",
        ("tests/test_cli.py -k existing_run",),
    ),
    Mutant(
        "the dry run says not where --max-steps stops",
        "plan_report",
        "    if cfg.schedule.max_steps:\n        steps +=",
        "    if False:\n        steps +=",
        ("tests/test_cli.py -k existing_run",),
    ),
    Mutant(
        "trainlaunch's dry run says train's 'none (one process)'",
        "describe@launch.torchrun",
        "launcher_name(os.environ, workers_of_its_own=True)",
        "launcher_name(os.environ)",
        ("tests/test_trainlaunch.py -k dry_run_prints",),
    ),
    Mutant(
        "the dry run does not try --weights",
        "describe_checks",
        "    if stop is None and cfg.network.weights and resume is None:",
        "    if False:",
        ("tests/test_cli.py -k existing_run",),
    ),
    Mutant(
        "the dry run's --weights shows torch's meta-copy warnings",
        "weights_preview",
        '        warnings.filterwarnings("ignore", message=".*meta parameter in the current model")\n',
        "",
        ("tests/test_cli.py -k existing_run",),
    ),
    Mutant(
        "SwAV logs no embedding std (its collapse unsaid)",
        "SwAVTask.loss_names",
        '    loss_names = ("loss", "prototype_usage", "embedding_std")',
        '    loss_names = ("loss", "prototype_usage")',
        ("tests/test_ssl.py -k moco_with_its_default_head",),
    ),
    Mutant(
        "an image file read with the limit's allocation",
        "read_bounded",
        "        want = info.st_size + 1",
        "        want = MAX_FILE_BYTES + 1",
        ("tests/test_loader.py -k read_whole",),
    ),
    Mutant(
        "an image file read to its stated size only",
        "read_bounded",
        "            want = READ_ON_BYTES if total <= MAX_FILE_BYTES else 0",
        "            want = 0",
        ("tests/test_loader.py -k read_whole",),
    ),
    Mutant(
        "JPEGs decoded in colour whatever the mode",
        "_torchvision_jpeg",
        "lambda data, mode: op(data, modes[mode], False)",
        'lambda data, mode: op(data, modes["RGB"], False)',
        ("tests/test_loader.py -k pixel_for_pixel",),
    ),
    Mutant(
        "an image file over the limit read before it is refused",
        "read_bounded",
        "        if stat.S_ISREG(info.st_mode) and info.st_size > MAX_FILE_BYTES:",
        "        if False:",
        ("tests/test_loader.py -k read_whole",),
    ),
    # --- a DeepLIIF model directory against deepliif test
    Mutant(
        "DeepLIIF's tiles overlap an eighth",
        "overlap_of",
        "return tile // 16",
        "return tile // 8",
        ("tests/test_deepliif_model_dir.py -k pixel_for_pixel",),
    ),
    Mutant(
        "no tile is empty",
        "is_empty",
        "return not values.size or float(np.var(values)) < EMPTY_VARIANCE",
        "return False",
        ("tests/test_deepliif_model_dir.py -k pixel_for_pixel",),
    ),
    Mutant(
        "a directory's background colours ignored",
        "background_colors",
        'given = info.get("background_colors")',
        "given = None",
        ("tests/test_deepliif_model_dir.py -k pixel_for_pixel",),
    ),
    Mutant(
        "the released model's names not supplied",
        "_settings",
        'v["modalities_names"] = list(RELEASED_NAMES)',
        'v["modalities_names"] = ["input1", "mod1", "mod2", "mod3", "mod4"]',
        ("tests/test_deepliif_model_dir.py -k released_models_layout",),
    ),
    Mutant(
        "per-cell data without the marker",
        "CellCounter.predict_one",
        "data = cell_data(seg, marker, ",
        "data = cell_data(seg, None, ",
        ("tests/test_deepliif_model_dir.py -k compute_cell_results",),
    ),
    Mutant(
        "a train_opt value of the wrong kind a traceback",
        "values_read",
        "except (ValueError, TypeError, KeyError) as exc:",
        "except KeyError as exc:",
        ("tests/test_deepliif_model_dir.py -k bad_directories",),
    ),
    Mutant(
        "prepare-training-data's row weights clamped as its column weights",
        "resized",
        "top, bottom, b0, b1 = _weights(height, size, clamp_weight=False)",
        "top, bottom, b0, b1 = _weights(height, size, clamp_weight=True)",
        ("tests/test_deepliif_prepare.py -k deepliifs",),
    ),
    Mutant(
        "prepare-training-data replaces an existing file",
        "prepare_training_data@prepare",
        "existing = [p for p in places if p.exists()]",
        "existing = []",
        ("tests/test_deepliif_prepare.py -k mistake",),
    ),
    Mutant(
        "--weights DIR takes nothing from train_opt.txt",
        "_take_from_weights",
        "taken = {name: value for name, value in found.items() if name not in given}",
        "taken = {}",
        ("tests/test_deepliif_model_dir.py -k training_from_a_directory",),
    ),
    # --- DeepLIIFExt and SDG against DeepLIIF's own models
    Mutant(
        "deepliif-ext's segmentation generators take the segmentation's GAN mode",
        "DeepLIIFExtTask.training_step",
        'gan_loss(frozen[f"DS_{n}"](torch.cat([seen[i], seg], 1)), True, o.gan_mode)',
        'gan_loss(frozen[f"DS_{n}"](torch.cat([seen[i], seg], 1)), True, o.gan_mode_s)',
        ("tests/test_deepliif_models.py -k deepliif-ext",),
    ),
    Mutant(
        "deepliif-ext's segmentation discriminators see generated modalities",
        "DeepLIIFExtTask.training_step",
        "seen = [torch.cat([inputs, reals[0], reals[i]], 1) for i in range(m)]",
        "seen = [torch.cat([inputs, fakes[0].detach(), fakes[i].detach()], 1) for i in range(m)]",
        ("tests/test_deepliif_models.py -k deepliif-ext",),
    ),
    Mutant(
        "sdg drops the perceptual loss",
        "SDGTask.training_step",
        'g_total = g_total + (losses[f"G_GAN_{n}"] + losses[f"G_L1_{n}"] + losses[f"G_VGG_{n}"]) * w_g[i]',
        'g_total = g_total + (losses[f"G_GAN_{n}"] + losses[f"G_L1_{n}"]) * w_g[i]',
        ("tests/test_deepliif_models.py -k sdg",),
    ),
    Mutant(
        "sdg's generators see the first input panel alone",
        "SDGTask.split",
        "return torch.cat([first, *rest[:, :k].unbind(1)], 1), rest[:, k:]",
        "return torch.cat([first, first.flip(-1)][: k + 1], 1), rest[:, k:]",
        ("tests/test_deepliif_models.py -k sdg",),
    ),
    Mutant(
        "deepliif-kd leaves out --kd-weight",
        "DeepLIIFKDTask.distillation",
        "total = total + share * self.options.kd_weight",
        "total = total + share",
        ("tests/test_deepliif_models.py -k distilled",),
    ),
    Mutant(
        "deepliif-kd takes each rank's softmax, not the batch's",
        "batch_kl",
        "everyone, start = ctx.all_gather(student.flatten(1))\n    theirs, _ = ctx.all_gather(teacher.flatten(1))",
        "(everyone, start), theirs = (student.flatten(1), 0), teacher.flatten(1)",
        ("tests/test_deepliif_models.py -k distilled",),
    ),
    Mutant(
        "deepliif-kd's teacher weighs its segmentation as its file says",
        "DeepLIIFKDTask.load_teacher",
        'trained_from(folder, False, {}, {"seg_weights": tuple([1 / (m + 1)] * (m + 1))}, OPTION)',
        "trained_from(folder, False, {}, {}, OPTION)",
        ("tests/test_deepliif_models.py -k distilled",),
    ),
    Mutant(
        "sdg's predict takes its input panels in reverse order",
        "NetworkFilesInference.predictor",
        "return torch.cat(scaled.split(width, dim=-1), 0)",
        "return torch.cat(scaled.split(width, dim=-1)[::-1], 0)",
        ("tests/test_deepliif_models.py -k sdg",),
    ),
    Mutant(
        "cyclegan ignores --label-smoothing",
        "CycleGANTask.gan",
        "if real and self.options.label_smoothing:",
        "if False:",
        ("tests/test_deepliif_models.py -k cyclegan",),
    ),
    Mutant(
        "cyclegan's B -> A perceptual loss compares with B",
        "CycleGANTask.training_step",
        "self.perceptual(fake_a[i], real_a)",
        "self.perceptual(fake_a[i], real_b[i])",
        ("tests/test_deepliif_models.py -k cyclegan",),
    ),
    Mutant(
        "cyclegan's discriminators judge the pool's images as real",
        "CycleGANTask.training_step",
        "self.gan(models[d](pooled), False)",
        "self.gan(models[d](pooled), True)",
        ("tests/test_deepliif_models.py -k cyclegan",),
    ),
    Mutant(
        "cyclegan pairs A's image i with B's image i whatever its count",
        "UnpairedImages.pick",
        "folder[index % len(folder)] if draw is None",
        "folder[min(index, len(folder) - 1)] if draw is None",
        ("tests/test_deepliif_models.py -k cyclegan",),
    ),
]


def copy_repository(copy: Path, ref: str | None) -> None:
    """The working tree (or commit ``ref``) without environments, caches and results."""
    if ref is None:
        shutil.copytree(
            REPO,
            copy,
            ignore=shutil.ignore_patterns(".venv*", ".git", "checkpoints", "__pycache__", "results", ".pytest_cache"),
        )
        return
    copy.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(copy)], input=archive, check=True)


def run_mutant(mutant: Mutant, python: str, ref: str | None) -> tuple[bool, float, str]:
    """(caught, seconds, the last lines of pytest's output)."""
    with tempfile.TemporaryDirectory(prefix="phalanx-mutant-") as tmp:
        copy = Path(tmp) / "repo"
        copy_repository(copy, ref)
        try:
            changed, mutated = resolve(mutant, *definitions(copy))
        except Unresolved as problem:
            raise SystemExit(f"mutant {mutant.name!r}: {problem}; update scripts/mutants.py") from None
        (copy / changed).write_text(mutated)
        env = {**os.environ, "PYTHONPATH": str(copy)}  # every process the tests start imports the copy
        started, caught, output = time.monotonic(), False, ""
        for test in mutant.tests:
            path, _, words = test.partition(" -k ")
            argv = [python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--timeout", "300", path]
            done = subprocess.run(
                argv + (["-k", words] if words else []), cwd=copy, env=env, capture_output=True, text=True
            )
            output = "\n".join((done.stdout + done.stderr).strip().splitlines()[-3:])
            if done.returncode == 5:
                raise SystemExit(f"mutant {mutant.name!r}: {test} selects no test; update scripts/mutants.py")
            if done.returncode != 0:
                caught = True
                break
        return caught, time.monotonic() - started, output


def check(mutants: list[Mutant], ref: str | None) -> int:
    """Resolve every mutant, run nothing; say each one that does not resolve."""
    with tempfile.TemporaryDirectory(prefix="phalanx-mutant-") as tmp:
        root = REPO
        if ref is not None:
            root = Path(tmp) / "repo"
            copy_repository(root, ref)
        found, texts = definitions(root)
        problems = []
        for mutant in mutants:
            try:
                resolve(mutant, found, texts)
            except Unresolved as problem:
                problems.append(f"{mutant.name!r}: {problem}")
    for problem in problems:
        print(problem)
    print(
        f"{len(mutants) - len(problems)} of {len(mutants)} mutants resolve"
        + (f"; {len(problems)} do not: update scripts/mutants.py" if problems else "")
    )
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="run the mutants whose name contains this (or one of A|B|C)")
    parser.add_argument("--list", action="store_true", help="list the mutants and their tests")
    parser.add_argument("--check", action="store_true", help="resolve every mutant's target and text, run no test")
    parser.add_argument("--ref", help="mutate this commit (git archive) instead of the working tree")
    opts = parser.parse_args()
    chosen = [m for m in MUTANTS if not opts.only or any(part in m.name for part in opts.only.split("|"))]
    if opts.list:
        for m in chosen:
            print(f"{m.name}: {m.target}  ->  {', '.join(m.tests)}")
        return 0
    if opts.check:
        return check(chosen, opts.ref)
    survived = []
    for index, mutant in enumerate(chosen, start=1):
        caught, seconds, output = run_mutant(mutant, sys.executable, opts.ref)
        print(
            f"[{index}/{len(chosen)}] {'caught  ' if caught else 'SURVIVED'} {mutant.name} ({seconds:.0f} s)",
            flush=True,
        )
        if not caught:
            survived.append(mutant.name)
            print("    " + output.replace("\n", "\n    "), flush=True)
    print(
        f"\n{len(chosen) - len(survived)} of {len(chosen)} mutants caught"
        + (f"; survived: {', '.join(survived)}" if survived else "")
    )
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())

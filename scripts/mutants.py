"""Deliberate bugs, and the test that must catch each one (run by hand, not in CI).

    .venv/bin/python scripts/mutants.py                 # every mutant, about 25 minutes on 2 cores
    .venv/bin/python scripts/mutants.py --only rank     # those whose name contains "rank"
    .venv/bin/python scripts/mutants.py --list
    .venv/bin/python scripts/mutants.py --ref HEAD      # a commit, not the working tree (keep editing)

Each mutant changes one line of phalanx/ in a throwaway copy of the repository and runs the named
tests there (every process they start imports the copy). A mutant that passes its tests survived:
the suite cannot see that bug. The README's development section gives the current score; the
target is that none survives.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EQUIV = "tests/test_equivalence.py"
RELIABILITY = "tests/test_reliability.py"
LAUNCH = "tests/test_trainlaunch.py"
TASKS = "tests/test_tasks.py"


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # a file of phalanx/
    before: str  # an exact fragment of one line, found once
    after: str
    tests: tuple[str, ...]  # pytest node ids or -k expressions ("file::name", "file -k words")


MUTANTS = [
    # --- the five that passed their named tests before (issue 17)
    Mutant("no reshuffle between epochs", "phalanx/trainer.py", "epoch_order(total, self.cfg.seed, epoch)",
           "epoch_order(total, self.cfg.seed, 1)", (f"{EQUIV} -k float64_ddp_one_process",)),
    Mutant("metrics trimmed by epoch at resume", "phalanx/rundir.py",
           'if (r.get("step", 0) <= last_step if r.get("kind") == "train" else r.get("epoch", 0) <= last_epoch)]',
           'if r.get("epoch", 0) <= last_epoch]', (f"{RELIABILITY} -k preempted_train",)),
    Mutant("DDP device count forced to 1", "phalanx/devices.py",
           'mode, devices, world, sharing = "ddp", (device,), env.world_size, env.world_size',
           'mode, devices, world, sharing = "ddp", (device,), env.world_size, 1', (f"{EQUIV} -k float64_ddp_one_process",)),
    Mutant("autocast never applied", "phalanx/context.py", "        if self.amp_dtype is None:",
           "        if True:", ("tests/test_train.py -k autocast",)),
    Mutant("plain-data check removed from the loader", "phalanx/snapshots.py",
           "    _check_plain(segment)\n    if not isinstance(segment, dict)", "    if not isinstance(segment, dict)",
           ("tests/test_snapshots.py -k plain_data_check",)),
    # --- DDP
    Mutant("rank shares overlap", "phalanx/sampling.py", "order[micro_start + rank:micro_end:world_size]",
           "order[micro_start:micro_end:world_size]", ("tests/test_resume.py -k 2-workers-then-1",)),
    Mutant("loss not scaled by the world size", "phalanx/sampling.py", "return world_size / self.step_samples",
           "return 1 / self.step_samples", (f"{EQUIV} -k float64_ddp_one_process",)),
    Mutant("gradient sync on every micro-batch", "phalanx/trainer.py",
           "            stack.enter_context(self.strategy.no_sync(model))", "            pass",
           (f"{EQUIV} -k accumulation",)),
    Mutant("logged loss from rank 0 only", "phalanx/train_losses.py",
           "strategy.all_reduce_sum(torch.cat([self.window, riders])).tolist()", "torch.cat([self.window, riders]).tolist()",
           (f"{LAUNCH} -k mean_over", "tests/test_tasks.py -k named_losses")),
    Mutant("divergence check blind", "phalanx/rank_buffers.py", "    return worst.item()", "    return 0.0",
           (f"{LAUNCH} -k diverge",)),
    Mutant("every rank draws rank 0's stream", "phalanx/trainer.py",
           'derive_seed(self.cfg.seed, "train", self.rank, epoch, micro.start)',
           'derive_seed(self.cfg.seed, "train", 0, epoch, micro.start)', (f"{RELIABILITY} -k one_worker",)),
    Mutant("validation shards overlap", "phalanx/sampling.py", "self.indices = range(rank, length, world_size)",
           "self.indices = range(0, length, world_size)", (f"{LAUNCH} -k as_written",)),
    Mutant("a stop request is not agreed between ranks", "phalanx/train_losses.py",
           "sums, count, stops, summed = reduced[:size - 1], reduced[size - 1], reduced[size], reduced[size + 1:]",
           "sums, count, stops, summed = reduced[:size - 1], reduced[size - 1], float(stopping), reduced[size + 1:]",
           (f"{RELIABILITY} -k one_worker",)),
    Mutant("loss not scaled by the world size, seen in float32", "phalanx/sampling.py",
           "return world_size / self.step_samples", "return 1 / self.step_samples", (f"{EQUIV} -k float32",)),
    # --- the task API
    Mutant("gather without the backward all-reduce", "phalanx/gather_rows.py",
           "            dist.all_reduce(padded)\n", "            pass\n", (f"{TASKS} -k all_gather",)),
    Mutant("a second optimizer not checkpointed", "phalanx/run_state.py",
           '"optimizers": {name: opt.state_dict() for name, opt in self.optimizers.items()},',
           '"optimizers": {name: opt.state_dict() for name, opt in self.optimizers.items() '
           'if name == self.task.primary_model},', (f"{TASKS} -k resumes_mid_epoch",)),
    Mutant("task state not restored", "phalanx/run_state.py",
           '        self.task.load_state_dict(state.get("task_state") or {})', "        pass",
           (f"{TASKS} -k task_state",)),
    Mutant("SimCLR's negatives from this rank only under DDP", "phalanx/tasks/simclr.py",
           "        if self.options.gather:\n            all1, all2, start = gather_views(ctx, z1, z2)",
           "        if False:\n            all1, all2, start = gather_views(ctx, z1, z2)", ("tests/test_ssl_family.py -k padding and simclr",)),
    Mutant("SimCLR's gather without the backward all-reduce", "phalanx/gather_rows.py",
           "            dist.all_reduce(padded)\n", "            pass\n", ("tests/test_ssl_family.py -k padding and simclr",)),
    Mutant("BYOL's momentum teacher a copy of the student", "phalanx/tasks/byol.py",
           '        ema_update(models["teacher"], nn.Sequential(models["backbone"], models["projector"]), decay)',
           '        ema_update(models["teacher"], nn.Sequential(models["backbone"], models["projector"]), 0.0)',
           ("tests/test_ssl.py -k byol_resumes",)),
    Mutant("an old checkpoint's momentum dropped by the upgrade", "phalanx/checkpoint.py",
           '"optimizers": {"model": state["optimizer"]}', '"optimizers": {"model": {**state["optimizer"], "state": {}}}',
           (f"{TASKS} -k old_checkpoint_resumes",)),
    Mutant("networks (BYOL's teacher among them) validate in train mode", "phalanx/validation.py",
           "        for model in models.values():\n            model.eval()\n        evaluation = self.task.evaluate(",
           "        evaluation = self.task.evaluate(",
           ("tests/test_ssl.py -k last_batch_of_one_image",)),
    Mutant("mAP of rank 0's shard only", "phalanx/tasks/detect.py",
           'everything = ctx.all_gather_objects([("image", i) for i in seen] + [("box", r) for r in results])',
           'everything = [("image", i) for i in seen] + [("box", r) for r in results]',
           ("tests/test_dense.py -k any_world_size",)),
    Mutant("images without boxes dropped", "phalanx/data/coco.py",
           '    images = [image for image in images if image["file_name"] not in bad]',
           '    images = [image for image in images if image["file_name"] not in bad and boxes[image["id"]]]',
           ("tests/test_dense.py -k any_world_size",)),
    Mutant("validation sums not all-reduced", "phalanx/tasks/base.py",
           "        return self.validation_metrics(ctx.all_reduce_sums(sums))",
           "        return self.validation_metrics(sums)", ("tests/test_dense.py -k segmenter_learns",)),
    Mutant("the generator's step reaches the discriminator's weights", "phalanx/context.py",
           "            param.requires_grad_(False)", "            pass", (f"{TASKS} -k hand_written",)),
    Mutant("predict --features writes the logits", "phalanx/tasks/classify_inference.py",
           "        return backbone_of(self.models[self.task.primary_model])[0], images",
           "        return self.models[self.task.primary_model], images",
           ("tests/test_inference.py -k features",)),
    Mutant("a detector's --weights loaded into a copy", "phalanx/tasks/detect.py",
           'return [load_weights(models["detector"], spec, [c["name"] for c in self.categories])]',
           'return [load_weights(copy.deepcopy(models["detector"]), spec, [c["name"] for c in self.categories])]',
           ("tests/test_dense.py -k pretrained",)),
    # --- resume and checkpoints
    Mutant("mid-epoch position not restored", "phalanx/checkpointing.py",
           'self.epoch, self.step, self.position = state["epoch"], state["step"], state["position"]',
           'self.epoch, self.step, self.position = state["epoch"], state["step"], 0',
           ("tests/test_resume.py -k 1-then-2",)),
    Mutant("epoch loss sums not restored", "phalanx/train_losses.py",
           '[float(sums["losses"].get(name, 0.0)) for name in self.names] + [float(sums["samples"])]',
           '[0.0] * (len(self.names) + 1)', (f"{RELIABILITY} -k preempted_train",)),
    Mutant("best.pt follows the latest epoch", "phalanx/best.py",
           "if self.value is None or (value > self.value if self.mode == \"max\" else value < self.value):",
           "if True:", ("tests/test_train.py -k best_pt",)),
    Mutant("checkpoints saved with module. prefixes", "phalanx/trainer.py",
           "self.parts = RunState(self.bare_models,", "self.parts = RunState(lambda: self.models,",
           ("tests/test_resume.py -k 2-workers-then-1",)),
    Mutant("write in place, no rename", "phalanx/atomic.py", "    tmp = path.with_name(f\".{path.name}.tmp-{os.getpid()}\")",
           "    tmp = path", (f"{RELIABILITY} -k sigkill_while_saving",)),
    Mutant("the schedule ignores --epochs changes", "phalanx/optim.py", "        span = schedule.epochs - warmup",
           "        span = 2 - warmup", ("tests/test_resume.py -k longer_cosine",)),
    Mutant("a fused step reads a gradient of another layout as the parameter's", "phalanx/optim.py",
           "                param.grad = torch.empty_like(param).copy_(grad)", "                pass",
           ("tests/test_optim.py -k another_layout",)),
    Mutant("optimizers never fused", "phalanx/optim.py", "    return make(fused=True) if fusable else make()",
           "    return make()", ("tests/test_optim.py -k another_layout",)),
    Mutant("fused SGD meets a parameter without a momentum buffer", "phalanx/optim.py",
           '            if group.get("momentum") and optimizer.state[param].get("momentum_buffer") is None:',
           "            if False:", ("tests/test_optim.py -k late",)),
    Mutant("a resumed optimizer's momentum kept in the checkpoint's layout", "phalanx/optim.py",
           "                    state[key] = torch.empty_like(param).copy_(value)", "                    pass",
           ("tests/test_optim.py -k switches_channels_last",)),
    Mutant("a resumed optimizer takes the checkpoint's implementation", "phalanx/run_state.py",
           "            keep_implementation(optimizer)", "            pass",
           ("tests/test_fsdp.py::test_fsdp_trains_what_the_hand_written_loop_does_and_resumes_at_another_world_size_or_preempted",)),
    # --- snapshots
    Mutant("segments never sealed", "phalanx/snapshots.py", '"sealed": len(chunk) == SEGMENT_RECORDS,',
           '"sealed": False,', ("tests/test_snapshots.py -k sealed_segments",)),
    Mutant("readers mix generations", "phalanx/snapshots.py",
           "by_index = {s[\"segment\"]: s for s in segments if s[\"generation\"] == newest}",
           "by_index = {s[\"segment\"]: s for s in segments}", ("tests/test_snapshots.py -k incomplete_generation",)),
    Mutant("no budget on nested data", "phalanx/snapshots.py", "        budget -= 1\n", "\n",
           ("tests/test_snapshots.py -k bomb",)),
    # --- launch
    Mutant("a worker's exit code is not passed on", "phalanx/launch.py",
           "MEANINGFUL = (EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_TERMINATED)", "MEANINGFUL = ()",
           (f"{RELIABILITY} -k one_worker",)),
    Mutant("a restart keeps --overwrite", "phalanx/run.py", 'return cfg.replace(resume="auto", overwrite=False)',
           'return cfg.replace(resume="auto")', (f"{LAUNCH} -k worker_killed",)),
    Mutant("workers outlive a killed launcher", "phalanx/worker.py", "    die_with_parent(os.getppid())",
           "    pass", (f"{LAUNCH} -k sigkill",)),
    # --- schedulers
    Mutant("a batch script taken for an srun task", "phalanx/cluster.py",
           'if "SLURM_STEP_ID" in env and "SLURM_PROCID" in env:', 'if "SLURM_PROCID" in env:',
           ("tests/test_cluster.py -k wins",)),
    Mutant("mpirun loses to SLURM's inherited variables", "phalanx/cluster.py", '    if "OMPI_COMM_WORLD_RANK" in env:',
           "    if False:", ("tests/test_cluster.py -k wins",)),
    # --- data and recipes
    Mutant("the manifest checks every file again", "phalanx/data/manifest.py",
           "if isinstance(entry, list) and len(entry) == 3 and entry[:2] == [size, mtime]:", "if False:",
           ("tests/test_loader.py -k manifest",)),
    Mutant("the same augmentation every epoch", "phalanx/data/__init__.py",
           'image, label = self.raw[index]\n        # torch\'s CPU generator only (augmentation runs on the CPU): a loader '
           'worker\'s stream,\n        # or the training process\'s, reseeded for this sample.\n        '
           'torch.default_generator.manual_seed(derive_seed(self.seed, "augment", epoch, index))',
           'image, label = self.raw[index]\n        torch.default_generator.manual_seed(derive_seed(self.seed, "augment", '
           '1, index))', ("tests/test_recipes.py -k seeded_per_sample",)),
    Mutant("frozen BatchNorm statistics still move", "phalanx/finetune.py", "            norm.eval()",
           "            pass", ("tests/test_recipes.py -k fine_tuning",)),
    Mutant("the EMA starts over at resume", "phalanx/run_state.py",
           'ema.module.load_state_dict(saved_ema.get(name) or bare[name].state_dict())',
           'ema.module.load_state_dict(bare[name].state_dict())', ("tests/test_recipes.py -k ema",)),
    Mutant("a head trained on other classes is kept", "phalanx/finetune.py",
           "            and not (other_classes and k.startswith(head))}", "            }",
           ("tests/test_recipes.py -k other_classes",)),
    Mutant("a diverging run trains on", "phalanx/train_losses.py", "        if bad:\n",
           "        if False:\n", ("tests/test_train.py -k non_finite",)),
    Mutant("MixUp and CutMix silently off", "phalanx/tasks/classify.py",
           "    if not options.mixup_alpha and not options.cutmix_alpha:", "    if True:",
           ("tests/test_recipes.py -k mixing",)),
    Mutant("random erasing silently off", "phalanx/data/transforms.py", "    if random_erasing > 0:",
           "    if False:", ("tests/test_recipes.py -k mixing",)),
    Mutant("--num-workers ignored", "phalanx/data/__init__.py",
           '    if num_workers != "auto":\n        return int(num_workers)', "",
           ("tests/test_train.py -k loader_worker",)),
    Mutant("loader workers not shared between local processes", "phalanx/data/__init__.py",
           "available_cores() // max(1, local_processes) - training_threads", "available_cores() - training_threads",
           ("tests/test_loader.py -k num_workers_auto",)),
    Mutant("channels-last never reaches the model", "phalanx/context.py",
           "            if self.channels_last and batch.dim() == 4 and batch.is_floating_point():",
           "            if False:", ("tests/test_recipes.py -k channels_last",)),
    # --- input pipeline
    Mutant("visualize's stop signal an Exception a health check swallows", "phalanx/visualize/__init__.py",
           "class _Signalled(BaseException):", "class _Signalled(Exception):",
           ("tests/test_security.py -k health_check", "tests/test_visualize_robust.py -k stop_signal_while")),
    Mutant("generated images not bounded by memory", "phalanx/data/sources.py", "    if nbytes > limit:",
           "    if False:", ("tests/test_cli.py -k dry_run_allocates",)),
    Mutant("the evaluation resize rounds instead of timm's floor", "phalanx/data/transforms.py",
           "return math.floor(self.size / self.crop_pct)", "return round(self.size / self.crop_pct)",
           ("tests/test_recipes.py -k torchvisions_resize",)),
    Mutant("a crop above the resized image is not padded", "phalanx/data/transforms.py",
           "if self.crop > min(h, w):", "if False:", ("tests/test_recipes.py -k torchvisions_resize",)),
    Mutant("the evaluation crop fraction unbounded below", "phalanx/config_checks.py",
           "cfg.data.val_crop_pct == 0 or 0.5 <= cfg.data.val_crop_pct <= 1.25", "0 <= cfg.data.val_crop_pct <= 1.25",
           ("tests/test_recipes.py -k crop_fraction_outside",)),
    Mutant("grayscale folders read as RGB", "phalanx/data/sources.py",
           'channels is None and _grayscale(root / "train")', "False",
           ("tests/test_train.py -k image_folder_of_png",)),
    Mutant("JPEGs reduced to 1/8 scale", "phalanx/data/images.py",
           "img.draft(mode, (img.size[0] // DRAFT_REDUCTION, img.size[1] // DRAFT_REDUCTION))",
           "img.draft(mode, (img.size[0] // 8, img.size[1] // 8))",
           ("tests/test_loader.py -k within_tolerance",)),
    # --- visualize
    Mutant("a symlink out of the pickle dir is followed", "phalanx/visualize/sources.py",
           "        if not real.is_relative_to(self.root):", "        if False:", ("tests/test_visualize.py -k hostile",)),
    Mutant("a FIFO is read", "phalanx/visualize/sources.py", "            if not stat.S_ISREG(info.st_mode):",
           "            if False:", ("tests/test_visualize.py -k hostile",)),
    # --- the self-supervised family
    Mutant("MoCo's keys enqueued in rank order", "phalanx/tasks/moco.py", "keys = ctx.all_gather_in_order(key)",
           "keys = ctx.all_gather(key)[0]", ("tests/test_ssl_family.py -k padding and moco",)),
    Mutant("MoCo's keys enqueued before the loss", "phalanx/tasks/moco.py",
           "        loss = self.info_nce(query, key)\n        keys = ctx.all_gather_in_order(key)"
           "  # the batch's keys, as one process would hold them\n        self.enqueue(keys)\n",
           "        keys = ctx.all_gather_in_order(key)\n        self.enqueue(keys)\n"
           "        loss = self.info_nce(query, key)\n", ("tests/test_ssl_family.py -k moco_step",)),
    Mutant("DINO's teacher given the local crops", "phalanx/tasks/dino.py",
           'teacher = [ctx.models["teacher"](view) for view in views[:2]]',
           'teacher = [ctx.models["teacher"](view) for view in views]', ("tests/test_ssl_family.py -k teacher_sees",)),
    Mutant("MoCo's queue not checkpointed", "phalanx/tasks/moco.py",
           'return {"queue": self.queue.detach().cpu().clone(), "queue_at": self.queue_at}', "return {}",
           ("tests/test_ssl_family.py -k resumed_mid_epoch and moco",)),
    Mutant("DINO's centre not checkpointed", "phalanx/tasks/dino.py",
           'return {"center": self.center.detach().cpu().clone()}', "return {}",
           ("tests/test_ssl_family.py -k resumed_mid_epoch and dino",)),
    Mutant("DINO's centre from this rank's rows alone", "phalanx/tasks/dino.py",
           'return ctx.all_reduce_sums_later({"sum": rows.sum((0, 1)), "count": count}, move)',
           'return move({"sum": rows.sum((0, 1)).double(), "count": count.double()})',
           ("tests/test_ssl_family.py -k padding and dino",)),
    Mutant("DINO's last layer trains in its frozen epochs", "phalanx/tasks/dino.py",
           "        if ctx.epoch <= self.options.freeze_last_layer:", "        if False:",
           ("tests/test_ssl_family.py -k padding and dino",)),
    Mutant("a padding rank's SimCLR loss skips the gather", "phalanx/tasks/simclr.py",
           'return {"loss": (all1.sum() + all2.sum()) * 0.0}', 'return {"loss": (z1.sum() + z2.sum()) * 0.0}',
           ("tests/test_ssl_family.py -k padding and simclr",)),
    Mutant("Barlow Twins and VICReg on each rank's own batch", "phalanx/tasks/decorrelation.py",
           "        if self.options.gather:  # every rank's rows", "        if False:  # every rank's rows",
           ("tests/test_ssl_family.py -k padding and barlowtwins",)),
    Mutant("SwAV's codes from this rank's scores alone", "phalanx/tasks/swav.py",
           "everyone, start = ctx.all_gather(score.detach())", "everyone, start = score.detach(), 0",
           ("tests/test_ssl_family.py -k padding and swav",)),
    Mutant("SwAV's prototypes train in their frozen epochs", "phalanx/tasks/swav.py",
           "        if ctx.epoch <= self.options.freeze_prototypes:", "        if False:",
           ("tests/test_ssl_family.py -k padding and swav",)),
    Mutant("SimSiam's stop-gradient dropped", "phalanx/tasks/simsiam.py", "cosine(p1, z2.detach(), dim=1)",
           "cosine(p1, z2, dim=1)", ("tests/test_ssl_family.py -k one_process_with",)),
    Mutant("--val-every skips the last epoch", "phalanx/trainer.py",
           "validate = epoch % self.cfg.output.val_every == 0 or epoch == self.cfg.schedule.epochs",
           "validate = epoch % self.cfg.output.val_every == 0", ("tests/test_train_guards.py -k val_every",)),
    Mutant("the step-time breakdown loses the loader's wait", "phalanx/step_times.py",
           "        self.window[PARTS.index(part)] += now - self.mark",
           "        self.window[PARTS.index(part)] += 0.0 if part == \"data\" else now - self.mark",
           ("tests/test_train_guards.py -k step_time",)),
    # --- the contract: declarations, config sections, window kinds
    Mutant("translate declares its first target's names only", "phalanx/tasks/translate.py",
           'primary_model=self.net("generator", 0),', 'primary_model="generator",',
           ("tests/test_contract.py -k declaration_follows",)),
    Mutant("a config's replace drops the changes", "phalanx/config.py",
           "return RunConfig.flat(**{**self.to_dict(), **changes})", "return RunConfig.flat(**self.to_dict())",
           ("tests/test_contract.py -k frozen_sections",)),
    Mutant("a pane's window drawn beside the kind's default", "phalanx/windows.py",
           "and kind.record not in covered for d in kind.defaults]", "for d in kind.defaults]",
           ("tests/test_visualize_robust.py -k names_its_window_kind",)),
    # --- --task deepliif against DeepLIIF's own model
    Mutant("deepliif drops the input's segmentation weight", "phalanx/tasks/deepliif.py",
           "for k, part in enumerate(parts)]).sum(0)]", "for k, part in enumerate(parts) if k]).sum(0)]",
           ("tests/test_deepliif.py -k plain_layout",)),
    Mutant("deepliif drops the first modality's VGG term", "phalanx/tasks/deepliif.py",
           '+ losses[f"G_VGG_{i + 1}"]) * w_g[i]', '+ (losses[f"G_VGG_{i + 1}"] if i else 0)) * w_g[i]',
           ("tests/test_deepliif.py -k one_process_and_two_ddp",)),
    Mutant("deepliif's segmentation discriminators see the input for every source", "phalanx/tasks/deepliif.py",
           "sources = [inputs] + reals[:m]", "sources = [inputs] * (m + 1)",
           ("tests/test_deepliif.py -k one_process_and_two_ddp",)),
    Mutant("deepliif's biases before InstanceNorm train", "phalanx/tasks/deepliif_nets.py",
           "layer.bias.requires_grad_(False)", "layer.bias.requires_grad_(True)",
           ("tests/test_deepliif.py -k one_process_and_two_ddp",)),
    Mutant("a released DeepLIIF model's G51 read as GS1", "phalanx/tasks/deepliif_files.py",
           'return f"{kind}S{int(source) - first}"', 'return f"{kind}S{(int(source) - first + 1) % (modalities + 1)}"',
           ("tests/test_deepliif.py -k released",)),
    Mutant("DeepLIIF's noise threshold off by one", "phalanx/tasks/deepliif_cells.py",
           "found = (sizes > noise_thresh)", "found = (sizes >= noise_thresh)",
           ("tests/test_deepliif.py -k cell_counts_and",)),
    Mutant("DeepLIIF's cells 4-connected", "phalanx/tasks/deepliif_cells.py",
           "structure=np.ones((3, 3), dtype=bool))", "structure=None)", ("tests/test_deepliif.py -k cell_counts_and",)),
    Mutant("DeepLIIF's size threshold from every region, noise included", "phalanx/tasks/deepliif_cells.py",
           'size_thresh = default_size_thresh(found["size"], resolution)',
           'size_thresh = default_size_thresh(cells(seg, marker, seg_thresh, 0)["size"], resolution)',
           ("tests/test_deepliif.py -k cell_counts_and",)),
    Mutant("DeepLIIF's networks predict with BatchNorm's running statistics", "phalanx/tasks/deepliif.py",
           "with batch_statistics(models[name] for name in self.generator_names()):", "with contextlib.nullcontext():",
           ("tests/test_deepliif.py -k each_images_statistics",)),
    Mutant("a serialized DeepLIIF network without running statistics refused", "phalanx/tasks/deepliif_files.py",
           'if path.suffix == ".pt":  # `deepliif serialize`', 'if False:  # `deepliif serialize`',
           ("tests/test_deepliif.py -k released",)),
    Mutant("a slide's blocks never joined to the band above", "phalanx/tasks/deepliif_slide_cells.py",
           "if top > 0:  # the band above", "if False:  # the band above", ("tests/test_deepliif.py -k block_by_block",)),
    Mutant("a slide's cells not joined diagonally across block borders", "phalanx/tasks/deepliif_slide_cells.py",
           "shifts = (-1, 0, 1) if self.eight else (0,)", "shifts = (0,)", ("tests/test_deepliif.py -k block_by_block",)),
    Mutant("a slide's bottom edge not the slide's edge", "phalanx/tasks/deepliif_slide_cells.py",
           "edges += [labels[-1]] if top", "edges += [] if top", ("tests/test_deepliif.py -k block_by_block",)),
    Mutant("a slide's outlines drawn without the pixels around each block", "phalanx/tasks/deepliif_slide_cells.py",
           "OUTLINE_REACH = 3", "OUTLINE_REACH = 0", ("tests/test_deepliif.py -k block_by_block",)),
    Mutant("a slide's regions predicted without the tiles that start before them", "phalanx/tasks/translate_inference.py",
           "before = (-(-size // stride) - 1) * stride", "before = 0", ("tests/test_deepliif.py -k plain_layout",)),
    Mutant("a slide's regions predicted without the tiles' overlap after them", "phalanx/tasks/translate_inference.py",
           "else min(total, end + overlap)", "else end", ("tests/test_deepliif.py -k plain_layout",)),
    Mutant("a slide's last regions predicted without the whole image's last tile", "phalanx/tasks/translate_inference.py",
           "return total if total - size < end else", "return total if False else", ("tests/test_deepliif.py -k plain_layout",)),
    # --- --strategy fsdp
    Mutant("fsdp leaves the weights outside the blocks whole on every rank", "phalanx/sharded.py",
           "        fully_shard(model, reshard_after_forward=self.reshard_after_forward, mp_policy=policy)\n", "        pass\n",
           ("tests/test_fsdp.py -k holds_half",)),
    Mutant("fsdp saves rank 0's shard for the whole network", "phalanx/sharded.py",
           "whole = state.full_tensor()", "whole = state.to_local()", ("tests/test_fsdp.py -k holds_half",)),
    Mutant("fsdp loads a checkpoint's optimizer state without cutting it into shards", "phalanx/sharded.py",
           "return {**saved, \"state\": state}", "return saved", ("tests/test_fsdp.py -k resumes_at_another",)),
    Mutant("fsdp keeps in-place activations", "phalanx/sharded.py", "module.inplace = False", "pass",
           ("tests/test_translate.py -k float64",)),
    Mutant("a sharded resume leaves the optimizer state fresh", "phalanx/sharded_checkpoint.py",
           'if any(f"optimizers.{name}.state.{fqn}.{key}" in stored for key in values)}', "if False}",
           ("tests/test_fsdp.py -k resumes_at_another",)),
    Mutant("shards named by a checkpoint are removed", "phalanx/sharded_checkpoint.py",
           "named.add(state[\"sharded\"].split(\"/\")[-1])", "pass", ("tests/test_fsdp.py -k resumes_at_another",)),
    Mutant("shards no checkpoint names are kept", "phalanx/sharded_checkpoint.py",
           "if directory.name != WRITING and directory.name not in named:", "if False:",
           ("tests/test_fsdp.py -k resumes_at_another",)),
    Mutant("consolidate numbers an optimizer's parameters per group", "phalanx/sharded_checkpoint.py",
           "numbers = [index.setdefault(name, len(index)) for name in group[\"params\"]]",
           "numbers = list(range(len(group[\"params\"])))", ("tests/test_fsdp.py -k resumes_at_another",)),
    Mutant("fsdp averages bf16 gradients in bf16", "phalanx/sharded.py", "reduce_dtype=torch.float32", "reduce_dtype=None",
           ("tests/test_fsdp.py -k holds_half",)),
    Mutant("fsdp ignores --no-reshard-after-forward", "phalanx/sharded.py",
           "fully_shard(block, reshard_after_forward=self.reshard_after_forward,", "fully_shard(block,",
           ("tests/test_fsdp.py -k holds_half",)),
    Mutant("activation checkpointing updates BatchNorm's statistics twice", "phalanx/blocks.py",
           "            buffer.detach().copy_(value)", "            pass", ("tests/test_fsdp.py -k activation",)),
    Mutant("activation checkpointing forgets the random draws", "phalanx/blocks.py",
           "checkpoint(block, context_fn=", "checkpoint(block, preserve_rng_state=False, context_fn=",
           ("tests/test_fsdp.py -k activation",)),
    Mutant("scale's speedup over the first point, not the 1-worker one", "phalanx/scale.py",
           "base = next(p for p in points if p.scaling == point.scaling and p.workers == 1)", "base = points[-1]",
           ("tests/test_scale.py -k own_records",)),
    Mutant("scale counts the warm-up", "phalanx/scale.py", 'windows = [r for r in train if r["step"] > warmup]',
           "windows = train", ("tests/test_scale.py -k own_records",)),
    Mutant("scale's strong scaling keeps the batch per worker", "phalanx/scale.py",
           'cfg.optim.batch_size if scaling == "weak" else cfg.optim.batch_size // w', "cfg.optim.batch_size",
           ("tests/test_scale.py -k touches_no_run",)),
    Mutant("--max-steps saves no checkpoint mid-epoch", "phalanx/trainer.py",
           "                self._write_checkpoint([self.cfg.run_dir / checkpoint.LATEST])\n                break",
           "                break", ("tests/test_scale.py -k max_steps",)),
    Mutant("a run's loader workers left to the garbage collector", "phalanx/run.py",
           "            close_loaders(trainer.train_loader, trainer.val_loader)", "            pass",
           ("tests/test_train.py -k loader_worker",)),
    Mutant("the dry run's memory counts one Adam moment", "phalanx/memory_plan.py",
           'if cfg.optim.optimizer in ("adam", "adamw"):\n        return 2', 'if cfg.optim.optimizer in ("adam", "adamw"):\n        return 1',
           ("tests/test_fsdp.py -k dry_run",)),
    Mutant("checkpoints written on the training thread", "phalanx/checkpoint_writer.py",
           "self.thread.start()", "self.thread.run()", ("tests/test_reliability.py -k holds_its_own_moment",)),
    Mutant("SwAV's queue never joins the codes", "phalanx/tasks/swav.py",
           "if not length or epoch < self.options.queue_start_epoch or self.queued < length:", "if True:",
           ("tests/test_ssl_family.py -k swavs_queue",)),
    Mutant("SwAV's queue keeps the oldest features", "phalanx/tasks/swav.py",
           "torch.cat([new, self.queue.to(new)], dim=1)", "torch.cat([self.queue.to(new), new], dim=1)",
           ("tests/test_ssl_family.py -k swavs_queue",)),
    Mutant("SwAV's queue filled with this rank's features only", "phalanx/tasks/swav.py",
           "self.enqueue([ctx.all_gather_in_order(f.detach()) for f in features[:2]])",
           "self.enqueue([f.detach() for f in features[:2]])",
           ("tests/test_ssl_family.py -k padding_sample and swav",)),
    Mutant("a slide's thin last region read without the whole image's last tile", "phalanx/tasks/translate_inference.py",
           "return max(0, min(begin - before, (total - size) // stride * stride))", "return max(0, begin - before)",
           ("tests/test_deepliif.py -k plain_layout",)),
    Mutant("a text window unescaped", "phalanx/windows.py", "{escape(record['text'][:100_000])}",
           "{record['text'][:100_000]}", ("tests/test_visualize_robust.py -k names_its_window_kind",)),
    Mutant("a resume takes nothing of its run", "phalanx/resume_options.py", "saved = from_mapping(_saved_config(given[\"resume\"], general)",
           "saved = from_mapping(None", ("tests/test_resume.py -k leaves_out",)),
    Mutant("a resume takes the identity options only", "phalanx/resume_options.py",
           "and (FIELDS[name].metadata[\"identity\"] or name in TAKEN_BEYOND_IDENTITY)}",
           "and FIELDS[name].metadata[\"identity\"]}", ("tests/test_resume.py -k leaves_out",)),
    Mutant("a resume takes the run's values that equal this command line's", "phalanx/resume_options.py",
           "and value != alone[name]", "and True", ("tests/test_resume.py -k leaves_out",)),
    Mutant("a finished run's resume rewrites the run", "phalanx/run.py",
           "if state[\"epoch\"] >= cfg.schedule.epochs and not state[\"position\"]:", "if False:",
           ("tests/test_resume.py -k leaves_out",)),
    Mutant("a detector is let train under DataParallel", "phalanx/devices.py",
           "if mode == \"dataparallel\" and task.data_parallel_refused:", "if False:",
           ("tests/test_dense.py -k refuses_dataparallel",)),
    Mutant("a typed --task drops the --config file's task: section", "phalanx/cliopts.py",
           "merged[name] = {**file_values[\"task\"], \"name\": value}", "merged[name] = value",
           ("tests/test_newcomer.py -k config_file_errors",)),
    Mutant("a checkpoint by path continues over another run", "phalanx/rundir.py",
           "        if not cfg.overwrite:\n            _check_not_another_run(run_dir, resume)", "        pass",
           ("tests/test_resume.py -k never_continues",)),
    Mutant("a resume at its --max-steps trains and rewrites the run", "phalanx/run.py",
           "if limit and state[\"step\"] >= limit:", "if False:", ("tests/test_scale.py -k max_steps",)),
    Mutant("windows escape nothing", "phalanx/windows.py", "    return html.escape(text)", "    return text",
           ("tests/test_visualize_robust.py -k names_its_window_kind",)),
    # --- --sync-bn on CPU workers (GlobalBatchNorm)
    Mutant("sync-bn counts a padding sample's rows", "phalanx/sync_norm.py", "counted = 0.0 if _padding else 1.0",
           "counted = 1.0", (f"{LAUNCH} -k gloo_ranks",)),
    Mutant("sync-bn's variance from this rank's rows", "phalanx/sync_norm.py",
           "var = _all_reduce((centred * centred).sum(dims) * counted) / count",
           "var = (centred * centred).mean(dims)", (f"{LAUNCH} -k gloo_ranks",)),
    Mutant("sync-bn's backward keeps each rank's own gradient", "phalanx/sync_norm.py",
           "return _summed_over_ranks(grad)", "return grad", (f"{LAUNCH} -k gloo_ranks",)),
    Mutant("sync-bn's statistics summed in bf16", "phalanx/sync_norm.py",
           "values = x.to(torch.promote_types(x.dtype, torch.float32))", "values = x", (f"{LAUNCH} -k gloo_ranks",)),
    Mutant("sync-bn's running variance biased", "phalanx/sync_norm.py",
           "unbiased = var * count / (count - 1).clamp_min(1)", "unbiased = var", (f"{LAUNCH} -k gloo_ranks",)),
    Mutant("SimSiam's monitor from this rank's rows alone", "phalanx/tasks/decorrelation.py",
           'return ctx.all_reduce_sums_later({**sums, "count": torch.tensor(float(rows))}, spread)',
           'return spread({**sums, "count": torch.tensor(float(rows), dtype=torch.float64)})',
           ("tests/test_ssl_family.py -k padding and simsiam",)),
    Mutant("the second view's rows not gathered", "phalanx/tasks/ssl.py",
           "return both[:, :z1.shape[1]], both[:, z1.shape[1]:], start", "return both[:, :z1.shape[1]], z2, start",
           ("tests/test_ssl_family.py -k padding and simclr",)),
    Mutant("rank 0's buffers never broadcast after a step", "phalanx/parallel.py",
           "broadcast_from_rank0(models, self.clock)  # every network's, a momentum teacher's too", "pass", (f"{LAUNCH} -k late_in_backward",)),
    Mutant("the gradient all-reduce's wait after backward not counted", "phalanx/context.py",
           ", self.strategy.clock.backward(micro.ends_step):", ":",
           (f"{LAUNCH} -k late_in_backward",)),
    Mutant("the trainer never marks a padding micro-batch", "phalanx/trainer.py",
           "        stack.enter_context(self.strategy.padding(not micro.real))\n", "",
           (f"{LAUNCH} -k cpu_workers_trains",)),
    Mutant("the fp16 range hint given in every precision", "phalanx/divergence.py", 'if precision == "fp16" else "")',
           'if precision else "")', ("tests/test_train.py -k diverg",)),
    Mutant("the probe's norm frozen with the backbone", "phalanx/finetune.py",
           "isinstance(m, nn.modules.batchnorm._NormBase) and not isinstance(m, ProbeNorm)",
           "isinstance(m, nn.modules.batchnorm._NormBase)", ("tests/test_ssl.py -k dinos_backbone",)),
    Mutant("features taken after the probe's norm", "phalanx/finetune.py", "isinstance(parent[0], ProbeNorm)",
           "False", ("tests/test_inference.py -k probes_norm",)),
    Mutant("augmented training reads images normalised in place", "phalanx/data/__init__.py",
           "in_place=augmented is None)", "in_place=True)", ("tests/test_loader.py -k in_memory",)),
    Mutant("the in-place split moves rows in the wrong order", "phalanx/data/sources.py",
           "order = torch.tensor(train_idx, dtype=torch.long)", "order = torch.tensor(train_idx, dtype=torch.long).flip(0)",
           ("tests/test_loader.py -k hold_out",)),
    Mutant("the probe's norm trains on a batch of one row", "phalanx/finetune.py",
           "if self.training and len(rows) < 2:", "if False:", ("tests/test_inference.py -k probes_norm_takes",)),
    Mutant("scale's srun steps started one task each", "phalanx/scale.py",
           "*srun_placement(point.workers, slurm_tasks_per_node(env))", "*srun_placement(1, slurm_tasks_per_node(env))",
           ("tests/test_cluster.py -k srun_step",)),
    Mutant("every srun step of a job rendezvouses at one port", "phalanx/cluster.py",
           '(_int(env, "SLURM_JOB_ID") + STEP_PORT_STRIDE * _int(env, "SLURM_STEP_ID", 0)) % 20000',
           '_int(env, "SLURM_JOB_ID") % 20000', ("tests/test_cluster.py -k placed_from",)),
    Mutant("scale ignores the allocation's task count", "phalanx/scale.py", "if tasks is not None and max(workers) > tasks:",
           "if False:", ("tests/test_cluster.py -k plans_its_sizes",)),
    Mutant("small JPEGs decoded at reduced scale", "phalanx/data/images.py",
           "min(size) >= max(DRAFT_REDUCTION * min_side, DRAFT_MIN_SIDE)", "min(size) >= DRAFT_REDUCTION * min_side",
           ("tests/test_loader.py -k fast_jpeg",)),
    Mutant("a last training batch of one image reaches BatchNorm1d", "phalanx/run.py",
           'refuse_single_rows(cfg, len(data.train), models, strategy.world_size, resume.state["position"] if resume else 0,\n'
           "                           len(strategy.plan.devices))", "None", ("tests/test_train_guards.py -k batchnorm1d",)),
    Mutant("a resume's first epoch at another world size not checked for single rows", "phalanx/run.py",
           'strategy.world_size, resume.state["position"] if resume else 0,', "strategy.world_size, 0,",
           ("tests/test_train_guards.py -k batchnorm1d",)),
    Mutant("DataParallel's split not checked for single rows in a dry run", "phalanx/run.py",
           'if resume else 0, replicas)', "if resume else 0)", ("tests/test_train_guards.py -k batchnorm1d",)),
    Mutant("DataParallel's smallest piece taken as an even split", "phalanx/single_rows.py",
           "return rows - piece * (-(-rows // piece) - 1)", "return rows // replicas",
           ("tests/test_train_guards.py -k dataparallels_smallest",)),
    Mutant("evaluate's header line left to each task", "phalanx/inference/evaluate.py",
           """print(f"{results['checkpoint']} on {results['data']}\\n{inference.results_table(results)}")""",
           "print(inference.results_table(results))", ("tests/test_tasks.py -k trains_from_its_own_folder",)),
    Mutant("an elastic restart with nothing left to train leaves the run's last status failed", "phalanx/run.py",
           "if done and not elastic_restart_count():", "if done:", ("tests/test_resume.py -k leaves_out_from_the_run",)),
    Mutant("the manifest's check sized by the machine's cores, not the process's", "phalanx/data/manifest.py",
           "    cores = available_cores()", "    cores = os.cpu_count() or 1",
           ("tests/test_loader.py -k fewer_cores",)),
    Mutant("a PatchGAN's last layers given 2 pixels", "phalanx/tasks/translate_nets.py", "    if left >= 3:",
           "    if left >= 2:", ("tests/test_translate.py -k discriminator_check",)),
    Mutant("translate's discriminator not checked against the image size", "phalanx/tasks/translate.py",
           "        check_discriminator(self.options.d_layers, size)\n", "", ("tests/test_bad_input.py -k discriminator",)),
    Mutant("a task's shared options left under the heading of the task declaring them first", "phalanx/cliopts.py",
           'section = tasks.BUILTIN[task].heading if param.name in own else getattr(param, "section", GENERAL)',
           'section = getattr(param, "section", GENERAL)', ("tests/test_newcomer.py -k named_tasks_defaults",)),
    Mutant("no warning where every labelled image votes in the kNN accuracy", "phalanx/tasks/ssl.py",
           "    if not voters or k < voters:", "    if True:", ("tests/test_ssl.py -k last_batch_of_one_image",)),
    Mutant("a probe of a phalanx checkpoint normalised otherwise says nothing", "phalanx/finetune.py",
           "    if own is None or run is None or _close(own, run):", "    if True:", ("tests/test_ssl.py -k label_free_folder",)),
    Mutant("a dry run that found the run directory would stop the run exits 0", "phalanx/cli.py",
           "            raise stop  # the plan printed", "            pass  # the plan printed",
           ("tests/test_cli.py -k dry_run_says",)),
    Mutant("a dry run's resume names the epoch before a mid-epoch checkpoint", "phalanx/run.py",
           "    if state[\"position\"]:\n", "    if False:\n", ("tests/test_cli.py -k dry_run_says",)),
    Mutant("--task bogus --help shows the general page", "phalanx/cliopts.py",
           "            tasks.check_name(named)  # `--task bogus --help`", "            pass  # `--task bogus --help`",
           ("tests/test_newcomer.py -k named_tasks_defaults",)),
    Mutant("evaluate's --knn-k taken and ignored", "phalanx/inference/model.py",
           "        cfg = cfg.replace(task_options={**cfg.task_options, **task_changes})", "        pass",
           ("tests/test_ssl.py -k last_batch_of_one_image",)),
    Mutant("a DataParallel resume's refusal suggests more processes", "phalanx/single_rows.py",
           "        if resumed_rest:  # one process", "        if False:  # one process",
           ("tests/test_train_guards.py -k names_what_can_change",)),
    Mutant("the rest of a resumed epoch not counted", "phalanx/single_rows.py",
           "return min(whole, self.rows(train_samples - start, batch)) if 0 < start < train_samples else whole",
           "return whole", ("tests/test_train_guards.py -k batchnorm1d",)),
    Mutant("a padding sample counted as no row", "phalanx/sampling.py",
           "return max(1, last_micro_batch(num_samples, batch_size, world_size) // world_size)",
           "return last_micro_batch(num_samples, batch_size, world_size) // world_size",
           ("tests/test_train_guards.py -k smallest_share",)),
    Mutant("a key of a --config file's task: section not located", "phalanx/config_file.py",
           'lines.update({f"task.{k.value}": k.start_mark.line + 1 for k, _ in value.value})', "pass",
           ("tests/test_newcomer.py -k config_file_errors",)),
    Mutant("predict takes another task's option silently", "phalanx/inference/predict.py",
           "if name in typed and name not in read]", "if False]",
           ("tests/test_bad_input.py -k another and tasks and option",)),
    Mutant("a user module not found says not where phalanx looked", "phalanx/plugins.py",
           'if isinstance(exc, ModuleNotFoundError) and exc.name == top else ""', 'if False else ""',
           ("tests/test_bad_input.py -k model and module and missing",)),
    Mutant("a failed run in process leaves the caller's stop signals held", "phalanx/cli.py",
           "        restore_signal_mask(mask)", "        pass", (f"{RELIABILITY} -k gives_the_caller_back",)),
    # --- the self-supervised views made a batch at a time
    Mutant("the views' hue turned the other way", "phalanx/tasks/view_batch.py", "% 1.0 + shift[:, None, None]) % 1.0",
           "% 1.0 - shift[:, None, None]) % 1.0", ("tests/test_view_batch.py",)),
    Mutant("contrast blends with the batch's mean", "phalanx/tasks/view_batch.py", "mean = (rows.sum(-1) / gray[0].numel())",
           "mean = (rows.sum(-1).mean() / gray[0].numel()).expand(len(gray))", ("tests/test_view_batch.py",)),
    Mutant("colour jitter in one fixed order", "phalanx/tasks/view_batch.py", "chosen = (params[:, ORDER.start + position] == step).nonzero()",
           "chosen = (params[:, JITTER] * (step == position) > 0).nonzero()", ("tests/test_view_batch.py",)),
    Mutant("every view blurred with the first view's sigma", "phalanx/tasks/view_batch.py", "(taps[None] / params[:, SIGMA, None]) ** 2",
           "(taps[None] / params[:1, SIGMA, None]) ** 2", ("tests/test_view_batch.py",)),
    Mutant("a tall image's centre crop of the wrong height", "phalanx/tasks/view_batch.py", "(width, int(round(width * 4 / 3))) if ratio < 3 / 4",
           "(width, int(round(width * 3 / 4))) if ratio < 3 / 4", ("tests/test_view_batch.py",)),
    Mutant("flips drawn but not made", "phalanx/tasks/view_batch.py", "    return views.flip(-1)", "    return views", ("tests/test_view_batch.py",)),
    Mutant("crops never reach the bottom or right edge", "phalanx/tasks/view_batch.py",
           "top, left = int(u_top * (height - h + 1)), int(u_left * (width - w + 1))",
           "top, left = int(u_top * (height - h)), int(u_left * (width - w))", ("tests/test_view_batch.py",)),
    Mutant("contrast's mean one float32 sum a view", "phalanx/tasks/view_batch.py",
           "rows = gray.reshape(len(gray), -1, gray.shape[-1]).double().sum(-1)",
           "rows = gray.reshape(len(gray), 1, -1).sum(-1)", ("tests/test_view_batch.py",)),
    Mutant("the jitter's factors drawn over half their range", "phalanx/tasks/view_batch.py",
           "params[JITTER:HUE + 1] = [1.0, 0.6 + 0.8 * b, 0.6 + 0.8 * c, 0.6 + 0.8 * s if colour else 1.0,",
           "params[JITTER:HUE + 1] = [1.0, 0.8 + 0.4 * b, 0.6 + 0.8 * c, 0.8 + 0.4 * s if colour else 1.0,",
           ("tests/test_view_batch.py",)),
    Mutant("larger 8-bit views made a batch at a time too", "phalanx/tasks/views.py",
           "if image.dtype == torch.uint8 and max(recipe.size for recipe, _ in self.groups) > SMALL:", "if False:",
           ("tests/test_view_batch.py",)),
    Mutant("every view made from the batch's first image", "phalanx/tasks/views.py",
           "crops = torch.cat([torch.stack([item.crops[group][view] for item in items])",
           "crops = torch.cat([torch.stack([items[0].crops[group][view] for item in items])", ("tests/test_view_batch.py",)),
]


def copy_repository(copy: Path, ref: str | None) -> None:
    """The working tree (or commit ``ref``) without environments, caches and results."""
    if ref is None:
        shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(".venv*", ".git", "checkpoints", "__pycache__",
                                                                   "results", ".pytest_cache"))
        return
    copy.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(copy)], input=archive, check=True)


def run_mutant(mutant: Mutant, python: str, ref: str | None) -> tuple[bool, float, str]:
    """(caught, seconds, the last lines of pytest's output)."""
    with tempfile.TemporaryDirectory(prefix="phalanx-mutant-") as tmp:
        copy = Path(tmp) / "repo"
        copy_repository(copy, ref)
        target = copy / mutant.path
        text = target.read_text()
        if text.count(mutant.before) != 1:
            raise SystemExit(f"mutant {mutant.name!r}: {mutant.before!r} is in {mutant.path} "
                             f"{text.count(mutant.before)} times, not once; update scripts/mutants.py")
        target.write_text(text.replace(mutant.before, mutant.after))
        env = {**os.environ, "PYTHONPATH": str(copy)}  # every process the tests start imports the copy
        started, caught, output = time.monotonic(), False, ""
        for test in mutant.tests:
            path, _, words = test.partition(" -k ")
            argv = [python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--timeout", "300", path]
            done = subprocess.run(argv + (["-k", words] if words else []), cwd=copy, env=env,
                                  capture_output=True, text=True)
            output = "\n".join((done.stdout + done.stderr).strip().splitlines()[-3:])
            if done.returncode == 5:
                raise SystemExit(f"mutant {mutant.name!r}: {test} selects no test; update scripts/mutants.py")
            if done.returncode != 0:
                caught = True
                break
        return caught, time.monotonic() - started, output


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="run the mutants whose name contains this (or one of A|B|C)")
    parser.add_argument("--list", action="store_true", help="list the mutants and their tests")
    parser.add_argument("--ref", help="mutate this commit (git archive) instead of the working tree")
    opts = parser.parse_args()
    chosen = [m for m in MUTANTS if not opts.only or any(part in m.name for part in opts.only.split("|"))]
    if opts.list:
        for m in chosen:
            print(f"{m.name}: {m.path}  ->  {', '.join(m.tests)}")
        return 0
    survived = []
    for index, mutant in enumerate(chosen, start=1):
        caught, seconds, output = run_mutant(mutant, sys.executable, opts.ref)
        print(f"[{index}/{len(chosen)}] {'caught  ' if caught else 'SURVIVED'} {mutant.name} ({seconds:.0f} s)",
              flush=True)
        if not caught:
            survived.append(mutant.name)
            print("    " + output.replace("\n", "\n    "), flush=True)
    print(f"\n{len(chosen) - len(survived)} of {len(chosen)} mutants caught"
          + (f"; survived: {', '.join(survived)}" if survived else ""))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())

"""The task contract's seams (issue 36): only ``phalanx/tasks/`` and the registry know which tasks
exist; each task's inference lives apart from its training; the task API lists what it exports."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "phalanx"
# A word spelled as a task's name with another meaning, where it is meant so.
OTHER_MEANINGS = {
    ("records/snapshots.py", "segment"): "a part of a run's snapshot history",
    ("visualize/sources.py", "segment"): "a part of a run's snapshot history",
    ("config/sections.py", "deepliif"): "the DeepLIIF project, whose --remote flag phalanx accepts",
    ("config/inference.py", "deepliif"): "the DeepLIIF project, whose test command's options predict mirrors",
    ("config/__init__.py", "deepliif"): "the DeepLIIF project, whose directories --weights reads",
}
# The registry lists the task folders by name: a new built-in task is its folder and one line there.
REGISTRY = "config/registry.py"


def builtin_task_names() -> set[str]:
    from phalanx.config.registry import BUILTIN

    return set(BUILTIN)


def words_in_code(path: Path) -> list[tuple[int, str]]:
    """(line, word) of every identifier part and every word of a string in the module's code:
    docstrings and comments are prose and are left out."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found += [(node.lineno, word.lower()) for word in re.findall(r"[A-Za-z0-9]+", node.value)]
        names = (
            [node.id]
            if isinstance(node, ast.Name)
            else [node.attr]
            if isinstance(node, ast.Attribute)
            else [node.name]
            if isinstance(node, (ast.FunctionDef, ast.ClassDef))
            else [a.asname or a.name for a in node.names]
            if isinstance(node, ast.ImportFrom)
            else []
        )
        found += [(node.lineno, part.lower()) for name in names for part in name.split("_")]
    return found


def test_no_module_outside_tasks_names_a_built_in_task():
    names = builtin_task_names()
    assert names >= {"classify", "translate", "simclr", "byol", "detect", "segment"}
    leaks = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith("tasks/") or relative == REGISTRY:
            continue
        leaks += [
            f"phalanx/{relative}:{line}: {word}"
            for line, word in words_in_code(path)
            if word in names and (relative, word) not in OTHER_MEANINGS
        ]
    assert not leaks, "\n".join(leaks)


def test_the_check_sees_a_task_name_in_a_string_and_in_a_name_but_not_in_prose(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('"""A module for classify."""\n# translate\nif task != "detect":\n    CLASSIFY_PANES = 1\n')
    assert [w for _, w in words_in_code(planted) if w in builtin_task_names()] == ["detect", "classify"]


def test_each_task_names_its_inference_and_no_task_module_holds_a_predict_loop():
    from phalanx.config.registry import BUILTIN, task_class
    from phalanx.tasks.inference import Inference, inference_class

    for name in BUILTIN:
        named = inference_class(task_class(name))
        assert issubclass(named, Inference) and named is not Inference, name
    # The loop over the inputs is inference.predict's alone: a task module that batches input
    # files or shows a progress bar has copied it.
    for path in sorted((PACKAGE / "tasks").rglob("*.py")):
        text = path.read_text()
        assert "ProgressBar(" not in text and "collate_inputs" not in text, path.name


def test_every_hook_of_the_task_contract_is_typed_and_none_with_any():
    import inspect

    from phalanx.tasks.base import Task
    from phalanx.tasks.inference import Inference

    for cls in (Task, Inference):
        for name, member in vars(cls).items():
            function = getattr(member, "__func__", member)
            if not inspect.isfunction(function):
                continue
            parameters = [p for p in inspect.signature(function).parameters.values() if p.name not in ("self", "cls")]
            assert all(p.annotation is not inspect.Parameter.empty for p in parameters), (cls.__name__, name)
            assert not any("Any" in str(p.annotation) for p in parameters), (cls.__name__, name)
    assert "Any" not in (PACKAGE / "tasks" / "base.py").read_text()


DECLARED = (
    "loss_names",
    "metrics",
    "primary_model",
    "best_metric",
    "ema_models",
    "metric_labels",
    "manual_optimization",
    "find_unused_parameters",
)


def assignments_to_declarations(text: str) -> list[str]:
    """``self.<declaration> = ...`` anywhere in ``text``: a declaration changed on the instance."""
    found = []
    for node in ast.walk(ast.parse(text)):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, (ast.AugAssign, ast.AnnAssign))
            else []
        )
        found += [
            f"{node.lineno}: self.{t.attr}"
            for t in targets
            if isinstance(t, ast.Attribute)
            and isinstance(t.value, ast.Name)
            and t.value.id == "self"
            and t.attr in DECLARED
        ]
    return found


def test_declarations_are_made_once_and_never_changed_on_the_instance():
    # translate set loss_names/primary_model/ema_models in build_data, ssl best_metric, detect
    # loss_names in build_models: what the trainer read depended on the order of the calls.
    paths = [
        *sorted((PACKAGE / "tasks").glob("*.py")),
        *sorted((REPO / "examples").rglob("*.py")),
        REPO / "tests" / "support" / "phalanx_testtasks.py",
    ]
    changed = [f"{path.name}:{line}" for path in paths for line in assignments_to_declarations(path.read_text())]
    assert not changed, changed
    assert assignments_to_declarations("class T:\n    def build_data(self):\n        self.loss_names = ('a',)\n")


def test_a_declaration_follows_the_data_and_is_frozen(tmp_path):
    import dataclasses

    import pytest
    import torch

    from phalanx.config import from_mapping
    from phalanx.config.registry import task_class
    from phalanx.tasks.base import Declaration

    root = tmp_path / "pairs" / "train"
    root.mkdir(parents=True)
    from PIL import Image

    for i in range(4):  # input | target 1 | target 2, side by side
        Image.fromarray((torch.rand(8, 24, 3) * 255).to(torch.uint8).numpy()).save(root / f"{i}.png")
    task = task_class("translate")(
        from_mapping(
            {
                "task": "translate",
                "dataroot": str(tmp_path / "pairs"),
                "image_size": 8,
                "generator": "unet_8",
                "d_layers": 1,
            },
            "test",
        )
    )
    class_view = (task.primary_model, task.loss_names)
    declared = task.declare(task.build_data(), {})
    assert declared.primary_model == "generator1" and declared.ema_models == ("generator1", "generator2")
    assert declared.loss_names[:4] == ("G_GAN_1", "G_L1_1", "D_real_1", "D_fake_1") and len(declared.loss_names) == 8
    assert {"L1_2", "PSNR_2"} <= set(declared.metrics)
    assert (task.primary_model, task.loss_names) == class_view  # the class's declarations as they were
    with pytest.raises(dataclasses.FrozenInstanceError):
        declared.loss_names = ()  # type: ignore[misc]
    with pytest.raises(TypeError):
        declared.metric_labels["L1"] = "x"  # type: ignore[index]
    assert isinstance(declared, Declaration)


def test_the_config_is_frozen_sections_that_read_and_write_flat_as_before():
    import dataclasses

    import pytest
    import torch

    from phalanx.config import FIELDS, RunConfig, from_mapping
    from phalanx.data import sources, transforms
    from phalanx.distributed import devices
    from phalanx.errors import PhalanxError
    from phalanx.train import optim

    # The flat configuration of a format-2 checkpoint (before tasks and sections): read into
    # sections, written back flat, every key as it was.
    old = torch.load(REPO / "tests" / "fixtures" / "v2" / "latest.pt", weights_only=True)["config"]
    cfg = from_mapping(old, "test")
    assert cfg.optim.lr == old["lr"] and cfg.schedule.epochs == old["epochs"] == 1 and cfg.optim.batch_size == 64
    general = {
        k: list(v) if isinstance(v, tuple) else v
        for k, v in old.items()
        if k in FIELDS and k not in ("dataroot", "task_options")
    }
    assert cfg.to_dict().keys() == FIELDS.keys() and {k: cfg.to_dict()[k] for k in general} == general
    assert cfg.task_options["label_smoothing"] == old["label_smoothing"] == 0.1  # a task's option, then flat
    assert RunConfig.flat(**cfg.to_dict()) == cfg == RunConfig.from_json(cfg.to_json())
    assert cfg.replace(lr=0.5, epochs=2).optim.lr == 0.5 and cfg.replace(epochs=2).schedule.epochs == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.optim.lr = 1.0  # type: ignore[misc]
    with pytest.raises(PhalanxError, match="--weight-decay: expected a finite number"):
        cfg.replace(weight_decay=float("inf"))  # a section checks its own fields when it is made
    # Helpers take the section they read, not the whole run.
    for helper, section in (
        (optim.lr_factor, "ScheduleOptions"),
        (optim.build_optimizer, "OptimOptions"),
        (transforms.resolve, "DataOptions"),
        (transforms.normalisation, "DataOptions"),
        (transforms.build, "DataOptions"),
        (sources.load, "DataOptions"),
        (devices.local_rank_device, "DeviceOptions"),
    ):
        annotations = [str(a) for a in helper.__annotations__.values()]
        assert section in annotations and "RunConfig" not in " ".join(annotations), helper.__name__


def test_the_task_api_lists_what_it_exports_and_each_name_imports():
    import phalanx.tasks as api

    assert sorted(api.__all__) == sorted(api._WHERE) and dir(api) == api.__all__
    for name in api.__all__:
        assert getattr(api, name) is not None, name

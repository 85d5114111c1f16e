"""The task contract's seams (issue 36): only ``phalanx/tasks/`` knows which tasks exist; the
modules stay small; each task's inference lives apart from its training."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "phalanx"
# A word spelled as a task's name with another meaning, where it is meant so.
OTHER_MEANINGS = {("snapshots.py", "segment"): "a part of a run's snapshot history",
                  ("visualize/sources.py", "segment"): "a part of a run's snapshot history"}


def builtin_task_names() -> set[str]:
    from phalanx.tasks import BUILTIN

    return set(BUILTIN)


def words_in_code(path: Path) -> list[tuple[int, str]]:
    """(line, word) of every identifier part and every word of a string in the module's code:
    docstrings and comments are prose and are left out."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found += [(node.lineno, word.lower()) for word in re.findall(r"[A-Za-z0-9]+", node.value)]
        names = [node.id] if isinstance(node, ast.Name) else [node.attr] if isinstance(node, ast.Attribute) else \
            [node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else \
            [a.asname or a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []
        found += [(node.lineno, part.lower()) for name in names for part in name.split("_")]
    return found


def test_no_module_outside_tasks_names_a_built_in_task():
    names = builtin_task_names()
    assert names >= {"classify", "translate", "simclr", "byol", "detect", "segment"}
    leaks = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith("tasks/"):
            continue
        leaks += [f"phalanx/{relative}:{line}: {word}" for line, word in words_in_code(path)
                  if word in names and (relative, word) not in OTHER_MEANINGS]
    assert not leaks, "\n".join(leaks)


def test_the_check_sees_a_task_name_in_a_string_and_in_a_name_but_not_in_prose(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('"""A module for classify."""\n# translate\nif task != "detect":\n    CLASSIFY_PANES = 1\n')
    assert [w for _, w in words_in_code(planted) if w in builtin_task_names()] == ["detect", "classify"]


def test_no_module_over_300_lines_and_no_function_over_50():
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > 300:
            long.append(f"{path.relative_to(REPO)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 50:
                long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not long, "\n".join(long)


def test_each_task_names_its_inference_and_no_task_module_holds_a_predict_loop():
    from phalanx.tasks import BUILTIN, task_class
    from phalanx.tasks.inference import Inference

    for name in BUILTIN:
        cls = task_class(name)
        assert issubclass(cls.Inference, Inference) and cls.Inference is not Inference, name
    # The loop over the inputs is inference.predict's alone: a task module that batches input
    # files or shows a progress bar has copied it.
    for path in sorted((PACKAGE / "tasks").glob("*.py")):
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

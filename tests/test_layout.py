"""The package's layout holds (issue 65): imports flow one way through the layers ``setup.cfg``
declares (import-linter, imports inside functions and under TYPE_CHECKING counted), no module
imports itself back through others, few modules sit at the top, and a new built-in task is its
folder and one line of the registry."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from conftest import REPO

PACKAGE = REPO / "phalanx"


def test_the_import_contracts_hold():
    lint = shutil.which("lint-imports", path=os.path.dirname(sys.executable))
    assert lint, "import-linter is a test dependency (scripts/setup.sh --test installs it)"
    done = subprocess.run(
        [lint, "--no-logo", "--no-cache", str(REPO / "setup.cfg")],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0 and "0 broken" in done.stdout, done.stdout + done.stderr


def test_the_task_folders_the_contracts_keep_apart_are_the_registrys():
    """A new task folder is in the contracts that keep the folders apart (they name each one)."""
    import configparser

    from phalanx.config.registry import PACKAGES

    contracts = configparser.ConfigParser()
    contracts.read(REPO / "setup.cfg")
    named = set()
    for section in (
        "importlinter:contract:tasks-apart",
        "importlinter:contract:deepliif-apart",
        "importlinter:contract:tasks-by-name",
    ):
        key = "forbidden_modules" if section.endswith("by-name") else "modules"
        folders = {
            line.strip().removeprefix("phalanx.tasks.") for line in contracts[section][key].split() if line.strip()
        }
        named |= folders
        if section.endswith("by-name"):
            assert folders == set(PACKAGES), (section, folders)
    assert named == set(PACKAGES)


def test_no_module_imports_itself_back_through_others():
    import grimp

    graph = grimp.build_graph("phalanx", cache_dir=None)
    imports = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    circles = []
    for start in sorted(graph.modules):  # a module a chain of imports leads back to
        seen, frontier = set(), set(imports[start])
        while frontier:
            module = frontier.pop()
            if module == start:
                circles.append(start)
                break
            if module not in seen:
                seen.add(module)
                frontier |= imports.get(module, set())
    assert circles == [], circles


def test_few_modules_at_the_top_and_every_package_says_what_it_owns():
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    packages = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    assert len(top) + len(packages) <= 15, (top, packages)  # modules and packages at the top, at most 15
    for name in packages:
        import ast

        doc = ast.get_docstring(ast.parse((PACKAGE / name / "__init__.py").read_text()))
        assert doc and len(doc) > 80, f"phalanx/{name}/__init__.py says nothing of what the package owns"


def test_a_new_built_in_task_is_its_folder_and_one_line_of_the_registry(tmp_path):
    """A copy of the package with a task folder added (its declaration, options and task) and its
    name added to the registry's one list: the new task trains, and nothing else was edited."""
    copy = tmp_path / "phalanx"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    folder = copy / "tasks" / "echo"
    folder.mkdir()
    (folder / "__init__.py").write_text(
        '"""An echo: a classifier by another name."""\n'
        "from ...config.registry import TaskInfo\n"
        "from .options import EchoOptions\n\n"
        'SPECS = (TaskInfo("echo", "Echo (--task echo)", "a classifier by another name", EchoOptions,\n'
        '                  "phalanx.tasks.echo.task:EchoTask"),)\n'
    )
    (folder / "options.py").write_text(
        "from __future__ import annotations\n\nfrom dataclasses import dataclass\n\nfrom ...config.fields import option\n\n\n"
        "@dataclass(frozen=True)\nclass EchoOptions:\n"
        '    loudness: int = option(1, "How loud the echo is.", metavar="N")\n'
    )
    (folder / "task.py").write_text(
        "import torch\nfrom torch import nn\n\nfrom ...data import SeededView, load_digits\n"
        "from ..base import Task, TaskData\nfrom .options import EchoOptions\n\n\n"
        "class EchoTask(Task):\n"
        '    name = "echo"\n    Options = EchoOptions\n\n'
        "    def build_data(self):\n"
        "        images, _ = load_digits()\n"
        '        return TaskData(SeededView(images[:64]), images[64:96], "digits, echoed", info={})\n\n'
        "    def build_models(self, data):\n"
        '        return {"model": nn.Linear(64, 64)}\n\n'
        "    def training_step(self, images, ctx):\n"
        '        echoed = ctx.models["model"](images.flatten(1)) * self.options.loudness\n'
        '        return {"loss": (echoed - images.flatten(1)).pow(2).mean(1)}\n\n'
        "    def validation_step(self, models, images, ctx):\n"
        '        error = (models["model"](images.flatten(1)) - images.flatten(1)).pow(2).mean(1)\n'
        '        return {"loss": error.sum(), "samples": torch.tensor(float(len(images)))}\n'
    )
    registry = copy / "config" / "registry.py"
    before = registry.read_text()
    after = before.replace('"segment")', '"segment",\n            "echo")', 1)
    assert after != before
    registry.write_text(after)
    changed = sorted(
        str(p.relative_to(tmp_path))
        for p in copy.rglob("*.py")
        if not (PACKAGE / p.relative_to(copy)).is_file()
        or (PACKAGE / p.relative_to(copy)).read_bytes() != p.read_bytes()
    )
    assert changed == [
        "phalanx/config/registry.py",
        "phalanx/tasks/echo/__init__.py",
        "phalanx/tasks/echo/options.py",
        "phalanx/tasks/echo/task.py",
    ]
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    shown = subprocess.run(
        [sys.executable, "-m", "phalanx.cli", "train", "--task", "echo", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
    )
    assert shown.returncode == 0 and "Echo (--task echo)" in shown.stdout and "--loudness" in shown.stdout, shown.stderr
    trained = subprocess.run(
        [
            sys.executable,
            "-m",
            "phalanx.cli",
            "train",
            "--task",
            "echo",
            "--loudness",
            "2",
            "--epochs",
            "1",
            "--no-progress",
            "--checkpoints-dir",
            str(tmp_path / "ck"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
    )
    assert trained.returncode == 0 and "phalanx: task echo; digits, echoed" in trained.stdout, trained.stderr


def test_any_module_imports_first_in_a_fresh_process():
    """A task folder imported before the configuration once met the registry half made ("partially
    initialized module ... has no attribute 'SPECS'"): each package, each task folder and a module
    deep in one, imported first in a process of its own."""
    from phalanx.config.registry import PACKAGES

    first = [
        "phalanx.cli",
        "phalanx.config",
        "phalanx.config.registry",
        "phalanx.train.run",
        "phalanx.inference.predict",
        "phalanx.visualize",
        "phalanx.launch.torchrun",
        "phalanx.tasks.selfsupervised.losses",
        *(f"phalanx.tasks.{package}" for package in PACKAGES),
    ]
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    for name in first:
        done = subprocess.run(
            [sys.executable, "-c", code, name],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        assert done.returncode == 0, (name, done.stderr[-600:])

"""scripts/mutants.py finds each mutant's code by its qualified name: every target must still name one
definition that holds its text once. A refactor that renames a function or rewrites a mutated line
fails here, at once, rather than hours later in a mutant run; a module moved into a package does not."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _mutants():
    spec = importlib.util.spec_from_file_location("phalanx_mutants", REPO / "scripts" / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def test_every_mutant_resolves_in_this_tree():
    mutants = _mutants()
    found, texts = mutants.definitions(REPO)
    problems = []
    for mutant in mutants.MUTANTS:
        try:
            mutants.resolve(mutant, found, texts)
        except mutants.Unresolved as problem:
            problems.append(f"{mutant.name!r}: {problem}")
    assert not problems, "update scripts/mutants.py:\n" + "\n".join(problems)


def test_a_module_moved_into_a_package_changes_no_target(tmp_path):
    mutants = _mutants()
    (tmp_path / "phalanx" / "tasks").mkdir(parents=True)
    source = (
        "LIMIT = 3\n\n\nclass Trainer:\n    @property\n    def scale(self):\n        return 1 / 2\n\n"
        "    def step(self):\n        if self.scale:\n            return LIMIT\n\n\ndef main():\n    return 0\n"
    )
    (tmp_path / "phalanx" / "trainer.py").write_text(source)
    (tmp_path / "phalanx" / "tasks" / "classify.py").write_text("def main():\n    return 1\n")
    chosen = [
        mutants.Mutant("a", "Trainer.scale", "1 / 2", "1 / 3", ()),
        mutants.Mutant("b", "Trainer.step", "        if self.scale:\n", "        if False:\n", ()),
        mutants.Mutant("c", "LIMIT", "= 3", "= 4", ()),
        mutants.Mutant("d", "main@trainer", "return 0", "return 2", ()),
        mutants.Mutant("e", "main@tasks.classify", "return 1", "return 2", ()),
    ]
    before = [mutants.resolve(m, *mutants.definitions(tmp_path)) for m in chosen]
    (tmp_path / "phalanx" / "trainer").mkdir()
    shutil.move(tmp_path / "phalanx" / "trainer.py", tmp_path / "phalanx" / "trainer" / "__init__.py")
    (tmp_path / "phalanx" / "tasks" / "classify").mkdir()
    shutil.move(tmp_path / "phalanx" / "tasks" / "classify.py", tmp_path / "phalanx" / "tasks" / "classify" / "task.py")
    after = [mutants.resolve(m, *mutants.definitions(tmp_path)) for m in chosen]
    assert [text for _, text in after] == [text for _, text in before]
    assert [str(path) for path, _ in after] == ["phalanx/trainer/__init__.py"] * 4 + ["phalanx/tasks/classify/task.py"]
    assert before[0][1] == source.replace("1 / 2", "1 / 3")


def test_an_ambiguous_or_missing_target_is_refused(tmp_path):
    mutants = _mutants()
    (tmp_path / "phalanx").mkdir()
    (tmp_path / "phalanx" / "a.py").write_text("def main():\n    return 0\n")
    (tmp_path / "phalanx" / "b.py").write_text("def main():\n    return 0\n")
    found, texts = mutants.definitions(tmp_path)
    for target, before, said in [
        ("main", "return 0", "names 2 definitions"),
        ("mian", "return 0", "no definition"),
        ("main@a", "return 1", "0 times, not once"),
    ]:
        try:
            mutants.resolve(mutants.Mutant("x", target, before, "", ()), found, texts)
        except mutants.Unresolved as problem:
            assert said in str(problem)
        else:
            raise AssertionError(f"{target!r} resolved")

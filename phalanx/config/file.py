"""``--config FILE``: a YAML or JSON file of option values, read bounded in size, with the line of
each key so that an error names where the bad value is."""

from __future__ import annotations

import json
from typing import Any

from ..errors import PhalanxError
from . import split_keys

MAX_CONFIG_BYTES = 1024 * 1024


class ConfigFileValues(dict):
    """The option values of a ``--config`` file, with the line of each key (for error messages)."""

    def __init__(self, path: str, values: dict[str, Any], lines: dict[str, int]):
        super().__init__(values)
        self.path, self.lines = path, lines

    def where(self, name: str) -> str | None:
        """``--config FILE, line N`` for an option set in this file (``task.KEY``: in its task: section),
        else None."""
        for key, line in self.lines.items():
            if key.replace("-", "_") == name:
                return f"--config {self.path}, line {line}"
        return None


def load_config_file(path: str) -> ConfigFileValues:
    """Read ``--config FILE`` (YAML or JSON) into a dict of option values; a syntax error names its line."""
    where = f"--config {path}"
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise PhalanxError(f"cannot read the file ({exc.strerror})", where) from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise PhalanxError(f"is larger than {MAX_CONFIG_BYTES // 1024} KiB; a configuration is a few lines", where)
    text = raw.decode("utf-8", errors="replace")
    lines: dict[str, int] = {}
    try:
        if path.endswith(".json"):
            data = json.loads(text)
        else:
            import yaml  # JSON is YAML too, so any other suffix is read as YAML

            data = yaml.safe_load(text)
            node = yaml.compose(text)
            if isinstance(node, yaml.MappingNode):
                for key, value in node.value:
                    lines[str(key.value)] = key.start_mark.line + 1
                    if str(key.value) == "task" and isinstance(value, yaml.MappingNode):  # the task: section's keys
                        lines.update({f"task.{k.value}": k.start_mark.line + 1 for k, _ in value.value})
    except json.JSONDecodeError as exc:
        raise PhalanxError(f"line {exc.lineno}: does not parse: {exc.msg}", where) from None
    except Exception as exc:  # yaml.YAMLError
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        at = f"line {mark.line + 1}: " if mark is not None else ""
        raise PhalanxError(f"{at}does not parse: {problem}", where) from None
    if data is None:
        return ConfigFileValues(path, {}, {})
    if not isinstance(data, dict):
        raise PhalanxError("must hold a mapping of option: value", where)
    if path.endswith(".json"):
        lines = _json_lines(text, data)
    problems = []  # unknown keys: every one named now, with the file and the key's line
    for key, value in data.items():
        try:
            split_keys({key: value}, where)
        except PhalanxError as exc:
            problems.append((lines.get(str(key)), exc.message))
    if problems:
        (line, message), rest = problems[0], problems[1:]
        more = "".join(f"; line {at}: {said}" if at else f"; {said}" for at, said in rest)
        raise PhalanxError(message + more, f"{where}, line {line}" if line else where)
    return ConfigFileValues(path, data, lines)


def _json_lines(text: str, data: dict[str, Any]) -> dict[str, int]:
    """Each key's line in a JSON file (its first occurrence; a task: section's after "task"), 0 if not found."""

    def line(key: object, start: int = 0) -> int:
        at = text.find(f'"{key}"', start)
        return text.count("\n", 0, at) + 1 if at >= 0 else 0

    lines = {str(key): line(key) for key in data}
    task = data.get("task")
    section = task if isinstance(task, dict) else {}
    lines.update({f"task.{key}": line(key, max(0, text.find('"task"'))) for key in section})
    return lines

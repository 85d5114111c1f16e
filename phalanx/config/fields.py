"""Options declared once: dataclass fields that are also command-line options.

``RunConfig`` (``phalanx.config``), each task's options (its folder's ``options.py``) and the inference
commands' options (``phalanx.config.inference``) declare their fields with ``option``; ``phalanx.cli.options`` turns each field
into a click option, and the checks here apply to values from flags, config files and JSON alike.
Standard library only: ``phalanx --help`` reads these without importing torch.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable
from dataclasses import field
from typing import Any

from ..errors import PhalanxError


def option(
    default: Any,
    help: str | Callable[[], str],
    *,
    choices: tuple[str, ...] | None = None,
    identity: bool = True,
    metavar: str | None = None,
    launch_help: str | None = None,
    cli: bool = True,
    valued: bool = False,
    at_least: float | None = None,
    above: float | None = None,
    at_most: float | None = None,
    below: float | None = None,
) -> Any:
    """A dataclass field that is also a command-line option.

    ``identity=False`` marks options that do not change what a run computes (where files go,
    how much is printed, how many epochs to run for): a run directory may be resumed with a
    different value. ``launch_help`` replaces ``help`` in ``trainlaunch --help`` where the option
    means something else per DDP worker. ``cli=False``: a field of the configuration that no flag
    sets directly. ``valued=True``: a bool option typed with a value (``--remote True``, as DeepLIIF
    spells it) instead of a ``--flag/--no-flag`` pair. ``at_least``/``above`` and ``at_most``/``below``
    bound a number (inclusive/exclusive), checked wherever the value comes from. A ``help`` that
    names what the registry knows (the built-in tasks) is a function, read when help is shown
    (``help_of``): the configuration is then made without loading a task's declaration.
    """
    meta = {
        "help": help,
        "choices": choices,
        "identity": identity,
        "metavar": metavar,
        "launch_help": launch_help or help,
        "cli": cli,
        "valued": valued,
        "bounds": (at_least, above, at_most, below),
    }
    if isinstance(default, (list, tuple)):
        return field(default_factory=lambda: tuple(default), metadata=meta)
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=meta)
    return field(default=default, metadata=meta)


def help_of(f: dataclasses.Field, key: str = "help") -> str:
    """A field's help text (``key``: ``help`` or ``launch_help``), made now where it is a function."""
    text = f.metadata[key]
    return text() if callable(text) else text


def flag(name: str) -> str:
    """The command-line spelling of a field: ``batch_size`` -> ``--batch-size``."""
    return "--" + name.replace("_", "-")


def bad_value(name: str, message: str) -> PhalanxError:
    """A value a field's own rule refuses, naming its flag (raised where the options are built)."""
    return PhalanxError(message, flag(name))


def suggest(name: str, known: list[str]) -> str:
    """Up to three close names, case aside (a Lightly user's ``--task SimCLR`` is ``simclr``)."""
    spelt = {k.lower(): k for k in known}
    close = difflib.get_close_matches(name.lower(), list(spelt), n=3)
    return f" (did you mean {', '.join(spelt[c] for c in close)}?)" if close else ""


def parse_list(value: Any, kind: type, option: str) -> tuple:
    """``(0, 1)``, ``[0, 1]``, ``"0,1"``, ``0`` or a mix (``("0,1", "2")``) -> ``(0, 1, 2)``."""
    items = value if isinstance(value, (list, tuple)) else [value]
    parsed: list = []
    try:
        for item in items:
            if isinstance(item, bool) or (kind is int and isinstance(item, float)):
                raise ValueError
            parts = item.split(",") if isinstance(item, str) else [item]
            parsed += [kind(part) for part in parts if not isinstance(part, str) or part.strip()]
    except (TypeError, ValueError):
        raise PhalanxError(
            f"expected {kind.__name__}s (a comma-separated list, or repeated flags), got {value!r}", option
        ) from None
    if kind is float and not all(math.isfinite(v) for v in parsed):
        raise PhalanxError(f"expected finite numbers, got {value!r}", option)
    return tuple(parsed)


# By a field's annotation: its text (options modules postpone annotations), which typeshed types ``type | str``.
_EXPECTED: dict[object, type | tuple[type, ...]] = {
    "int": int,
    "float": (int, float),
    "bool": bool,
    "str": str,
    "str | None": (str, type(None)),
}


def check_fields(obj: Any) -> None:
    """Types and choices of every field of an options dataclass, naming the flag."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.type.startswith("tuple["):
            kind = int if f.type.startswith("tuple[int") else float if f.type.startswith("tuple[float") else str
            object.__setattr__(
                obj,
                f.name,
                parse_list(value, kind, flag(f.name))
                if kind is not str
                else tuple(str(v) for v in (value if isinstance(value, (list, tuple)) else [value])),
            )
            continue
        expected = _EXPECTED.get(f.type)
        if expected and (not isinstance(value, expected) or (expected is not bool and isinstance(value, bool))):
            raise PhalanxError(f"expected {f.type}, got {value!r}", flag(f.name))
        if f.type == "float" and not math.isfinite(value):
            raise PhalanxError(f"expected a finite number, got {value!r}", flag(f.name))
        choices = f.metadata.get("choices")
        if choices and value is not None and value not in choices:
            raise PhalanxError(f"must be one of {', '.join(choices)} (got {value!r})", flag(f.name))
        if value is not None and f.type in ("int", "float", "float | None", "int | None"):
            check_bounds(value, f.metadata.get("bounds") or (None,) * 4, f.type.startswith("int"), flag(f.name))


def check_bounds(value: float, bounds: tuple, integer: bool, option_name: str) -> None:
    """A number within its field's bounds, else one line saying them."""
    at_least, above, at_most, below = bounds
    if (
        (at_least is None or value >= at_least)
        and (above is None or value > above)
        and (at_most is None or value <= at_most)
        and (below is None or value < below)
    ):
        return
    if at_most is None and below is None:
        words = (
            ("a positive integer" if integer else "positive")
            if above == 0
            else f"at least {at_least}"
            if at_least not in (None, 0)
            else f"above {above}"
            if above is not None
            else None
        )
        message = f"must be {words}" if words else "must not be negative"
    else:
        left = f"[{at_least}" if at_least is not None else f"({above}" if above is not None else "(-inf"
        right = f"{at_most}]" if at_most is not None else f"{below})"
        message = f"must be in {left}, {right}"
    raise PhalanxError(f"{message} (got {value})", option_name)


def parse_text(text: str, type_name: str, option: str) -> Any:
    """A value typed on the command line (``--task-option ngf=32``) as the field's type."""
    try:
        if type_name == "bool":
            lowered = text.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if type_name == "int":
            return int(text)
        if type_name == "float":
            return float(text)
    except ValueError:
        raise PhalanxError(f"expected {type_name}, got {text!r}", option) from None
    if type_name.startswith("tuple["):
        return text
    return None if type_name == "str | None" and text == "" else text

"""Click options generated from ``RunConfig``'s fields, and help pages grouped under headings.

With ``cli.py``, the only module that imports click. Each training option is declared once, in
``config.py``; here it becomes a click option with the help text of the command that shows it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import click
from click.core import ParameterSource

from . import config as config_mod
from . import tasks
from .config import FIELDS, RunConfig, section_of
from .errors import PhalanxError
from .fields import flag, parse_list

_CLICK_TYPES = {"int": click.INT, "float": click.FLOAT, "str": click.STRING, "str | None": click.STRING}
GENERAL = "General"


class Option(click.Option):
    """A click option that knows its heading on the help page."""

    def __init__(self, *args: Any, section: str = GENERAL, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.section = section


class Command(click.Command):
    """Options grouped under headings (as ``accelerate launch --help`` does), and ``--batch_size``
    accepted as well as ``--batch-size``, as torchrun and DeepLIIF users type."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        known = {name for param in self.params for name in param.opts if name.startswith("--")}
        normalised = []
        for arg in args:
            head, eq, tail = arg.partition("=")
            dashed = head.replace("_", "-")
            if head.startswith("--") and head not in known and dashed in known:
                arg = dashed + eq + tail
            normalised.append(arg)
        return super().parse_args(ctx, normalised)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        groups: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                groups.setdefault(getattr(param, "section", GENERAL), []).append(record)
        for heading, records in sorted(groups.items(), key=lambda item: item[0] != GENERAL):
            with formatter.section(f"{heading} options"):
                formatter.write_dl(records)


class CommaList(click.ParamType):
    """``--gpu-ids 0,1`` (Lightning's and accelerate's spelling) as well as repeated flags."""

    def __init__(self, kind: type):
        self.kind, self.name = kind, f"{kind.__name__} list"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple:
        if isinstance(value, tuple):
            return value
        try:
            return parse_list(value, self.kind, param.opts[0] if param else "")
        except PhalanxError:
            self.fail(f"{value!r} is not a {self.kind.__name__} or a comma-separated list of them", param, ctx)


def field_option(f: dataclasses.Field, default_value: Any, text: str, section: str,
                 required: bool = False) -> Callable[[Callable], Callable]:
    """The click option of one dataclass field declared with ``fields.option``."""
    meta = f.metadata
    kwargs: dict[str, Any] = {"help": text, "show_default": not required, "cls": Option, "section": section,
                              "required": required}
    if not required:  # click 8.2+ takes an explicit default=None as a value given
        kwargs["default"] = default_value
    if meta["metavar"]:
        kwargs["metavar"] = meta["metavar"]
    if f.type == "bool":
        decls = [f"{flag(f.name)}/--no-{flag(f.name)[2:]}"]
    elif f.type.startswith("tuple["):  # "tuple[int, ...]": a comma list, or the flag repeated
        kind = int if f.type.startswith("tuple[int") else float
        decls, kwargs["multiple"], kwargs["type"] = [flag(f.name)], True, CommaList(kind)
        kwargs["show_default"] = False
    else:
        decls = [flag(f.name)]
        kwargs["type"] = click.Choice(meta["choices"]) if meta["choices"] else _CLICK_TYPES[f.type]
    return click.option(*decls, f.name, **kwargs)


def training_options(command: str) -> Callable[[Callable], Callable]:
    """One click option per ``RunConfig`` field and per built-in task option (under the task's
    heading), ``--task-option`` for a user task's, and ``--config``, with ``command``'s help texts."""

    def decorate(func: Callable) -> Callable:
        func = click.option("--task-option", "task_option", multiple=True, metavar="KEY=VALUE", cls=Option,
                            section="Run", help="An option of your own task (--task package.module:Class), checked "
                            "against the options it declares; repeat for several.")(func)
        for name, (f, default_value, heading) in reversed(list(tasks.option_fields().items())):
            assert name not in FIELDS, f"task option {name} shadows a general option"
            func = field_option(f, default_value, f.metadata["help"], heading)(func)
        for f in reversed([f for f in FIELDS.values() if f.metadata["cli"]]):
            default = RunConfig.__dataclass_fields__[f.name]
            default_value = default.default_factory() if callable(default.default_factory) else default.default
            text = f.metadata["launch_help"] if command == "trainlaunch" else f.metadata["help"]
            func = field_option(f, default_value, text, section_of(f.name))(func)
        return click.option("--config", "config_file", metavar="FILE", type=click.STRING, cls=Option,
                            help="YAML or JSON file of option defaults (as --print-config writes); flags "
                            "override it.")(func)

    return decorate


def dataclass_options(cls: type) -> Callable[[Callable], Callable]:
    """One click option per field of an options dataclass; a field whose default is None is required."""

    def decorate(func: Callable) -> Callable:
        for f in reversed(dataclasses.fields(cls)):
            default = f.default_factory() if callable(f.default_factory) else f.default
            required = default is None and not f.type.endswith("None")
            func = field_option(f, default, f.metadata["help"], GENERAL, required)(func)
        return func

    return decorate


def build_options(cls: type, values: dict[str, Any]) -> Any:
    """The options dataclass from click's values (comma lists flattened)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    return cls(**{name: tuple(v for vs in value for v in vs) if fields[name].type.startswith("tuple[") else value
                  for name, value in values.items() if name in fields})


def build_config(ctx: click.Context, values: dict[str, Any]) -> RunConfig:
    """The task's defaults < ``--config FILE`` < flags typed on the command line."""
    merged: dict[str, Any] = {}
    file_values = config_mod.load_config_file(values["config_file"]) if values.get("config_file") else None
    if file_values is not None:
        merged.update(file_values)
    typed = set()
    for name in [*(n for n, f in FIELDS.items() if f.metadata["cli"]), *tasks.option_fields()]:
        if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None):
            value = values[name]
            is_list = name in FIELDS and FIELDS[name].type.startswith("tuple[")
            merged[name] = tuple(v for values in value for v in values) if is_list else value
            typed.add(name)
    given = {}
    for item in values.get("task_option") or ():
        key, eq, text = item.partition("=")
        if not eq or not key.strip():
            raise PhalanxError(f"expected KEY=VALUE, got {item!r}", "--task-option")
        given[key.strip().replace("-", "_")] = text
        typed.add(key.strip().replace("-", "_"))
    if given:
        merged["task_options"] = {**(merged.get("task_options") or {}), **given}
    try:
        return config_mod.from_mapping(merged, source="--config")
    except PhalanxError as exc:
        # A bad value from the file: name the file, the line and the key, not only the flag.
        name = (exc.option or "").removeprefix("--").replace("-", "_")
        where = file_values.where(name) if file_values is not None and name not in typed else None
        if where is None:
            raise
        raise PhalanxError(f"{name}: {exc.message}", where) from None


def echo_config(cfg: RunConfig) -> None:
    """The resolved configuration as YAML that ``--config`` reads back (LightningCLI's --print_config)."""
    import yaml

    click.echo(yaml.safe_dump(cfg.to_dict(), sort_keys=False, default_flow_style=None), nl=False)

"""Click options generated from ``RunConfig``'s fields, and help pages grouped under headings.

With ``phalanx.cli``, the only package that imports click. Each training option is declared once,
in ``phalanx.config`` (its ``sections``); here it becomes a click option with the help text of the command that shows it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import click
from click.core import ParameterSource

from .. import config as config_mod
from ..config import FIELDS, RunConfig, registry, section_of
from ..config.fields import flag, help_of, parse_list
from ..config.file import load_config_file
from ..config.resume import described, saved_options
from ..errors import PhalanxError

# By a field's annotation: its text (options modules postpone annotations), which typeshed types ``type | str``.
_CLICK_TYPES: dict[object, click.ParamType] = {
    "int": click.INT,
    "float": click.FLOAT,
    "str": click.STRING,
    "str | None": click.STRING,
}
GENERAL = "General"


HELP_TASK = "phalanx.help_task"  # ctx.meta key: the built-in task named on the command line, for --help
HELP_USER_TASK = "phalanx.help_user_task"  # ... and your own task's, whose options --help lists too


class Option(click.Option):
    """A click option that knows its heading on the help page, and shows the default of the task
    named on the command line (``train --task translate --help``: batch 1, Adam, 2e-4)."""

    def __init__(self, *args: Any, section: str = GENERAL, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.section = section

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        task = ctx.meta.get(HELP_TASK)
        own = registry.own_options(task) if task else {}
        if task is None or (self.name not in registry.BUILTIN[task].defaults and self.name not in own):
            return super().get_help_record(ctx)
        saved = self.default, self.help
        if self.name in own:  # the named task's own default and words, not those of the task declaring it first
            self.default, self.help = own[self.name]
        else:
            self.default = registry.BUILTIN[task].defaults[self.name]
        try:
            return super().get_help_record(ctx)
        finally:
            self.default, self.help = saved


def user_task_help(name: str, formatter: click.HelpFormatter) -> None:
    """Your own task's options (imported by name, as a run would), each as --task-option KEY=VALUE."""
    try:
        options = registry.task_class(name).Options
    except PhalanxError as exc:
        formatter.write_paragraph()
        formatter.write_text(f"(--task {name}: {exc.message})")
        return
    if options is None:
        return
    records = []
    for f in dataclasses.fields(options):
        default = f.default_factory() if callable(f.default_factory) else f.default
        text = f.metadata.get("help", "") if f.metadata else ""
        records.append((f"--task-option {f.name}=VALUE", f"{text}  [default: {default}]".strip()))
    with formatter.section(f"Your task (--task {name}) options"):
        formatter.write_dl(records)


def task_named(args: list[str]) -> str | None:
    """The value of ``--task`` in a command line (``--task X`` or ``--task=X``), if any."""
    for i, arg in enumerate(args):
        if arg == "--task" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--task="):
            return arg.partition("=")[2]
    return None


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
        named = task_named(normalised)
        if named is not None and any(a in ("-h", "--help") for a in normalised):
            registry.check_name(named)  # `--task bogus --help` is refused as a run would be, not the general page
        if named in registry.BUILTIN:
            ctx.meta[HELP_TASK] = named
        elif named and registry.is_user_task(named) and any(a in ("-h", "--help") for a in normalised):
            ctx.meta[HELP_USER_TASK] = named
        return super().parse_args(ctx, normalised)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        groups: dict[str, list[tuple[str, str]]] = {}
        task = ctx.meta.get(HELP_TASK)
        # With --task named, the other built-in tasks' options are left out: they would be refused.
        user_task = ctx.meta.get(HELP_USER_TASK)
        hidden = {info.heading for info in registry.BUILTIN.values() if (task or user_task) and info.name != task}
        own = registry.own_options(task) if task else {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            # An option the named task shares with another sits under the named task's heading.
            section = registry.BUILTIN[task].heading if param.name in own else getattr(param, "section", GENERAL)
            if record is not None and section not in hidden:
                groups.setdefault(section, []).append(record)
        if task:
            formatter.write_paragraph()
            formatter.write_text(f"Defaults shown for --task {task}.")
        for heading, records in sorted(groups.items(), key=lambda item: item[0] != GENERAL):
            with formatter.section(f"{heading} options"):
                formatter.write_dl(records)
        if user_task:
            user_task_help(user_task, formatter)


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


def field_option(
    f: dataclasses.Field, default_value: Any, text: str, section: str, required: bool = False
) -> Callable[[Callable], Callable]:
    """The click option of one dataclass field declared with ``fields.option``."""
    meta = f.metadata
    kwargs: dict[str, Any] = {
        "help": text,
        "show_default": not required,
        "cls": Option,
        "section": section,
        "required": required,
    }
    if not required:  # click 8.2+ takes an explicit default=None as a value given
        kwargs["default"] = default_value
    if meta["metavar"]:
        kwargs["metavar"] = meta["metavar"]
    if f.type == "bool" and meta.get("valued"):
        decls, kwargs["type"] = [flag(f.name)], click.BOOL
    elif f.type == "bool":
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
        func = click.option(
            "--task-option",
            "task_option",
            multiple=True,
            metavar="KEY=VALUE",
            cls=Option,
            section="Run",
            help="An option of your own task (--task package.module:Class), checked "
            "against the options it declares; repeat for several.",
        )(func)
        owners = registry.option_owners()
        for name, (f, default_value, heading) in reversed(list(registry.option_fields().items())):
            assert name not in FIELDS, f"task option {name} shadows a general option"
            others = owners[name][1:]  # it sits under the first task's heading; say who else takes it
            also = f" Also --task {', '.join(others)} (each with its own default)." if others else ""
            func = field_option(f, default_value, help_of(f) + also, heading)(func)
        for f in reversed([f for f in FIELDS.values() if f.metadata["cli"]]):
            default_value = f.default_factory() if callable(f.default_factory) else f.default
            text = help_of(f, "launch_help" if command == "trainlaunch" else "help")
            func = field_option(f, default_value, text, section_of(f.name))(func)
        return click.option(
            "--config",
            "config_file",
            metavar="FILE",
            type=click.STRING,
            cls=Option,
            help="YAML or JSON file of option defaults (as --print-config writes); flags override it.",
        )(func)

    return decorate


def dataclass_options(cls: type) -> Callable[[Callable], Callable]:
    """One click option per field of an options dataclass; a field whose default is None is required."""

    def decorate(func: Callable) -> Callable:
        for f in reversed(dataclasses.fields(cls)):
            default = f.default_factory() if callable(f.default_factory) else f.default
            required = default is None and not f.type.endswith("None")
            func = field_option(f, default, help_of(f), GENERAL, required)(func)
        return func

    return decorate


def build_options(cls: type, values: dict[str, Any]) -> Any:
    """The options dataclass from click's values (comma lists flattened)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    return cls(
        **{
            name: tuple(v for vs in value for v in vs) if fields[name].type.startswith("tuple[") else value
            for name, value in values.items()
            if name in fields
        }
    )


def build_config(ctx: click.Context, values: dict[str, Any]) -> RunConfig:
    """The task's defaults < ``--config FILE`` < flags typed on the command line."""
    merged: dict[str, Any] = {}
    file_values = load_config_file(values["config_file"]) if values.get("config_file") else None
    if file_values is not None:
        merged.update(file_values)
    file_task = file_values.get("task") if file_values is not None else None
    typed = set()
    for name in [*(n for n, f in FIELDS.items() if f.metadata["cli"]), *registry.option_fields()]:
        if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None):
            value = values[name]
            field = FIELDS[name] if name in FIELDS else registry.option_fields()[name][0]
            is_list = field.type.startswith("tuple[")
            merged[name] = tuple(v for values in value for v in values) if is_list else value
            if name == "task" and isinstance(file_task, dict):  # the file's task: section stays
                merged[name] = {**file_task, "name": value}
            typed.add(name)
    given = {}
    for item in values.get("task_option") or ():
        key, eq, text = item.partition("=")
        if not eq or not key.strip():
            raise PhalanxError(f"expected KEY=VALUE, got {item!r}", "--task-option")
        given[key.strip().replace("-", "_")] = text
        typed.add(key.strip().replace("-", "_"))
    if given:  # last: what the command line gives beats a key of the file (later keys win)
        merged["task_options"] = {**(merged.pop("task_options", None) or {}), **given}
    taken = _take_from_resumed_run(merged)
    task = merged.get("task", registry.DEFAULT)
    if isinstance(task, str) and not merged.get("resume"):
        _take_from_weights(merged, task, typed)
    if isinstance(task, str):
        registry.check_used(task, merged, {name: f.default for name, f in FIELDS.items()})
        flagged = [
            n for n in registry.option_fields() if ctx.get_parameter_source(n) not in (ParameterSource.DEFAULT, None)
        ]
        if registry.is_user_task(task) and flagged:  # a built-in task's flag would set your task's option silently
            raise registry.not_an_option_of(
                flagged[0], task, f"; your task's own options go in --task-option {flagged[0]}=VALUE"
            )
    twice = [
        k
        for k in given
        if k in registry.option_fields() and ctx.get_parameter_source(k) not in (ParameterSource.DEFAULT, None)
    ]
    if twice:  # which would win is no choice of the user's: refused
        raise PhalanxError(f"{twice[0]} is given twice, here and as {flag(twice[0])}; give one", "--task-option")
    if taken:  # below what is given, and past check_used: the run's own values are not the user's choice
        merged = {
            **{k: v for k, v in taken.items() if k != "task"},
            **merged,
            "task_options": {**taken["task_options"], **(merged.get("task_options") or {})},
        }
    try:
        return config_mod.from_mapping(merged, source="--config")
    except PhalanxError as exc:
        where = _in_the_file(exc, file_values, typed)
        if where is None:
            raise
        raise PhalanxError(f"{where[1]}: {exc.message}", where[0]) from None


def _in_the_file(exc: PhalanxError, file_values: Any, typed: set[str]) -> tuple[str, str] | None:
    """A bad value or an unknown key from the ``--config`` file: where (the file and the key's line)
    and which key, rather than the flag alone; a key of the file's task: section included."""
    name = (exc.option or "").removeprefix("--").replace("-", "_")
    if name.startswith("no_") and name not in typed and name[3:] in (file_values or {}):  # X: false in the file
        name = name[3:]
    if file_values is None or name in typed:
        return None
    task = file_values.get("task")
    section = task if isinstance(task, dict) else {}
    key: str | None
    if name in section:  # a bad value of the section's key
        key = name
    elif name == "task_option":  # an unknown key of the section, named in the message
        key = next((k for k in section if f"'{k}'" in exc.message), None)
    else:
        key = None
    where = file_values.where(f"task.{key}") if key else file_values.where(name)
    return (where, key or name) if where else None


def _take_from_weights(merged: dict[str, Any], task: str, typed: set[str]) -> None:
    """``--weights DIR`` where the task reads a directory's own settings (``TaskInfo.weights_options``:
    a DeepLIIF directory's train_opt.txt): those its options leave out, named in ``weights_with``."""
    reader = registry.builtin()[task].weights_options if task in registry.builtin() else ""
    weights = merged.get("weights")
    if not reader or not weights:
        return
    found = registry.named_function(reader)(str(weights))
    if not found:
        return
    section = merged.get("task")
    given = set(typed) | {str(k).replace("-", "_") for k in merged}
    given |= {str(k).replace("-", "_") for k in (section if isinstance(section, dict) else {})}
    given |= {str(k).replace("-", "_") for k in (merged.get("task_options") or {})}
    taken = {name: value for name, value in found.items() if name not in given}
    merged["task_options"] = {**taken, **(merged.get("task_options") or {})}

    def shown(value: Any) -> str:
        if isinstance(value, bool):
            return "" if value else "(off)"
        return (
            ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
            if isinstance(value, tuple)
            else str(value)
        )

    merged["weights_with"] = tuple(f"{flag(name)} {shown(value)}".strip() for name, value in taken.items())


def _take_from_resumed_run(merged: dict[str, Any]) -> dict[str, Any]:
    """--resume: what the command line leaves out is the run's own (``phalanx.config.resume``), named in
    ``resumed_with`` (the run says it once its checks pass). The run's task is set in ``merged`` as
    if given, so the checks that follow are its task's."""
    taken = saved_options(merged)
    if "task" in taken:
        merged["task"] = (
            {**merged["task"], "name": taken["task"]} if isinstance(merged.get("task"), dict) else taken["task"]
        )
    task = merged.get("task", registry.DEFAULT)
    merged["resumed_with"] = tuple(
        described(taken, task.get("name", registry.DEFAULT) if isinstance(task, dict) else task)
    )
    return taken


def echo_config(cfg: RunConfig) -> None:
    """The resolved configuration as YAML that ``--config`` reads back (LightningCLI's --print_config)."""
    import yaml

    click.echo(yaml.safe_dump(cfg.to_dict(), sort_keys=False, default_flow_style=None), nl=False)

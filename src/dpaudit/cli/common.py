"""Shared pieces of the thin CLI layer: the error-handling group, JSON output, consoles."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import sys
import textwrap
import types
import typing
import warnings
from pathlib import Path
from collections.abc import Mapping
from enum import Enum
from inspect import Parameter
from typing import Any, Callable, Optional

import typer
from rich.padding import Padding
from rich.table import Table
from rich.text import Text
from typer._click.exceptions import (
    BadOptionUsage,
    BadParameter,
    MissingParameter,
    NoArgsIsHelpError,
    NoSuchOption,
    UsageError as ClickUsageError,
)
from typer._click.globals import get_current_context
from typer.core import TyperCommand, TyperGroup

# The consoles live below the CLI so library modules can print progress without importing it.
# re-exported: commands import them from here
from ..console import console, err_console, print_message  # noqa: F401
from ..errors import DPAuditError
from ..integrations.opacus_script import warning_lines
from ..paths import check_new_file, check_new_folder, fresh_folder
from ..progress import heartbeat
from ..records import _json_safe, check_out_dir
from .coercion import install


#: (command, first argument) -> factory of the click command that handles ``dpaudit COMMAND ARG
#: ...`` instead of COMMAND: the generic ``dpaudit audit NAME`` of catalogue entries without a
#: bespoke audit target (:func:`dpaudit.cli.generic.register_audit`).
ROUTES: dict[tuple[str, str], Any] = {}


class LazyCommands(Mapping):
    """A group's ``commands`` mapping whose click commands are built on first look-up (start-up:
    see :mod:`dpaudit.cli`). Iterating yields the names, in order, without building anything."""

    def __init__(self, builders: dict[str, Callable[[], Any]]) -> None:
        self._builders = builders
        self._built: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._built:
            self._built[name] = _fast_options(self._builders[name]())
        return self._built[name]

    def __iter__(self):
        return iter(self._builders)

    def __len__(self) -> int:
        return len(self._builders)


def _fast_options(command: Any) -> Any:
    """Plain options converted without pydantic (:mod:`dpaudit.cli.coercion`), this command and,
    for a group built eagerly, its sub-commands."""
    install(command)
    subs = getattr(command, "commands", None)
    if isinstance(subs, dict):
        for sub in subs.values():
            _fast_options(sub)
    return command


#: Library parameter names the command line spells otherwise (``out_dir`` is ``--out``).
FLAG_ALIASES = {"out_dir": "out", "epsilon": "eps"}


def flag_names(message: str, command: Any) -> str:
    """``message`` (a library error) with the parameter names the user typed as flags: its first
    word and every ``snake_case`` name (not quoted values) that is an option of ``command``."""
    flags = {
        p.name: p.opts[0]
        for p in getattr(command, "params", ())
        if p.param_type_name == "option" and p.opts[0].startswith("--")
    }
    flags.update({a: flags[b] for a, b in FLAG_ALIASES.items() if b in flags and a not in flags})

    def spell(m: re.Match) -> str:
        word = m.group(0)
        return flags.get(word, word) if m.start() == 0 or "_" in word else word

    # quoted parts are values (paths, names typed by the user): left as they are
    return "".join(
        part
        if part.startswith("'")
        else re.sub(r"(?<![\w'-])[a-z][a-z0-9_]*(?![\w'-])", spell, part)
        for part in re.split(r"('[^']*')", message)
    )


class DPAuditGroup(TyperGroup):
    """Turns every domain error raised below into one line on stderr and exit code 2."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # built eagerly (typer.main.get_command): the same converters as lazily
        if not isinstance(self.commands, LazyCommands):
            _fast_options(self)

    def list_commands(self, ctx):
        return list(self.commands)  # names only: a lazy group builds a command when it is looked up

    def resolve_command(self, ctx, args):
        # builds args[0] (its family) first: it may add ROUTES (dpaudit audit NAME)
        if len(args) >= 2 and isinstance(self.commands, LazyCommands):
            self.commands.get(args[0])
        if len(args) >= 2 and (args[0], args[1]) in ROUTES:
            found = f"{args[0]} {args[1]}", ROUTES[(args[0], args[1])](), args[2:]
        else:
            found = super().resolve_command(ctx, args)
        # the innermost one wins: its flags name the parameters in errors, its path the help to see
        ctx.meta["dpaudit.command"] = found[1]
        ctx.meta["dpaudit.command_path"] = f"{ctx.command_path} {found[0]}"
        return found

    def make_context(self, info_name, args, parent=None, **extra):
        try:  # the root's own options (`dpaudit --bogus`); a sub-command's are parsed inside its group's invoke
            return super().make_context(info_name, args, parent=parent, **extra)
        except ClickUsageError as e:
            _usage_exit(e)

    def invoke(self, ctx):  # noqa: D401
        try:
            with _progress_of(ctx), _one_line_warnings(ctx):
                return super().invoke(ctx)
        except DPAuditError as e:
            msg = type(e).__name__
            if str(e):
                msg = flag_names(str(e).splitlines()[0], ctx.meta.get("dpaudit.command"))
            if e.hint and e.hint not in msg:
                msg = f"{msg} {e.hint}"
            _error(msg)
            raise typer.Exit(2) from None
        except ClickUsageError as e:
            _usage_exit(e, ctx.meta.get("dpaudit.command_path"))


def _progress_of(ctx):
    """The root group's heartbeat (:func:`dpaudit.progress.heartbeat`, named after the command, e.g.
    "dpaudit ledger summary"): any command may take seconds on a loaded machine, and one that ends
    within the heartbeat's grace period prints nothing. Nothing for ``--help``."""
    words = [*ctx._protected_args, *ctx.args]
    if ctx.parent is not None or not words or "--help" in words:
        return contextlib.nullcontext()
    group = isinstance(ctx.command.commands.get(words[0]), TyperGroup) and len(words) > 1
    return heartbeat(" ".join(["dpaudit", *words[: 1 + group]]))


@contextlib.contextmanager
def _one_line_warnings(ctx):
    """While the root group runs a command, each warning Python shows (NumPy, SciPy, torch, Opacus;
    the filters, ``-W``, still choose which) is one dpaudit line on stderr, ``warning: Category:
    first line (file:line)``, never the raw two-line form; the expected ones are dropped, Opacus's
    secure-RNG one reworded (:func:`dpaudit.integrations.opacus_script.warning_lines`)."""
    if ctx.parent is not None:
        yield
        return

    def show(message, category, filename, lineno, file=None, line=None):
        for said in warning_lines([warnings.WarningMessage(message, category, filename, lineno)]):
            note(f"warning: {said} ({Path(filename).name}:{lineno})")

    shown, warnings.showwarning = warnings.showwarning, show
    try:
        yield
    finally:
        warnings.showwarning = shown


def _usage_exit(e: ClickUsageError, command_path: Optional[str] = None):
    """A usage error (bad value, unknown or missing option or command) as one line on stderr, exit 2, instead of typer's
    usage box; a command given without arguments still shows its help."""
    if isinstance(e, NoArgsIsHelpError):
        raise e
    _error(usage_line(e, command_path))
    raise typer.Exit(2) from None


def _error(message: str) -> None:
    """The one error line (wrapped only where a width is known: console.wrap_width)."""
    print_message(Text.assemble(("error:", "bold red"), " ", message), err_console)


def _allowed(param: Any) -> str:
    """What a parameter takes, in words."""
    choices = getattr(getattr(param, "type", None), "choices", None)
    if choices:
        return "one of " + ", ".join(str(getattr(c, "value", c)) for c in choices)
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return "one of " + ", ".join(str(m.value) for m in annotation)
    words = {
        int: "an integer",
        float: "a number",
        bool: "true or false",
        str: "a text value",
        Path: "a path",
    }
    many = getattr(param, "nargs", 1) != 1
    items = typing.get_args(annotation) if many else ()
    word = words.get(items[0] if items else annotation, "a value")
    return f"one or more: {word}" if many else word


def _bad_value(e: BadParameter) -> str:
    """A refused option value as one line: dpaudit's own rule where it worded one (a seed), else what the option takes."""
    name = _param_name(e.param, e.param_hint)
    ours = re.match(r"must be (.+), got (.+?)\.?$", e.message)
    if ours:
        return f"{name} must be {ours.group(1)}, got {ours.group(2)}."
    got = re.search(r"got (.+?)\.?$", e.message) or re.search(r"('[^']*') is not", e.message)
    return (
        f"{name} must be {_allowed(e.param)}, got {got.group(1) if got else e.message.rstrip('.')}."
    )


def _param_name(param: Any, hint: Optional[str]) -> str:
    if param is None:
        return (hint or "value").strip("'\"")
    if param.param_type_name == "option":
        return max(param.opts, key=len)
    return (param.metavar or param.name).upper()


def _help_of(command_path: Optional[str]) -> str:
    """The help to see for the command at ``command_path`` (the root's when unknown)."""
    if not command_path:
        return "`dpaudit --help`"
    return f"`{' '.join(['dpaudit', *command_path.split()[1:]])} --help`"


def usage_line(e: ClickUsageError, command_path: Optional[str] = None) -> str:
    """``e`` as one "{name} must be {rule}, got {value}." line (click's words where nothing better is
    known). ``command_path``: the command being run, for errors click raises without a context (an
    option missing its value), so the line names that command's help rather than the root's."""
    ctx = getattr(e, "ctx", None)
    where = _help_of(ctx.command_path if ctx is not None else command_path)
    if isinstance(e, NoSuchOption):
        near = (
            f"one of {', '.join(e.possibilities)}" if e.possibilities else f"an option of {where}"
        )
        return f"option must be {near}, got {e.option_name}."
    if isinstance(e, MissingParameter):
        return f"{_param_name(e.param, e.param_hint)} must be given ({_allowed(e.param)}; see {where}), got none."
    if isinstance(e, BadOptionUsage) and "requires an argument" in e.message:
        return f"{e.option_name} must be given a value (see {where}), got none."
    if isinstance(e, BadParameter):
        return _bad_value(e)
    command = re.match(r"No such command '([^']*)'", e.message)
    if command and ctx is not None:
        return f"COMMAND must be one of {', '.join(ctx.command.list_commands(ctx))}, got {command.group(1)!r}."
    return " ".join(e.format_message().split()) + f" (see {where})"


class _Deferred(type):
    """Metaclass of a stand-in class: class attributes come from the real class, imported then."""

    def __getattr__(cls, attr):
        return getattr(cls._real(), attr)


def _stand_in(module: str, name: str) -> type:
    def _real(module=module, name=name):
        return getattr(importlib.import_module(module), name)

    def __new__(cls, *args, **kwargs):  # noqa: N807
        return _real()(*args, **kwargs)

    return _Deferred(
        name, (), {"__new__": __new__, "_real": staticmethod(_real), "__module__": module}
    )


def light_rich_help() -> None:
    """Import typer's rich help renderer without ``rich.markdown`` and ``rich.traceback`` (~0.25 s, half
    of ``dpaudit --help``; typer uses them only for markdown markup and pretty tracebacks, which dpaudit
    does not): stand-ins that import the real module when first used, removed from ``sys.modules``
    afterwards. If typer ever needs more from them, the normal import runs instead."""
    if "typer.rich_utils" in sys.modules:
        return
    stubs = {}
    for module, name in (("rich.markdown", "Markdown"), ("rich.traceback", "Traceback")):
        if module not in sys.modules:
            stub = types.ModuleType(module)
            setattr(stub, name, _stand_in(module, name))
            stubs[module] = stub
    sys.modules.update(stubs)
    try:
        importlib.import_module("typer.rich_utils")
    except ImportError:
        sys.modules.pop("typer.rich_utils", None)
    finally:
        for module, stub in stubs.items():
            if sys.modules.get(module) is stub:
                del sys.modules[module]
    if "typer.rich_utils" not in sys.modules:
        importlib.import_module("typer.rich_utils")


class HelpTable(Table):
    """typer's options and commands tables in ``--help``: flag names and metavars are never cut or
    broken mid-word; where they would leave the help text under 30 columns (an 80-column
    terminal), each option's help goes on the lines beneath its names instead."""

    def __rich_console__(self, console, options):
        *names, text = self.columns
        for c in names:
            c.no_wrap, c.overflow = True, "fold"
        text.ratio = text.ratio or 1
        if options.max_width - _names_width(console, names) >= 30:
            yield from super().__rich_console__(console, options)
            return
        for *head, body in zip(*(c.cells for c in self.columns)):
            yield Text(" ").join(
                h if isinstance(h, Text) else Text(str(h)) for h in head if str(h).strip()
            )
            yield Padding(body, (0, 0, 0, 4))


def _names_width(console, columns) -> int:
    """The columns the name columns of a help table take (their widest cells, 2 apart)."""
    widths = (max((console.measure(x).maximum for x in c.cells), default=0) for c in columns)
    return sum(w + 2 for w in widths if w)


def _help_format(format_help: Callable) -> Callable:
    def wrapped(self, ctx, formatter):
        light_rich_help()
        sys.modules["typer.rich_utils"].Table = HelpTable
        for p in self.get_params(ctx):
            if getattr(p, "is_flag", False) and not getattr(p, "count", False):
                p.metavar = ""  # a flag takes no value: no <bool>
        return format_help(self, ctx, formatter)

    return wrapped


TyperCommand.format_help = _help_format(TyperCommand.format_help)
TyperGroup.format_help = _help_format(TyperGroup.format_help)


def new_app(help: str, root: type = typer.Typer) -> typer.Typer:
    return root(
        cls=DPAuditGroup,
        help=help,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode="rich",
    )


def choice_enum(name: str, values) -> type[Enum]:
    """A string enum of ``values`` for a typer option (member names with ``_`` for ``-``)."""
    return Enum(name, {v.replace("-", "_"): v for v in values}, type=str)


def keyword(name: str, annotation: Any, option: Any) -> Parameter:
    """A keyword-only parameter of a generated command, its typer ``option`` as its default."""
    return Parameter(name, Parameter.KEYWORD_ONLY, annotation=annotation, default=option)


#: Options of ``dpaudit audit`` that say how, where or in what format an audit runs, never what it
#: computes (nor the plan-writing argument): left out of its recorded command line.
NOT_RECORDED = tuple(
    "json_out workers executor scheduler ledger planned plan key fail_on_violation".split()
)


def recorded_argv(
    ctx: Any = None, *, values: Optional[dict] = None, always=(), omit=(), last=("out",)
) -> list[str]:
    """The command line that re-creates what this command computes, from its *parsed* parameters:
    ``dpaudit``, the command path, every argument, then each option not at its default (or named in
    ``always``) in declaration order, ``last`` at the end. ``values`` replaces parsed values (a
    default the command resolved); ``omit``: options that say how or where it runs, never what it
    computes. Flags are ``--x`` / ``--no-x``, floats ``repr`` (exact round trip)."""
    ctx = get_current_context() if ctx is None else ctx
    params = {**ctx.params, **(values or {})}
    # the root's own name is the program's, always ``dpaudit``
    head, body, tail = ["dpaudit", *ctx.command_path.split()[1:]], [], []
    placed = dict.fromkeys(last, tail)  # where an option goes: the tail, else the body
    for p in ctx.command.params:
        value = params.get(p.name)
        if p.name in omit or p.name not in params:
            continue
        if p.param_type_name == "argument":
            head.append(str(plain(value)))
        elif value is not None and (p.name in always or value != p.default):
            placed.get(p.name, body).extend(_spelt(p, plain(value)))
    return head + body + tail


def plain(value: Any) -> Any:
    """A parsed value as the user typed it: a choice's string, a path's text."""
    if isinstance(value, Enum):
        return value.value
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def _spelt(p: Any, value: Any) -> list[str]:
    """Option ``p`` set to ``value`` as typed: a flag ``--x`` / ``--no-x``, a float ``repr``."""
    if not getattr(p, "is_flag", False):
        return [p.opts[0], repr(value) if isinstance(value, float) else str(value)]
    if not (value or p.secondary_opts):
        raise ValueError(f"flag {p.opts[0]} has no off spelling, got {value!r}.")
    return [p.opts[0] if value else p.secondary_opts[0]]


def new_out(out: Any) -> Path:
    """An explicit ``--out``, refused (one line) before any work when it cannot be written or holds results."""
    return check_new_folder(check_out_dir(out, name="out"), name="out")


def new_file(out: Any) -> Path:
    """An explicit ``--out`` file, refused (one line) before any work when it exists (a user's file
    is never replaced) or its folder cannot be written."""
    check_out_dir(check_new_file(out, name="out").parent, name="out")
    return Path(out)


def out_or_fresh(
    out: Any, default: Path, quiet: bool, what: str = "audit", fresh: Callable = fresh_folder
) -> Path:
    """``--out`` as given, else ``default`` or a fresh ``-2``, ``-3``, ... beside it (``fresh``: a
    folder's or a file's) when an earlier ``what`` holds it (said in one line unless ``quiet``):
    results are never overwritten."""
    if out is not None:
        return Path(out)
    chosen = fresh(default)
    if chosen != default and not quiet:
        note(f"{default} holds an earlier {what} (never overwritten): writing to {chosen}")
    return chosen


def default_workers() -> int:
    """Worker processes of a local audit when ``--workers`` is not given: two at most."""
    return max(1, min(2, os.cpu_count() or 1))


def exit_on_violation(fail: bool, results: list) -> None:
    """``--fail-on-violation``: exit code 1 when any audit's verdict is VIOLATION (after its output is written)."""
    if fail and any(r.violated for r in results):
        raise typer.Exit(1)


def emit_json(obj: Any) -> None:
    """Write one JSON object to stdout and nothing else."""
    sys.stdout.write(json.dumps(_json_safe(obj), indent=2) + "\n")
    sys.stdout.flush()


def pack(fields: list[str], width: int, indent: str = "") -> list[str]:
    """``fields`` on lines of at most ``width`` characters, broken only between fields (a field
    longer than a line wraps on its own, indented further), so no value is split from its name."""
    groups = [""]
    for f in fields:
        if groups[-1] and len(f"{indent}{groups[-1]} {f}") > width:
            groups.append("")
        groups[-1] += (" " if groups[-1] else "") + f
    return [
        line
        for g in groups
        for line in textwrap.wrap(
            g, width, initial_indent=indent, subsequent_indent=indent + "  ", break_on_hyphens=False
        )
    ]


def say(*fields: str, indent: str = "  ") -> None:
    """One summary line of ``fields``, continued on indented lines between fields where too wide."""
    console.print(Text("\n".join(pack(list(fields), console.width, indent))), soft_wrap=True)


def print_table(table: Any, out: Any = None) -> None:
    """``table`` as it is where it fits the console (a pipe: $COLUMNS or 80); else stacked: each row's
    first cell on its own line, then ``column=value`` for its other cells, wrapped between pairs.
    Numbers never give way: rich would shrink their columns to nothing rather than wrap a long name."""
    out = out or console
    for col in table.columns:
        col.overflow = "fold"  # a too-long word is folded, never cut with an ellipsis
    if _table_width(table, out) + 1 <= out.width:
        out.print(table)
        return
    _print_stacked(table, out)


def _print_stacked(table: Any, out: Any) -> None:
    """``table`` row by row: the first cell, then ``column=value`` pairs wrapped between pairs."""
    if table.title:
        print_message(Text.from_markup(str(table.title)), out)
    plain = [
        [c.plain if isinstance(c, Text) else Text.from_markup(str(c)).plain for c in col.cells]
        for col in table.columns
    ]
    heads = [str(col.header).replace(" ", "") for col in table.columns]
    for label, *rest in zip(*plain):
        indent = " " * (len(label) - len(label.lstrip()) + 4)
        lines = [f"#{label}" if heads[0] == "#" else label]
        lines += pack([f"{h}={v}" for h, v in zip(heads[1:], rest) if v.strip()], out.width, indent)
        out.print(Text("\n".join(lines)), soft_wrap=True)


def _table_width(table: Any, out: Any) -> int:
    """The width ``table`` needs on ``out`` without wrapping a no_wrap column (rich's own minimum
    ignores no_wrap: such a column needs its widest cell)."""
    wide = out.options.update_width(10_000)
    return sum(
        3
        + max(
            getattr(out.measure(x, options=wide), "maximum" if col.no_wrap else "minimum")
            for x in (col.header, *col.cells)
        )
        for col in table.columns
    )


def note(message: str) -> None:
    """A one-line note for people (stderr, so --json output stays clean)."""
    print_message(message, err_console)

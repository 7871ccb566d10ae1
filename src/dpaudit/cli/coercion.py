"""Option values of plain types converted without pydantic (start-up of the light commands).

typer converts every option value through a pydantic ``TypeAdapter`` built on first use, so the
first command with options imports pydantic (~0.15 s of the 0.5 s budget of ``dpaudit calibrate``).
:func:`install` gives each plain option (number, string, path, enum choice) a converter for the
values whose result is certain, exactly as typer's adapter would (and refuses a negative seed:
:func:`_seed_checked`), and hands everything else
(errors, odd spellings such as ``1_000``, lists, constrained numbers) to typer's own converter:
every message and accepted value stays typer's (tests/cli/test_cli_coercion.py compares both).
Without typer's private coercion classes (another typer) nothing is installed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

try:
    from typer._click.exceptions import BadParameter
    from typer._coercion import RuntimeParam, build_runtime_param
    from typer._param_types import coerce_cli_choice, coerce_cli_path
    from typer.core import _TyperParameter
except ImportError:  # pragma: no cover - a typer without these internals: keep its own conversion
    RuntimeParam = None  # type: ignore[assignment,misc]

_INT = re.compile(r"[+-]?[0-9]{1,18}")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_NO_CONSTRAINTS = ("min", "max", "clamp", "parser")
#: Path options with any of these set go to typer's converter (the fast rule assumes a plain Path).
_PATH_FLAGS = ("exists", "resolve_path", "path_type")


def _kind(annotation: Any, info: Any) -> str | None:
    """Which fast rule applies to an option (None: typer's converter only)."""
    if any(getattr(info, k, None) not in (None, False) for k in _NO_CONSTRAINTS):
        return None
    if annotation in (int, float, str, bool):
        return annotation.__name__
    if annotation is Path and not any(getattr(info, k, None) for k in _PATH_FLAGS):
        return "path"
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return "enum"
    return None


def _fast(
    kind: str, annotation: Any, info: Any, value: Any, param: Any, ctx: Any
) -> tuple[bool, Any]:
    """(True, result) where typer's adapter is certain to give ``result``; else (False, None)."""
    if kind in ("int", "float", "str", "bool") and type(value) is annotation:
        return True, value
    if kind == "enum":  # typer's adapter is this very function behind a pydantic "before" validator
        try:
            return True, coerce_cli_choice(
                value, choices=tuple(annotation), case_sensitive=info.case_sensitive, ctx=ctx
            )
        except ValueError:
            return False, None  # typer's adapter words the error
    if kind == "path":
        return _fast_path(info, value, param, ctx)
    number = _NUMBERS.get(kind)  # a str option's string was taken above
    if type(value) is str and number and number[0].fullmatch(value):
        return True, number[1](value)
    return False, None


#: Number kinds: the spellings converted here, and how.
_NUMBERS = {"int": (_INT, int), "float": (_FLOAT, float)}


def _fast_path(info: Any, value: Any, param: Any, ctx: Any) -> tuple[bool, Any]:
    """A Path is taken as it is, a plain string is ``Path(str)`` (as pydantic does), by typer's
    own path check; anything else (empty, a NUL byte) goes to typer's adapter."""
    if type(value) is str and value and "\x00" not in value:
        value = Path(value)
    if not isinstance(value, Path):
        return False, None
    return True, coerce_cli_path(value, info, path_type=Path, param=param, ctx=ctx)


if RuntimeParam is not None:

    @dataclass(frozen=True)
    class FastRuntimeParam(RuntimeParam):
        """typer's runtime conversion of one option, with the fast rules of :func:`_fast` first."""

        kind: str
        descriptor: Any
        slow: list  # typer's converter, built when a value needs it

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            ok, out = _fast(self.kind, self.annotation, self.parameter_info, value, param, ctx)
            if ok:
                return _seed_checked(out, param)
            if not self.slow:
                self.slow.append(build_runtime_param(self.descriptor))
            try:
                return _seed_checked(self.slow[0]._coerce_value(value, param=param, ctx=ctx), param)
            except BadParameter as e:  # pydantic's words name the rule, not the value typed
                if repr(value) not in e.message:
                    e.message = f"{e.message.rstrip('.')}, got {value!r}."
                raise


def _seed_checked(value: Any, param: Any) -> Any:
    """A seed option (``--seed``, ``--split-seed``, ...) is a non-negative integer: NumPy's seed sequences refuse a negative one,
    and it must be refused while parsing, before a command reserves budget or writes a file (typer's own rule otherwise)."""
    name = getattr(param, "name", None) or ""
    if type(value) is int and (name == "seed" or name.endswith("_seed")) and value < 0:
        raise BadParameter(f"must be an integer >= 0 (a public seed), got {value!r}.", param=param)
    return value


def fast_runtime_param(param: Any) -> Any:
    """The fast converter of one typer parameter, or None where typer's own must be used."""
    if RuntimeParam is None or not isinstance(param, _TyperParameter):
        return None
    desc = getattr(param, "type_descriptor", None)
    if desc is None or getattr(desc, "file_annotation", None) is not None:
        return None
    kind = _kind(desc.annotation, desc.parameter_info)
    if kind is None:
        return None
    return FastRuntimeParam(
        parameter_info=desc.parameter_info,
        annotation=desc.annotation,
        kind=kind,
        descriptor=desc,
        slow=[],
    )


class _DefaultHelpNames:
    """What click's ``get_help_option`` reads of a context: a root context's default names."""

    help_option_names = ["--help"]


def install(command: Any) -> Any:
    """Give each plain option of ``command`` (not its sub-commands) the fast converter; returns it.

    The ``--help`` option, which click creates on first parse, is created here (with click's
    default name, the only one dpaudit uses) so that it gets one too."""
    params = list(getattr(command, "params", ()))
    default_settings = getattr(command, "context_settings", None) in (None, {})
    if getattr(command, "_help_option", 0) is None and default_settings:
        try:
            params.append(command.get_help_option(_DefaultHelpNames()))
        except Exception:  # pragma: no cover - another click: leave the help option to it
            pass
    for param in params:
        if getattr(param, "_runtime_param", 0) is None:  # not yet built by typer
            fast = fast_runtime_param(param)
            if fast is not None:
                param._runtime_param = fast
    return command

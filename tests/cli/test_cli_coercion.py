"""dpaudit.cli.coercion converts every option value exactly as typer's pydantic adapter does.

Every option of the whole app that gets a fast converter is fed the same values through both
converters: a tricky set of strings (numbers spelt oddly, choices in other cases, paths) and
Python values (defaults). Results must be equal and of the same type, or both must fail with the
same message (dpaudit's adds ", got VALUE." where typer's does not name the value).
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import pytest
import typer
from typer._click import Context
from typer._click.exceptions import BadParameter
from typer._coercion import build_runtime_param

from dpaudit.cli import app
from dpaudit.cli.coercion import fast_runtime_param, install

STRINGS = [
    "2",
    "-3",
    "+4",
    "007",
    "0",
    "-0",
    "2.0",
    "2.",
    ".5",
    "-.5",
    "1e-5",
    "1E5",
    "1e400",
    "-1e400",
    "1e-400",
    "0.1",
    "3.14159265358979323846",
    "inf",
    "nan",
    "1_000",
    " 2",
    "2 ",
    "",
    " ",
    "abc",
    "0x10",
    "٣",
    "12345678901234567890",
    "9" * 40,
    "rdp",
    "RDP",
    "prv",
    "pld",
    "add-remove-record",
    "Add-Remove-Record",
    "-",
    ".",
    "a/b",
    "/tmp",
    "~",
    "true",
    "no",
    "x\x00y",
]
VALUES = [2, 0, -1, 2.5, 0.0, True, False, Path("a/b")]


def _params():
    root = typer.main.get_command(app)
    seen = {}

    def walk(cmd, path):
        for p in cmd.params:
            if fast_runtime_param(p) is not None:
                key = (
                    repr(p.type_descriptor.annotation),
                    bool(getattr(p.type_descriptor.parameter_info, "case_sensitive", True)),
                )
                seen.setdefault(key, (" ".join(path) + " " + p.name, cmd, p))
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, path + [name])

    walk(root, ["dpaudit"])
    return list(seen.values())


PARAMS = _params()


def _outcome(runtime, value, param, ctx):
    try:
        out = runtime._coerce_value(value, param=param, ctx=ctx)
    except BadParameter as e:
        return ("error", e.message)
    return ("value", type(out), out if out == out else "nan")


def test_every_kind_of_plain_option_is_covered():
    kinds = {fast_runtime_param(p).kind for _, _, p in PARAMS}
    assert kinds == {"int", "float", "str", "bool", "path", "enum"}


@pytest.mark.parametrize("label,command,param", PARAMS, ids=[label for label, _, _ in PARAMS])
def test_fast_conversion_equals_typer(label, command, param, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ctx = Context(command)
    fast = fast_runtime_param(param)
    slow = build_runtime_param(param.type_descriptor)
    values = STRINGS + VALUES
    annotation = param.type_descriptor.annotation
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        values = (
            values
            + list(annotation)
            + [m.value for m in annotation]
            + [m.value.upper() for m in annotation]
        )
    for value in values:
        want = _outcome(slow, value, param, ctx)
        if (
            want[0] == "error" and repr(value) not in want[1]
        ):  # dpaudit's converter also echoes the value typed
            want = ("error", f"{want[1].rstrip('.')}, got {value!r}.")
        assert _outcome(fast, value, param, ctx) == want, (label, value)


def test_installed_on_a_command_and_its_help_option():
    from dpaudit.cli import _RootTyper  # noqa: F401

    group = app.lazy_command()
    cmd = group.commands["calibrate"]  # built on look-up, fast converters installed
    kinds = {p.name: type(p._runtime_param).__name__ for p in cmd.params}
    assert kinds["eps"] == "FastRuntimeParam" and kinds["steps"] == "FastRuntimeParam", kinds
    assert type(cmd._help_option._runtime_param).__name__ == "FastRuntimeParam"
    assert install(cmd) is cmd  # a second install changes nothing

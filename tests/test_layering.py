"""Layering: the command line sits on top of the library, never below it.

A library module that imports :mod:`dpaudit.cli` (even inside a function) makes the library depend
on the CLI's imports and command registration, and an import cycle waits for the first refactor.
Every module under ``src/dpaudit`` outside ``dpaudit/cli/`` is parsed with :mod:`ast` and checked
for absolute, relative and ``importlib.import_module`` imports of the CLI package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dpaudit

PACKAGE_ROOT = Path(dpaudit.__file__).resolve().parent
CLI = "dpaudit.cli"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_cli(name: str) -> bool:
    return name == CLI or name.startswith(CLI + ".")


def cli_imports(source: str, module: str, *, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, imported name) for every import of ``dpaudit.cli`` in ``source`` (module ``module``)."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if _is_cli(a.name)]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if _is_cli(target):
                found.append((node.lineno, target))
            else:  # `from dpaudit import cli` / `from .. import cli`
                found += [
                    (node.lineno, f"{target}.{a.name}")
                    for a in node.names
                    if _is_cli(f"{target}.{a.name}")
                ]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            arg = node.args[0].value
            if name in ("import_module", "__import__") and isinstance(arg, str) and _is_cli(arg):
                found.append((node.lineno, arg))
    return found


def _library_modules() -> list[Path]:
    cli_dir = PACKAGE_ROOT / "cli"
    return sorted(p for p in PACKAGE_ROOT.rglob("*.py") if cli_dir not in p.parents)


def test_package_found():
    mods = _library_modules()
    assert len(mods) > 30 and PACKAGE_ROOT / "accounting" / "accountants.py" in mods


def test_no_library_module_imports_the_cli():
    offenders = []
    for path in _library_modules():
        hits = cli_imports(
            path.read_text(encoding="utf-8"),
            _module_name(path),
            is_package=path.name == "__init__.py",
        )
        offenders += [
            f"{path.relative_to(PACKAGE_ROOT.parent)}:{line} imports {name}" for line, name in hits
        ]
    assert not offenders, "library modules must not import dpaudit.cli:\n" + "\n".join(offenders)


@pytest.mark.parametrize(
    "source, module, expected",
    [
        (
            "from ...cli.common import err_console",
            "dpaudit.mechanisms.dpsgd.schedule",
            ["dpaudit.cli.common"],
        ),
        (
            "def f():\n    from ..cli.common import err_console",
            "dpaudit.sweeps.runner",
            ["dpaudit.cli.common"],
        ),
        ("from .. import cli", "dpaudit.sweeps.runner", ["dpaudit.cli"]),
        ("from . import cli", "dpaudit.records", ["dpaudit.cli"]),
        ("import dpaudit.cli.common as c", "dpaudit.records", ["dpaudit.cli.common"]),
        ("from dpaudit.cli import app", "dpaudit.records", ["dpaudit.cli"]),
        ("from dpaudit import cli", "dpaudit.records", ["dpaudit.cli"]),
        (
            "import importlib\nimportlib.import_module('dpaudit.cli.ledger')",
            "dpaudit.records",
            ["dpaudit.cli.ledger"],
        ),
        ("from ...cli import app", "dpaudit.a.b.c", ["dpaudit.cli"]),
        # not the CLI: a sibling named like it, the console module, a `cli` below another package
        ("from ..console import err_console", "dpaudit.mechanisms.dpsgd.schedule", []),
        ("from .cli import x", "dpaudit.sweeps.runner", []),
        ("import dpaudit.client", "dpaudit.records", []),
        ("from .. import console", "dpaudit.sweeps.runner", []),
    ],
)
def test_detector(source, module, expected):
    assert [name for _, name in cli_imports(source, module)] == expected


def test_detector_package_init_relative():
    # In a package's __init__, `.` is the package itself.
    assert [
        n for _, n in cli_imports("from ..cli import app", "dpaudit.reports", is_package=True)
    ] == ["dpaudit.cli"]
    assert cli_imports("from .cli import app", "dpaudit.reports", is_package=True) == []

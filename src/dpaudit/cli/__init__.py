"""The `dpaudit` command line: parse, call the library, render with rich. No logic lives here."""

from __future__ import annotations

import importlib

import typer

from .. import __version__
from .common import new_app

app = new_app("dpaudit: train differentially private models, account for every release, audit them.")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"dpaudit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version and exit."),
) -> None:
    """dpaudit: train DP models, keep a budget ledger, audit releases, write reviewer reports."""


# Each command family lives in its own module and registers itself on `app`.
_COMMAND_MODULES = ("accounting",)
_OPTIONAL_MODULES = ("train", "ledger", "audit", "report", "sweep", "mixmin")

for _name in _COMMAND_MODULES:
    importlib.import_module(f"{__name__}.{_name}").register(app)
for _name in _OPTIONAL_MODULES:
    try:
        _mod = importlib.import_module(f"{__name__}.{_name}")
    except ModuleNotFoundError as _e:  # a command family not built yet
        if _e.name != f"{__name__}.{_name}":
            raise
        continue
    _mod.register(app)


def main() -> None:
    app()

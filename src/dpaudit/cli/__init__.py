"""The `dpaudit` command line: parse, call the library, render with rich. No logic lives here."""

from __future__ import annotations

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
from . import accounting, audit, ledger, mixmin, report, sweep, train  # noqa: E402

for _module in (accounting, train, ledger, audit, report, sweep, mixmin):
    _module.register(app)


def main() -> None:
    app()

"""Shared pieces of the thin CLI layer: the error-handling group, JSON output, consoles."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer
from rich.console import Console
from typer.core import TyperGroup

from ..errors import DPAuditError
from ..records import _json_safe

#: People read rich output on stdout; with --json, stdout holds exactly one JSON object.
console = Console()
#: Progress bars, notes and errors go to stderr so they never mix with --json output.
err_console = Console(stderr=True)


class DPAuditGroup(TyperGroup):
    """Turns every domain error raised below into one line on stderr and exit code 2."""

    def invoke(self, ctx):  # noqa: D401
        try:
            return super().invoke(ctx)
        except DPAuditError as e:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            err_console.print(f"[bold red]error:[/] {msg}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None


def new_app(help: str) -> typer.Typer:
    return typer.Typer(
        cls=DPAuditGroup,
        help=help,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode="rich",
    )


def emit_json(obj: Any) -> None:
    """Write one JSON object to stdout and nothing else."""
    sys.stdout.write(json.dumps(_json_safe(obj), indent=2) + "\n")
    sys.stdout.flush()


def note(message: str) -> None:
    """A one-line note for people (stderr, so --json output stays clean)."""
    err_console.print(message, highlight=False)

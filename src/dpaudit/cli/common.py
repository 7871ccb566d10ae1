"""Shared pieces of the thin CLI layer: the error-handling group, JSON output, consoles."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer
from typer.core import TyperGroup

# The consoles live below the CLI so library modules can print progress without importing it.
from ..console import console, err_console  # noqa: F401  (re-exported: commands import them from here)
from ..errors import DPAuditError
from ..records import _json_safe


#: (command, first argument) -> factory of the click command that handles ``dpaudit COMMAND ARG
#: ...`` instead of COMMAND: the generic ``dpaudit audit NAME`` of catalogue entries without a
#: bespoke audit target (:func:`dpaudit.cli.generic.register_audit`).
ROUTES: dict[tuple[str, str], Any] = {}


class DPAuditGroup(TyperGroup):
    """Turns every domain error raised below into one line on stderr and exit code 2."""

    def resolve_command(self, ctx, args):
        if len(args) >= 2 and (args[0], args[1]) in ROUTES:
            return f"{args[0]} {args[1]}", ROUTES[(args[0], args[1])](), args[2:]
        return super().resolve_command(ctx, args)

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

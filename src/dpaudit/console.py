"""The rich consoles every layer writes to, importable without the CLI (and without torch).

The library reports progress on stderr (training steps, sweep tasks) through the same console the CLI prints its errors and notes
to, so a ``--json`` run keeps stdout to exactly one JSON object. These live here, below :mod:`dpaudit.cli`, so that library
modules never import the CLI package (which would register every command and pull in its imports)."""

from __future__ import annotations

from rich.console import Console

#: People read rich output on stdout; with --json, stdout holds exactly one JSON object.
console = Console()
#: Progress bars, notes and errors go to stderr so they never mix with --json output.
err_console = Console(stderr=True)

__all__ = ["console", "err_console"]

"""The rich consoles every layer writes to, importable without the CLI (and without torch).

The library reports progress on stderr (training steps, sweep tasks) through the same console the CLI prints its errors and notes
to, so a ``--json`` run keeps stdout to exactly one JSON object. These live here, below :mod:`dpaudit.cli`, so that library
modules never import the CLI package (which would register every command and pull in its imports).

Messages (:func:`print_message`) wrap at the width of a terminal, or the one ``$COLUMNS`` declares,
between words only: a path or a hash stays whole, so it can be copied. A pipe or a log that declares
no width keeps each message on one line (greppable; an error stays the one line scripts read)."""

from __future__ import annotations

import os
import re

from rich.console import Console
from rich.text import Text

#: People read rich output on stdout; with --json, stdout holds exactly one JSON object.
console = Console()
#: Progress bars, notes and errors go to stderr so they never mix with --json output.
err_console = Console(stderr=True)
#: Where a wrapped message continues.
INDENT = "  "


def wrap_width(out: Console) -> int | None:
    """The width messages on ``out`` wrap at: a terminal's or ``$COLUMNS``; else None."""
    return out.width if out.is_terminal or os.environ.get("COLUMNS", "").strip().isdigit() else None


def wrap_words(text: Text, width: int | None) -> Text:
    """``text`` broken between words into lines of at most ``width`` characters, each continuation
    indented by :data:`INDENT`; a word longer than a line stays whole. ``width`` None: unchanged."""
    if width is None:
        return text
    return Text("\n").join(_wrap_line(line, width) for line in text.split("\n", allow_blank=True))


def _wrap_line(line: Text, width: int) -> Text:
    own = len(line.plain) - len(line.plain.lstrip(" "))
    indent = " " * own + INDENT  # continued under the line's own indent
    starts, start, room = [], 0, width
    for word in re.finditer(r"\S+", line.plain):
        if word.end() - start > room and word.start() > start:
            starts.append(word.start())
            start, room = word.start(), width - len(indent)
    head, *rest = line.divide(starts)
    for part in (head, *rest):
        part.rstrip()
    return Text("\n").join([head, *(Text(indent) + part for part in rest)])


def print_message(message: str | Text, out: Console | None = None, style: str = "") -> None:
    """``message`` (plain text, never markup) on ``out`` (default: stdout's console), wrapped by
    :func:`wrap_words` at :func:`wrap_width`."""
    out = out or console
    text = message if isinstance(message, Text) else Text(message, style=style)
    out.print(wrap_words(text, wrap_width(out)), soft_wrap=True, highlight=False)

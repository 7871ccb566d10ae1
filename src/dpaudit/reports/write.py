"""Writing a report model to a file: HTML, Markdown or the JSON model itself."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import UsageError
from ..records import write_json_atomic
from .html import render_html
from .markdown import render_markdown

FORMATS = ("html", "md", "json")


def write_report(
    report: dict, out_file: str | os.PathLike, *, fmt: str = "html", figures=None
) -> Path:
    """Render ``report`` to ``out_file`` in ``fmt`` (html | md | json); returns the path written."""
    if fmt not in FORMATS:
        raise UsageError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}.")
    out = Path(out_file)
    if fmt == "json":
        return write_json_atomic(out, report)
    if fmt == "md":
        return render_markdown(report, out, figures)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(report, figures), encoding="utf-8")
    return out


def report_json(report: dict) -> str:
    return json.dumps(report, indent=2)

"""Reviewer reports: releases + ledger + audits -> one document a reviewer can sign.

Python API (the CLI ``dpaudit report`` is a thin wrapper)::

    from dpaudit.reports import build_report, write_report
    report = build_report(["runs/"], ledger_path=".dpaudit/ledger.sqlite")   # JSON model
    write_report(report, "report.html", fmt="html")                         # or "md" / "json"

The JSON model (:func:`build_report`) is the source of truth; HTML (self-contained, figures
embedded) and Markdown (PNG figures beside it) are rendered from it alone, so a saved JSON
report can be re-rendered later with :func:`write_report`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import UsageError
from ..records import write_json_atomic
from .html import render_html
from .markdown import render_markdown
from .model import SCHEMA, SECTIONS, build_report, read_report

FORMATS = ("html", "md", "json")


def write_report(report: dict, out_file: str | os.PathLike, *, fmt: str = "html", figures=None) -> Path:
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


__all__ = ["FORMATS", "SCHEMA", "SECTIONS", "build_report", "read_report", "render_html", "render_markdown", "write_report", "report_json"]

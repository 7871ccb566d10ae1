"""Reviewer reports: releases + ledger + audits -> one document a reviewer can sign.

Python API (the CLI ``dpaudit report`` is a thin wrapper)::

    from dpaudit.reports import build_report, write_report
    report = build_report(["runs/"], ledger_path=".dpaudit/ledger.sqlite")   # JSON model
    write_report(report, "report.html", fmt="html")                         # or "md" / "json"

The JSON model (:func:`build_report`) is the source of truth; HTML (self-contained, figures
embedded) and Markdown (PNG figures beside it) are rendered from it alone, so a saved JSON
report can be re-rendered later with :func:`write_report`. The names load on first use, so the
command line imports this package without its numerics.
"""

from __future__ import annotations

from ..lazy import lazy_exports

_WHERE = {"SCHEMA": "model", "SECTIONS": "model", "build_report": "model", "read_report": "model", "render_html": "html",
          "render_markdown": "markdown", "FORMATS": "write", "write_report": "write", "report_json": "write",
          "make_bundle": "verify", "verify_bundle": "verify", "failed": "verify"}
__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
__all__ = ["FORMATS", "SCHEMA", "SECTIONS", "build_report", "read_report", "render_html", "render_markdown", "write_report", "report_json"]

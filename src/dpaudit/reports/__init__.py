"""Reviewer reports: releases + ledger + audits -> one document a reviewer can sign (``dpaudit report``
is a thin wrapper; the Python calls: docs/review-walkthrough.md, "Python"). HTML (self-contained,
figures embedded) and Markdown (PNG figures beside it) are rendered from the JSON model
(:mod:`.model`) alone, so a saved JSON report can be re-rendered later with :func:`write_report`.
"""

from __future__ import annotations

from .html import render_html
from .markdown import render_markdown
from .model import SCHEMA, SECTIONS, build_report, read_report
from .verify import failed, make_bundle, verify_bundle
from .write import FORMATS, report_json, write_report

__all__ = [
    "FORMATS",
    "SCHEMA",
    "SECTIONS",
    "build_report",
    "failed",
    "make_bundle",
    "read_report",
    "render_html",
    "render_markdown",
    "report_json",
    "verify_bundle",
    "write_report",
]

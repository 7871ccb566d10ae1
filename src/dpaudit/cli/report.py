"""`dpaudit report PATH... [--format html|md|json] [--out FILE] [--ledger PATH]`."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import List, Optional

import typer

from .. import reports
from ..paths import fresh_file
from .common import choice_enum, emit_json, new_file, note, out_or_fresh, print_message
from .options import json_out, ledger, optional


ReportFormat = choice_enum("ReportFormat", ("html", "md", "json"))


#: Verdict statuses that fail ``--fail-on-violation``, and each status's colour (others: yellow).
_FAILED = ("violation", "accounting-mismatch")
_STYLES = {**dict.fromkeys(_FAILED, "bold red"), "no-evidence": "green"}


def register(app: typer.Typer) -> None:
    @app.command()
    def report(
        paths: List[Path] = typer.Argument(
            ...,
            help="Release, audit and sweep directories (or folders holding many; searched recursively). A sweep folder (or its sweep.sqlite) is summarised in one Sweep section.",
        ),
        fmt: ReportFormat = typer.Option(
            ReportFormat.html,
            "--format",
            help="html (self-contained), md (PNGs beside it) or json (the source of truth).",
        ),
        out: Optional[Path] = optional(
            "--out", "Output file (default: report.html / report.md; json goes to stdout)."
        ),
        ledger_path: Optional[Path] = ledger(),
        title: Optional[str] = optional("--title", "Title of the report."),
        fail_on_violation: bool = typer.Option(
            False,
            "--fail-on-violation",
            help="Exit 1 when any verdict is VIOLATION or ACCOUNTING MISMATCH.",
        ),
        as_json: bool = json_out(),
    ):
        """Write a reviewer report: verdict, claim card, provenance, budget, (sweep,) utility, audit, reproduce."""
        out = _out_file(out, fmt, as_json)
        typed = sys.argv and Path(sys.argv[0]).name == "dpaudit"
        command = "dpaudit " + shlex.join(sys.argv[1:]) if typed else None
        model = reports.build_report(
            paths, ledger_path=ledger_path, title=title, command=command, progress=True
        )
        verdicts = model["sections"]["verdict"]
        _emit(model, out, fmt, as_json)
        failed = [v for v in verdicts if v["status"] in _FAILED]
        if fail_on_violation and failed:
            raise typer.Exit(1)


def _out_file(out: Path | None, fmt: ReportFormat, as_json: bool) -> Path | None:
    """The file to write, checked before the report is built (one line, exit 2; an existing file
    or folder is never replaced): the default file, or a fresh report-2.html beside an earlier one
    (None: a JSON model on stdout)."""
    if out is not None:
        return new_file(out)
    if fmt is ReportFormat.json:
        return None
    return out_or_fresh(None, Path(f"report.{fmt.value}"), as_json, "report", fresh_file)


def _emit(model: dict, out: Path | None, fmt: ReportFormat, as_json: bool) -> None:
    if out is None and as_json:  # the JSON model itself, on stdout
        emit_json(model)
    elif out is None:
        sys.stdout.write(reports.report_json(model) + "\n")
    else:
        written = reports.write_report(model, out, fmt=fmt.value)
        _summary(model, model["sections"]["verdict"], written, fmt.value, as_json)


def _summary(model: dict, verdicts: list[dict], written: Path, fmt: str, as_json: bool) -> None:
    """What was written, and the verdict lines (coloured by status)."""
    if as_json:
        lines = [{k: v[k] for k in ("mechanism", "status", "line")} for v in verdicts]
        written_to = {"out": str(written), "format": fmt}
        return emit_json({**written_to, "notes": model["notes"], "verdicts": lines})
    for v in verdicts:
        print_message(v["line"], style=_STYLES.get(v["status"], "yellow"))
    n_err = sum(1 for n in model["notes"] if n["level"] == "error")
    if n_err:
        note(f"{n_err} error note(s) in the report: read them before signing.")
    print_message(f"report written to {written}")

"""`dpaudit report PATH... [--format html|md|json] [--out FILE] [--ledger PATH]`."""

from __future__ import annotations

import shlex
import sys
from enum import Enum
from pathlib import Path
from typing import List, Optional

import typer

from .. import reports
from ..paths import check_new_file, fresh_file
from ..records import check_out_dir
from .common import emit_json, note, print_message
from .options import json_out, ledger


class ReportFormat(str, Enum):
    html = "html"
    md = "md"
    json = "json"


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
        out: Optional[Path] = typer.Option(
            None,
            "--out",
            help="Output file (default: report.html / report.md; json goes to stdout).",
            show_default=False,
        ),
        ledger_path: Optional[Path] = ledger(),
        title: Optional[str] = typer.Option(
            None, "--title", help="Title of the report.", show_default=False
        ),
        fail_on_violation: bool = typer.Option(
            False,
            "--fail-on-violation",
            help="Exit 1 when any verdict is VIOLATION or ACCOUNTING MISMATCH.",
        ),
        as_json: bool = json_out(),
    ):
        """Write a reviewer report: verdict, claim card, provenance, budget, (sweep,) utility, audit, reproduce."""
        if (
            out is not None
        ):  # before the report is built: one line, exit 2; an existing file or folder is never replaced
            check_out_dir(check_new_file(out, name="out").parent, name="out")
        elif (
            fmt is not ReportFormat.json
        ):  # the default file, or a fresh report-2.html beside an earlier one
            out = _fresh_default(Path(f"report.{fmt.value}"), as_json)
        command = (
            "dpaudit " + shlex.join(sys.argv[1:])
            if sys.argv and Path(sys.argv[0]).name == "dpaudit"
            else None
        )
        model = reports.build_report(
            paths, ledger_path=ledger_path, title=title, command=command, progress=True
        )
        verdicts = model["sections"]["verdict"]
        if fmt is ReportFormat.json and out is None and as_json:  # the model itself, on stdout
            emit_json(model)
        elif fmt is ReportFormat.json and out is None:
            sys.stdout.write(reports.report_json(model) + "\n")
        else:
            written = reports.write_report(model, out, fmt=fmt.value)
            _summary(model, verdicts, written, fmt.value, as_json)
        if fail_on_violation and any(
            v["status"] in ("violation", "accounting-mismatch") for v in verdicts
        ):
            raise typer.Exit(1)


def _fresh_default(default: Path, as_json: bool) -> Path:
    out = fresh_file(default)
    if out != default and not as_json:
        note(f"{default} holds an earlier report (never overwritten): writing to {out}")
    return out


def _summary(model: dict, verdicts: list[dict], written: Path, fmt: str, as_json: bool) -> None:
    """What was written, and the verdict lines (coloured by status)."""
    if as_json:
        emit_json(
            {
                "out": str(written),
                "format": fmt,
                "notes": model["notes"],
                "verdicts": [
                    {"mechanism": v["mechanism"], "status": v["status"], "line": v["line"]}
                    for v in verdicts
                ],
            }
        )
        return
    for v in verdicts:
        style = {
            "violation": "bold red",
            "accounting-mismatch": "bold red",
            "no-evidence": "green",
        }.get(v["status"], "yellow")
        print_message(v["line"], style=style)
    n_err = sum(1 for n in model["notes"] if n["level"] == "error")
    if n_err:
        note(f"{n_err} error note(s) in the report: read them before signing.")
    print_message(f"report written to {written}")

"""`dpaudit bundle RELEASES... AUDITS... --ledger L --out B` and `dpaudit verify B`: a claim's
evidence collected (shareable parts only) and re-checked without the private data
(:mod:`dpaudit.reports.verify`). Parsing and rendering only."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from .. import reports
from ..records import check_out_dir
from . import options
from .common import console, emit_json, print_message


def register(app: typer.Typer) -> None:
    @app.command("bundle")
    def bundle(
        inputs: List[Path] = typer.Argument(
            ...,
            help="release folders or release.json, audit folders (audit.json / one_run.json), plan.json files.",
        ),
        ledger: Optional[Path] = options.ledger(),
        out: Path = typer.Option(..., "--out", help="A new folder for the bundle."),
        json_out: bool = options.json_out(),
    ) -> None:
        """Collect what a reviewer needs to verify a claim: releases, audits and their plans (shareable parts only), the ledger's export and head."""
        # /proc, a file, a read-only place: one line before anything is read
        check_out_dir(out, name="out")
        made = reports.make_bundle(inputs, ledger=ledger, out=out)
        if json_out:
            return emit_json({"bundle": str(out), **made})
        counts = ", ".join(f"{len(made[k])} {k[:-1]}(s)" for k in ("releases", "audits", "plans"))
        head = made["head"]["hash"][:16]
        print_message(
            f"wrote {out}: {counts}, the ledger's export and head {head} "
            f"(shareable parts only); check it with: dpaudit verify {out}"
        )

    @app.command("verify")
    def verify(
        bundle: Path = typer.Argument(..., help="A folder written by `dpaudit bundle`."),
        anchor: Optional[str] = options.optional(
            "--anchor", "A head hash published earlier (`ledger head`): the chain must contain it."
        ),
        owner: Optional[str] = options.optional(
            "--owner", "The ledger owner's key id, known from outside the bundle."
        ),
        json_out: bool = options.json_out(),
    ) -> None:
        """Re-check a bundle without the private data: claims, ledger, plans, audits. Exit 1 on any failed check."""
        checks = reports.verify_bundle(bundle, anchor=anchor, owner=owner)
        bad = reports.failed(checks)
        if json_out:
            emit_json({"bundle": str(bundle), "ok": not bad, "checks": [vars(c) for c in checks]})
        else:
            t = Table("check", "subject", "result", "detail", width=min(console.width, 80))
            marks = {"pass": "[green]pass[/]", "FAIL": "[bold red]FAIL[/]"}
            for c in checks:
                t.add_row(c.name, c.subject, marks.get(c.status, "[yellow]note[/]"), c.detail)
            console.print(t)
            said = f"all {len(checks)} checks passed."
            if bad:
                said = f"{sum(c.status == 'FAIL' for c in checks)} of {len(checks)} checks failed."
            console.print(said, highlight=False)
        if bad:
            raise typer.Exit(1)

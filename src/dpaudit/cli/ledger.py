"""`dpaudit ledger ...`: read and extend the privacy budget ledger (thin; see accounting.ledger)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape
from rich.table import Table

from ..accounting.ledger import open_ledger
from ..records import read_release
from . import options
from .common import console, emit_json, new_app

ledger_app = new_app("The privacy budget ledger: what each dataset has spent, by which releases.")


def _num(x, digits: int = 4) -> str:
    if x is None:
        return ""
    if isinstance(x, float) and math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def _entry_brief(e) -> str:
    p = e.payload
    if e.kind == "release":
        g = p.get("guarantee") or {}
        what = "non-private (unbounded)" if p.get("non_private") else f"eps={_num(p.get('epsilon'))} delta={p.get('delta'):g} [{g.get('type', '?')}]"
        tag = (p.get("sweep") or {}).get("name")
        return (f"{p.get('mechanism')} on {e.dataset}:{p.get('partition')}  {what}" + (f"  sweep {tag}" if tag else "")
                + (f"  VOIDED by {e.voided_by}" if e.voided_by else ""))
    if e.kind == "void":
        return f"voids {p.get('target')}: {p.get('reason')}"
    if e.kind == "cap":
        return f"cap {e.dataset}: eps={_num(p.get('epsilon'))} at delta={p.get('delta'):g}"
    if e.kind == "partition":
        return f"{e.dataset}:{p.get('parent')} = " + " + ".join(f"{e.dataset}:{c}" for c in p.get("children", [])) + f"  (declared by {p.get('declared_by')})"
    return ""


def register(app: typer.Typer) -> None:
    @ledger_app.command("summary")
    def summary(
        dataset: Optional[str] = typer.Option(None, "--dataset", help="Only this dataset."),
        sweep: Optional[str] = typer.Option(None, "--sweep", help="Compose only the releases recorded under this sweep.", show_default=False),
        ledger: options.OptionalPath = options.ledger(),
        json_out: bool = options.json_out(),
    ):
        """Per dataset and partition: releases, composed epsilon (rdp, prv) at the cap's delta, naive sum, cap, remaining."""
        with open_ledger(ledger) as led:
            rows = led.summary(dataset, sweep=sweep)
            path = str(led.path)
        if json_out:
            emit_json({"ledger": path, "sweep": sweep, "rows": rows})
            return
        if not rows:
            console.print(f"ledger {path}: no releases recorded.")
            return
        t = Table(title=f"privacy budget spent ({path})" if sweep is None else f"privacy budget spent by sweep {sweep} ({path})")
        for col in ("partition", "rel.", "epsilon", "rdp", "prv", "naive", "delta", "cap", "left"):
            t.add_column(col, justify="left" if col == "partition" else "right", no_wrap=col == "partition")
        for r in rows:
            depth = 0 if r["partition"] == "*" else 1 + r["partition"].count("/")
            label = ("  " * depth) + (r["dataset"] + " (total)" if r["partition"] == "*" else r["partition"])
            cap = r["cap"]
            t.add_row(
                label,
                f"{r['releases_subtree']}" if r["partition"] == "*" else f"{r['releases']}/{r['releases_subtree']}",
                _num(r["epsilon"], 3), _num(r["epsilon_rdp"], 3), _num(r["epsilon_prv"], 3), _num(r["naive_epsilon"], 3),
                f"{r['delta']:g}",
                "" if cap is None else f"{cap['epsilon']:g}",
                _num(r["remaining"], 3) if r["partition"] == "*" else "",
            )
        console.print(t)
        console.print(
            "rel.: releases direct/in subtree. epsilon: smallest valid bound (rdp, prv upper, pure sum) at delta; "
            "naive: sum of the releases' own claims; cap and left (cap minus the dataset total) in epsilon at delta. "
            "Partitions never declared disjoint compose sequentially in the total.",
            style="dim", highlight=False,
        )

    @ledger_app.command("list")
    def list_(
        dataset: Optional[str] = typer.Option(None, "--dataset", help="Only this dataset."),
        sweep: Optional[str] = typer.Option(None, "--sweep", help="Only the releases recorded under this sweep.", show_default=False),
        ledger: options.OptionalPath = options.ledger(),
        json_out: bool = options.json_out(),
    ):
        """Every entry in append order (releases, voids, caps, partition declarations)."""
        with open_ledger(ledger) as led:
            es = led.entries(dataset=dataset)
            path = str(led.path)
            if sweep is not None:
                led.require_sweep(sweep)
                es = [e for e in es if e.kind == "release" and (e.payload.get("sweep") or {}).get("name") == sweep]
        if json_out:
            emit_json({"ledger": path, "entries": [e.to_dict() for e in es]})
            return
        t = Table(title=f"ledger {path}")
        for col in ("#", "id", "time (UTC)", "kind", "what"):
            t.add_column(col)
        for e in es:
            t.add_row(str(e.seq), e.id[:12], e.created_at[:19], e.kind, escape(_entry_brief(e)))
        console.print(t)

    @ledger_app.command("show")
    def show(
        entry_id: str = typer.Argument(..., metavar="ID", help="Entry id (or a unique prefix of >= 6 characters)."),
        ledger: options.OptionalPath = options.ledger(),
        json_out: bool = options.json_out(),
    ):
        """One entry with everything recorded about it."""
        with open_ledger(ledger) as led:
            d = led.get(entry_id).to_dict()
        if json_out:
            emit_json(d)
            return
        t = Table(show_header=False)
        t.add_column("field")
        t.add_column("value")
        for k, v in d.items():
            t.add_row(k, escape(str(v)))
        console.print(t)

    @ledger_app.command("cap")
    def cap(
        dataset: str = typer.Option(..., "--dataset", help="Dataset name (as in release.json)."),
        eps: float = typer.Option(..., "--eps", help="Cap on the dataset's composed epsilon (> 0)."),
        delta: float = typer.Option(..., "--delta", help="The delta at which the cap holds, in (0, 1)."),
        ledger: options.OptionalPath = options.ledger(),
        json_out: bool = options.json_out(),
    ):
        """Set a dataset's budget cap; later releases that would exceed it are refused before training."""
        with open_ledger(ledger) as led:
            eid = led.cap(dataset, eps, delta)
        if json_out:
            emit_json({"id": eid, "dataset": dataset, "epsilon": eps, "delta": delta})
            return
        console.print(f"cap of {dataset}: epsilon {eps:g} at delta {delta:g} (entry {eid}).")

    @ledger_app.command("verify")
    def verify(
        ledger: options.OptionalPath = options.ledger(),
        json_out: bool = options.json_out(),
    ):
        """Check the hash chain; names each edited, deleted or reordered entry. Exit 1 if any."""
        with open_ledger(ledger) as led:
            rep = led.verify()
        if json_out:
            emit_json(rep.to_dict())
        elif rep.ok:
            console.print(str(rep), highlight=False)
        else:
            console.print(f"[bold red]ledger {escape(rep.path)} FAILED verification ({len(rep.problems)} problem(s)):[/]", highlight=False)
            for p in rep.problems:
                console.print(f"  - {escape(p.message)}", highlight=False, soft_wrap=True)
        if not rep.ok:
            raise typer.Exit(1)

    @ledger_app.command("void")
    def void(
        entry_id: str = typer.Argument(..., metavar="ID", help="Release entry to withdraw."),
        reason: str = typer.Option(..., "--reason", help="Why the release is withdrawn (recorded)."),
        ledger: options.OptionalPath = options.ledger(),
        json_out: bool = options.json_out(),
    ):
        """Withdraw a release recorded by mistake (appends a void entry; nothing is deleted)."""
        with open_ledger(ledger) as led:
            vid = led.void(entry_id, reason)
            target = led.get(vid).payload["target"]
        if json_out:
            emit_json({"id": vid, "target": target, "reason": reason})
            return
        console.print(f"release {target} voided (entry {vid}).")

    @ledger_app.command("declare-partition")
    def declare_partition(
        dataset: str = typer.Option(..., "--dataset", help="Dataset name."),
        parent: str = typer.Option(..., "--parent", help="Partition being split, e.g. train."),
        child: List[str] = typer.Option(..., "--child", help="A disjoint part (repeat), e.g. --child train/mix --child train/ft."),
        declared_by: str = typer.Option(..., "--declared-by", help="Mechanism or person that made the split disjoint."),
        ledger: options.OptionalPath = options.ledger(),
        json_out: bool = options.json_out(),
    ):
        """Declare PARENT as the disjoint union of CHILDREN: releases on the children compose in parallel."""
        with open_ledger(ledger) as led:
            eid = led.declare_partition(dataset, parent, child, declared_by)
        if json_out:
            emit_json({"id": eid, "dataset": dataset, "parent": parent, "children": list(child), "declared_by": declared_by})
            return
        console.print(f"{dataset}:{parent} = " + " + ".join(f"{dataset}:{c}" for c in child) + f" (declared by {declared_by}; entry {eid}).")

    @ledger_app.command("record")
    def record(
        release_path: Path = typer.Argument(..., metavar="RELEASE", help="release.json (or the directory holding it)."),
        ledger: options.OptionalPath = options.ledger(),
        json_out: bool = options.json_out(),
    ):
        """Append an existing release.json to the ledger (training commands do this themselves)."""
        rel = read_release(release_path)
        art = release_path if release_path.is_dir() else release_path.parent
        with open_ledger(ledger) as led:
            eid = led.record(rel, artefact_path=str(art.resolve()))
        if json_out:
            emit_json({"id": eid, "dataset": rel.dataset.get("name"), "partition": rel.partition})
            return
        console.print(f"recorded release {eid} on {rel.dataset.get('name')}:{rel.partition}.")

    app.add_typer(ledger_app, name="ledger")

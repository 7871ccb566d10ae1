"""Section ``budget``: the ledger's own summary (entries, hash-chain check) for the datasets of
the report, and the releases' own composition as a cross-check."""

from __future__ import annotations

import os
from collections import OrderedDict, defaultdict
from typing import Any

from ..errors import DPAuditError, UsageError
from ..records import Release
from .inputs import LoadedRelease, Note, dataset_name, num
from .recompute import EpsCache, compose_sequential, compose_side_by_side


def _rows_of(obj: Any) -> list[dict]:
    out = []
    for x in obj or []:
        if isinstance(x, dict):
            out.append(dict(x))
        elif hasattr(x, "to_dict"):
            out.append(dict(x.to_dict()))
        elif hasattr(x, "__dataclass_fields__"):
            from dataclasses import asdict

            out.append(asdict(x))
        elif hasattr(x, "_asdict"):
            out.append(dict(x._asdict()))
    return out


# Keyed fingerprints are dropped too: with the ledger's key (which `ledger export --include-key`
# hands out) a reader could test a candidate dataset against them. Reports show version labels.
LEDGER_ENTRY_DROP = ("prev_hash", "hash", "guarantee", "payload", "artefact_path", "dataset_sha256", "release_created_at",
                     "dataset_fingerprint", "fingerprint", "previous")


def _data_versions(entries: list[dict]) -> dict[str, str]:
    """Keyed fingerprint -> an opaque label ("version 1", ...), numbered per dataset in ledger order."""
    labels: dict[str, str] = {}
    counts: dict[str, int] = defaultdict(int)
    for e in entries:
        fp = e.get("dataset_fingerprint") or (e.get("fingerprint") if e.get("kind") == "version" else None)
        if fp and fp not in labels:
            counts[str(e.get("dataset"))] += 1
            labels[fp] = f"version {counts[str(e.get('dataset'))]}"
    return labels


def ledger_budget(ledger_path: str | os.PathLike | None, explicit: bool, datasets: list[str], release_ids: list[str],
                   notes: list[Note]) -> dict:
    """The ledger's own summary (and entries, and hash-chain check) for ``datasets``."""
    from ..ledger.paths import resolve_ledger

    loc = resolve_ledger(ledger_path)
    # A PostgreSQL ledger is opened as given (a server that is down is an error, not "no ledger").
    path = loc.path if loc.backend == "sqlite" else loc
    out: dict = {"ledger": loc.display, "summary": [], "entries": [], "available": False, "verify": None}
    if loc.backend == "sqlite" and not path.exists():
        if explicit:
            raise UsageError(f"ledger must be an existing ledger database, got {str(ledger_path)!r}.")
        if datasets:
            notes.append(Note("warning", "budget", f"no ledger at {path}: pass --ledger PATH to show the spent and remaining budget; "
                                                 "only the composition of the releases in this report is shown."))
        out["ledger"] = None
        return out
    try:
        from ..ledger.book import open_ledger
    except ImportError:
        notes.append(Note("warning", "budget", "this dpaudit has no ledger module (dpaudit.accounting.ledger); budget from the releases only."))
        return out
    summary: list[dict] = []
    entries: list[dict] = []
    try:
        with open_ledger(path) as ledger:
            for name in datasets or [None]:
                try:
                    ds_entries = ledger.entries(dataset=name) if name is not None else ledger.entries()
                    rows = ledger.summary(dataset=name)
                    summary.extend(_rows_of(rows))
                    entries.extend(_rows_of(ds_entries))
                except UsageError:
                    notes.append(Note("warning", "budget", f"dataset {name!r} is not recorded in ledger {path}: its releases were not "
                                                           "accounted there."))
            if hasattr(ledger, "verify"):
                try:
                    ver = ledger.verify()
                    out["verify"] = ver if isinstance(ver, dict) else (_rows_of([ver]) or [None])[0]
                except DPAuditError as e:
                    out["verify"] = {"ok": False, "problems": [{"message": str(e)}]}
    except DPAuditError as e:
        notes.append(Note("error", "budget", f"ledger {path} could not be read: {e}"))
        return out
    ver = out["verify"]
    if isinstance(ver, dict):
        ok = ver.get("ok")
        if ok is None and "problems" in ver:
            ok = not ver["problems"]
        if ok is False:
            msgs = "; ".join(str(p.get("message", p)) for p in ver.get("problems", [])[:3] if isinstance(p, dict))
            notes.append(Note("error", "budget", f"ledger {path} failed its integrity check: {msgs or 'see ledger verify'}."))
    # Which data version (an opaque label for the keyed fingerprint) each recorded release used:
    # what the provenance shows. Old ledgers have none; their raw dataset_sha256 is dropped.
    labels = _data_versions(entries)
    out["data_versions"] = {str(e.get("release_id") or e.get("id")): labels[e["dataset_fingerprint"]]
                            for e in entries if e.get("kind", "release") == "release" and e.get("dataset_fingerprint")}
    for e in entries:
        for k in LEDGER_ENTRY_DROP:
            e.pop(k, None)
    for row in summary:
        row["data_versions"] = len(row.pop("dataset_fingerprints", None) or [])
    recorded = {str(e.get("release_id") or e.get("id")) for e in entries if e.get("kind", "release") == "release"}
    for rid in release_ids:
        if rid not in recorded and (entries or summary):
            notes.append(Note("warning", "budget", f"release {rid[:12]} is not in ledger {path}: its budget use is not accounted there."))
    out.update(summary=summary, entries=entries, available=True)
    for row in summary:
        rem = num(row.get("remaining"))
        if rem is not None and rem < 0:
            notes.append(Note("error", "budget", f"dataset {row.get('dataset')} partition {row.get('partition')}: budget exceeded "
                                                 f"(remaining {rem:.4f})."))
    return out



def release_composition(releases: list[LoadedRelease], cache: EpsCache, notes: list[Note]) -> list[dict]:
    """Sequential composition per (dataset, partition); parallel (max) over partitions."""
    groups: "OrderedDict[tuple, list[Release]]" = OrderedDict()
    for lr in releases:
        r = lr.release
        if r.non_private:
            continue
        groups.setdefault((dataset_name(r.dataset), str(r.partition), str(r.adjacency)), []).append(r)
    rows = []
    for (ds, part, adj), rels in groups.items():
        deltas = [num(r.delta) for r in rels if num(r.delta) is not None]
        delta = max(deltas) if deltas else None
        row = {"dataset": ds, "partition": part, "adjacency": adj, "releases": len(rels),
               "naive_sum": sum(num(r.epsilon) or 0.0 for r in rels), "delta": delta, "rdp": None, "prv": None}
        if delta is not None and 0 < delta < 1:
            tree = compose_sequential(r.guarantee for r in rels)
            for acc, res in compose_side_by_side(cache, tree, delta, adj).items():
                row[acc] = res["epsilon"]
                if res["error"]:
                    notes.append(Note("warning", "budget", f"composition of {ds}/{part} with {acc}: {res['error']}"))
        rows.append(row)
    by_ds: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_ds[row["dataset"]].append(row)
    for ds, rs in by_ds.items():
        if len({r["partition"] for r in rs}) > 1:
            rows.append({
                "dataset": ds, "partition": "all (parallel, max over partitions)", "adjacency": ",".join(sorted({r["adjacency"] for r in rs})),
                "releases": sum(r["releases"] for r in rs), "naive_sum": max(r["naive_sum"] for r in rs),
                "delta": max((r["delta"] for r in rs if r["delta"] is not None), default=None),
                "rdp": max((r["rdp"] for r in rs if r["rdp"] is not None), default=None),
                "prv": max((r["prv"] for r in rs if r["prv"] is not None), default=None),
            })
    return rows

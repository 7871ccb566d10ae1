"""Section ``budget``: the ledger's own summary (entries, hash-chain check) for the datasets of
the report, and the releases' own composition as a cross-check."""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

from ..errors import DPAuditError, UsageError
from ..ledger.book import open_ledger
from ..ledger.paths import resolve_ledger
from ..records import Release
from .inputs import LoadedRelease, Note, dataset_name, num
from .recompute import GROUP_KEY, composed


def _rows_of(rows: Any) -> list[dict]:
    """The ledger's rows (dicts, or entries / reports with ``to_dict``) as plain dicts."""
    return [dict(x) if isinstance(x, dict) else dict(x.to_dict()) for x in rows or []]


# Keyed fingerprints are dropped too: with the ledger's key (which `ledger export --include-key`
# hands out) a reader could test a candidate dataset against them. Reports show version labels. A row set's keyed row hashes
# and their count are dropped too: the count is the private training count.
LEDGER_ENTRY_DROP = tuple(
    "prev_hash hash guarantee payload artefact_path dataset_sha256 release_created_at "
    "dataset_fingerprint fingerprint previous count hashes".split()
)


def _data_versions(entries: list[dict]) -> dict[str, str]:
    """Keyed fingerprint -> an opaque label ("version 1", ...), numbered per dataset in ledger order."""
    labels: dict[str, str] = {}
    counts: dict[str, int] = defaultdict(int)
    for e in entries:
        fp = e.get("dataset_fingerprint") or (
            e.get("fingerprint") if e.get("kind") == "version" else None
        )
        if fp and fp not in labels:
            counts[str(e.get("dataset"))] += 1
            labels[fp] = f"version {counts[str(e.get('dataset'))]}"
    return labels


def _no_ledger(out: dict, path, ledger_path, datasets: list[str], notes: list[Note]) -> dict:
    """No ledger at ``path``: an error when it was given (``ledger_path``), else a note."""
    if ledger_path is not None:
        raise UsageError(f"ledger must be an existing ledger database, got {str(ledger_path)!r}.")
    if datasets:
        text = (
            f"no ledger at {path}: pass --ledger PATH to show the spent and remaining budget; "
            "only the composition of the releases in this report is shown."
        )
        notes.append(Note("warning", "budget", text))
    out["ledger"] = None
    return out


def _verify(ledger) -> dict:
    try:
        return ledger.verify().to_dict()
    except DPAuditError as e:
        return {"ok": False, "problems": [{"message": str(e)}]}


def _read_ledger(
    path, datasets: list[str], notes: list[Note]
) -> tuple[list[dict], list[dict], dict]:
    """(summary rows, entries, verify report) of ``datasets`` (every dataset when none)."""
    summary, entries = [], []
    with open_ledger(path) as ledger:
        for name in datasets or [None]:
            try:
                ds_entries = ledger.entries(dataset=name) if name is not None else ledger.entries()
                summary.extend(_rows_of(ledger.summary(dataset=name)))
                entries.extend(_rows_of(ds_entries))
            except UsageError:
                text = (
                    f"dataset {name!r} is not recorded in ledger {path}: its releases were not "
                    "accounted there."
                )
                notes.append(Note("warning", "budget", text))
        return summary, entries, _verify(ledger)


def _integrity_note(ver: dict, path, notes: list[Note]) -> None:
    if not ver["ok"]:  # a VerifyReport's dict, or _verify's own when the check raised
        msgs = "; ".join(str(p["message"]) for p in ver["problems"][:3])
        notes.append(Note("error", "budget", f"ledger {path} failed its integrity check: {msgs}."))


def release_id(e: dict) -> str | None:
    """The release id of a ledger release entry (None for other kinds)."""
    return (
        str(e.get("release_id") or e.get("id")) if e.get("kind", "release") == "release" else None
    )


def _budget_notes(
    release_ids: list[str], entries: list[dict], summary: list[dict], path, notes: list[Note]
) -> None:
    recorded = {release_id(e) for e in entries} - {None}
    for rid in release_ids:
        if rid not in recorded and (entries or summary):
            text = f"release {rid[:12]} is not in ledger {path}: its budget use is not accounted there."
            notes.append(Note("warning", "budget", text))
    for row in summary:
        rem = num(row.get("remaining"))
        if rem is not None and rem < 0:
            text = (
                f"dataset {row.get('dataset')} partition {row.get('partition')}: budget exceeded "
                f"(remaining {rem:.4f})."
            )
            notes.append(Note("error", "budget", text))


def _release_versions(entries: list[dict]) -> dict[str, str]:
    """Release id -> the data version label of the keyed fingerprint it was recorded under."""
    labels = _data_versions(entries)
    return {
        release_id(e): labels[e["dataset_fingerprint"]]
        for e in entries
        if release_id(e) and e.get("dataset_fingerprint")
    }


def _drop_fingerprints(entries: list[dict], summary: list[dict]) -> None:
    for e in entries:
        for k in LEDGER_ENTRY_DROP:
            e.pop(k, None)
    for row in summary:
        row["data_versions"] = len(row.pop("dataset_fingerprints", None) or [])


def ledger_budget(
    ledger_path: str | os.PathLike | None, datasets: list[str], release_ids: list[str], notes: list
) -> dict:
    """The ledger's own summary (and entries, and hash-chain check) for ``datasets``
    (``ledger_path`` None: ``$DPAUDIT_LEDGER`` or the default path, whose absence is only a note)."""
    loc = resolve_ledger(ledger_path)
    # A PostgreSQL ledger is opened as given (a server that is down is an error, not "no ledger").
    path = loc.path if loc.backend == "sqlite" else loc
    out = {"ledger": loc.display, "summary": [], "entries": [], "available": False, "verify": None}
    if loc.backend == "sqlite" and not path.exists():
        return _no_ledger(out, path, ledger_path, datasets, notes)
    try:
        summary, entries, out["verify"] = _read_ledger(path, datasets, notes)
    except DPAuditError as e:
        notes.append(Note("error", "budget", f"ledger {path} could not be read: {e}"))
        return out
    _integrity_note(out["verify"], path, notes)
    # Which data version (an opaque label for the keyed fingerprint) each recorded release used:
    # what the provenance shows. Old ledgers have none; their raw dataset_sha256 is dropped.
    out["data_versions"] = _release_versions(entries)
    _drop_fingerprints(entries, summary)
    out.update(summary=summary, entries=entries, available=True)
    _budget_notes(release_ids, entries, summary, path, notes)
    return out


def _max_of(rows: list[dict], key: str) -> float | None:
    return max((r[key] for r in rows if r[key] is not None), default=None)


def _parallel_row(ds: str, rs: list[dict]) -> dict:
    """The parallel composition (max) over the partitions of one dataset."""
    return {
        "dataset": ds,
        "partition": "all (parallel, max over partitions)",
        "adjacency": ",".join(sorted({r["adjacency"] for r in rs})),
        "releases": sum(r["releases"] for r in rs),
        "naive_sum": max(r["naive_sum"] for r in rs),
        "delta": _max_of(rs, "delta"),
        "rdp": _max_of(rs, "rdp"),
        "prv": _max_of(rs, "prv"),
    }


def _composition_row(key: tuple, rels: list[Release], notes: list[Note]) -> dict:
    ds, part, adj = key
    deltas = [num(r.delta) for r in rels if num(r.delta) is not None]
    row = {
        **dict(zip(GROUP_KEY, key)),
        "releases": len(rels),
        "naive_sum": sum(num(r.epsilon) or 0.0 for r in rels),
        "delta": max(deltas) if deltas else None,
        "rdp": None,
        "prv": None,
    }
    for acc, res in composed((r.guarantee for r in rels), row["delta"], adj).items():
        row[acc] = res["epsilon"]
        if res["error"]:
            text = f"composition of {ds}/{part} with {acc}: {res['error']}"
            notes.append(Note("warning", "budget", text))
    return row


def release_composition(releases: list[LoadedRelease], notes: list[Note]) -> list[dict]:
    """Sequential composition per (dataset, partition); parallel (max) over partitions."""
    groups: dict[tuple, list[Release]] = {}
    for r in (lr.release for lr in releases if not lr.release.non_private):
        key = (dataset_name(r.dataset), str(r.partition), str(r.adjacency))
        groups.setdefault(key, []).append(r)
    rows = [_composition_row(key, rels, notes) for key, rels in groups.items()]
    by_ds: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_ds[row["dataset"]].append(row)
    return rows + [
        _parallel_row(ds, rs) for ds, rs in by_ds.items() if len({r["partition"] for r in rs}) > 1
    ]

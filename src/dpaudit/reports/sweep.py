"""Sweeps in a reviewer report: one summary per sweep instead of one claim card per release.

A sweep folder (``OUT/NAME/``, :func:`dpaudit.sweeps.run_sweep`) may hold hundreds of releases. Every
``release.json`` below it belongs to it (it exists, so it spent budget, whether or not its task
finished), cross-checked against its store; a release the store names whose file is missing is
composed from what the store kept (without that, a lower bound). The tasks' releases compose
sequentially. The ``sections.sweep`` fields and the verdict line: docs/review-walkthrough.md.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from ..ledger.book import open_ledger
from ..claims import verify_claim
from ..errors import DPAuditError
from ..records import _json_safe, read_json
from ..sweeps import sweep_tables
from .claim import noise_label
from .inputs import LoadedSweep, Note, dataset_name, fixed, num
from .recompute import GROUP_KEY, compose_sequential, composed, recomputed
from .reproduce import FIELDS

#: At most this many mismatching releases are named one by one (the rest are counted).
MAX_LISTED = 20


def _store_guarantee(result: dict) -> dict | None:
    """A release's event rebuilt from what the store kept (only when its release.json is gone; None: non-private or unknown)."""
    nm, q, steps = (num(result.get(k)) for k in ("noise_multiplier", "sample_rate", "steps"))
    if result.get("non_private") or nm is None or q is None or steps is None:
        return None
    return {
        "type": "subsampled-gaussian",
        "noise_multiplier": nm,
        "sample_rate": q,
        "steps": int(steps),
    }


def _ref(lr, **extra) -> dict:
    r = lr.release
    return {"release_id": r.id, "mechanism": r.mechanism, "path": str(lr.path), **extra}


def _accounting_notes(name: str, acc: dict, notes: list[Note]) -> None:
    """The notes of a sweep's accounting check (``acc``: :func:`_accounting`)."""
    problems, unverified = acc["mismatches"], acc["unverified_releases"]
    for p in problems[:MAX_LISTED]:
        text = (
            f"sweep {name}: release {p['release_id'][:12]} ({p['mechanism']}, {p['path']}): "
            f"ACCOUNTING MISMATCH: {p['message']}."
        )
        notes.append(Note("error", "sweep", text))
    if len(problems) > MAX_LISTED:
        text = (
            f"sweep {name}: {len(problems) - MAX_LISTED} more releases with an ACCOUNTING MISMATCH "
            "(all listed in the JSON report)."
        )
        notes.append(Note("error", "sweep", text))
    if unverified:
        text = (
            f"sweep {name}: {len(unverified)} of {acc['checked']} release claims could not be "
            f"recomputed (first: {unverified[0]['message']})."
        )
        notes.append(Note("warning", "sweep", text))
    if acc["reproducible_noise"]:
        text = (
            f"sweep {name}: {acc['reproducible_noise']} release(s) used noise derived from a "
            "published seed: not private; the ledger counts them as unbounded."
        )
        notes.append(Note("warning", "sweep", text))


def _accounting_line(n: dict[str, int], checked: int) -> tuple[str, str]:
    no_claim = f"; {n['no-claim']} non-private release(s) make no claim" if n["no-claim"] else ""
    if not checked:
        nothing = "no private release below the sweep's folder (nothing to check)"
        return "no-claim", nothing + no_claim
    status = "mismatch" if n["mismatch"] else "unverified" if n["unverified"] else "ok"
    line = {
        "mismatch": f"{n['mismatch']} of {checked} releases do NOT check out (ACCOUNTING MISMATCH)",
        "unverified": f"{n['ok']} of {checked} releases check out; {n['unverified']} could not be recomputed",
        "ok": f"{n['ok']} of {checked} releases check out",
    }[status]
    rule = (
        " (each stored guarantee recomputed with its own accountant is at most the claimed epsilon)"
    )
    return status, line + rule + no_claim


def _accounting(sweep: LoadedSweep, notes: list[Note]) -> dict:
    """Check every release's claim with :func:`dpaudit.claims.verify_claim` (the claim-card check)."""
    n = {"ok": 0, "mismatch": 0, "unverified": 0, "no-claim": 0}
    problems, unverified, reproducible = [], [], 0
    for lr in sweep.releases:
        r, check = lr.release, verify_claim(lr.release)
        reproducible += noise_label(r.noise_source)[1] is False and not r.non_private
        status = check.status if check.status in ("ok", "mismatch", "no-claim") else "unverified"
        n[status] += 1
        if status == "mismatch":
            problems.append(_ref(lr, epsilon=num(r.epsilon), message=check.reason))
        elif status == "unverified":
            unverified.append(_ref(lr, message=check.reason))
    checked = n["ok"] + n["mismatch"] + n["unverified"]
    status, line = _accounting_line(n, checked)
    acc = {
        "status": status,
        "line": line,
        "checked": checked,
        **{k: n[k] for k in ("ok", "mismatch", "unverified")},
        "non_private": n["no-claim"],
        "reproducible_noise": reproducible,
        "mismatches": problems,
        "unverified_releases": unverified,
    }
    _accounting_notes(sweep.name or str(sweep.path), acc, notes)
    return acc


def _from_release(r) -> dict:
    """A release of the sweep in the form of one the store kept (:func:`_from_store`), plus its largest-claim record."""
    return {
        "dataset": dataset_name(r.dataset),
        "partition": str(r.partition),
        "adjacency": str(r.adjacency),
        "epsilon": num(r.epsilon),
        "delta": num(r.delta),
        "guarantee": r.guarantee,
        "non_private": r.non_private,
        "from_store": False,
        "largest": {
            "epsilon": num(r.epsilon),
            "release_id": r.id,
            "mechanism": r.mechanism,
            "target_epsilon": num(r.target_epsilon),
        },
    }


def _compose_into(
    row: dict, res: dict[str, dict], sweep_name: str | None, notes: list[Note]
) -> None:
    row.update({acc: r["epsilon"] for acc, r in res.items()})
    row["errors"].update({acc: r["error"] for acc, r in res.items() if r["error"]})
    if res and row["rdp"] is None:
        text = (
            f"sweep {sweep_name}: composition of {row['dataset']}/{row['partition']} failed with rdp: "
            f"{row['errors'].get('rdp')}"
        )
        notes.append(Note("error", "sweep", text))


def _claims(private: list[dict]) -> dict:
    """The claim columns of a budget row of ``private`` members: the largest single claim (its
    release's record, the first of equals), the largest and the summed claim (a member without one
    counts as unbounded) and the largest delta."""
    claims = [x["epsilon"] if x["epsilon"] is not None else math.inf for x in private]
    sized = [
        x["largest"] for x in private if x.get("largest") and x["largest"]["epsilon"] is not None
    ]
    return {
        "largest_single": max(sized, key=lambda big: big["epsilon"], default=None),
        "max_single_epsilon": max(claims) if claims else None,
        "naive_sum": sum(claims) if claims else None,
        "delta": max((x["delta"] for x in private if x["delta"] is not None), default=None),
    }


def _budget_row(key: tuple, members: list[dict], sweep_name: str | None, notes: list[Note]) -> dict:
    """One (dataset, partition, adjacency) of the sweep's budget: its ``members`` (:func:`_from_release`,
    :func:`_from_store`) counted, the private ones composed; a non-private one makes it unbounded."""
    private = [x for x in members if not x["non_private"] and x["guarantee"] is not None]
    n_non_private = sum(1 for x in members if x["non_private"])
    unknown = len(members) - len(private) - n_non_private
    row = {
        **dict(zip(GROUP_KEY, key)),
        "releases": len(members),
        "private_releases": len(private),
        "non_private_releases": n_non_private,
        "unknown_releases": unknown,
        "from_store": sum(x["from_store"] for x in members),
        **_claims(private),
        "rdp": None,
        "prv": None,
        "errors": {},
        "unbounded": n_non_private > 0,
        "lower_bound_only": unknown > 0,
    }
    if n_non_private:
        # a non-private release on the same records has no finite guarantee: the sweep's cost is unbounded
        row["rdp"] = row["prv"] = math.inf
    elif private:
        composition = composed([x["guarantee"] for x in private], row["delta"], row["adjacency"])
        _compose_into(row, composition, sweep_name, notes)
    row["sentence"] = _budget_sentence(row)
    return row


def _budget(sweep: LoadedSweep, extra: list[dict], notes: list[Note]) -> list[dict]:
    """Per (dataset, partition, adjacency): count, largest single claim, naive sum, composed epsilon
    (``extra``: the releases the store names whose file is missing, :func:`_from_store`)."""
    groups: dict[tuple, list[dict]] = {}
    for x in [_from_release(lr.release) for lr in sweep.releases] + extra:
        groups.setdefault(tuple(x[k] for k in GROUP_KEY), []).append(x)
    return [_budget_row(key, members, sweep.name, notes) for key, members in groups.items()]


def _composed_clause(row: dict, where: str) -> str:
    via = "rdp" if row["rdp"] is not None or row["prv"] is None else "prv"
    comp = row[via]
    at_least = "at least " if row["lower_bound_only"] else ""
    s = f"{row['releases']} releases of this sweep on {where}" + (
        ": composed epsilon could not be computed"
        if comp is None
        else f" compose to eps = {at_least}{fixed(comp)} ({via}) at delta = {row['delta']:g}"
    )
    if row["prv"] is not None and via == "rdp":
        return s + f" (prv: {fixed(row['prv'])})"
    if row["prv"] is None and row["errors"].get("prv"):
        return s + f" (prv gave no bound: {row['errors']['prv'].rstrip('.')})"
    return s


def _budget_sentence(row: dict) -> str:
    where = f"{row['dataset']}/{row['partition']}"
    if row["unbounded"]:
        return (
            f"{row['releases']} releases of this sweep on {where} include {row['non_private_releases']} non-private one(s): "
            "their composed privacy cost is unbounded (eps = inf)."
        )
    if not row["private_releases"]:
        return f"no private release of this sweep on {where}."
    s = _composed_clause(row, where)
    if row["largest_single"] is not None:
        s += f"; the largest single release claims eps = {fixed(row['largest_single']['epsilon'])}"
    if row["naive_sum"] is not None:
        s += f"; the naive sum of their claims is {fixed(row['naive_sum'])}"
    if row["lower_bound_only"]:
        s += f" ({row['unknown_releases']} release(s) could not be read: the composed epsilon is a lower bound)"
    return s + "."


def _ledger_entries(sweep: LoadedSweep, ledger_path: str) -> tuple[list, list[dict] | None]:
    """(the ledger's release entries of the sweep's datasets, its summary of the sweep when it knows the sweep)."""
    entries = []
    with open_ledger(ledger_path, create=False) as ledger:
        for ds in sorted({dataset_name(lr.release.dataset) for lr in sweep.releases}):
            try:
                entries.extend(ledger.entries(dataset=ds, kind="release"))
            except DPAuditError:
                continue
        # What the ledger says this sweep spent, when its entries carry the sweep tag; a ledger
        # failing verification gives none (the entries above still match by id).
        try:
            known = sweep.name and sweep.name in ledger.sweeps()
            return entries, [dict(r) for r in ledger.summary(sweep=sweep.name)] if known else None
        except DPAuditError:
            return entries, None


def _tag_of(e) -> str | None:
    tag = e.payload.get("sweep")
    return tag.get("name") if isinstance(tag, dict) else (tag if isinstance(tag, str) else None)


def _rid(e) -> str:
    return str(e.payload.get("release_id") or e.id)


def _match(out: dict, entries: list, release_ids: set[str], name: str | None) -> list:
    """Count the entries of this sweep (by id or tag) into ``out``; the unvoided ones."""
    ours = []
    for e in entries:
        tagged, known = _tag_of(e) is not None and _tag_of(e) == name, _rid(e) in release_ids
        out["tagged"] += tagged
        out["tagged_elsewhere"] += tagged and not known
        out["recorded"] += known
        if known or tagged:
            out["voided"] += bool(e.voided_by)
            ours += [] if e.voided_by else [e]
    return ours


def _ledger_rdp(private: list, n: int, delta: float | None, adj: str) -> float | None:
    """rdp epsilon of the ledger's stored events (inf when a non-private release is among the ``n``)."""
    if len(private) < n:
        return math.inf
    # n >= 1 (a group has a member), so private is not empty here
    if delta is None or not 0 < delta < 1:
        return None
    events = compose_sequential(e.payload.get("guarantee") for e in private)
    return recomputed(events, delta, "rdp", adj)["epsilon"]


def _ledger_row(key: tuple, es: list) -> dict:
    private = [e for e in es if not e.payload.get("non_private")]
    deltas = (num(e.payload.get("delta")) for e in private)
    delta = max((d for d in deltas if d is not None), default=None)
    row = {
        **dict(zip(GROUP_KEY, key)),
        "releases": len(es),
        "non_private_releases": len(es) - len(private),
        "naive_sum": sum(num(e.payload.get("epsilon")) or 0.0 for e in private),
        "delta": delta,
    }
    return row | {"rdp": _ledger_rdp(private, len(es), delta, row["adjacency"])}


def _ledger_block(
    sweep: LoadedSweep, ledger_path: str | None, release_ids: set[str], notes: list[Note]
) -> dict | None:
    """What the ledger recorded for this sweep: by release id and by the entries' ``sweep`` tag."""
    if not ledger_path:
        return None
    name = sweep.name
    counts = dict.fromkeys(("recorded", "tagged", "tagged_elsewhere", "voided", "missing"), 0)
    out: dict = {"ledger": ledger_path, **counts, "missing_ids": [], "composition": []}
    out |= {"summary": None, "error": None}
    try:
        entries, out["summary"] = _ledger_entries(sweep, ledger_path)
    except DPAuditError as e:
        out["error"] = str(e)
        text = f"sweep {name}: ledger {ledger_path} could not be read: {e}"
        notes.append(Note("error", "sweep", text))
        return out
    ours = _match(out, entries, release_ids, name)
    missing = sorted(release_ids - {_rid(e) for e in entries})
    out["missing"], out["missing_ids"] = len(missing), missing
    if missing:
        text = (
            f"sweep {name}: {len(missing)} of {len(release_ids)} releases are not in ledger "
            f"{ledger_path}: their budget use is not accounted there."
        )
        notes.append(Note("warning", "sweep", text))
    if out["tagged_elsewhere"]:
        text = (
            f"sweep {name}: the ledger holds {out['tagged_elsewhere']} release(s) tagged with this sweep "
            "that are not in its folder (composed below with the rest)."
        )
        notes.append(Note("info", "sweep", text))
    groups: dict[tuple, list] = {}
    for e in ours:
        pay = e.payload
        where = (pay.get("dataset_name") or e.dataset, pay.get("partition"), pay.get("adjacency"))
        groups.setdefault(tuple(map(str, where)), []).append(e)
    out["composition"] = [_ledger_row(key, es) for key, es in groups.items()]
    return out


def _tables_note(sweep: LoadedSweep, tables: dict, notes: list[Note]) -> str:
    """Compare the sweep's saved tables.json with the recomputed tables (the report trusts the store)."""
    f = sweep.path / "tables.json"
    if not f.is_file():
        return "absent"
    try:
        saved = read_json(f, "sweep tables")
    except DPAuditError:
        text = (
            f"sweep {sweep.name}: {f} is unreadable; the tables here are recomputed from the store."
        )
        notes.append(Note("info", "sweep", text))
        return "unreadable"
    keys = ("tasks_with_results", "cells", "contrasts")
    a = json.dumps({k: _json_safe(saved.get(k)) for k in keys}, sort_keys=True)
    b = json.dumps({k: _json_safe(tables.get(k)) for k in keys}, sort_keys=True)
    if a == b:
        return "matches"
    text = (
        f"sweep {sweep.name}: {f} differs from the store (written when "
        f"{saved.get('tasks_with_results')} tasks had finished, now {tables.get('tasks_with_results')}); "
        "the tables here are recomputed from the store."
    )
    notes.append(Note("info", "sweep", text))
    return "differs"


def _task_notes(name: str, c: dict, failures: list[dict], notes: list[Note]) -> None:
    if c["failed"]:
        first = failures[0]
        stale = sum(1 for fl in failures if fl.get("in_current_spec") is False)
        earlier = "left from an earlier version of it: not part of the grid"
        why = f"; {stale} of them are not in the sweep's current spec ({earlier})" if stale else ""
        text = (
            f"sweep {name}: {c['failed']} task(s) failed (first: {first['model']} {first['dataset']} "
            f"eps={first['epsilon']} seed={first['seed']}: {first['error']}){why}."
        )
        notes.append(Note("warning", "sweep", text))
    if c["pending"]:
        text = f"sweep {name}: {c['pending']} task(s) still pending: the tables cover finished tasks only."
        notes.append(Note("info", "sweep", text))


def _from_store(r: dict) -> dict:
    """A release the store names but whose file is missing, from what the store kept."""
    return {
        "dataset": dataset_name(r.get("dataset")),
        "partition": str(r.get("partition") or "train"),
        "adjacency": str(r.get("adjacency") or "add-remove-record"),
        "epsilon": num(r.get("epsilon")),
        "delta": num(r.get("delta")),
        "guarantee": _store_guarantee(r),
        "non_private": bool(r.get("non_private")),
        "from_store": True,
    }


def _release_file_notes(
    sweep: LoadedSweep, name: str, missing: list[dict], orphans: set[str], notes: list[Note]
) -> None:
    if missing:
        text = (
            f"sweep {name}: {len(missing)} release(s) recorded by its store have no readable release.json "
            f"under {sweep.path} (first: {missing[0]['release_id'][:12]}); they are composed from the "
            "parameters the store kept and cannot be checked."
        )
        notes.append(Note("error", "sweep", text))
    if orphans:
        text = (
            f"sweep {name}: {len(orphans)} release(s) under {sweep.path} belong to no finished task "
            "of its store (e.g. a task that failed after training); they spent budget and are "
            "composed and checked with the rest."
        )
        notes.append(Note("warning", "sweep", text))


def _release_sets(sweep: LoadedSweep) -> tuple[set[str], set[str], list[dict], set[str]]:
    """(release ids on disk, ids the store names, store results whose release file is missing, orphans on disk)."""
    on_disk = {lr.release.id for lr in sweep.releases}
    store_ids = {str(r["release_id"]) for r in sweep.results if r.get("release_id")}
    missing = [
        r for r in sweep.results if r.get("release_id") and str(r["release_id"]) not in on_disk
    ]
    return on_disk, store_ids, missing, (on_disk - store_ids) if store_ids else set()


def sweep_section(sweep: LoadedSweep, notes: list[Note], *, ledger_path: str | None = None) -> dict:
    """The ``sections.sweep`` entry of one sweep (fields: docs/review-walkthrough.md)."""
    notes.extend(sweep.notes)
    name = sweep.name or sweep.path.name
    counts = {"done": 0, "failed": 0, "pending": 0, **sweep.counts}
    counts["total"] = sum(counts[k] for k in ("done", "failed", "pending"))
    tables = None if sweep.error else sweep_tables(sweep.records, name=sweep.name)
    _task_notes(name, counts, sweep.failures, notes)
    tables_json = None if sweep.error else _tables_note(sweep, tables, notes)
    on_disk, store_ids, missing, orphans = _release_sets(sweep)
    _release_file_notes(sweep, name, missing, orphans, notes)
    return {
        "name": name,
        "path": str(sweep.path),
        "store": str(sweep.store),
        "error": sweep.error,
        "counts": counts,
        "failures": sweep.failures,
        "spec": sweep.spec,
        "releases": len(sweep.releases),
        "unreadable_releases": sweep.unreadable,
        "release_ids": [lr.release.id for lr in sweep.releases],
        "tables": tables,
        "tables_json": tables_json,
        "accounting": _accounting(sweep, notes),
        "budget": _budget(sweep, [_from_store(r) for r in missing], notes),
        "ledger": _ledger_block(sweep, ledger_path, on_disk | store_ids, notes),
        "missing_releases": [str(r["release_id"]) for r in missing],
        "orphan_releases": sorted(orphans),
    }


def _verdict_parts(entry: dict, acc: dict) -> tuple[str, list[str]]:
    if acc.get("status") == "mismatch":
        firsts = "; ".join(m["message"] for m in acc["mismatches"][:3])
        mismatch = f"ACCOUNTING MISMATCH: {acc['mismatch']} of {acc['checked']} releases ({firsts})"
        return "accounting-mismatch", [mismatch]
    accounting = f"accounting: {acc.get('line', 'n/a')}"
    if entry.get("error"):
        unread = f"INCONCLUSIVE: the sweep store could not be read ({entry['error']})"
        return "inconclusive", [unread, accounting]
    if not entry["releases"]:
        return "no-claim", [accounting]
    not_audited = "NOT AUDITED as a sweep (audit single releases with `dpaudit audit`)"
    return "not-audited", [accounting, not_audited]


def _sweep_flags(entry: dict, status: str) -> list[str]:
    named = (
        ("accounting-mismatch", status == "accounting-mismatch"),
        ("missing-releases", entry.get("missing_releases")),
        ("unreadable-releases", entry.get("unreadable_releases")),
    )
    return ["sweep"] + [flag for flag, on in named if on]


def sweep_verdict(entry: dict) -> dict:
    """One verdict line per sweep (fail closed: any accounting mismatch makes it ACCOUNTING MISMATCH)."""
    name = entry["name"]
    head = f"sweep {name} ({entry['releases']} releases)"
    status, parts = _verdict_parts(entry, entry["accounting"] or {})
    if entry.get("unreadable_releases"):
        parts.append(f"{entry['unreadable_releases']} release file(s) unreadable (see notes)")
    worst = [b for b in entry["budget"] if b.get("rdp") is not None]
    if worst:
        b = max(worst, key=lambda r: r["rdp"])
        where, single = f"{b['dataset']}/{b['partition']}", fixed(b["max_single_epsilon"])
        parts.append(
            f"composed eps on {where} = {fixed(b['rdp'])} (rdp) vs largest single {single}"
        )
    singles = (b.get("max_single_epsilon") for b in entry["budget"])
    return {
        "mechanism": head,
        "key": f"sweep:{name}",
        "status": status,
        "flags": _sweep_flags(entry, status),
        "line": f"{head}: " + "; ".join(parts),
        "max_epsilon_lower_bound": None,
        "claimed_epsilons": sorted({e for e in singles if e is not None}),
        "releases": [],
        "non_private_releases": [],
        "audits": [],
        "sweep": name,
    }


def _sweep_command(source: Any, out_parent: str) -> str | None:
    """The command that reruns a sweep from its spec's source (a builtin name or an existing file)."""
    if not isinstance(source, str) or not source:
        return None
    if source.startswith("builtin:"):
        return f"dpaudit sweep --builtin {source.split(':', 1)[1]} --out {out_parent}"
    return f"dpaudit sweep {source} --out {out_parent}" if os.path.exists(source) else None


def sweep_reproduce(entry: dict) -> dict:
    """The reproduce entry of a sweep (its spec; the builtin command when it is a builtin spec)."""
    spec = entry.get("spec") if isinstance(entry.get("spec"), dict) else None
    cmd = _sweep_command(spec.get("source") if spec else None, str(Path(entry["path"]).parent))
    params = {"parameters": {"spec": spec}} if spec and cmd is None else {}
    mine = {"kind": "sweep", "id": entry["name"], "path": entry["path"], "command": cmd}
    return dict.fromkeys(FIELDS) | mine | params

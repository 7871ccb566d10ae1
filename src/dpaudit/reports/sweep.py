"""Sweeps in a reviewer report: one summary per sweep instead of one claim card per release.

A sweep folder (``OUT/NAME/`` holding ``sweep.sqlite`` and ``releases/...``, written by
:func:`dpaudit.sweeps.run_sweep`) may hold hundreds of releases; a reviewer cannot read that many
claim cards. The report therefore treats a sweep as one input and summarises it:

- the task counts of its store (done / failed / pending);
- its tables, *recomputed from the store* with :func:`dpaudit.sweeps.sweep_tables` (cells with
  mean, SD, 95 % t-interval and n; paired contrasts with the exact sign-flip p, Holm-adjusted p
  and seed-level win/tie/loss; the Table 3 comparison of the DP-RVFL paper, section 4.3);
- an accounting check over *every* release of the sweep: each release's stored guarantee is
  checked by :func:`dpaudit.claims.verify_claim` (the check of a claim card: its stored guarantee
  recomputed with its own accountant must not exceed its claimed epsilon, steps and target
  agree); any mismatch makes the sweep's verdict ACCOUNTING MISMATCH (fail closed);
- the budget: per (dataset, partition) the number of the sweep's releases, the largest single
  claim, the naive sum and the composed epsilon of all of them (rdp, and prv where it does not
  decline) at the releases' delta. Every task of a sweep is a separate release on the same
  training partition, so these compose sequentially: the sweep's cost is far above any single
  run's epsilon, and the report says so;
- with a ledger, what the ledger recorded for the sweep (by release id, and by the ``sweep`` tag
  the ledger keeps in each entry's payload when present).

Which releases belong to a sweep: every ``release.json`` below the sweep folder (a release that
exists on disk spent budget, whether or not its task finished cleanly), cross-checked against the
release ids the store's finished tasks recorded. A release the store names but whose file is
missing is composed from the parameters the store kept, with an error note; if even those are
missing, the composed epsilon is marked a lower bound.
"""

from __future__ import annotations

import json
import math
import os
from collections import OrderedDict
from pathlib import Path

from ..claims import verify_claim
from ..errors import DPAuditError
from ..records import read_json
from .claim import noise_label
from .inputs import (  # noqa: F401  (LoadedSweep, find_sweeps, load_sweep, sweep_store_of: re-exported, they lived here)
    STORE_FILE, LoadedSweep, Note, dataset_name, find_sweeps, load_sweep, num, sweep_store_of,
)
from .recompute import EpsCache, compose_sequential, compose_side_by_side

#: At most this many mismatching releases are named one by one (the rest are counted).
MAX_LISTED = 20


# ------------------------------------------------------------------ the sweep section


def _fmt(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "n/a"
    return "inf" if math.isinf(x) else f"{x:.{digits}f}"


def _store_guarantee(result: dict) -> dict | None:
    """A release's event rebuilt from what the store kept (only when its release.json is gone)."""
    if result.get("non_private"):
        return {"type": "non-private"}
    nm, q, steps = num(result.get("noise_multiplier")), num(result.get("sample_rate")), num(result.get("steps"))
    if nm is None or q is None or steps is None:
        return None
    return {"type": "subsampled-gaussian", "noise_multiplier": nm, "sample_rate": q, "steps": int(steps)}


def _accounting(sweep: LoadedSweep, notes: list[Note]) -> dict:
    """Check every release's claim with :func:`dpaudit.claims.verify_claim` (the claim-card check)."""
    ok = mismatch = unverified = no_claim = reproducible = 0
    problems: list[dict] = []
    unverified_list: list[dict] = []
    for lr in sweep.releases:
        check = verify_claim(lr.release)
        status, msg = check.status, check.reason
        if noise_label(lr.release.noise_source)[1] is False and not lr.release.non_private:
            reproducible += 1
        if status == "ok":
            ok += 1
        elif status == "mismatch":
            mismatch += 1
            problems.append({"release_id": lr.release.id, "mechanism": lr.release.mechanism, "path": str(lr.path),
                             "epsilon": num(lr.release.epsilon), "message": msg})
        elif status == "no-claim":
            no_claim += 1
        else:
            unverified += 1
            unverified_list.append({"release_id": lr.release.id, "mechanism": lr.release.mechanism, "path": str(lr.path), "message": msg})
    checked = ok + mismatch + unverified
    name = sweep.name or str(sweep.path)
    for p in problems[:MAX_LISTED]:
        notes.append(Note("error", "sweep", f"sweep {name}: release {p['release_id'][:12]} ({p['mechanism']}, {p['path']}): "
                                            f"ACCOUNTING MISMATCH: {p['message']}."))
    if len(problems) > MAX_LISTED:
        notes.append(Note("error", "sweep", f"sweep {name}: {len(problems) - MAX_LISTED} more releases with an ACCOUNTING MISMATCH "
                                            "(all listed in the JSON report)."))
    if unverified:
        notes.append(Note("warning", "sweep", f"sweep {name}: {unverified} of {checked} release claims could not be recomputed "
                                              f"(first: {unverified_list[0]['message']})."))
    if reproducible:
        notes.append(Note("warning", "sweep", f"sweep {name}: {reproducible} release(s) used noise derived from a published "
                                              "seed: not private; the ledger counts them as unbounded."))
    if mismatch:
        line = f"{mismatch} of {checked} releases do NOT check out (ACCOUNTING MISMATCH)"
        status = "mismatch"
    elif unverified:
        line = f"{ok} of {checked} releases check out; {unverified} could not be recomputed"
        status = "unverified"
    elif checked:
        line = f"{ok} of {checked} releases check out"
        status = "ok"
    else:
        line = "no private release below the sweep's folder (nothing to check)"
        status = "no-claim"
    line += " (each stored guarantee recomputed with its own accountant is at most the claimed epsilon)" if checked else ""
    if no_claim:
        line += f"; {no_claim} non-private release(s) make no claim"
    return {"status": status, "line": line, "checked": checked, "ok": ok, "mismatch": mismatch, "unverified": unverified,
            "non_private": no_claim, "reproducible_noise": reproducible, "mismatches": problems, "unverified_releases": unverified_list}


def _budget(sweep: LoadedSweep, extra: list[dict], cache: EpsCache, notes: list[Note]) -> list[dict]:
    """Per (dataset, partition, adjacency): count, largest single claim, naive sum, composed epsilon.

    ``extra``: releases the store names but whose file is missing, as {dataset, partition,
    adjacency, epsilon, delta, guarantee (or None), non_private}.
    """
    groups: "OrderedDict[tuple, dict]" = OrderedDict()

    def group(ds: str, part: str, adj: str) -> dict:
        return groups.setdefault((ds, part, adj), {"guarantees": [], "claims": [], "deltas": [], "non_private": 0, "unknown": 0,
                                                    "from_store": 0, "largest": None})

    for lr in sweep.releases:
        r = lr.release
        g = group(dataset_name(r.dataset), str(r.partition), str(r.adjacency))
        if r.non_private:
            g["non_private"] += 1
            continue
        g["guarantees"].append(r.guarantee)
        eps = num(r.epsilon)
        g["claims"].append(eps if eps is not None else math.inf)
        if num(r.delta) is not None:
            g["deltas"].append(num(r.delta))
        if eps is not None and (g["largest"] is None or eps > g["largest"]["epsilon"]):
            g["largest"] = {"epsilon": eps, "release_id": r.id, "mechanism": r.mechanism, "target_epsilon": num(r.target_epsilon)}
    for x in extra:
        g = group(x["dataset"], x["partition"], x["adjacency"])
        g["from_store"] += 1
        if x["non_private"]:
            g["non_private"] += 1
        elif x["guarantee"] is None:
            g["unknown"] += 1
        else:
            g["guarantees"].append(x["guarantee"])
            g["claims"].append(x["epsilon"] if x["epsilon"] is not None else math.inf)
            if x["delta"] is not None:
                g["deltas"].append(x["delta"])
    rows = []
    for (ds, part, adj), g in groups.items():
        n_private = len(g["guarantees"])
        delta = max(g["deltas"]) if g["deltas"] else None
        row = {"dataset": ds, "partition": part, "adjacency": adj, "releases": n_private + g["non_private"] + g["unknown"],
               "private_releases": n_private, "non_private_releases": g["non_private"], "unknown_releases": g["unknown"],
               "from_store": g["from_store"], "largest_single": g["largest"],
               "max_single_epsilon": max(g["claims"]) if g["claims"] else None,
               "naive_sum": sum(g["claims"]) if g["claims"] else None, "delta": delta,
               "rdp": None, "prv": None, "errors": {}, "unbounded": g["non_private"] > 0, "lower_bound_only": g["unknown"] > 0}
        if g["non_private"]:
            # a non-private release on the same records has no finite guarantee: the sweep's cost is unbounded
            row["rdp"] = row["prv"] = math.inf
        elif n_private and delta is not None and 0 < delta < 1:
            tree = compose_sequential(g["guarantees"])
            for acc, res in compose_side_by_side(cache, tree, delta, adj).items():
                row[acc] = res["epsilon"]
                if res["error"]:
                    row["errors"][acc] = res["error"]
            if row["rdp"] is None:
                notes.append(Note("error", "sweep", f"sweep {sweep.name}: composition of {ds}/{part} failed with rdp: {row['errors'].get('rdp')}"))
        row["sentence"] = _budget_sentence(row)
        rows.append(row)
    return rows


def _budget_sentence(row: dict) -> str:
    where = f"{row['dataset']}/{row['partition']}"
    if row["unbounded"]:
        return (f"{row['releases']} releases of this sweep on {where} include {row['non_private_releases']} non-private one(s): "
                "their composed privacy cost is unbounded (eps = inf).")
    if not row["private_releases"]:
        return f"no private release of this sweep on {where}."
    comp = row["rdp"]
    via = "rdp"
    if comp is None and row["prv"] is not None:
        comp, via = row["prv"], "prv"
    at_least = "at least " if row["lower_bound_only"] else ""
    s = (f"{row['releases']} releases of this sweep on {where} compose to eps = {at_least}{_fmt(comp)} ({via}) at delta = {row['delta']:g}"
         if comp is not None else f"{row['releases']} releases of this sweep on {where}: composed epsilon could not be computed")
    if row["prv"] is not None and via == "rdp":
        s += f" (prv: {_fmt(row['prv'])})"
    elif row["prv"] is None and row["errors"].get("prv"):
        s += f" (prv gave no bound: {row['errors']['prv'].rstrip('.')})"
    big = row["largest_single"]
    if big is not None:
        s += f"; the largest single release claims eps = {_fmt(big['epsilon'])}"
    if row["naive_sum"] is not None:
        s += f"; the naive sum of their claims is {_fmt(row['naive_sum'])}"
    if row["lower_bound_only"]:
        s += f" ({row['unknown_releases']} release(s) could not be read: the composed epsilon is a lower bound)"
    return s + "."


def _ledger_block(sweep: LoadedSweep, ledger_path: str | None, release_ids: set[str], cache: EpsCache,
                  notes: list[Note]) -> dict | None:
    """What the ledger recorded for this sweep: by release id and by the entries' ``sweep`` tag."""
    if not ledger_path:
        return None
    name = sweep.name
    out: dict = {"ledger": ledger_path, "recorded": 0, "tagged": 0, "tagged_elsewhere": 0, "voided": 0, "missing": 0,
                 "missing_ids": [], "composition": [], "summary": None, "error": None}
    try:
        from ..ledger.book import open_ledger

        datasets = sorted({dataset_name(lr.release.dataset) for lr in sweep.releases})
        with open_ledger(ledger_path, create=False) as ledger:
            entries = []
            for ds in datasets:
                try:
                    entries.extend(ledger.entries(dataset=ds, kind="release"))
                except DPAuditError:
                    continue
            summary = None
            try:  # what the ledger says this sweep spent, when its entries carry the sweep tag
                if name and name in ledger.sweeps():
                    summary = [dict(r) for r in ledger.summary(sweep=name)]
            except DPAuditError:  # e.g. a ledger failing verification: the entries above still match by id
                summary = None
            out["summary"] = summary
    except DPAuditError as e:
        out["error"] = str(e)
        notes.append(Note("error", "sweep", f"sweep {name}: ledger {ledger_path} could not be read: {e}"))
        return out
    ours = []
    for e in entries:
        tag = e.payload.get("sweep")
        tag_name = tag.get("name") if isinstance(tag, dict) else (tag if isinstance(tag, str) else None)
        rid = str(e.payload.get("release_id") or e.id)
        if tag_name is not None and tag_name == name:
            out["tagged"] += 1
            if rid not in release_ids:
                out["tagged_elsewhere"] += 1
        if rid in release_ids or (tag_name is not None and tag_name == name):
            if rid in release_ids:
                out["recorded"] += 1
            if e.voided_by:
                out["voided"] += 1
            else:
                ours.append(e)
    recorded_ids = {str(e.payload.get("release_id") or e.id) for e in entries}
    missing = sorted(release_ids - recorded_ids)
    out["missing"], out["missing_ids"] = len(missing), missing
    if missing:
        notes.append(Note("warning", "sweep", f"sweep {name}: {len(missing)} of {len(release_ids)} releases are not in ledger "
                                              f"{ledger_path}: their budget use is not accounted there."))
    if out["tagged_elsewhere"]:
        notes.append(Note("info", "sweep", f"sweep {name}: the ledger holds {out['tagged_elsewhere']} release(s) tagged with this sweep "
                                           "that are not in its folder (composed below with the rest)."))
    groups: "OrderedDict[tuple, list]" = OrderedDict()
    for e in ours:
        p = e.payload
        groups.setdefault((str(p.get("dataset_name") or e.dataset), str(p.get("partition")), str(p.get("adjacency"))), []).append(e)
    for (ds, part, adj), es in groups.items():
        private = [e for e in es if not e.payload.get("non_private")]
        deltas = [num(e.payload.get("delta")) for e in private if num(e.payload.get("delta")) is not None]
        delta = max(deltas) if deltas else None
        row = {"dataset": ds, "partition": part, "adjacency": adj, "releases": len(es), "non_private_releases": len(es) - len(private),
               "naive_sum": sum(num(e.payload.get("epsilon")) or 0.0 for e in private), "delta": delta, "rdp": None}
        if len(private) < len(es):
            row["rdp"] = math.inf
        elif private and delta is not None and 0 < delta < 1:
            row["rdp"] = cache.get(compose_sequential(e.payload.get("guarantee") for e in private), delta, "rdp", adj)["epsilon"]
        out["composition"].append(row)
    return out


def _tables_note(sweep: LoadedSweep, tables: dict, notes: list[Note]) -> str:
    """Compare the sweep's saved tables.json with the recomputed tables (the report trusts the store)."""
    f = sweep.path / "tables.json"
    if not f.is_file():
        return "absent"
    try:
        saved = read_json(f, "sweep tables")
    except DPAuditError:
        notes.append(Note("info", "sweep", f"sweep {sweep.name}: {f} is unreadable; the tables here are recomputed from the store."))
        return "unreadable"
    from ..records import _json_safe

    keys = ("tasks_with_results", "cells", "contrasts")
    a = json.dumps({k: _json_safe(saved.get(k)) for k in keys}, sort_keys=True)
    b = json.dumps({k: _json_safe(tables.get(k)) for k in keys}, sort_keys=True)
    if a == b:
        return "matches"
    notes.append(Note("info", "sweep", f"sweep {sweep.name}: {f} differs from the store (written when "
                                       f"{saved.get('tasks_with_results')} tasks had finished, now {tables.get('tasks_with_results')}); "
                                       "the tables here are recomputed from the store."))
    return "differs"


def sweep_section(sweep: LoadedSweep, cache: EpsCache, notes: list[Note], *, ledger_path: str | None = None) -> dict:
    """The ``sections.sweep`` entry of one sweep (see the report model's docstring)."""
    from ..sweeps import sweep_tables

    notes.extend(sweep.notes)
    name = sweep.name or sweep.path.name
    entry: dict = {"name": name, "path": str(sweep.path), "store": str(sweep.store), "error": sweep.error,
                   "counts": {"done": 0, "failed": 0, "pending": 0, **sweep.counts}, "failures": sweep.failures,
                   "spec": sweep.spec, "releases": len(sweep.releases), "unreadable_releases": sweep.unreadable, "release_ids": [lr.release.id for lr in sweep.releases],
                   "tables": None, "tables_json": None, "accounting": None, "budget": [], "ledger": None}
    entry["counts"]["total"] = sum(entry["counts"][k] for k in ("done", "failed", "pending"))
    c = entry["counts"]
    if c["failed"]:
        first = sweep.failures[0]
        stale = sum(1 for fl in sweep.failures if fl.get("in_current_spec") is False)
        why = (f"; {stale} of them are not in the sweep's current spec (left from an earlier version of it: not part of the grid)"
               if stale else "")
        notes.append(Note("warning", "sweep", f"sweep {name}: {c['failed']} task(s) failed (first: {first['model']} {first['dataset']} "
                                              f"eps={first['epsilon']} seed={first['seed']}: {first['error']}){why}."))
    if c["pending"]:
        notes.append(Note("info", "sweep", f"sweep {name}: {c['pending']} task(s) still pending: the tables cover finished tasks only."))
    if not sweep.error:
        tables = sweep_tables(sweep.records, name=sweep.name)
        entry["tables"] = tables
        entry["tables_json"] = _tables_note(sweep, tables, notes)

    # releases named by the store vs. found on disk
    on_disk = {lr.release.id for lr in sweep.releases}
    store_ids = {str(r["release_id"]) for r in sweep.results if r.get("release_id")}
    missing = [r for r in sweep.results if r.get("release_id") and str(r["release_id"]) not in on_disk]
    orphans = on_disk - store_ids
    extra = []
    for r in missing:
        ds = r.get("dataset")
        g = _store_guarantee(r)
        extra.append({"dataset": dataset_name(ds), "partition": str(r.get("partition") or "train"),
                      "adjacency": str(r.get("adjacency") or "add-remove-record"), "epsilon": num(r.get("epsilon")),
                      "delta": num(r.get("delta")), "guarantee": g if g is None or g.get("type") != "non-private" else None,
                      "non_private": bool(r.get("non_private"))})
    if missing:
        notes.append(Note("error", "sweep", f"sweep {name}: {len(missing)} release(s) recorded by its store have no readable release.json "
                                            f"under {sweep.path} (first: {missing[0]['release_id'][:12]}); they are composed from the "
                                            "parameters the store kept and cannot be checked."))
    if orphans and store_ids:
        notes.append(Note("warning", "sweep", f"sweep {name}: {len(orphans)} release(s) under {sweep.path} belong to no finished task "
                                              "of its store (e.g. a task that failed after training); they spent budget and are "
                                              "composed and checked with the rest."))
    entry["missing_releases"] = [str(r["release_id"]) for r in missing]
    entry["orphan_releases"] = sorted(orphans) if store_ids else []
    entry["accounting"] = _accounting(sweep, notes)
    entry["budget"] = _budget(sweep, extra, cache, notes)
    entry["ledger"] = _ledger_block(sweep, ledger_path, on_disk | store_ids, cache, notes)
    return entry


def sweep_verdict(entry: dict) -> dict:
    """One verdict line per sweep (fail closed: any accounting mismatch makes it ACCOUNTING MISMATCH)."""
    acc = entry["accounting"] or {}
    name = entry["name"]
    head = f"sweep {name} ({entry['releases']} releases)"
    if acc.get("status") == "mismatch":
        firsts = "; ".join(m["message"] for m in acc["mismatches"][:3])
        status, parts = "accounting-mismatch", [f"ACCOUNTING MISMATCH: {acc['mismatch']} of {acc['checked']} releases ({firsts})"]
    elif entry.get("error"):
        status, parts = "inconclusive", [f"INCONCLUSIVE: the sweep store could not be read ({entry['error']})",
                                         f"accounting: {acc.get('line', 'n/a')}"]
    else:
        status = "not-audited" if entry["releases"] else "no-claim"
        parts = [f"accounting: {acc.get('line', 'n/a')}"]
        if entry["releases"]:
            parts.append("NOT AUDITED as a sweep (audit single releases with `dpaudit audit`)")
    if entry.get("unreadable_releases"):
        parts.append(f"{entry['unreadable_releases']} release file(s) unreadable (see notes)")
    worst = [b for b in entry["budget"] if b.get("rdp") is not None]
    if worst:
        b = max(worst, key=lambda r: r["rdp"])
        parts.append(f"composed eps on {b['dataset']}/{b['partition']} = {_fmt(b['rdp'])} (rdp) vs largest single {_fmt(b['max_single_epsilon'])}")
    flags = ["sweep"] + (["accounting-mismatch"] if status == "accounting-mismatch" else [])
    if entry.get("missing_releases"):
        flags.append("missing-releases")
    if entry.get("unreadable_releases"):
        flags.append("unreadable-releases")
    return {"mechanism": head, "key": f"sweep:{name}", "status": status, "flags": flags, "line": f"{head}: " + "; ".join(parts),
            "max_epsilon_lower_bound": None,
            "claimed_epsilons": sorted({b["max_single_epsilon"] for b in entry["budget"] if b.get("max_single_epsilon") is not None}),
            "releases": [], "non_private_releases": [], "audits": [], "sweep": name}


def sweep_reproduce(entry: dict) -> dict:
    """The reproduce entry of a sweep (its spec; the builtin command when it is a builtin spec)."""
    spec = entry.get("spec") if isinstance(entry.get("spec"), dict) else None
    cmd = None
    source = spec.get("source") if spec else None
    out_parent = str(Path(entry["path"]).parent)
    if isinstance(source, str) and source.startswith("builtin:"):
        cmd = f"dpaudit sweep --builtin {source.split(':', 1)[1]} --out {out_parent}"
    elif isinstance(source, str) and source and os.path.exists(source):
        cmd = f"dpaudit sweep {source} --out {out_parent}"
    params = {"spec": spec} if spec and cmd is None else {}
    return {"kind": "sweep", "mechanism": None, "id": entry["name"], "path": entry["path"], "command": cmd, "seed": None,
            "noise": None, "dpaudit_version": None, "git_commit": None, **({"parameters": params} if params else {})}

"""Section ``audit``: one entry per audit record (its own verdict, recomputed bound and ceiling,
ROC), the Table-16-shaped table (DP-MixMin paper, Table 16) and the links between audits and the
releases they belong to.

Only the shareable part of an audit is read (audit.json / one_run.json, with any private key an
old file still carries removed on loading, :func:`dpaudit.audit_outputs.shareable_audit`): never
``audit_local.json`` or the raw scores (``scores.npz``), which are functions of the private data
in score units. Audit results are not covered by the release's claim; the section says so
(:data:`dpaudit.audit_outputs.NOT_COVERED`)."""

from __future__ import annotations

import math
from collections import OrderedDict
from pathlib import Path

from ..audits.curves import family_statement
from ..audits.verdicts import decision_at, upgrade, violated
from ..errors import DPAuditError
from ..records import Release
from . import evidence, stats
from .inputs import Inputs, LoadedAudit, LoadedOneRun, LoadedRelease, Note, canonical_mechanism, command_str, integer, num


def link_audits(inputs: Inputs, notes: list[Note]) -> dict[int, LoadedRelease | None]:
    """Release each audit explicitly belongs to (release_id / release_path / same directory)."""
    by_id = {lr.release.id: lr for lr in inputs.releases}
    by_dir = {lr.path.resolve(): lr for lr in inputs.releases}
    links: dict[int, LoadedRelease | None] = {}
    for i, la in enumerate(inputs.audits):
        v = la.view
        lr = None
        if v["release_id"] and str(v["release_id"]) in by_id:
            lr = by_id[str(v["release_id"])]
        elif v["release_path"]:
            p = Path(v["release_path"])
            p = p if p.is_absolute() else la.path / p
            p = p.parent if p.name.endswith(".json") else p
            lr = by_dir.get(p.resolve())
        if lr is None:
            lr = by_dir.get(la.path.resolve())
        links[i] = lr
        if lr is not None and v["mechanism"] is not None and canonical_mechanism(v["mechanism"]) != canonical_mechanism(lr.release.mechanism):
            notes.append(Note("error", "audit", (
                f"audit {la.path} is of mechanism {v['mechanism']!r} but belongs to release {lr.release.id[:12]} of mechanism "
                f"{lr.release.mechanism!r}: it is NOT used for {lr.release.mechanism}'s verdict.")))
    return links


def audit_entry(i: int, la: LoadedAudit, covered: list[Release], notes: list[Note], with_scores: bool = False) -> dict:
    """One audit's entry. ``with_scores`` has no effect any more: raw scores are local (issue 23
    point 5), so the report never reads them; kept for callers that still pass it."""
    v = dict(la.view)
    label = f"audit {la.path}"
    entry = {k: v[k] for k in ("id", "mechanism", "canary", "task", "dataset", "trials", "eval_trials", "claimed_epsilon", "delta",
                                "epsilon_lower_bound", "confidence", "method", "counts", "ceiling", "ceiling_source",
                                "gdp_estimate", "no_noise", "null", "auc", "seeds", "missing")}
    entry["index"] = i
    entry["path"] = str(la.path)
    entry["label"] = la.path.name or str(la.path)
    entry["command"] = command_str(v["command"])
    entry["covers_releases"] = [r.id for r in covered]
    # the claim the audit itself tested (its recorded claim); a release's only when it records none
    own = v["claimed_epsilon"]
    entry["compared_claim"] = own if own is not None else next((num(r.epsilon) for r in covered if num(r.epsilon) is not None), None)
    if v.get("epsilon_lower_bound_note"):
        notes.append(Note("info", "audit", f"{label}: {v['epsilon_lower_bound_note']}."))
    if v["missing"]:
        notes.append(Note("info", "audit", f"{label} lacks keys: {', '.join(v['missing'])}."))
    _evidence(entry, la, v, label, notes)
    # recompute the bound and the ceiling from the EVAL counts (independent cross-check)
    counts = v["counts"] or {}
    c = {k: integer(counts.get(k)) for k in ("tp", "fp", "tn", "fn")}
    entry["recomputed_epsilon_lower_bound"] = None
    delta = v["delta"]
    conf = v["confidence"]
    decision = None
    if all(x is not None for x in c.values()) and delta is not None and conf is not None and 0 < conf < 1:
        cp_rec = stats.epsilon_lower_bound(tp=c["tp"], fp=c["fp"], tn=c["tn"], fn=c["fn"], delta=delta, confidence=conf)
        if entry["ceiling"] is None:
            entry["ceiling"] = stats.ceiling(n_in=c["tp"] + c["fn"], n_out=c["fp"] + c["tn"], delta=delta, confidence=conf)
            entry["ceiling_source"] = "computed by the report from the EVAL counts"
        # the counts are the Clopper-Pearson test's: compare with the stored CP bound
        stored = entry["clopper_pearson_epsilon"]
        if stored is not None and abs(stored - cp_rec) > 0.01 + 1e-3 * abs(cp_rec):
            notes.append(Note("warning", "audit", f"{label}: stored Clopper-Pearson eps_LB {stored:.4f} differs from the bound "
                                                  f"{cp_rec:.4f} recomputed from its counts (two-sided split of significance)."))
        try:  # the published eps_LB and the decision, recomputed from the stored counts
            decision = decision_at(la.record, conf)
        except (DPAuditError, ValueError, KeyError, TypeError) as e:
            notes.append(Note("warning", "audit", f"{label}: its decision could not be recomputed from its counts ({e})."))
        entry["recomputed_epsilon_lower_bound"] = None if decision is None else decision["epsilon_lower_bound"]
    elif entry["ceiling"] is None:
        notes.append(Note("warning", "audit", f"{label}: no ceiling and no complete counts; whether the audit could detect a violation is unknown."))
    # the verdict of this one audit (the one rule: dpaudit.audits.verdicts.violated)
    lb, claim = v["epsilon_lower_bound"], entry["compared_claim"]
    rec = entry["recomputed_epsilon_lower_bound"]
    stored_violated = violated({**upgrade(la.record), "claimed_epsilon": claim})
    entry["role"] = v["role"]
    if v["role"] != "main" or not v["noise"] or not v["canary_inserted"]:
        status = "control"
        notes.append(Note("info", "verdict", f"{label} is a control run (role {v['role']}, noise {'on' if v['noise'] else 'off'}, "
                                             f"canary {'inserted' if v['canary_inserted'] else 'not inserted'}); no privacy claim applies to it."))
    elif lb is None or claim is None or (isinstance(lb, float) and math.isnan(lb)):
        status = "incomplete"
        why = "no eps_LB" if lb is None or math.isnan(lb) else "no claimed epsilon"
        notes.append(Note("error", "verdict", f"{label}: {why}; the verdict for {v['mechanism']} is INCONCLUSIVE."))
    elif stored_violated:
        status = "violation"
    elif decision is not None and decision["violated"] is not False:
        # a record at odds with its own counts must not read as "no evidence" (fail closed)
        status = "incomplete"
        notes.append(Note("error", "verdict", f"{label}: stored verdict 'no violation' but its own counts "
                                              + ("cannot be re-judged" if decision["violated"] is None else "give a violation")
                                              + (f" (eps_LB {rec:.4f}, claim {claim:.4f})" if rec is not None else "") + "; INCONCLUSIVE."))
    elif rec is not None and abs(rec - lb) > 0.01 + 1e-3 * abs(rec):
        status = "incomplete"
        notes.append(Note("error", "verdict", f"{label}: stored eps_LB {lb:.4f} differs from {rec:.4f} recomputed from its counts; INCONCLUSIVE."))
    elif entry["statistic"] not in evidence.STATISTICS:
        status = "incomplete"
        notes.append(Note("error", "verdict", f"{label}: eps_LB comes from statistic {entry['statistic']!r}, which this report does not know; "
                                              "INCONCLUSIVE."))
    elif v["mechanism"] is None:
        status = "incomplete"  # no mechanism: no claim it could support (a violation above is still shown)
    else:
        status = "no-evidence"
    entry["status"] = status
    ceil = entry["ceiling"]
    entry["underpowered"] = bool(ceil is not None and claim is not None and ceil < claim)
    nn = v["no_noise"]
    if nn is not None and nn.get("epsilon_lower_bound") is not None and nn["epsilon_lower_bound"] < 0.1:
        notes.append(Note("warning", "audit", f"{label}: the no-noise control found almost no leakage (eps_LB {nn['epsilon_lower_bound']:.3f}); "
                                              "the attack may be too weak to detect a violation."))
    elif nn is None:
        notes.append(Note("info", "audit", f"{label}: no no-noise control recorded."))
    # plot data: the audit's own ROC on its EVAL trials (rates only; raw scores are never read)
    entry["direction"] = v["direction"]
    entry["roc"] = v["roc"]
    entry["roc_source"] = "audit record (EVAL trials)" if v["roc"] else None
    return entry


def _evidence(entry: dict, la: LoadedAudit, v: dict, label: str, notes: list[Note]) -> None:
    """The issue-15 blocks of an audit record: which statistic decided its eps_LB, the
    Clopper-Pearson bound beside it, the claimed-curve block (drawn as the trade-off figure) and
    the cross-tool comparison statistics. An audit.json from before these existed has none of
    them: its eps_LB is the Clopper-Pearson bound and it renders as it always did."""
    rec = la.record
    entry["statistic"] = evidence.statistic_of(rec)
    cp = num(rec.get("clopper_pearson_epsilon"))
    entry["clopper_pearson_epsilon"] = cp if cp is not None else (v["epsilon_lower_bound"] if entry["statistic"] == "clopper-pearson" else None)
    entry["threat_model"] = rec.get("threat_model") if isinstance(rec.get("threat_model"), str) else "final-model"
    entry["comparison"] = evidence.comparison_view(rec.get("comparison"))
    cv = evidence.curve_view(rec.get("claimed_curve"))
    entry["claimed_curve"] = cv
    fam = (cv or {}).get("family") or {}
    entry["claim_family_bound"] = ({"statement": family_statement(fam), "violated": cv["violated"]}
                                   if fam.get("parameter") and fam.get("claimed") is not None else None)
    if rec.get("claimed_curve") is not None and cv is None:
        notes.append(Note("warning", "audit", f"{label}: its claimed_curve block is malformed (needs curve, point with fpr_upper/fnr_upper "
                                              "in [0, 1], and violated); no trade-off figure."))
    if entry["statistic"] == "claimed-curve":
        if cv is None:
            notes.append(Note("warning", "audit", f"{label}: eps_LB is said to come from the claimed-curve statistic but the record holds "
                                                  "no readable claimed_curve block to check it against."))


#: The analyses of a one-run record (its ``statistic`` field) and their names in the report.
ONE_RUN_STATISTICS = {"f-dp": "one-run f-DP", "steinke": "one-run (eps, delta)"}


def one_run_entry(i: int, lo: LoadedOneRun, notes: list[Note]) -> dict | None:
    """One one-run audit (one_run.json): its bounds, and its own verdict against its claim.

    The record's deciding analysis (f-DP when a claimed event was tested, else Steinke et al.)
    decides: its bound above the claim is a VIOLATION; an f-DP ``violated`` flag its eps_LB does
    not back, or a missing claim, is INCONCLUSIVE (fail closed). A no-noise run is a control.
    """
    label = f"one-run record {lo.path}"
    view = evidence.one_run_view(lo.record)
    if view is None:
        notes.append(Note("error", "audit", f"{label} skipped: it has neither a steinke nor an fdp block."))
        return None
    rec = lo.record
    e = dict(view, index=i, path=str(lo.path), label=lo.path.parent.name or str(lo.path))
    claim = view["claimed_epsilon"]
    st_lb = (view["steinke"] or {}).get("epsilon_lower_bound")
    fd_lb = (view["fdp"] or {}).get("epsilon_lower_bound")
    # One analysis decides, fixed before looking (the record's rule: f-DP when a claimed event
    # was tested, else Steinke et al.); taking the larger of the two would test twice at the
    # stated confidence. The other is shown beside it, never used for the verdict.
    stat = rec.get("statistic") if rec.get("statistic") in ONE_RUN_STATISTICS else ("f-dp" if fd_lb is not None else "steinke")
    lb = fd_lb if stat == "f-dp" else st_lb
    e["statistic"] = ONE_RUN_STATISTICS[stat]
    e["epsilon_lower_bound"] = lb if lb is not None and not math.isnan(lb) else None
    other, other_lb = ("steinke", st_lb) if stat == "f-dp" else ("f-dp", fd_lb)
    control = rec.get("noise") is False or rec.get("role") not in (None, "main") or rec.get("canary_inserted") is False
    fdp_flag = (view["fdp"] or {}).get("violated") if stat == "f-dp" else None
    if control:
        status = "control"
        notes.append(Note("info", "verdict", f"{label} is a control run (no noise or no canary); no privacy claim applies to it."))
    elif claim is None or e["epsilon_lower_bound"] is None:
        status = "incomplete"
        notes.append(Note("error", "verdict", f"{label}: {'no claimed epsilon' if claim is None else 'no eps_LB'}; INCONCLUSIVE."))
    elif e["epsilon_lower_bound"] > claim:
        status = "violation"
    elif fdp_flag:
        status = "incomplete"
        notes.append(Note("error", "verdict", f"{label}: its f-DP analysis says the claimed event is violated but its eps_LB "
                                              f"{e['epsilon_lower_bound']:.4f} <= claim {claim:.4f}; INCONCLUSIVE."))
    else:
        status = "no-evidence"
    if not control and claim is not None and other_lb is not None and other_lb > claim and status != "violation":
        notes.append(Note("warning", "verdict", f"{label}: the {ONE_RUN_STATISTICS[other]} analysis, which does not decide (the "
                                                f"{e['statistic']} analysis was fixed in advance), gives eps_LB {other_lb:.4f} > claim {claim:.4f}."))
    e["status"] = status
    return e


def table16(entries: list[dict]) -> dict:
    """Rows per (mechanism, task), one column group per canary: private / no-noise eps_LB, ceiling."""
    canaries: list[str] = []
    rows: "OrderedDict[tuple, dict]" = OrderedDict()
    for e in entries:
        can = e["canary"] or "unnamed canary"
        if can not in canaries:
            canaries.append(can)
        task = e["task"] or e["dataset"] or "-"
        key = (e["mechanism"] or "unknown", task, e["compared_claim"])
        n = 1
        while key in rows and can in rows[key]["cells"]:  # a second audit of the same cell gets its own row
            n += 1
            key = (e["mechanism"] or "unknown", f"{task} [{e['label']}]", e["compared_claim"], n)
        row = rows.setdefault(key, {"mechanism": key[0], "task": key[1], "claimed_epsilon": e["compared_claim"], "cells": {}})
        nn = e["no_noise"] or {}
        row["cells"][can] = {
            "private": e["epsilon_lower_bound"], "no_noise": nn.get("epsilon_lower_bound"), "ceiling": e["ceiling"],
            "confidence": e["confidence"], "trials": e["trials"], "status": e["status"],
        }
    out_rows = list(rows.values())
    max_row: dict = {"mechanism": "max over tasks", "task": "", "claimed_epsilon": None, "cells": {}}
    for can in canaries:
        cells = [r["cells"][can] for r in out_rows if can in r["cells"]]

        def _mx(k: str) -> float | None:
            vals = [c[k] for c in cells if c[k] is not None]
            return max(vals) if vals else None

        max_row["cells"][can] = {"private": _mx("private"), "no_noise": _mx("no_noise"), "ceiling": _mx("ceiling"),
                                 "confidence": None, "trials": None, "status": None}
    return {"canaries": canaries, "rows": out_rows, "max": max_row if len(out_rows) > 1 else None}

"""Section ``audit``: one entry per audit record (its own verdict, recomputed bound and ceiling,
ROC), the Table-16-shaped table (DP-MixMin paper, Table 16) and the links between audits and the
releases they belong to. Only the shareable part of an audit is read (:mod:`.inputs`); audit
results are not covered by the release's claim (:data:`dpaudit.audit_outputs.NOT_COVERED`)."""

from __future__ import annotations

import math

from ..accounting.events import event_from_dict
from ..audits.curves import family_ruled_out, family_statement
from ..audits.verdicts import box_uppers, decision_at, violated
from ..errors import DataError, DPAuditError
from ..records import Release
from . import stats
from .audit_view import STATISTICS, one_run_view, white_box_view
from .inputs import (
    Inputs,
    LoadedAudit,
    LoadedOneRun,
    LoadedRelease,
    Note,
    canonical_mechanism,
    command_str,
    num,
)


def _linked(la: LoadedAudit, by_id: dict, by_dir: dict) -> LoadedRelease | None:
    """The release ``la`` records: by release id, else by release path, else its own folder."""
    v = la.view
    if v.release_id and str(v.release_id) in by_id:
        return by_id[str(v.release_id)]
    lr = None
    if v.release_path:
        p = la.path / v.release_path  # an absolute release_path stays itself
        lr = by_dir.get((p.parent if p.name.endswith(".json") else p).resolve())
    return lr if lr is not None else by_dir.get(la.path.resolve())


def link_audits(inputs: Inputs, notes: list[Note]) -> dict[int, LoadedRelease | None]:
    """Release each audit explicitly belongs to (release_id / release_path / same directory)."""
    by_id = {lr.release.id: lr for lr in inputs.releases}
    by_dir = {lr.path.resolve(): lr for lr in inputs.releases}
    links: dict[int, LoadedRelease | None] = {}
    for i, la in enumerate(inputs.audits):
        lr = links[i] = _linked(la, by_id, by_dir)
        mech = la.view.mechanism
        if (
            lr is not None
            and mech is not None
            and canonical_mechanism(mech) != canonical_mechanism(lr.release.mechanism)
        ):
            text = (
                f"audit {la.path} is of mechanism {mech!r} but belongs to release {lr.release.id[:12]} of "
                f"mechanism {lr.release.mechanism!r}: it is NOT used for {lr.release.mechanism}'s verdict."
            )
            notes.append(Note("error", "audit", text))
    return links


#: The fields of an audit's view its entry repeats as they are.
ENTRY_FIELDS = tuple(
    "id mechanism canary task dataset adjacency trials eval_trials claimed_epsilon delta "
    "epsilon_lower_bound confidence method counts ceiling ceiling_source gdp_estimate no_noise "
    "null auc seeds missing power sequential".split()
)


def audit_entry(i: int, la: LoadedAudit, covered: list[Release], notes: list[Note]) -> dict:
    """One audit's entry (raw scores are local: the report never reads them)."""
    v = la.view
    label = f"audit {la.path}"
    entry = {k: getattr(v, k) for k in ENTRY_FIELDS}
    entry.update(
        index=i,
        path=str(la.path),
        label=la.path.name or str(la.path),
        command=command_str(v.command),
        plan_id=v.plan_id,
        covers_releases=[r.id for r in covered],
        compared_claim=_compared_claim(v.claimed_epsilon, covered),
    )
    _record_notes(v, label, notes)
    _evidence(entry, la, label, notes)
    decision = _recount(entry, la, label, notes)
    entry["role"] = v.role
    entry["status"] = _status(entry, la, decision, label, notes)
    entry["underpowered"] = _underpowered(entry["ceiling"], entry["compared_claim"], v.power)
    _no_noise_note(v.no_noise, label, notes)
    # plot data: the audit's own ROC on its EVAL trials (rates only; raw scores are never read)
    entry.update(
        direction=v.direction, roc=v.roc, roc_source="audit record (EVAL trials)" if v.roc else None
    )
    return entry


def _underpowered(ceiling: float | None, claim: float | None, power: dict | None) -> bool:
    """True when the audit cannot detect a violation of its claim at all: its ceiling (the bound of
    perfectly separated scores) is below the claim, or its power block says nothing is detectable."""
    below = ceiling is not None and claim is not None and ceiling < claim
    power = power or {}
    return bool(
        below or power.get("claimed_epsilon") is not None and power.get("detectable") is False
    )


def _compared_claim(own: float | None, covered: list[Release]) -> float | None:
    """The claim the audit itself tested (its recorded claim); a release's only when it records none."""
    if own is not None:
        return own
    return next((num(r.epsilon) for r in covered if num(r.epsilon) is not None), None)


def _record_notes(v, label: str, notes: list[Note]) -> None:
    if v.epsilon_lower_bound_note:
        notes.append(Note("info", "audit", f"{label}: {v.epsilon_lower_bound_note}."))
    if v.missing:
        notes.append(Note("info", "audit", f"{label} lacks keys: {', '.join(v.missing)}."))


def _far(a: float, b: float) -> bool:
    """Two eps_LB of one record differ by more than rounding (0.01 + 0.1 %)."""
    return abs(a - b) > 0.01 + 1e-3 * abs(b)


def _recount(entry: dict, la: LoadedAudit, label: str, notes: list[Note]) -> dict | None:
    """Recompute the bound, the ceiling and the decision from the EVAL counts (an independent
    cross-check); the decision of :func:`dpaudit.audits.verdicts.decision_at`, or None."""
    c, delta, conf = la.view.counts, la.view.delta, la.view.confidence
    entry["recomputed_epsilon_lower_bound"] = entry["recomputed"] = None
    if c is None or delta is None or conf is None or not 0 < conf < 1:
        if entry["ceiling"] is None:
            text = f"{label}: no ceiling and no complete counts; whether the audit could detect a violation is unknown."
            notes.append(Note("warning", "audit", text))
        return None
    cp_rec = stats.epsilon_lower_bound(**c, delta=delta, confidence=conf)
    if entry["ceiling"] is None:
        entry["ceiling"] = stats.ceiling(
            n_in=c["tp"] + c["fn"], n_out=c["fp"] + c["tn"], delta=delta, confidence=conf
        )
        entry["ceiling_source"] = "computed by the report from the EVAL counts"
    # the counts are the Clopper-Pearson test's: compare with the stored CP bound
    stored = entry["clopper_pearson_epsilon"]
    if stored is not None and _far(stored, cp_rec):
        text = (
            f"{label}: stored Clopper-Pearson eps_LB {stored:.4f} differs from the bound "
            f"{cp_rec:.4f} recomputed from its counts (two-sided split of significance)."
        )
        notes.append(Note("warning", "audit", text))
    try:  # the published eps_LB and the decision, recomputed from the stored counts
        decision = decision_at(la.record, conf)
    except (DPAuditError, ValueError, KeyError, TypeError) as e:
        text = f"{label}: its decision could not be recomputed from its counts ({e})."
        notes.append(Note("warning", "audit", text))
        return None
    entry["recomputed_epsilon_lower_bound"] = decision["epsilon_lower_bound"]
    entry["recomputed"] = _deciding(la.record, conf, decision, entry["statistic"], label, notes)
    return decision


def _deciding(
    rec: dict, conf: float, decision: dict, statistic: str, label: str, notes: list[Note]
) -> dict | None:
    """The statistic that decides the audit, recomputed from its stored counts: the claimed-curve
    family search on the Clopper-Pearson box corners, or the published eps_LB (None: not recomputable)."""
    cc = rec.get("claimed_curve")
    if statistic != "claimed-curve" or not isinstance(cc, dict):
        return {"statistic": statistic, "epsilon_lower_bound": decision["epsilon_lower_bound"]}
    try:
        fam = _family_from_counts(rec, cc, conf)
    except (DPAuditError, ValueError, KeyError, TypeError) as e:
        text = f"{label}: its claimed-curve test could not be recomputed from its counts ({e})."
        notes.append(Note("warning", "audit", text))
        return None
    stored = (cc.get("family") or {}).get("lower_bound")
    if _differ(stored, fam["lower_bound"]):
        text = (
            f"{label}: stored claimed-curve result ({family_statement(cc.get('family') or {})}) differs "
            f"from the one recomputed from its counts ({family_statement(fam)})."
        )
        notes.append(Note("warning", "audit", text))
    return {"statistic": statistic, "statement": family_statement(fam), "violated": fam["violated"]}


def _family_from_counts(rec: dict, cc: dict, conf: float) -> dict:
    """The claim family ruled out by the Clopper-Pearson box corners of the stored counts."""
    hi = box_uppers(rec, conf)
    if hi is None:
        raise DataError("no box counts")
    adjacency = cc.get("adjacency") or rec.get("adjacency") or "add-remove-record"
    return family_ruled_out(event_from_dict(cc["event"]), adjacency, *hi)


def _differ(stored, recomputed: float | None) -> bool:
    """A stored result and its recomputation disagree (one absent, or more than rounding apart)."""
    if (stored is None) != (recomputed is None):
        return True
    return stored is not None and _far(float(stored), recomputed)


def _is_control(v, label: str, notes: list[Note]) -> bool:
    if v.role == "main" and v.noise and v.canary_inserted:
        return False
    text = (
        f"{label} is a control run (role {v.role}, noise {'on' if v.noise else 'off'}, "
        f"canary {'inserted' if v.canary_inserted else 'not inserted'}); no privacy claim applies to it."
    )
    notes.append(Note("info", "verdict", text))
    return True


def _unjudgeable(lb: float | None, claim: float | None) -> str | None:
    """Why a record supports no verdict at all (None: it does)."""
    if lb is None or math.isnan(lb):
        return "no eps_LB"
    return "no claimed epsilon" if claim is None else None


def _status(
    entry: dict, la: LoadedAudit, decision: dict | None, label: str, notes: list[Note]
) -> str:
    """The verdict of this one audit (the one rule: :func:`dpaudit.audits.verdicts.violated`), fail closed."""
    v = la.view
    if _is_control(v, label, notes):
        return "control"
    lb, claim = v.epsilon_lower_bound, entry["compared_claim"]
    why = _unjudgeable(lb, claim)
    if why is not None:
        text = f"{label}: {why}; the verdict for {v.mechanism} is INCONCLUSIVE."
        notes.append(Note("error", "verdict", text))
        return "incomplete"
    if violated({**la.record, "claimed_epsilon": claim}):
        return "violation"
    problem = _inconsistency(entry, lb, claim, decision)
    if problem is not None:
        notes.append(Note("error", "verdict", f"{label}: {problem}"))
        return "incomplete"
    # no mechanism: no claim it could support
    return "incomplete" if v.mechanism is None else "no-evidence"


def _inconsistency(entry: dict, lb: float, claim: float, decision: dict | None) -> str | None:
    """Why a record that reads "no violation" cannot be trusted to (None: it can)."""
    rec = entry["recomputed_epsilon_lower_bound"]
    if decision is not None and decision["violated"] is not False:
        # a record at odds with its own counts must not read as "no evidence" (fail closed)
        return (
            "stored verdict 'no violation' but its own counts "
            + ("cannot be re-judged" if decision["violated"] is None else "give a violation")
            + (f" (eps_LB {rec:.4f}, claim {claim:.4f})" if rec is not None else "")
            + "; INCONCLUSIVE."
        )
    if rec is not None and _far(lb, rec):
        return f"stored eps_LB {lb:.4f} differs from {rec:.4f} recomputed from its counts; INCONCLUSIVE."
    if entry["statistic"] not in STATISTICS:
        return f"eps_LB comes from statistic {entry['statistic']!r}, which this report does not know; INCONCLUSIVE."
    return None


def _no_noise_note(nn: dict | None, label: str, notes: list[Note]) -> None:
    if nn is None:
        notes.append(Note("info", "audit", f"{label}: no no-noise control recorded."))
    elif nn.get("epsilon_lower_bound") is not None and nn["epsilon_lower_bound"] < 0.1:
        text = (
            f"{label}: the no-noise control found almost no leakage (eps_LB {nn['epsilon_lower_bound']:.3f}); "
            "the attack may be too weak to detect a violation."
        )
        notes.append(Note("warning", "audit", text))


def _family_bound(cv: dict | None) -> dict | None:
    """The claimed-curve verdict as a statement about the claim's family (None without a family)."""
    fam = (cv or {}).get("family") or {}
    if not fam.get("parameter") or fam.get("claimed") is None:
        return None
    return {"statement": family_statement(fam), "violated": cv["violated"]}


#: The evidence fields of an audit's view its entry repeats as they are.
EVIDENCE_FIELDS = ("statistic", "clopper_pearson_epsilon", "threat_model", "comparison")
EVIDENCE_FIELDS += ("claimed_curve",)


def _evidence(entry: dict, la: LoadedAudit, label: str, notes: list[Note]) -> None:
    """The evidence blocks of an audit record: which statistic decided its eps_LB, the
    Clopper-Pearson bound beside it, the claimed-curve block (drawn as the trade-off figure) and
    the cross-tool comparison statistics. An audit.json from before these existed has none of
    them: its eps_LB is the Clopper-Pearson bound and it renders as it always did."""
    v = la.view
    stat, cv = v.statistic, v.claimed_curve
    entry.update({k: getattr(v, k) for k in EVIDENCE_FIELDS}, claim_family_bound=_family_bound(cv))
    if v.claimed_curve_malformed:
        text = (
            f"{label}: its claimed_curve block is malformed (needs curve, point with fpr_upper/fnr_upper "
            "in [0, 1], and violated); no trade-off figure."
        )
        notes.append(Note("warning", "audit", text))
    if cv is None and stat == "claimed-curve":
        text = (
            f"{label}: eps_LB is said to come from the claimed-curve statistic but the record holds "
            "no readable claimed_curve block to check it against."
        )
        notes.append(Note("warning", "audit", text))


#: The analyses of a one-run record (its ``statistic`` field) and their names in the report.
ONE_RUN_STATISTICS = {"f-dp": "one-run f-DP", "steinke": "one-run (eps, delta)"}


def _one_run_control(rec: dict) -> bool:
    side_role = rec.get("role") not in (None, "main")
    return rec.get("noise") is False or side_role or rec.get("canary_inserted") is False


def _other_analysis_note(e: dict, stat: str, lbs: dict, label: str, notes: list[Note]) -> None:
    """Warn when the analysis that does not decide would have found a violation."""
    other = "steinke" if stat == "f-dp" else "f-dp"
    claim, other_lb = e["claimed_epsilon"], lbs[other]
    above = claim is not None and other_lb is not None and other_lb > claim
    if above and e["status"] != "violation":
        text = (
            f"{label}: the {ONE_RUN_STATISTICS[other]} analysis, which does not decide (the "
            f"{e['statistic']} analysis was fixed in advance), gives eps_LB {other_lb:.4f} > claim {claim:.4f}."
        )
        notes.append(Note("warning", "verdict", text))


def _run_entry(view: dict, i: int, lo: LoadedOneRun, **fields) -> dict:
    """A one-run or white-box record's entry: its view, where it is, and ``fields``."""
    return dict(
        view, index=i, path=str(lo.path), label=lo.path.parent.name or str(lo.path), **fields
    )


def one_run_entry(i: int, lo: LoadedOneRun, notes: list[Note]) -> dict | None:
    """One one-run audit (one_run.json): its bounds, and its own verdict against its claim (the deciding
    analysis's bound above the claim is a VIOLATION; an f-DP ``violated`` flag its eps_LB does not back,
    or a missing claim, is INCONCLUSIVE: fail closed; a no-noise run is a control)."""
    label = f"one-run record {lo.path}"
    view = one_run_view(lo.record)
    if view is None:
        text = f"{label} skipped: it has neither a steinke nor an fdp block."
        notes.append(Note("error", "audit", text))
        return None
    rec = lo.record
    lbs = {
        "steinke": (view["steinke"] or {}).get("epsilon_lower_bound"),
        "f-dp": (view["fdp"] or {}).get("epsilon_lower_bound"),
    }
    stat = _one_run_statistic(rec, lbs)
    lb = lbs[stat] if lbs[stat] is not None and not math.isnan(lbs[stat]) else None
    e = _run_entry(view, i, lo, statistic=ONE_RUN_STATISTICS[stat], epsilon_lower_bound=lb)
    if _one_run_control(rec):
        e["status"] = "control"
        text = f"{label} is a control run (no noise or no canary); no privacy claim applies to it."
        notes.append(Note("info", "verdict", text))
        return e
    e["status"] = _one_run_status(e, view, stat, label, notes)
    e["not_certified"] = _not_certified(rec)
    if e["not_certified"]:  # the claim itself is not certified: never "no evidence" (fail closed)
        notes.append(Note("error", "verdict", f"{label}: {e['not_certified']}."))
        e["status"] = "violation" if e["status"] == "violation" else "incomplete"
    e["ceiling"], e["underpowered"] = _one_run_power(view)
    _other_analysis_note(e, stat, lbs, label, notes)
    return e


def _one_run_statistic(rec: dict, lbs: dict) -> str:
    """One analysis decides, fixed before looking (the record's rule: f-DP when a claimed event
    was tested, else Steinke et al.); taking the larger of the two would test twice at the
    stated confidence. The other is shown beside it, never used for the verdict."""
    if rec.get("statistic") in ONE_RUN_STATISTICS:
        return rec["statistic"]
    return "f-dp" if lbs["f-dp"] is not None else "steinke"


def _one_run_power(view: dict) -> tuple[float | None, bool]:
    """(ceiling, underpowered). The power block speaks for the deciding analysis (its limit,
    whether anything is detectable); a record without one: neither analysis can report more than
    its ceiling, both below the claim and no violation is detectable."""
    blocks = (view["steinke"] or {}, view["fdp"] or {})
    ceilings = [b["ceiling"] for b in blocks if b.get("ceiling") is not None]
    power, limit = view["power"], num((view["power"] or {}).get("ceiling"))
    ceiling = limit if limit is not None else max(ceilings, default=None)
    return ceiling, _underpowered(limit if power else ceiling, view["claimed_epsilon"], power)


#: The statistic of each white-box threat model (dpaudit.audits.white_box), as the report names it.
WHITE_BOX_STATISTICS = {
    "white-box": "white-box step bound",
    "crafted-final": "crafted-final sum bound",
}


def white_box_entry(i: int, lo: LoadedOneRun, notes: list[Note]) -> dict | None:
    """One white-box or crafted-final audit (white_box.json): its main bound against its claim,
    read like a one-run audit's (eps_LB above the claim: VIOLATION; no eps_LB or claim:
    INCONCLUSIVE), and fail closed on its controls: a null control that flags, or (without a
    violation) a no-noise control that does not, makes it INCONCLUSIVE. Its limit is unbounded
    (noise-free observations give infinity)."""
    label = f"white-box record {lo.path}"
    view = white_box_view(lo.record)
    if view is None:
        notes.append(Note("error", "audit", f"{label} skipped: it has no main bound."))
        return None
    lb = view["epsilon_lb"]
    lb = math.inf if lb is None and view["violation"] else lb  # an infinite bound is stored as null
    kind = view["threat_model"] if view["threat_model"] in WHITE_BOX_STATISTICS else "white-box"
    statistic = WHITE_BOX_STATISTICS[kind]
    e = _run_entry(view, i, lo, audit_kind=kind, statistic=statistic, epsilon_lower_bound=lb)
    e["not_certified"] = None
    e["status"] = _white_box_status(e, label, notes)
    e["ceiling"] = num((view["power"] or {}).get("ceiling"))
    e["underpowered"] = _underpowered(e["ceiling"], view["claimed_epsilon"], view["power"])
    return e


def _white_box_status(e: dict, label: str, notes: list[Note]) -> str:
    claim, lb, controls = e["claimed_epsilon"], e["epsilon_lower_bound"], e["controls_ok"]
    why = "no claimed epsilon" if claim is None else "no eps_LB" if lb is None else None
    if why is None and controls.get("null") is False:
        why = "its null control (canaries adding nothing) flags a violation"
    if why is None and lb <= claim and controls.get("no-noise") is False:
        why = "its no-noise control does not see the canaries"
    if why is not None:
        notes.append(Note("error", "verdict", f"{label}: {why}; INCONCLUSIVE."))
        return "incomplete"
    return "violation" if lb > claim else "no-evidence"


def _not_certified(rec: dict) -> str | None:
    """Why a one-run record's claim is not certified (a pipeline mismatch: :mod:`dpaudit.integrations.pipeline`), else None."""
    findings = [f for f in rec.get("findings") or [] if isinstance(f, dict)]
    cert = rec.get("certified")
    if not findings and not (isinstance(cert, str) and cert.startswith("not certified")):
        return None
    codes = ", ".join(str(f.get("code", "?")) for f in findings)
    return "not certified: pipeline findings" + (f" ({codes})" if codes else "")


def _one_run_status(e: dict, view: dict, stat: str, label: str, notes: list[Note]) -> str:
    claim, lb = view["claimed_epsilon"], e["epsilon_lower_bound"]
    if claim is None or lb is None:
        text = f"{label}: {'no claimed epsilon' if claim is None else 'no eps_LB'}; INCONCLUSIVE."
        notes.append(Note("error", "verdict", text))
        return "incomplete"
    if lb > claim:
        return "violation"
    if stat == "f-dp" and (view["fdp"] or {}).get("violated"):
        text = (
            f"{label}: its f-DP analysis says the claimed event is violated but its eps_LB "
            f"{lb:.4f} <= claim {claim:.4f}; INCONCLUSIVE."
        )
        notes.append(Note("error", "verdict", text))
        return "incomplete"
    return "no-evidence"


def _row_key(rows: dict, e: dict, can: str) -> tuple:
    """(mechanism, task, claim): a second audit of the same cell gets its own row."""
    task = e["task"] or e["dataset"] or "-"
    key, n = (e["mechanism"] or "unknown", task, e["compared_claim"]), 1
    while key in rows and can in rows[key]["cells"]:
        n += 1
        key = (e["mechanism"] or "unknown", f"{task} [{e['label']}]", e["compared_claim"], n)
    return key


def _max_cell(cells: list[dict]) -> dict:
    largest = {
        k: max((c[k] for c in cells if c[k] is not None), default=None)
        for k in ("private", "no_noise", "ceiling")
    }
    return {**largest, "confidence": None, "trials": None, "status": None}


def _table16_row(mechanism: str, task: str, claim: float | None, cells: dict) -> dict:
    return {"mechanism": mechanism, "task": task, "claimed_epsilon": claim, "cells": cells}


def _table16_cell(e: dict) -> dict:
    return {
        "private": e["epsilon_lower_bound"],
        "no_noise": (e["no_noise"] or {}).get("epsilon_lower_bound"),
        **{k: e[k] for k in ("ceiling", "confidence", "trials", "status")},
    }


def table16(entries: list[dict]) -> dict:
    """Rows per (mechanism, task), one column group per canary: private / no-noise eps_LB, ceiling."""
    rows: dict[tuple, dict] = {}
    for e in entries:
        can = e["canary"] or "unnamed canary"
        key = _row_key(rows, e, can)
        row = rows.setdefault(key, _table16_row(key[0], key[1], e["compared_claim"], {}))
        row["cells"][can] = _table16_cell(e)
    canaries = list(dict.fromkeys(e["canary"] or "unnamed canary" for e in entries))
    out = list(rows.values())
    largest = {
        can: _max_cell([r["cells"][can] for r in out if can in r["cells"]]) for can in canaries
    }
    max_row = _table16_row("max over tasks", "", None, largest)
    return {"canaries": canaries, "rows": out, "max": max_row if len(out) > 1 else None}

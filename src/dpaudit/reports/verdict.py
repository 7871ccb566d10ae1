"""Section ``verdict``: one line per mechanism (the rules are in :mod:`dpaudit.reports.model`'s
docstring), from the claim cards and the audit entries."""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

from ..audits.verdicts import family_verdict, upgrade
from .audit import audit_entry
from .inputs import Inputs, LoadedRelease, Note, canonical_mechanism, num

#: Relative tolerance when checking that a linked release claims the epsilon its audit tested
#: (float rounding of the same accountant's number, nothing more).
CLAIM_MATCH_RTOL = 1e-6


def _close(a: float | None, b: float | None, rtol: float) -> bool:
    if a is None or b is None:
        return False
    return abs(a - b) <= rtol * max(abs(a), abs(b), 1e-12)


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else ("inf" if math.isinf(x) else f"{x:.3f}")


def _statistics(entries: list[dict]) -> list[str]:
    """The statistics behind ``entries``' eps_LB, in first-seen order."""
    out: list[str] = []
    for e in entries:
        if e.get("statistic") and e["statistic"] not in out:
            out.append(e["statistic"])
    return out


def _tally(entries: list[dict]) -> str:
    """"claimed-curve" or, for a mix, "claimed-curve (2 audits), clopper-pearson (1)"."""
    names = _statistics(entries)
    if len(names) == 1:
        return names[0]
    return ", ".join(f"{n} ({sum(1 for e in entries if e.get('statistic') == n)})" for n in names)


def one_run_verdicts(entries: list[dict]) -> list[dict]:
    """One verdict line per one-run audit (one_run.json) with a claim: a one-run bound is a
    lower bound on its own, so a bound above the claim is a VIOLATION, stated with the analysis
    that found it (Steinke et al. 2023 (eps, delta) or the f-DP analysis)."""
    out = []
    for e in entries:
        if e["status"] == "control":
            continue
        m = e["canaries"]
        name = f"{e['mechanism'] or 'unknown'} (one-run audit, {m if m is not None else 'n/a'} canaries)"
        lb, claim = e["epsilon_lower_bound"], e["claimed_epsilon"]
        if e["status"] == "violation":
            line = f"VIOLATION: eps_LB {_fmt(lb)} > claimed {_fmt(claim)}, decided by the {e['statistic']} statistic"
        elif e["status"] == "no-evidence":
            line = f"no evidence of a violation (eps_LB {_fmt(lb)} <= claimed {_fmt(claim)}; statistic: {e['statistic']})"
        else:
            line = "INCONCLUSIVE: the one-run record cannot be judged (see notes)"
        out.append({
            "mechanism": name, "key": f"one-run:{e['path']}", "status": "inconclusive" if e["status"] == "incomplete" else e["status"],
            "flags": ["one-run"], "line": f"{name}: {line}", "max_epsilon_lower_bound": lb,
            "decided_by": [e["statistic"]] if e["statistic"] and e["status"] in ("violation", "no-evidence") else [],
            "statistics": [e["statistic"]] if e["statistic"] else [],
            "claimed_epsilons": [claim] if claim is not None else [], "releases": [], "non_private_releases": [], "audits": [e["path"]],
        })
    return out


def mechanism_verdicts(inputs: Inputs, claims: list[dict], links: dict[int, LoadedRelease | None], notes: list[Note],
              with_scores: bool) -> tuple[list[dict], list[dict]]:
    groups: "OrderedDict[str, dict]" = OrderedDict()

    def group(name: Any) -> dict:
        key = canonical_mechanism(name)
        return groups.setdefault(key, {"key": key, "names": [], "releases": [], "non_private": [], "audits": []})

    for lr in inputs.releases:
        g = group(lr.release.mechanism)
        if lr.release.mechanism not in g["names"]:
            g["names"].append(lr.release.mechanism)
        (g["non_private"] if lr.release.non_private else g["releases"]).append(lr.release)
    for i, la in enumerate(inputs.audits):
        mech = la.view["mechanism"]
        if mech is None:
            notes.append(Note("error", "verdict", f"audit {la.path} names no mechanism; it is matched to no release and cannot support any verdict."))
        g = group(mech if mech is not None else "unknown")
        if mech is not None and mech not in g["names"]:
            g["names"].append(mech)
        g["audits"].append(i)

    claim_by_id = {c["release_id"]: c for c in claims}
    entries: list[dict] = []
    verdicts: list[dict] = []
    for key, g in groups.items():
        name = " / ".join(g["names"]) or key
        g_entries = []
        covered_ids: set[str] = set()
        for i in g["audits"]:
            la = inputs.audits[i]
            covered = _covered(la, links.get(i), key, notes)
            covered_ids.update(r.id for r in covered)
            for r in covered:
                ad, rd = la.view["delta"], num(r.delta)
                if ad is not None and rd is not None and not _close(ad, rd, 1e-9):
                    notes.append(Note("warning", "audit", f"audit {la.path} bounds epsilon at delta={ad:g} but release {r.id[:12]} claims "
                                                          f"delta={rd:g}; the comparison is only exact at equal delta."))
                aa = la.view.get("adjacency")
                if aa and str(aa) != str(r.adjacency):
                    notes.append(Note("warning", "audit", f"audit {la.path} uses adjacency {aa} but release {r.id[:12]} claims "
                                                          f"{r.adjacency}; the comparison is not like for like."))
            e = audit_entry(i, la, covered, notes, with_scores)
            g_entries.append(e)
        entries.extend(g_entries)
        if g["audits"] and not g["releases"] and (g["non_private"] or inputs.releases):
            if key != "unknown":
                notes.append(Note("warning", "verdict", f"audit(s) of {name} match no private release of {name} among the inputs; "
                                                        "the verdict uses the audits' own claimed epsilon."))
        uncovered = [r for r in g["releases"] if r.id not in covered_ids]
        for r in uncovered:
            notes.append(Note("warning", "verdict", f"release {r.id[:12]} ({r.mechanism}, eps={_fmt(num(r.epsilon))}) has no audit "
                                                    "among the inputs (none of its mechanism at its epsilon)."))
        mismatched = [claim_by_id[r.id] for r in g["releases"] if r.id in claim_by_id and claim_by_id[r.id]["accounting_check"]["status"] == "mismatch"]
        parts: list[str] = []
        flags: list[str] = []
        violations = [e for e in g_entries if e["status"] == "violation"]
        incomplete = [e for e in g_entries if e["status"] == "incomplete"]
        ok = [e for e in g_entries if e["status"] == "no-evidence"]
        controls_only = bool(g_entries) and all(e["status"] == "control" for e in g_entries)
        if mismatched:
            flags.append("accounting-mismatch")
            parts.append("ACCOUNTING MISMATCH: " + "; ".join(c["accounting_check"]["message"] for c in mismatched))
        decided_by: list[str] = []
        pool = violations + ok
        family = _bonferroni(inputs, pool, notes, name)
        if family is not None:  # K > 1: the decisions at confidence 1 - alpha / K replace the single ones
            violations = [e for e in pool if e["family_decision"]["violated"] is True]
            incomplete = incomplete + [e for e in pool if e["family_decision"]["violated"] is None]
            ok = [e for e in pool if e["family_decision"]["violated"] is False]
        if violations:
            worst = max(violations, key=_excess)
            status = "violation"
            decided_by = [worst["statistic"]]
            where = ", ".join(x for x in (f"canary {worst['canary']}" if worst["canary"] else "", f"task {worst['task']}" if worst["task"] else "") if x)
            parts.append(_violation_text(worst) + (f" ({where})" if where else "")
                         + f", decided by the {worst['statistic']} statistic"
                         + (f"; {len(violations)} of {len(g_entries)} audits exceed their claim" if len(g_entries) > 1 else ""))
        elif incomplete:
            status = "inconclusive"
            parts.append(f"INCONCLUSIVE: {len(incomplete)} of {len(g_entries)} audit record(s) cannot be judged (see notes)")
        elif ok:
            status = "no-evidence"
            best = max(ok, key=lambda e: e["epsilon_lower_bound"] - e["compared_claim"])
            decided_by = _statistics(ok)
            op = "<=" if best["epsilon_lower_bound"] is None or best["epsilon_lower_bound"] <= best["compared_claim"] else ">"
            parts.append(f"no evidence of a violation (max eps_LB {_fmt(best['epsilon_lower_bound'])} {op} claimed {_fmt(best['compared_claim'])}; "
                         f"statistic: {_tally(ok)})")
        elif g["releases"] or controls_only:
            status = "not-audited"
            parts.append("NOT AUDITED: only control runs of this mechanism among the inputs" if controls_only
                         else "NOT AUDITED: no audit of this mechanism among the inputs")
        else:
            status = "no-claim"
            parts.append("non-private reference only (no privacy claim)")
        if status == "no-evidence":
            weak = [e for e in ok if e["underpowered"]]
            if weak:
                w = min(weak, key=lambda e: e["ceiling"])
                parts.append(f"audit underpowered: ceiling {_fmt(w['ceiling'])} < claimed {_fmt(w['compared_claim'])}")
                flags.append("underpowered")
            unknown = [e for e in ok if e["ceiling"] is None]
            if unknown:
                parts.append(f"ceiling unknown for {len(unknown)} audit(s)")
                flags.append("ceiling-unknown")
        if family is not None and status in ("violation", "no-evidence", "inconclusive"):
            parts.append(family["method"])
            flags.append("bonferroni")
        if uncovered and g_entries:
            parts.append(f"{len(uncovered)} release(s) not audited at their epsilon")
            flags.append("releases-not-audited")
        if mismatched and status in ("no-evidence", "not-audited", "no-claim"):
            status = "accounting-mismatch"
        lbs = [e["epsilon_lower_bound"] for e in g_entries if e["epsilon_lower_bound"] is not None]
        verdicts.append({
            "mechanism": name, "key": key, "status": status, "flags": flags,
            "line": f"{name}: " + "; ".join(parts),
            "max_epsilon_lower_bound": max(lbs) if lbs else None,
            "decided_by": decided_by,
            "statistics": _statistics([e for e in g_entries if e["status"] != "control"]),
            "claimed_epsilons": sorted({e["compared_claim"] for e in g_entries if e["compared_claim"] is not None}
                                       | {num(r.epsilon) for r in g["releases"] if num(r.epsilon) is not None}),
            "releases": [r.id for r in g["releases"]], "non_private_releases": [r.id for r in g["non_private"]],
            "audits": [e["path"] for e in g_entries],
            "family_wise": None if family is None else {"audits": family["audits"], "method": family["method"]},
        })
    return verdicts, entries


def _covered(la, link: LoadedRelease | None, key: str, notes: list[Note]) -> list:
    """The release ``la`` audited: exactly the one it records (release id / path / folder), never
    one guessed from a nearby epsilon; none when it records none among the inputs."""
    if link is None or canonical_mechanism(link.release.mechanism) != key:
        if la.view["mechanism"] is not None:
            notes.append(Note("info", "audit", f"audit {la.path} records no release among the inputs; it is judged against the claim it "
                                               "records itself and covers no release."))
        return []
    own, rel = la.view["claimed_epsilon"], num(link.release.epsilon)
    if own is not None and rel is not None and not _close(own, rel, CLAIM_MATCH_RTOL):
        notes.append(Note("warning", "audit", f"audit {la.path} tested claimed epsilon {_fmt(own)} but its release {link.release.id[:12]} "
                                              f"claims {_fmt(rel)}: it does not audit that claim and covers no release."))
        return []
    return [link.release]


def _excess(e: dict) -> float:
    d = e.get("family_decision") or {}
    lb = d.get("epsilon_lower_bound", e["epsilon_lower_bound"])
    return (lb if lb is not None else -math.inf) - (e["compared_claim"] or 0.0)


def _violation_text(e: dict) -> str:
    d = e.get("family_decision") or {}
    lb = d.get("epsilon_lower_bound", e["epsilon_lower_bound"])
    fam = (e.get("claim_family_bound") or {}).get("statement") if e["statistic"] == "claimed-curve" else None
    if fam:
        return f"VIOLATION: the claimed event is ruled out ({fam}; eps_LB {_fmt(lb)}, claimed {_fmt(e['compared_claim'])})"
    return f"VIOLATION: eps_LB {_fmt(lb)} > claimed {_fmt(e['compared_claim'])}"


def _bonferroni(inputs: Inputs, judged: list[dict], notes: list[Note], name: str) -> dict | None:
    """With K > 1 judged audits of one mechanism: each decision recomputed at 1 - alpha / K
    (:func:`dpaudit.audits.verdicts.family_verdict`) into ``family_decision``; None when K <= 1."""
    if len(judged) <= 1:
        return None
    records = [{**upgrade(inputs.audits[e["index"]].record), "claimed_epsilon": e["compared_claim"]} for e in judged]
    fam = family_verdict(records)
    for e, d in zip(judged, fam["decisions"]):
        e["family_decision"] = d
    notes.append(Note("info", "verdict", f"{name}: {fam['method']}."))
    return fam

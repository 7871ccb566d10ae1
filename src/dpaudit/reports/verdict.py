"""Section ``verdict``: one line per mechanism (the rules: docs/review-walkthrough.md, "What the
seven sections say"), from the claim cards and the audit entries."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..audits.power import power_cell
from ..audits.verdicts import family_verdict
from .audit import audit_entry
from .inputs import Inputs, LoadedRelease, Note, canonical_mechanism, fixed, num

#: Relative tolerance when checking that a linked release claims the epsilon its audit tested
#: (float rounding of the same accountant's number, nothing more).
CLAIM_MATCH_RTOL = 1e-6


def _close(a: float | None, b: float | None, rtol: float) -> bool:
    return a is not None and b is not None and abs(a - b) <= rtol * max(abs(a), abs(b), 1e-12)


def _statistics(entries: list[dict]) -> list[str]:
    """The statistics behind ``entries``' eps_LB, in first-seen order."""
    return list(dict.fromkeys(e["statistic"] for e in entries if e.get("statistic")))


def _tally(entries: list[dict]) -> str:
    """ "claimed-curve" or, for a mix, "claimed-curve (2 audits), clopper-pearson (1)"."""
    names = _statistics(entries)
    if len(names) == 1:
        return names[0]
    return ", ".join(f"{n} ({sum(1 for e in entries if e.get('statistic') == n)})" for n in names)


def _one_run_reason(e: dict) -> str:
    """What qualifies a one-run verdict, in the words its row shows: not certified, or unable to detect a violation."""
    if e.get("not_certified"):
        return e["not_certified"]
    if e["status"] == "no-evidence" and e.get("underpowered"):
        ceiling, claim = e.get("ceiling"), f"claimed {fixed(e['claimed_epsilon'])}"
        limit = (
            f"its power line, {claim}" if ceiling is None else f"ceiling {fixed(ceiling)} < {claim}"
        )
        return f"audit underpowered: {limit}, it cannot detect a violation at all"
    return "eps_LB above the claim" if e["status"] == "violation" else ""


def _one_run_line(e: dict) -> str:
    lb, claim = e["epsilon_lower_bound"], e["claimed_epsilon"]
    why = _one_run_reason(e)
    if e["status"] == "violation":
        return f"VIOLATION: eps_LB {fixed(lb)} > claimed {fixed(claim)}, decided by the {e['statistic']} statistic"
    if e["status"] == "no-evidence":
        return (
            f"no evidence of a violation (eps_LB {fixed(lb)} <= claimed {fixed(claim)}; statistic: {e['statistic']})"
            + (f"; {why}" if why else "")
        )
    kind = e.get("audit_kind", "one-run")
    return f"INCONCLUSIVE: {why or f'the {kind} record cannot be judged'} (see notes)"


def _one_run_verdict(e: dict) -> dict:
    m, stat, claim = e["canaries"], e["statistic"], e["claimed_epsilon"]
    kind = e.get("audit_kind", "one-run")  # one-run, white-box or crafted-final
    name = f"{e['mechanism'] or 'unknown'} ({kind} audit, {m if m is not None else 'n/a'} canaries)"
    qualified = (("not-certified", e.get("not_certified")), ("underpowered", e.get("underpowered")))
    flags = [kind] + [flag for flag, on in qualified if on]
    status = "inconclusive" if e["status"] == "incomplete" else e["status"]
    return {
        "mechanism": name,
        "key": f"{kind}:{e['path']}",
        "status": status,
        "flags": flags,
        "line": f"{name}: {_one_run_line(e)}",
        "max_epsilon_lower_bound": e["epsilon_lower_bound"],
        "ceiling": e.get("ceiling"),
        "power": power_cell(e.get("power")),
        "delta": e.get("delta"),
        "accountant": e.get("accountant"),
        "reason": _one_run_reason(e),
        "decided_by": [stat] if stat and e["status"] in ("violation", "no-evidence") else [],
        "statistics": [stat] if stat else [],
        "claimed_epsilons": [claim] if claim is not None else [],
        "releases": [],
        "non_private_releases": [],
        "audits": [e["path"]],
    }


def one_run_verdicts(entries: list[dict]) -> list[dict]:
    """One verdict line per one-run audit (one_run.json) or white-box / crafted-final audit
    (white_box.json) with a claim: such a bound is a lower bound on its own, so a bound above the
    claim is a VIOLATION, stated with the analysis that found it (one-run: Steinke et al. 2023
    (eps, delta) or the f-DP analysis; white-box: the step or sum bound)."""
    return [_one_run_verdict(e) for e in entries if e["status"] != "control"]


@dataclass
class _Group:
    """The releases and audits of one mechanism (matched by :func:`canonical_mechanism`)."""

    key: str
    names: list[str] = field(default_factory=list)
    releases: list = field(default_factory=list)
    non_private: list = field(default_factory=list)
    audits: list[int] = field(default_factory=list)

    def named(self, name: Any) -> "_Group":
        if name is not None and name not in self.names:
            self.names.append(name)
        return self

    @property
    def name(self) -> str:
        return " / ".join(self.names) or self.key


def _groups(inputs: Inputs, notes: list[Note]) -> dict[str, _Group]:
    groups: dict[str, _Group] = {}

    def group(name: Any) -> _Group:
        key = canonical_mechanism(name)
        return groups.setdefault(key, _Group(key))

    for lr in inputs.releases:
        g = group(lr.release.mechanism).named(lr.release.mechanism)
        (g.non_private if lr.release.non_private else g.releases).append(lr.release)
    for i, la in enumerate(inputs.audits):
        mech = la.view.mechanism
        if mech is None:
            text = f"audit {la.path} names no mechanism; it is matched to no release and cannot support any verdict."
            notes.append(Note("error", "verdict", text))
        group(mech if mech is not None else "unknown").named(mech).audits.append(i)
    return groups


def _like_for_like(la, r, notes: list[Note]) -> None:
    """Warn when an audit and the release it covers differ in delta or adjacency."""
    ad, rd = la.view.delta, num(r.delta)
    if ad is not None and rd is not None and not _close(ad, rd, 1e-9):
        text = (
            f"audit {la.path} bounds epsilon at delta={ad:g} but release {r.id[:12]} claims "
            f"delta={rd:g}; the comparison is only exact at equal delta."
        )
        notes.append(Note("warning", "audit", text))
    aa = la.view.adjacency
    if aa and str(aa) != str(r.adjacency):
        text = (
            f"audit {la.path} uses adjacency {aa} but release {r.id[:12]} claims "
            f"{r.adjacency}; the comparison is not like for like."
        )
        notes.append(Note("warning", "audit", text))


def _entries(
    g: _Group, inputs: Inputs, links: dict, notes: list[Note]
) -> tuple[list[dict], set[str]]:
    """The audit entries of one group and the ids of the releases they cover."""
    entries, covered_ids = [], set()
    for i in g.audits:
        la = inputs.audits[i]
        covered = _covered(la, links.get(i), g.key, notes)
        covered_ids.update(r.id for r in covered)
        for r in covered:
            _like_for_like(la, r, notes)
        entries.append(audit_entry(i, la, covered, notes))
    return entries, covered_ids


def _uncovered(g: _Group, covered_ids: set[str], any_release: bool, notes: list[Note]) -> list:
    """The group's private releases no audit covers (each a warning)."""
    if g.audits and not g.releases and (g.non_private or any_release) and g.key != "unknown":
        text = (
            f"audit(s) of {g.name} match no private release of {g.name} among the inputs; "
            "the verdict uses the audits' own claimed epsilon."
        )
        notes.append(Note("warning", "verdict", text))
    uncovered = [r for r in g.releases if r.id not in covered_ids]
    for r in uncovered:
        text = (
            f"release {r.id[:12]} ({r.mechanism}, eps={fixed(num(r.epsilon))}) has no audit "
            "among the inputs (none of its mechanism at its epsilon)."
        )
        notes.append(Note("warning", "verdict", text))
    return uncovered


def _by_status(
    entries: list[dict], family: dict | None
) -> tuple[list[dict], list[dict], list[dict]]:
    """(violations, incomplete, no-evidence) entries; with K > 1 audits the decisions at
    confidence 1 - alpha / K replace the single ones."""
    violations, incomplete, ok = (
        [e for e in entries if e["status"] == s] for s in ("violation", "incomplete", "no-evidence")
    )
    if family is None:
        return violations, incomplete, ok
    pool = violations + ok
    decided = {
        s: [e for e in pool if e["family_decision"]["violated"] is s] for s in (True, None, False)
    }
    return decided[True], incomplete + decided[None], decided[False]


def _violation_line(worst: dict, n_violations: int, n_entries: int) -> str:
    where = ", ".join(f"{k} {worst[k]}" for k in ("canary", "task") if worst[k])
    return (
        _violation_text(worst)
        + (f" ({where})" if where else "")
        + f", decided by the {worst['statistic']} statistic"
        + (f"; {n_violations} of {n_entries} audits exceed their claim" if n_entries > 1 else "")
    )


def _headline(
    g: _Group, entries: list[dict], violations: list[dict], incomplete: list[dict], ok: list[dict]
) -> tuple[str, str, list[str]]:
    """(status, the line's main part, the statistics that decided it) of one mechanism."""
    if violations:
        worst = max(violations, key=_excess)
        line = _violation_line(worst, len(violations), len(entries))
        return "violation", line, [worst["statistic"]]
    if incomplete:
        judged = f"{len(incomplete)} of {len(entries)} audit record(s) cannot be judged"
        return "inconclusive", f"INCONCLUSIVE: {judged} (see notes)", []
    if ok:
        best = max(ok, key=lambda e: e["epsilon_lower_bound"] - e["compared_claim"])
        lb, claim = best["epsilon_lower_bound"], best["compared_claim"]
        op = "<=" if lb is None or lb <= claim else ">"
        line = f"max eps_LB {fixed(lb)} {op} claimed {fixed(claim)}; statistic: {_tally(ok)}"
        return "no-evidence", f"no evidence of a violation ({line})", _statistics(ok)
    if entries and all(e["status"] == "control" for e in entries):
        controls = "NOT AUDITED: only control runs of this mechanism among the inputs"
        return "not-audited", controls, []
    if g.releases:
        return "not-audited", "NOT AUDITED: no audit of this mechanism among the inputs", []
    return "no-claim", "non-private reference only (no privacy claim)", []


def _ceiling_qualifiers(ok: list[dict]) -> list[tuple[str, str]]:
    """An audit whose ceiling is below the claim could not have seen a violation of that size."""
    out = []
    weak = [e for e in ok if e["underpowered"]]
    if weak:
        w = min(weak, key=lambda e: e["ceiling"])
        below = f"ceiling {fixed(w['ceiling'])} < claimed {fixed(w['compared_claim'])}"
        out.append(("underpowered", f"audit underpowered: {below}"))
    unknown = sum(1 for e in ok if e["ceiling"] is None)
    if unknown:
        out.append(("ceiling-unknown", f"ceiling unknown for {unknown} audit(s)"))
    return out


def _qualifiers(
    status: str, ok: list[dict], family: dict | None, uncovered: list, entries: list[dict]
) -> list[tuple[str, str]]:
    """(flag, text) of what qualifies a line: weak or unknown ceilings, Bonferroni, releases not audited."""
    out = _ceiling_qualifiers(ok) if status == "no-evidence" else []
    if family is not None and status in ("violation", "no-evidence", "inconclusive"):
        out.append(("bonferroni", family["method"]))
    if uncovered and entries:
        not_audited = f"{len(uncovered)} release(s) not audited at their epsilon"
        out.append(("releases-not-audited", not_audited))
    return out


def _mismatched(g: _Group, claim_by_id: dict) -> list[tuple[str, str]]:
    """The line's ACCOUNTING MISMATCH part (flag, text) when a release of the group fails its claim card."""
    cards = [
        claim_by_id[r.id]
        for r in g.releases
        if r.id in claim_by_id and claim_by_id[r.id]["accounting_check"]["status"] == "mismatch"
    ]
    if not cards:
        return []
    messages = "; ".join(c["accounting_check"]["message"] for c in cards)
    return [("accounting-mismatch", f"ACCOUNTING MISMATCH: {messages}")]


def _numbers(g: _Group, entries: list[dict], decided_by: list[str]) -> dict:
    """The numbers behind a line: the largest eps_LB, the statistics that decided it and all the
    line's statistics, the claims compared."""
    lbs = [e["epsilon_lower_bound"] for e in entries if e["epsilon_lower_bound"] is not None]
    claims = {e["compared_claim"] for e in entries if e["compared_claim"] is not None} | {
        num(r.epsilon) for r in g.releases if num(r.epsilon) is not None
    }
    return {
        "max_epsilon_lower_bound": max(lbs) if lbs else None,
        "decided_by": decided_by,
        "statistics": _statistics([e for e in entries if e["status"] != "control"]),
        "claimed_epsilons": sorted(claims),
    }


def _judged(entries: list[dict]) -> list[dict]:
    """The entries a family-wise decision re-judges: violations, then those with no evidence."""
    return [e for s in ("violation", "no-evidence") for e in entries if e["status"] == s]


def _group_verdict(
    g: _Group, inputs: Inputs, claim_by_id: dict, links: dict, notes: list[Note]
) -> tuple[dict, list[dict]]:
    entries, covered_ids = _entries(g, inputs, links, notes)
    uncovered = _uncovered(g, covered_ids, bool(inputs.releases), notes)
    mismatch = _mismatched(g, claim_by_id)
    family = _bonferroni(inputs, _judged(entries), notes, g.name)
    violations, incomplete, ok = _by_status(entries, family)
    status, head, decided_by = _headline(g, entries, violations, incomplete, ok)
    parts = mismatch + [("", head)] + _qualifiers(status, ok, family, uncovered, entries)
    if mismatch and status in ("no-evidence", "not-audited", "no-claim"):
        status = "accounting-mismatch"
    return {
        "mechanism": g.name,
        "rows": _rows(g, entries, (violations, incomplete, ok), claim_by_id),
        "key": g.key,
        "status": status,
        "flags": [f for f, _ in parts if f],
        "line": f"{g.name}: " + "; ".join(t for _, t in parts),
        **_numbers(g, entries, decided_by),
        "releases": [r.id for r in g.releases],
        "non_private_releases": [r.id for r in g.non_private],
        "audits": [e["path"] for e in entries],
        "family_wise": family and {"audits": family["audits"], "method": family["method"]},
    }, entries


def _row(
    mech: str, claim: tuple, status: str, hits: list[dict], release: str | None = None
) -> dict:
    """One row of the first table: a claim (epsilon, delta, adjacency, accountant), the audits that decided its
    verdict (plan id, statistic), the largest eps_LB among them with that audit's ceiling, and the verdict."""
    top = max(hits, key=_bound_order, default={})
    return {
        "release": release,
        "mechanism": mech,
        **dict(zip(("epsilon", "delta", "adjacency", "accountant"), claim)),
        "plans": list(dict.fromkeys(e.get("plan_id") for e in hits)),
        "statistics": _statistics(hits),
        "audits": [e["path"] for e in hits],
        "plan_runs": {p: n for p, n in Counter(e.get("plan_id") for e in hits).items() if p},
        "epsilon_lower_bound": top.get("epsilon_lower_bound"),
        "ceiling": top.get("ceiling"),
        "status": status,
        "power": power_cell(top.get("power")) if top else None,
        "reason": _reason(status, hits),
    }


def _bound_order(entry: dict) -> float:
    lb = entry["epsilon_lower_bound"]
    return lb if lb is not None else -math.inf


def _reason(status: str, hits: list[dict]) -> str:
    """Why a row has its verdict: the claim family a claimed-curve violation rules out, else the
    bound above the claim, else an underpowered audit (for no evidence)."""
    statement = _family_statement(hits)
    if statement:
        return statement
    if status == "violation":
        return "eps_LB above the claim"
    if status == "no-evidence" and any(e["underpowered"] for e in hits):
        return "audit underpowered (ceiling below the claim): it cannot detect a violation at all"
    return ""


def _family_statement(hits: list[dict]) -> str | None:
    """The claim family ruled out by the first claimed-curve violation among ``hits``."""
    violations = (e for e in hits if e["status"] == "violation")
    family = next((e for e in violations if e["statistic"] == "claimed-curve"), {})
    return (family.get("claim_family_bound") or {}).get("statement")


def _worst(es: list[dict], pools: tuple, default: str) -> tuple[str, list[dict]]:
    """The worst verdict among audit entries ``es`` (pools: violations, incomplete, no-evidence after any
    family-wise decision) and the entries behind it; ``default`` when none is in a pool."""
    for status, pool in zip(("violation", "inconclusive", "no-evidence"), pools):
        hits = [e for e in es if any(e is x for x in pool)]
        if hits:
            return status, hits
    return default, []


def _release_row(r, entries: list[dict], pools: tuple, card: dict | None) -> dict:
    """A release's row: its verdict from the audits that cover it, fail closed."""
    covering = [e for e in entries if r.id in e["covers_releases"] and e["status"] != "control"]
    status, hits = _worst(covering, pools, "not-audited")
    mismatch = card is not None and card["accounting_check"]["status"] == "mismatch"
    if mismatch and status != "violation":
        status = "accounting-mismatch"
    claim = (num(r.epsilon), num(r.delta), r.adjacency, r.accountant)
    return _row(r.mechanism, claim, status, hits, release=r.id)


def _rows(g: _Group, entries: list[dict], pools: tuple, claim_by_id: dict) -> list[dict]:
    """A row per release of the group, then one per audit that covers none of them."""
    rows = [_release_row(r, entries, pools, claim_by_id.get(r.id)) for r in g.releases]
    rows += [_row(r.mechanism, (None,) * 4, "no-claim", [], release=r.id) for r in g.non_private]
    for e in entries:
        if not e["covers_releases"] and e["status"] != "control":
            accountant = (e.get("claimed_curve") or {}).get("accountant")
            claim = (e["compared_claim"], e["delta"], e["adjacency"], accountant)
            status = _worst([e], pools, "inconclusive")[0]
            rows.append(_row(e["mechanism"] or g.name, claim, status, [e]))
    return rows


def _verdict_row(v: dict) -> dict:
    """The first table's row of a verdict without rows of its own (a one-run audit or a sweep)."""
    claim = (max(v["claimed_epsilons"], default=None), v.get("delta"), None, v.get("accountant"))
    return _row(v["mechanism"], claim, v["status"], []) | {
        "statistics": v.get("statistics") or [],
        "epsilon_lower_bound": v["max_epsilon_lower_bound"],
        "ceiling": v.get("ceiling"),
        "reason": v.get("reason") or "",
    }


def summary_rows(verdicts: list[dict]) -> list[dict]:
    """The first table's rows: every mechanism's, and one per one-run audit or sweep (their verdict line's numbers)."""
    return [row for v in verdicts for row in v.get("rows") or [_verdict_row(v)]]


def mechanism_verdicts(
    inputs: Inputs, claims: list[dict], links: dict[int, LoadedRelease | None], notes: list[Note]
) -> tuple[list[dict], list[dict]]:
    """One verdict per mechanism, and the audit entries (in group order)."""
    claim_by_id = {c["release_id"]: c for c in claims}
    verdicts, entries = [], []
    for g in _groups(inputs, notes).values():
        v, es = _group_verdict(g, inputs, claim_by_id, links, notes)
        verdicts.append(v)
        entries.extend(es)
    return verdicts, entries


def _covered(la, link: LoadedRelease | None, key: str, notes: list[Note]) -> list:
    """The release ``la`` audited: exactly the one it records (release id / path / folder), never
    one guessed from a nearby epsilon; none when it records none among the inputs."""
    if link is None or canonical_mechanism(link.release.mechanism) != key:
        if la.view.mechanism is not None:
            text = (
                f"audit {la.path} records no release among the inputs; it is judged against the claim it "
                "records itself and covers no release."
            )
            notes.append(Note("info", "audit", text))
        return []
    own, rel = la.view.claimed_epsilon, num(link.release.epsilon)
    if own is not None and rel is not None and not _close(own, rel, CLAIM_MATCH_RTOL):
        text = (
            f"audit {la.path} tested claimed epsilon {fixed(own)} but its release {link.release.id[:12]} "
            f"claims {fixed(rel)}: it does not audit that claim and covers no release."
        )
        notes.append(Note("warning", "audit", text))
        return []
    return [link.release]


def _decided_lb(e: dict) -> float | None:
    """The eps_LB that decided ``e``: its family-wise decision's when it has one."""
    return (e.get("family_decision") or {}).get("epsilon_lower_bound", e["epsilon_lower_bound"])


def _excess(e: dict) -> float:
    lb = _decided_lb(e)
    return (lb if lb is not None else -math.inf) - (e["compared_claim"] or 0.0)


def _violation_text(e: dict) -> str:
    lb = _decided_lb(e)
    curve = e["statistic"] == "claimed-curve"
    fam = (e.get("claim_family_bound") or {}).get("statement") if curve else None
    if fam:
        return f"VIOLATION: the claimed event is ruled out ({fam}; eps_LB {fixed(lb)}, claimed {fixed(e['compared_claim'])})"
    return f"VIOLATION: eps_LB {fixed(lb)} > claimed {fixed(e['compared_claim'])}"


def _bonferroni(inputs: Inputs, judged: list[dict], notes: list[Note], name: str) -> dict | None:
    """With K > 1 judged audits of one mechanism: each decision recomputed at 1 - alpha / K
    (:func:`dpaudit.audits.verdicts.family_verdict`) into ``family_decision``; None when K <= 1."""
    if len(judged) <= 1:
        return None
    records = [
        {**inputs.audits[e["index"]].record, "claimed_epsilon": e["compared_claim"]} for e in judged
    ]
    fam = family_verdict(records)
    for e, d in zip(judged, fam["decisions"]):
        e["family_decision"] = d
    notes.append(Note("info", "verdict", f"{name}: {fam['method']}."))
    return fam

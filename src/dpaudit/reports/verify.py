"""``dpaudit bundle`` and ``dpaudit verify``: a claim's evidence, collected and re-checked without the private data.

A bundle (:func:`make_bundle`): ``bundle.json`` (contents, the ledger's head), ``ledger.json`` (the ledger's export without
its fingerprint key or row sets), ``releases/ID/release.json``, ``audits/ID/audit.json`` | ``one_run.json`` (shareable parts) and
``plans/ID/plan.json``; never a local file or scores. :func:`verify_bundle` re-checks it, one :class:`Check` per finding;
the checks are listed in docs/review-walkthrough.md (step 5).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..accounting.events import event_from_dict
from ..audit_outputs import shareable_audit, shareable_one_run
from ..audit_plans import (
    PLAN_FILE,
    commitment,
    digest,
    plan_entries,
    plan_target,
    signature_ok,
    target_problem,
)
from ..audits.engine import AUDIT_FILE, plan_trials, read_record
from ..audits.one_run import ONE_RUN_FILE, plan_coins, recompute_bounds
from ..audits.verdicts import decision_at, general_epsilon_at, violated
from ..claims import recompute_epsilon, verify_claim
from ..errors import DPAuditError, UsageError
from ..ledger import signing as sg
from ..ledger.book import open_ledger, uncertified_reason
from ..ledger.integrity import Snapshot, verify_snapshot, withhold_row_sets
from ..ledger.plan_rules import audits_of_target, same_target, target_label
from ..records import RELEASE_FILE, Release, now_utc, read_json, write_json_atomic

SCHEMA = "dpaudit.bundle/1"
BUNDLE_FILE, LEDGER_FILE = "bundle.json", "ledger.json"
#: Release fields that must equal the release's ledger entry (the ledger's entry is signed).
RELEASE_FIELDS = tuple(
    "mechanism guarantee epsilon delta accountant adjacency noise_multiplier sample_rate steps "
    "clipping_norm".split()
)
_TOL = 1e-9


@dataclass(frozen=True)
class Check:
    name: str
    subject: str
    status: str  # "pass" | "FAIL" | "note"
    detail: str


# ------------------------------------------------------------------------------ bundle

_KINDS = {
    RELEASE_FILE: "releases",
    AUDIT_FILE: "audits",
    ONE_RUN_FILE: "audits",
    PLAN_FILE: "plans",
}


def _inputs(paths) -> dict:
    """kind -> [file] of the inputs (a file, or a folder holding release.json / audit.json / one_run.json / plan.json)."""
    found: dict = {"releases": [], "audits": [], "plans": []}
    for p in map(Path, paths):
        candidates = [p / n for n in _KINDS] if p.is_dir() else [p]
        hits = [f for f in candidates if f.is_file() and f.name in _KINDS]
        if not hits:
            raise UsageError(
                f"inputs must be release, audit, one-run or plan files (or folders holding one), got {str(p)!r}."
            )
        for f in hits:
            found[_KINDS[f.name]].append(f)
    return found


def _put(out: Path, kind: str, name: str, doc: dict) -> str:
    if not doc.get("id"):
        raise UsageError(f"{name} must carry its id (written by this dpaudit), got none.")
    write_json_atomic(out / kind / str(doc["id"]) / name, doc)
    return str(doc["id"])


def _copy(found: dict, out: Path) -> dict:
    """Write the shareable part of each input under ``out``; kind -> ids."""
    audits = [(f.name, read_json(f, "audit")) for f in found["audits"]]
    revealed = ((r.get("plan") or {}).get("path") for _, r in audits)
    planned = [Path(p) for p in revealed if p and Path(p).is_file()]
    shareable = {AUDIT_FILE: shareable_audit, ONE_RUN_FILE: shareable_one_run}

    def put(kind: str, name: str, what: str, files: list) -> list[str]:
        return [_put(out, kind, name, read_json(f, what)) for f in files]

    return {
        "releases": put("releases", RELEASE_FILE, "release", found["releases"]),
        "audits": [_put(out, "audits", n, shareable[n](r)) for n, r in audits],
        "plans": sorted(set(put("plans", PLAN_FILE, "audit plan", found["plans"] + planned))),
    }  # never plan.local.json


def make_bundle(paths, *, ledger, out) -> dict:
    """Write the shareable parts of ``paths`` (releases, audits, one-run audits, plans; an audit's
    plan is also found from its revealed path), the ledger's shareable export (no fingerprint key, row sets withheld:
    :func:`~dpaudit.ledger.integrity.withhold_row_sets`) and its head into the new folder ``out``; returns bundle.json's content."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"out must be a new or empty folder, got {str(out)!r}.")
    found = _inputs(paths)
    with open_ledger(ledger, create=False) as led:
        dump, head = withhold_row_sets(led.export_rows(include_key=False)), led.head()
    made = {
        "schema": SCHEMA,
        "created_at": now_utc(),
        "head": {k: head[k] for k in ("hash", "seq", "entries")},
        **_copy(found, out),
    }
    write_json_atomic(out / LEDGER_FILE, dump)
    write_json_atomic(out / BUNDLE_FILE, made)
    return made


# ------------------------------------------------------------------------------ verify


def _check(name: str, subject: str, problems, ok: str) -> Check:
    """FAIL naming ``problems`` (a list, one string, or None), else pass saying ``ok``."""
    problems = [problems] if isinstance(problems, str) else list(problems or ())
    return Check(name, subject, "FAIL" if problems else "pass", "; ".join(problems) or ok)


def _read_all(root: Path) -> tuple[dict, list, dict]:
    """The bundle's releases (by id), audits and plans (by id)."""

    def docs(pattern: str, what: str) -> list[dict]:
        return [read_json(p, what) for p in sorted(root.glob(pattern))]

    return (
        {r.get("id"): r for r in docs(f"releases/*/{RELEASE_FILE}", "release")},
        docs(f"audits/*/{AUDIT_FILE}", "audit") + docs(f"audits/*/{ONE_RUN_FILE}", "one-run audit"),
        {p.get("id"): p for p in docs(f"plans/*/{PLAN_FILE}", "audit plan")},
    )


def _ledger(root: Path, anchor, owner) -> tuple[Check, set, list]:
    """The ledger's check, its registered key ids and its entries (seq, kind, signer, payload)."""
    meta = read_json(root / BUNDLE_FILE, "bundle")
    dump = read_json(root / LEDGER_FILE, "ledger export")
    rows, head = [tuple(r) for r in dump.get("rows") or []], meta.get("head") or {}
    tip = (head.get("seq"), head.get("entries"), head.get("hash"))
    version = int(dump.get("schema_version") or 0)
    snapshot = Snapshot(str(root / LEDGER_FILE), "export", version, tip, rows)
    rep = verify_snapshot(snapshot, anchor=anchor, owner=owner)
    intact = f"{rep.entries} entries, chain and signatures intact up to head {str(tip[2])[:12]}"
    check = _check("ledger", LEDGER_FILE, [p.message for p in rep.problems], intact)
    entries = [(r[0], r[2], r[8], p) for r in rows for p in [_payload(r[5])] if p is not None]
    return check, {k["key_id"] for k in rep.signatures.get("keys", [])}, entries


def _payload(text) -> dict | None:
    try:
        p = json.loads(text)
    except (TypeError, ValueError):
        return None
    return p if isinstance(p, dict) else None


def verify_bundle(path, *, anchor: str | None = None, owner: str | None = None) -> list[Check]:
    """Every check (docs/review-walkthrough.md, step 5) on the bundle at ``path`` (``anchor``: a head hash
    published elsewhere, which the chain must contain; ``owner``: the ledger owner's key id)."""
    root = Path(path)
    if not (root / BUNDLE_FILE).is_file():
        raise UsageError(
            f"bundle must be a folder written by `dpaudit bundle`, got {str(path)!r} (no {BUNDLE_FILE})."
        )
    ledger, keys, entries = _ledger(root, anchor, owner)
    releases, audits, plans = _read_all(root)
    in_ledger = {p.get("release_id"): p for _, kind, _, p in entries if kind == "release"}
    by_plan = plan_entries(
        (seq, signer, p) for seq, kind, signer, p in entries if kind == sg.PLAN_KIND
    )
    checks = [ledger]
    for rid, rel in releases.items():
        checks += _release_checks(rid, rel, in_ledger.get(rid))
    for pid, plan in plans.items():
        checks += _plan_checks(pid, plan, by_plan.get(pid, {}), keys, audits)
    checks += _whole_record_checks(
        plans, releases, by_plan, [(seq, kind, p) for seq, kind, _, p in entries]
    )
    return checks + _all_audit_checks(audits, plans, by_plan, releases)


def _all_audit_checks(audits, plans, by_plan, releases) -> list[Check]:
    """Each audit's checks against its plan, then each training-pipeline record's (:func:`_pipeline_check`)."""
    checks = [c for rec in audits for c in _audit_checks(rec, plans, by_plan, releases)]
    return checks + [_pipeline_check(r) for r in audits if "findings" in r or "certified" in r]


def _pipeline_check(rec: dict) -> Check:
    """A one-run record of a training pipeline (an Opacus run) fails when it carries pipeline findings
    or is marked not certified: its claim is not the executed run's, whatever its bound says."""
    codes = [str((f or {}).get("code")) for f in rec.get("findings") or []]
    bad = codes or rec.get("certified") is not None
    why = f"{rec.get('certified') or 'not certified'}: {', '.join(codes) or 'no finding listed'}"
    return _check("pipeline", str(rec.get("id"))[:12], why if bad else None, "no pipeline findings")


def _release_checks(rid: str, rel: dict, entry: dict | None) -> list[Check]:
    try:
        claim = verify_claim(Release.from_dict(rel))
        out = [Check("claim", rid[:12], "pass" if claim.ok else "FAIL", claim.reason)]
    except (DPAuditError, KeyError, TypeError, ValueError) as e:
        out = [Check("claim", rid[:12], "FAIL", f"release.json cannot be read: {e}")]
    signed = entry or {}
    differ = [k for k in RELEASE_FIELDS if k in signed and not _same(rel.get(k), signed[k])]
    problem = differ and f"differs from its signed ledger entry in {', '.join(differ)}"
    if entry is None:
        problem = "no release entry with this id in the ledger"
    private = "its signed ledger entry counts it as private"
    return out + [
        _check("release = ledger", rid[:12], problem or None, "equal to its signed ledger entry"),
        _check("private", rid[:12], _privacy_problems(rel, entry), private),
    ]


def _privacy_problems(rel: dict, entry: dict | None) -> list[str]:
    """Why the release is not private, judged from its signed ledger entry (``non_private``, ``uncertified``:
    e.g. noise from a published seed, counted unbounded), and whether the bundle's copy (its editable
    ``noise_source``, steps and sampler) tells the same; a release without a ledger entry fails elsewhere."""
    if entry is None:
        return []
    signed = "non-private" if entry.get("non_private") else entry.get("uncertified")
    try:
        copy = (
            "non-private" if rel.get("non_private") else uncertified_reason(Release.from_dict(rel))
        )
    except (DPAuditError, KeyError, TypeError, ValueError) as e:
        copy = f"release.json cannot be read: {e}"
    out = [f"not private: its signed ledger entry counts it unbounded ({signed})"] if signed else []
    if bool(copy) != bool(signed):
        out.append(
            f"release.json's privacy fields differ from its signed ledger entry: the copy says "
            f"{copy or 'private'}, the ledger {signed or 'private'}"
        )
    return out


def _same(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or math.isclose(a, b, rel_tol=1e-12)
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _plan_problems(plan: dict, reg, keys: set) -> list[str]:
    kid = (plan.get("signer") or {}).get("key_id")
    out = [] if signature_ok(plan) else ["its signature does not verify (edited after signing)"]
    out += [] if kid in keys else [f"its key {str(kid)[:12]} is not registered in the ledger"]
    out += [why for why in (target_problem(plan), _fixed_noise(plan)) if why]
    if reg is None:
        return out + ["the ledger holds no registration of it"]
    other_target = reg[2].get("target") != plan.get("target")
    registration = (
        (reg[2].get("sha256") != digest(plan), "it is not the plan.json the ledger registered"),
        (reg[1] != kid, "its ledger registration is not signed by its key"),
        (other_target, "its ledger registration names another target"),
    )
    return out + [why for bad, why in registration if bad]


def _fixed_noise(plan: dict) -> str | None:
    """A plan that fixes reproducible DP noise had an outcome that could be previewed."""
    if not (plan.get("request") or {}).get("reproducible_noise"):
        return None
    return "it fixes reproducible noise (DP noise from its seeds: its outcome could be previewed)"


def _plan_checks(pid: str, plan: dict, led: dict, keys: set, audits: list) -> list[Check]:
    signer = str((plan.get("signer") or {}).get("key_id"))[:12]
    present = [a.get("id") for a in audits if (a.get("plan") or {}).get("id") == pid]
    problems = _plan_problems(plan, led.get("registered"), keys)
    signed = _check("plan", pid[:12], problems, f"signed by {signer}, registered in the ledger")
    return [signed, _runs_check(pid, list(led.get("runs", [])), present)]


# ------------------------------------------------------------------------------ the whole record


def _whole_record_checks(plans: dict, releases: dict, by_plan: dict, entries: list) -> list[Check]:
    """What the ledger records about the bundle's targets, against the bundle: every plan of each
    target (the bundle's plans' targets and its releases) is in the bundle; each plan was registered
    before any audit of its target; each run has one result (the first counts)."""
    targets = [plan_target(p) for p in plans.values()] + [{"release": r} for r in releases]
    targets = [t for t in targets if t]
    unique = [t for i, t in enumerate(targets) if t not in targets[:i]]
    out = [_target_plans_check(t, plans, by_plan) for t in unique]
    for pid, plan in plans.items():
        led = by_plan.get(pid, {})
        out.append(_registered_first_check(pid, plan_target(plan), led.get("registered"), entries))
        out.append(_results_check(pid, led))
    return out


def _target_plans_check(target: dict, plans: dict, by_plan: dict) -> Check:
    """Every plan the ledger registered for ``target`` is in the bundle (one left out: plan shopping)."""
    ledger = [
        (pid, rec["registered"][0])
        for pid, rec in by_plan.items()
        if rec.get("registered") and same_target(target, rec["registered"][2].get("target"))
    ]
    missing = [
        f"{str(pid)[:12]} (registered at seq {seq})" for pid, seq in ledger if pid not in plans
    ]
    n = f"{len(ledger)} plan{'s' * (len(ledger) != 1)} of {target_label(target)} in the ledger"
    problem = missing and f"{n}, not in the bundle: {', '.join(missing)}"
    return _check("plans of target", target_label(target)[:24], problem, f"{n}, all in the bundle")


def _registered_first_check(pid: str, target, reg, entries: list) -> Check:
    """The plan was registered before any audit of its target (else it could be fitted to a result)."""
    if reg is None:
        return _check("registered first", pid[:12], "the ledger holds no registration of it", "")
    if not target:
        return Check("registered first", pid[:12], "note", "it names no target (an older plan)")
    before = [
        f"{aid[:12]} (seq {seq})" for seq, aid in audits_of_target(target, entries) if seq < reg[0]
    ]
    at, of = f"registered at seq {reg[0]}", target_label(target)
    return _check(
        "registered first",
        pid[:12],
        before and f"{at}, after audits of {of}: {', '.join(before)}",
        f"{at}, before any audit of {of}",
    )


def _results_check(pid: str, led: dict) -> Check:
    """One result per run, after the run: the first counts (another is how an edited result is passed off)."""
    later, orphan = led.get("later_results", []), led.get("orphan_results", [])
    groups = (("a second result entry for run", later), ("a result of no recorded run", orphan))
    why = "; ".join(_named_ids(groups))
    return _check(
        "one result",
        pid[:12],
        f"{why} (only a run's first result counts)" if why else None,
        f"{len(led.get('results', {}))} result(s), one per run",
    )


def _named_ids(groups) -> list[str]:
    """ "label: id, id" (ids cut to 12 characters) of each (label, ids) group holding any."""
    return [f"{label}: {', '.join(str(i)[:12] for i in ids)}" for label, ids in groups if ids]


def _runs_check(pid: str, runs: list, present: list) -> Check:
    """The plan's runs in the ledger against its audits in the bundle: a hidden run fails, a second one is noted."""
    n = f"{len(runs)} run{'s' * (len(runs) != 1)} of plan {pid[:12]}"
    groups = (
        ("not in the bundle", [r for r in runs if r not in present]),
        ("not recorded under the plan", [a for a in present if a not in runs]),
    )
    why = "".join(f"; {named}" for named in _named_ids(groups))
    if why:
        return _check("runs", pid[:12], f"{n} in the ledger, {len(present)} in the bundle{why}", "")
    status = "note" if len(runs) > 1 else "pass"  # a second run of one plan is worth a look
    return Check("runs", pid[:12], status, f"{n} in the ledger, all in the bundle")


def _audit_checks(rec: dict, plans: dict, by_plan: dict, releases: dict) -> list[Check]:
    aid, reveal = str(rec.get("id"))[:12], rec.get("plan") or {}
    plan = plans.get(reveal.get("id"))
    if plan is None:
        named = reveal.get("id")
        why = f"its plan {str(named)[:12]} is not in the bundle" if named else "it names no plan"
        return [_check("audit vs plan", aid, f"not pre-registered: {why}", "")]
    try:
        diffs, bound = _plan_differences(rec, plan, reveal), _bound_problem(rec, plan)
    except (DPAuditError, KeyError, TypeError, ValueError) as e:
        diffs, bound = [f"cannot be read ({type(e).__name__}: {e})"], "not recomputable"
    recorded = by_plan.get(plan["id"], {}).get("results", {}).get(rec.get("id"))
    result = (
        None
        if recorded == digest(rec)
        else "no result recorded under the plan"
        if recorded is None
        else "differs from the result the ledger recorded after the run"
    )
    return [
        _check("audit vs plan", aid, diffs, "commitment, seeds and settings as planned"),
        _check("bound", aid, bound, f"recomputed from its counts ({plan['audit']['statistic']})"),
        _check(
            "result = ledger",
            aid,
            result,
            "the file whose digest the ledger recorded after the run",
        ),
        _release_match(aid, rec, releases.get(rec.get("release_id")))
        if plan.get("release_id")
        else _claim_match(aid, rec, plan["claim"]),
    ]


#: The settings a plan fixes beyond statistic, confidence and release, by audit kind:
#: (name, the audit record's key, the plan's key).
PLANNED_SETTINGS = {
    "one-run": (("canaries", "canaries", "canaries"), ("canary", "kind", "canary")),
    "trials": (
        ("trials", "runs", "trials"),
        ("canary", "canary", "canary"),
        ("select_fraction", "select_fraction", "select_fraction"),
    ),
}


def _settings(rec: dict, plan: dict, seeds: dict) -> tuple[dict, dict]:
    """(what the audit records, what its plan fixed) for each planned setting."""
    a, one_run = plan["audit"], plan["audit"]["kind"] == "one-run"
    got = {k: rec.get(k) for k in ("statistic", "confidence")} | {"release": rec.get("release_id")}
    want = {k: a[k] for k in ("statistic", "confidence")} | {"release": plan.get("release_id")}
    for name, recorded, planned in PLANNED_SETTINGS["one-run" if one_run else "trials"]:
        got[name], want[name] = rec.get(recorded), a[planned]
    if not one_run:
        got["seed"], want["seed"] = (rec.get("seeds") or {}).get("public"), seeds.get("public")
    return got, want


def _plan_differences(rec: dict, plan: dict, reveal: dict) -> list[str]:
    seeds = reveal.get("seeds") or {}
    got, want = _settings(rec, plan, seeds)
    out = []
    if commitment(reveal.get("salt"), seeds) != plan["commitment"]:
        out.append("revealed salt and seeds do not hash to the commitment")
    return out + [
        f"{k} {got[k]!r}, planned {want[k]!r}" for k in want if got[k] != want[k]
    ] or _seeds_unused(rec, plan["audit"], seeds)


def _seeds_unused(rec: dict, a: dict, seeds: dict) -> list[str]:
    """Whether the run used the revealed seeds: the one-run coins, or the seeded worlds and SELECT split."""
    if a["kind"] == "one-run":
        used = int(plan_coins(seeds["coins"], a["canaries"]).sum()) if "coins" in seeds else None
        if used == rec.get("included"):
            return []
        return [f"{rec.get('included')} canaries included, the committed coins include {used}"]
    tp = plan_trials(a["trials"], seed=seeds["public"], select_fraction=a["select_fraction"])
    c, ev = rec["counts"], ~tp.select
    sizes = (int((tp.world & ev).sum()), int((~tp.world & ev).sum()))
    if (c["tp"] + c["fn"], c["tn"] + c["fp"]) == sizes:
        return []
    return [f"EVAL counts {c} do not fit the seeded worlds and split {sizes}"]


def _one_run_bound_problem(rec: dict, plan: dict) -> str | None:
    claim, stat = plan["claim"], plan["audit"]["statistic"]
    key = "fdp" if stat == "f-dp" else "steinke"
    got = recompute_bounds(
        rec,
        claim=event_from_dict(claim["event"]) if key == "fdp" else None,
        accountant=claim["accountant"],
        adjacency=claim["adjacency"],
    )[key]
    stored = (rec.get(key) or {}).get("epsilon_lower_bound")
    if got is not None and stored is not None and abs(got - float(stored)) <= 1e-6:
        return None
    return f"{key} eps_LB {stored} stored, {got} recomputed from its counts"


def _bound_problem(rec: dict, plan: dict) -> str | None:
    """Why the stored result differs from the one recomputed from its counts with the planned statistic and claim (None: equal)."""
    if plan["audit"]["kind"] == "one-run":
        return _one_run_bound_problem(rec, plan)
    claim, stat = plan["claim"], plan["audit"]["statistic"]
    conf = float(plan["audit"]["confidence"])
    lb, stored = general_epsilon_at(rec, conf), float(rec["epsilon_lower_bound"])
    if lb is None or abs(lb - stored) > _TOL * max(1.0, stored):
        return f"eps_LB {stored} stored, {lb} recomputed from its counts"
    curve = dict(rec.get("claimed_curve") or {}, event=claim["event"]) if claim["event"] else None
    planned = dict(rec, statistic=stat, claimed_curve=curve)
    decided = decision_at(planned, conf)["violated"]
    if decided == violated(read_record(rec)):
        return None
    return f"the {stat} verdict recomputed from its counts (violated: {decided}) differs from the stored one"


def _tests(rec: dict, event, delta) -> bool:
    """The audit tested ``event`` (a stored event) at ``delta``."""
    tested = (rec.get("claimed_curve") or rec.get("fdp") or {}).get("event")
    return (
        tested is not None
        and event is not None
        and event_from_dict(tested).to_dict() == event_from_dict(event).to_dict()
        and _same(rec.get("delta"), delta)
    )


def _release_match(aid: str, rec: dict, rel: dict | None) -> Check:
    if rel is None:
        missing = f"audits release {str(rec.get('release_id'))[:12]}, which is not in the bundle"
        return _check("audit = release", aid, missing, "")
    same = _tests(rec, rel.get("guarantee"), rel.get("delta"))
    return _check(
        "audit = release",
        aid,
        None if same else "the event or delta tested is not the release's",
        "tests the release's event at its delta",
    )


def _claim_match(aid: str, rec: dict, claim: dict) -> Check:
    """An audit planned without a release (an Opacus run) tests its plan's claim, whose epsilon is recomputed from its event."""
    eps = recompute_epsilon(
        claim.get("event"), claim.get("delta"), claim.get("accountant"), claim.get("adjacency")
    ).epsilon
    tested = _tests(rec, claim.get("event"), claim.get("delta"))
    problems = [] if tested else ["the event or delta tested is not the plan's"]
    if eps is None or not (
        _same(eps, claim.get("epsilon")) and _same(eps, rec.get("claimed_epsilon"))
    ):
        problems.append(
            f"claimed epsilon {claim.get('epsilon')} planned, {rec.get('claimed_epsilon')} audited, {eps} recomputed"
        )
    return _check(
        "audit = claim",
        aid,
        problems,
        f"tests its plan's claim (eps {eps:.4g} recomputed from its event)" if eps else "",
    )


def failed(checks) -> bool:
    return any(c.status == "FAIL" for c in checks)

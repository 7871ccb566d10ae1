"""``dpaudit bundle`` and ``dpaudit verify``: a claim's evidence, collected and re-checked without the private data (issue 27).

A bundle (:func:`make_bundle`) is one folder a reviewer can be sent: ``bundle.json`` (its contents and
the ledger's published head), ``ledger.json`` (the ledger's export, without the fingerprint key),
``releases/ID/release.json``, ``audits/ID/audit.json`` or ``one_run.json`` (their shareable parts) and
``plans/ID/plan.json``. Never a ``local.json``, ``*_local.json``, ``plan.local.json`` or ``scores.npz``.

:func:`verify_bundle` re-checks everything from those files alone, one :class:`Check` per finding:

- ledger: the hash chain up to the published head, every entry readable, every signature
  (:func:`dpaudit.ledger.integrity.verify_snapshot`); an entry dropped or edited is named;
- each release: its claim recomputed from its event with its own accountant and adjacency
  (:func:`dpaudit.claims.verify_claim`), and the release equal to its signed ledger entry (event,
  epsilon, delta, noise multiplier, sample rate, steps, ...);
- each plan: signed by its key, that key registered in the ledger, the ledger's registration of
  exactly this plan.json, and its runs in the ledger equal to its audits in the bundle (a hidden run fails);
- each audit: pre-registered, its revealed salt and seeds hashing to its plan's commitment and used
  (the seeded worlds / SELECT split, or the one-run coins), its statistic, confidence, trials and
  canaries the plan's, its bound recomputed from its stored counts with the statistic and claim its
  plan fixed, its shareable file the one whose digest the ledger recorded after the run, and it
  audits a release in the bundle (release id and event).
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..accounting.events import event_from_dict
from ..audit_outputs import shareable_audit, shareable_one_run
from ..audit_plans import PLAN_FILE, commitment, digest, plan_entries, signature_ok
from ..audits.engine import AUDIT_FILE, plan_trials
from ..audits.one_run import ONE_RUN_FILE, plan_coins, recompute_bounds
from ..audits.verdicts import decision_at, general_epsilon_at, violated
from ..claims import verify_claim
from ..errors import DPAuditError, UsageError
from ..ledger import signing as sg
from ..ledger.book import open_ledger
from ..ledger.integrity import Snapshot, verify_snapshot
from ..records import RELEASE_FILE, Release, now_utc, read_json, read_release, write_json_atomic

SCHEMA = "dpaudit.bundle/1"
BUNDLE_FILE, LEDGER_FILE = "bundle.json", "ledger.json"
#: Release fields that must equal the release's ledger entry (the ledger's entry is signed).
RELEASE_FIELDS = ("mechanism", "guarantee", "epsilon", "delta", "accountant", "adjacency", "noise_multiplier", "sample_rate", "steps",
                  "clipping_norm")
_TOL = 1e-9


@dataclass(frozen=True)
class Check:
    name: str
    subject: str
    status: str  # "pass" | "FAIL" | "note"
    detail: str


# ------------------------------------------------------------------------------ bundle


def _inputs(paths) -> dict:
    """kind -> [file] of the inputs (a file, or a folder holding release.json / audit.json / one_run.json / plan.json)."""
    found: dict = {"release": [], "audit": [], "plan": []}
    for p in map(Path, paths):
        files = [p / n for n in (RELEASE_FILE, AUDIT_FILE, ONE_RUN_FILE, PLAN_FILE)] if p.is_dir() else [p]
        hits = [f for f in files if f.is_file() and f.name in (RELEASE_FILE, AUDIT_FILE, ONE_RUN_FILE, PLAN_FILE)]
        if not hits:
            raise UsageError(f"inputs must be release, audit, one-run or plan files (or folders holding one), got {str(p)!r}.")
        for f in hits:
            found["release" if f.name == RELEASE_FILE else "plan" if f.name == PLAN_FILE else "audit"].append(f)
    return found


def make_bundle(paths, *, ledger, out) -> dict:
    """Copy the shareable parts of ``paths`` (releases, audits, one-run audits, plans; the plans of
    the audits are found from their revealed plan path too), the ledger's export without its
    fingerprint key and its head into the new folder ``out``; returns bundle.json's content."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"out must be a new or empty folder, got {str(out)!r}.")
    found = _inputs(paths)
    with open_ledger(ledger, create=False) as led:
        dump, head = led.export_rows(include_key=False), led.head()
    made = {"schema": SCHEMA, "created_at": now_utc(), "head": {k: head[k] for k in ("hash", "seq", "entries")}, "releases": [], "audits": [], "plans": []}
    for f in found["release"]:
        rel = read_release(f)
        (out / "releases" / rel.id).mkdir(parents=True)
        shutil.copyfile(f, out / "releases" / rel.id / RELEASE_FILE)
        made["releases"].append(rel.id)
    plans = list(found["plan"])
    for f in found["audit"]:
        rec = read_json(f, "audit")
        aid = str(rec.get("id") or f.parent.name)
        write_json_atomic(out / "audits" / aid / f.name, shareable_one_run(rec) if f.name == ONE_RUN_FILE else shareable_audit(rec))
        made["audits"].append(aid)
        plans += [Path(p) for p in ((rec.get("plan") or {}).get("path"),) if p and Path(p).is_file()]
    for f in plans:
        plan = read_json(f, "audit plan")
        if plan.get("id") not in made["plans"]:
            (out / "plans" / plan["id"]).mkdir(parents=True)
            shutil.copyfile(f, out / "plans" / plan["id"] / PLAN_FILE)  # never plan.local.json
            made["plans"].append(plan["id"])
    write_json_atomic(out / LEDGER_FILE, dump)
    write_json_atomic(out / BUNDLE_FILE, made)
    return made


# ------------------------------------------------------------------------------ verify


def _read_all(root: Path, pattern: str, what: str) -> list[dict]:
    return [read_json(p, what) for p in sorted(root.glob(pattern))]


def verify_bundle(path, *, anchor: str | None = None, owner: str | None = None) -> list[Check]:
    """Every check of the module docstring on the bundle at ``path`` (``anchor``: a head hash
    published elsewhere, which the chain must contain; ``owner``: the ledger owner's key id)."""
    root = Path(path)
    if not (root / BUNDLE_FILE).is_file():
        raise UsageError(f"bundle must be a folder written by `dpaudit bundle`, got {str(path)!r} (no {BUNDLE_FILE}).")
    meta, dump = read_json(root / BUNDLE_FILE, "bundle"), read_json(root / LEDGER_FILE, "ledger export")
    rows = [tuple(r) for r in dump.get("rows") or []]
    head = meta.get("head") or {}
    rep = verify_snapshot(Snapshot(str(root / LEDGER_FILE), "export", int(dump.get("schema_version") or 0),
                                   (head.get("seq"), head.get("entries"), head.get("hash")), rows), anchor=anchor, owner=owner)
    checks = [Check("ledger", LEDGER_FILE, "pass", f"{rep.entries} entries, chain and signatures intact up to head {str(head.get('hash'))[:12]}")] \
        if rep.ok else [Check("ledger", LEDGER_FILE, "FAIL", p.message) for p in rep.problems]
    entries = [(r[0], r[2], r[8], json.loads(r[5])) for r in rows if _json_object(r[5])]
    releases = {r["id"]: r for r in _read_all(root, f"releases/*/{RELEASE_FILE}", "release")}
    audits = _read_all(root, f"audits/*/{AUDIT_FILE}", "audit") + _read_all(root, f"audits/*/{ONE_RUN_FILE}", "one-run audit")
    plans = {p.get("id"): p for p in _read_all(root, f"plans/*/{PLAN_FILE}", "audit plan")}
    ledger_releases = {p.get("release_id"): p for _, kind, _, p in entries if kind == "release"}
    for rid, rel in releases.items():
        checks += _release_checks(rid, rel, ledger_releases.get(rid))
    by_plan = plan_entries((seq, signer, p) for seq, kind, signer, p in entries if kind == sg.PLAN_KIND)
    keys = {k["key_id"] for k in rep.signatures.get("keys", [])}
    for pid, plan in plans.items():
        checks += _plan_checks(pid, plan, by_plan.get(pid), keys, [a for a in audits if (a.get("plan") or {}).get("id") == pid])
    for rec in audits:
        checks += _audit_checks(rec, plans, by_plan, releases)
    return checks


def _json_object(text) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except (TypeError, ValueError):
        return False


def _release_checks(rid: str, rel: dict, entry: dict | None) -> list[Check]:
    try:
        claim = verify_claim(Release.from_dict(rel))
        out = [Check("claim", rid[:12], "pass" if claim.ok else "FAIL", claim.reason)]
    except (DPAuditError, KeyError, TypeError, ValueError) as e:
        out = [Check("claim", rid[:12], "FAIL", f"release.json cannot be read: {e}")]
    if entry is None:
        return out + [Check("release = ledger", rid[:12], "FAIL", "no release entry with this id in the ledger")]
    differ = [k for k in RELEASE_FIELDS if k in entry and not _same(rel.get(k), entry.get(k))]
    return out + [Check("release = ledger", rid[:12], "FAIL" if differ else "pass",
                        f"differs from its signed ledger entry in {', '.join(differ)}" if differ else "equal to its signed ledger entry")]


def _same(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or math.isclose(a, b, rel_tol=1e-12)
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _plan_checks(pid: str, plan: dict, led: dict | None, keys: set, audits: list) -> list[Check]:
    reg = (led or {}).get("registered")
    kid = (plan.get("signer") or {}).get("key_id")
    problems = [why for bad, why in ((not signature_ok(plan), "its signature does not verify (edited after signing)"),
                                     (kid not in keys, f"its key {str(kid)[:12]} is not registered in the ledger"),
                                     (reg is None, "the ledger holds no registration of it"),
                                     (reg is not None and reg[2].get("sha256") != digest(plan), "it is not the plan.json the ledger registered"),
                                     (reg is not None and reg[1] != kid, "its ledger registration is not signed by its key")) if bad]
    out = [Check("plan", pid[:12], "FAIL" if problems else "pass", "; ".join(problems) or f"signed by {str(kid)[:12]}, registered in the ledger")]
    runs, present = list((led or {}).get("runs", [])), [a.get("id") for a in audits]
    hidden = [r for r in runs if r not in present]
    extra = [a for a in present if a not in runs]
    n = f"{len(runs)} run{'s' if len(runs) != 1 else ''} of plan {pid[:12]}"
    if hidden or extra:
        why = (f"; not in the bundle: {', '.join(h[:12] for h in hidden)}" if hidden else "") + \
              (f"; not recorded under the plan: {', '.join(str(e)[:12] for e in extra)}" if extra else "")
        return out + [Check("runs", pid[:12], "FAIL", f"{n} in the ledger, {len(present)} in the bundle{why}")]
    return out + [Check("runs", pid[:12], "note" if len(runs) > 1 else "pass", f"{n} in the ledger, all in the bundle")]


def _audit_checks(rec: dict, plans: dict, by_plan: dict, releases: dict) -> list[Check]:
    aid = str(rec.get("id"))[:12]
    reveal = rec.get("plan") or {}
    plan = plans.get(reveal.get("id"))
    if plan is None:
        return [Check("audit vs plan", aid, "FAIL", "not pre-registered: no plan in the bundle" + (f" (plan {reveal['id'][:12]})" if reveal else ""))]
    try:
        diffs = _plan_differences(rec, plan, reveal)
        bound = _bound_problem(rec, plan)
    except (DPAuditError, KeyError, TypeError, ValueError) as e:
        diffs, bound = [f"cannot be read ({type(e).__name__}: {e})"], "not recomputable"
    sha = by_plan.get(plan["id"], {}).get("results", {}).get(rec.get("id"))
    return [Check("audit vs plan", aid, "FAIL" if diffs else "pass", "; ".join(diffs) or "commitment, seeds and settings as planned"),
            Check("bound", aid, "FAIL" if bound else "pass", bound or f"recomputed from its counts ({plan['audit']['statistic']})"),
            Check("result = ledger", aid, "pass" if sha == digest(rec) else "FAIL",
                  "the file whose digest the ledger recorded after the run" if sha == digest(rec) else
                  ("no result recorded under the plan" if sha is None else "differs from the result the ledger recorded after the run")),
            _release_match(aid, rec, releases.get(rec.get("release_id")))]


def _plan_differences(rec: dict, plan: dict, reveal: dict) -> list[str]:
    a, seeds = plan["audit"], reveal.get("seeds") or {}
    one = a["kind"] == "one-run"
    out = [] if commitment(reveal.get("salt"), seeds) == plan["commitment"] else ["revealed salt and seeds do not hash to the commitment"]
    got = {"statistic": rec.get("statistic"), "confidence": rec.get("confidence"), "release": rec.get("release_id")}
    want = {"statistic": a["statistic"], "confidence": a["confidence"], "release": plan.get("release_id")}
    if one:
        got.update(canaries=rec.get("canaries"), canary=rec.get("kind"))
        want.update(canaries=a["canaries"], canary=a["canary"])
    else:
        got.update(trials=rec.get("runs"), canary=rec.get("canary"), select_fraction=rec.get("select_fraction"), seed=(rec.get("seeds") or {}).get("public"))
        want.update(trials=a["trials"], canary=a["canary"], select_fraction=a["select_fraction"], seed=seeds.get("public"))
    out += [f"{k} {got[k]!r}, planned {want[k]!r}" for k in want if got[k] != want[k]]
    if out or "coins" not in seeds and one:
        return out or ["no committed coin seed revealed"]
    if one:
        used = int(plan_coins(seeds["coins"], a["canaries"]).sum())
        return [] if used == rec.get("included") else [f"{rec.get('included')} canaries included, the committed coins include {used}"]
    tp = plan_trials(a["trials"], seed=seeds["public"], select_fraction=a["select_fraction"])
    c, ev = rec["counts"], ~tp.select
    sizes = (int((tp.world & ev).sum()), int((~tp.world & ev).sum()))
    return [] if (c["tp"] + c["fn"], c["tn"] + c["fp"]) == sizes else [f"EVAL counts {c} do not fit the seeded worlds and split {sizes}"]


def _bound_problem(rec: dict, plan: dict) -> str | None:
    """Why the stored result differs from the one recomputed from its counts with the planned statistic and claim (None: equal)."""
    claim, stat, conf = plan["claim"], plan["audit"]["statistic"], float(plan["audit"]["confidence"])
    if plan["audit"]["kind"] == "one-run":
        event = event_from_dict(claim["event"]) if stat == "f-dp" else None
        got = recompute_bounds(rec, claim=event, accountant=claim["accountant"], adjacency=claim["adjacency"])
        key = "fdp" if stat == "f-dp" else "steinke"
        stored = (rec.get(key) or {}).get("epsilon_lower_bound")
        return None if got[key] is not None and stored is not None and abs(got[key] - float(stored)) <= 1e-6 else \
            f"{key} eps_LB {stored} stored, {got[key]} recomputed from its counts"
    lb = general_epsilon_at(rec, conf)
    stored = float(rec["epsilon_lower_bound"])
    if lb is None or abs(lb - stored) > _TOL * max(1.0, stored):
        return f"eps_LB {stored} stored, {lb} recomputed from its counts"
    planned = dict(rec, statistic=stat, claimed_curve=dict(rec.get("claimed_curve") or {}, event=claim["event"]) if claim["event"] else None)
    decided = decision_at(planned, conf)["violated"]
    if decided != violated(rec):
        return f"the {stat} verdict recomputed from its counts (violated: {decided}) differs from the stored one"
    return None


def _release_match(aid: str, rec: dict, rel: dict | None) -> Check:
    if rel is None:
        return Check("audit = release", aid, "FAIL", f"audits release {str(rec.get('release_id'))[:12]}, which is not in the bundle")
    tested = (rec.get("claimed_curve") or rec.get("fdp") or {}).get("event")
    same = tested is not None and rel.get("guarantee") is not None and \
        event_from_dict(tested).to_dict() == event_from_dict(rel["guarantee"]).to_dict() and _same(rec.get("delta"), rel.get("delta"))
    return Check("audit = release", aid, "pass" if same else "FAIL",
                 "tests the release's event at its delta" if same else "the event or delta tested is not the release's")


def failed(checks) -> bool:
    return any(c.status == "FAIL" for c in checks)


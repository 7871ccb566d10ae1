"""Pre-registered audits: what an audit will do, fixed, signed and in the ledger before it runs.

A black-box audit can be gamed: run it many times, or pick the statistic after seeing the scores. The walk-through is in
docs/review-walkthrough.md (and docs/one_run.md for Opacus): :func:`make_plan` writes the signed ``plan.json`` (committing to
the seeds by ``SHA-256(canonical {salt, seeds})``), the private ``plan.local.json`` and a signed ``plan`` ledger entry;
:func:`load_plan` checks signature, commitment and registration; :class:`PlanRun` records each run before it computes and its
result's digest after. :func:`opacus_plan` plans the one-run audit of an Opacus training run.

Privacy contract: the committed seeds fix public parts only (canaries, worlds, SELECT split, one-run coins: independent
of the data and of the DP noise); the DP noise never derives from them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import secrets
import uuid
from dataclasses import dataclass
from pathlib import Path

from .auditing import auditable_entry, entry_canary, target_claim, target_for
from .accounting.accountants import compute_epsilon
from .accounting.events import SubsampledGaussian
from .audits.engine import SELECT_FRACTION
from .errors import DataError, UsageError
from .ledger import signing as sg
from .ledger.book import open_ledger
from .ledger.integrity import canonical_json
from .one_run_auditing import MODULE_MODELS, module_target
from .paths import check_new_folder, results_in
from .records import now_utc, read_json, read_release, write_json_atomic
from .requests import AuditRequest
from .validation import open_unit, positive_int

SCHEMA = "dpaudit.audit-plan/1"
#: The mechanism of a plan for an Opacus training run (dpaudit.integrations.opacus).
OPACUS = "opacus"
PLAN_FILE = "plan.json"
PLAN_LOCAL_FILE = "plan.local.json"
_SIG_DOMAIN = "dpaudit-audit-plan-sig-v1"
NOT_FOR_PUBLICATION = (
    "the salt and seeds committed to by plan.json: keep this file private until the run reveals them "
    "in its audit file"
)


def digest(doc: dict) -> str:
    """SHA-256 of a document's canonical JSON (the ledger's serialisation)."""
    return hashlib.sha256(canonical_json(doc).encode("utf-8")).hexdigest()


def commitment(salt: str, seeds: dict) -> str:
    return digest({"salt": salt, "seeds": seeds})


def _material(plan: dict) -> bytes:
    return json.dumps(
        [_SIG_DOMAIN, canonical_json({k: v for k, v in plan.items() if k != "signature"})]
    ).encode("utf-8")


def signature_ok(plan: dict) -> bool:
    """plan.json is signed by the key it names (and was not changed since)."""
    signer = plan.get("signer") if isinstance(plan.get("signer"), dict) else {}
    try:
        kid = sg.key_id(sg.parse_public_key(str(signer.get("public_key"))))
    except UsageError:
        return False
    return kid == signer.get("key_id") and sg.signature_ok(
        signer["public_key"], plan.get("signature", ""), _material(plan)
    )


def _claim(a: AuditRequest) -> tuple[dict, dict]:
    """(the claim the run will test, its target): the release's, else the target's (public facts only;
    nothing is trained). The target (:mod:`dpaudit.ledger.plan_rules`) is the release, else the
    mechanism on its dataset at its claimed event, named as the run's ``audit`` entry names them."""
    if a.release is not None:
        rel = read_release(a.release)
        values = (rel.id, rel.guarantee, rel.epsilon, rel.delta, rel.adjacency, rel.accountant)
        return dict(zip(_CLAIM_KEYS, values)), {"release": rel.id}
    if a.protocol.one_run and a.mechanism in MODULE_MODELS:
        t = module_target(a)
    else:
        t = target_for(
            dataclasses.replace(a, canary=None, no_noise=False) if a.protocol.one_run else a
        )
    claim = target_claim(t)
    mechanism, dataset = t.mechanism, (t.private_data() or {}).get("dataset")
    event = None if claim["event"] is None else claim["event"].to_dict()
    values = (event, claim["claimed_epsilon"], claim["delta"], str(claim["adjacency"]))
    target = {"mechanism": str(mechanism), "dataset": dataset, "event": event}
    return dict(zip(_CLAIM_KEYS, (None, *values, claim["accountant"]))), target


#: A plan's "claim" block in its written order (the release id is popped into the plan's own field).
_CLAIM_KEYS = ("release_id", "event", "epsilon", "delta", "adjacency", "accountant")


def plan_target(plan: dict) -> dict | None:
    """What ``plan`` audits (its signed ``target``; an older plan without one: its release, else unnamed)."""
    if isinstance(plan.get("target"), dict):
        return plan["target"]
    return {"release": plan["release_id"]} if plan.get("release_id") else None


def target_problem(plan: dict) -> str | None:
    """Why ``plan``'s signed target is not the one its own fields name (None: it is, or it names none)."""
    target, release_id = plan.get("target"), plan.get("release_id")
    if target is None:
        return None
    event = (plan.get("claim") or {}).get("event")
    fits = (
        target == {"release": release_id}
        if release_id
        else isinstance(target, dict) and "release" not in target and target.get("event") == event
    )
    return None if fits else f"its target {target} is not the one its release or claim names"


def _settings(a: AuditRequest, claim: dict) -> dict:
    """The plan's "audit" block: what a verifier holds the run to (the statistic follows from the
    claim: an event is tested as a curve, f-DP in one run)."""
    if a.protocol.one_run:
        canaries = positive_int("canaries", a.protocol.canaries, 2)
        statistic = "f-dp" if claim["event"] else "steinke"
        return _one_run_settings(a.protocol.one_run_kind, canaries, statistic, a.confidence)
    canary = entry_canary(auditable_entry(a.mechanism), a.canary)
    trials = positive_int("runs", a.runs, 4)
    statistic = "claimed-curve" if claim["event"] else "clopper-pearson"
    values = ("trials", canary, None, trials, statistic, a.confidence, SELECT_FRACTION)
    return dict(zip(_SETTINGS_KEYS, values))


def _one_run_settings(canary: str, canaries: int, statistic: str, confidence: float) -> dict:
    values = ("one-run", canary, canaries, None, statistic, confidence, None)
    return dict(zip(_SETTINGS_KEYS, values))


#: A plan's "audit" block in its written order.
_SETTINGS_KEYS = "kind canary canaries trials statistic confidence select_fraction".split()


def make_plan(a: AuditRequest, *, key=None) -> Path:
    """Write plan.json and plan.local.json into the audit's output folder (``a.out``, default
    ``audits/MECHANISM-plan-ID``) and register the plan in ``a.output.ledger``, signed with ``key``
    (module docstring). Returns plan.json's path. Nothing is trained."""
    if a.threat_model != "final-model":
        raise UsageError(
            f"threat model of a planned audit must be final-model (one audit per plan), got {a.threat_model!r}."
        )
    refuse_reproducible_noise(a.trials.reproducible_noise)
    signing = sg.load_signing_key(key, required=True)
    _settings(a, {"event": None})  # its checks, before the claim is built
    claim, target = _claim(a)
    header = dict(mechanism=a.mechanism, release_id=claim.pop("release_id"), target=target)
    seeds = {"public": int(a.seed)}
    if a.protocol.one_run:
        seeds["coins"] = secrets.randbits(63)
    # to_dict: paths already as strings
    request = {k: v for k, v in a.to_dict().items() if k not in ("seed", "json_out")}
    header.update(claim=claim, audit=_settings(a, claim))
    return _write_plan(signing, header, request, seeds, a.out)


def refuse_reproducible_noise(reproducible) -> None:
    """A plan never fixes its DP noise: noise derived from the seeds it reveals (or the public seed)
    would let its outcome be computed before the run, and the run chosen from the previews."""
    if reproducible:
        raise UsageError(
            f"reproducible noise must be off for a planned audit (its DP noise would follow "
            f"from the seeds it fixes: its outcome could be previewed), got {reproducible!r}."
        )


def opacus_plan(
    event: SubsampledGaussian,
    *,
    delta: float,
    canaries: int,
    tensors=None,
    confidence: float = 0.95,
    out=None,
    ledger=None,
    key=None,
) -> Path:
    """The plan of a one-run audit of an Opacus training run (``dpaudit audit plan opacus ...``;
    run it with :meth:`dpaudit.integrations.opacus.OpacusCanaries.from_plan`): the claim is
    ``event`` (Opacus's noise multiplier, sample rate and steps) at ``delta``, add-remove-record,
    rdp accountant; ``canaries`` Dirac gradient canaries in ``tensors`` (parameter names, public;
    None: every trainable parameter), decided by the f-DP analysis at ``confidence``. The committed
    seeds (fresh OS entropy, private until the run) fix the canary coordinates and inclusion coins.
    Written and registered as :func:`make_plan` does."""
    signing = sg.load_signing_key(key, required=True)
    if not isinstance(event, SubsampledGaussian):
        raise UsageError(
            f"event must be a SubsampledGaussian (Opacus's noise multiplier, sample rate and steps), got {event!r}."
        )
    m = positive_int("canaries", canaries, 2)
    if tensors is not None and (isinstance(tensors, str) or not tensors):
        raise UsageError(
            f"tensors must be a list of parameter names (or None: every trainable parameter), got {tensors!r}."
        )
    delta, confidence = open_unit("delta", delta), open_unit("confidence", confidence)
    epsilon = float(compute_epsilon(event, delta=delta, accountant="rdp").epsilon)
    values = (event.to_dict(), epsilon, delta, "add-remove-record", "rdp")
    claim = dict(zip(_CLAIM_KEYS[1:], values))
    audit = _one_run_settings("gradient", m, "f-dp", confidence)
    request = {
        "tensors": None if tensors is None else [str(t) for t in tensors],
        "ledger": None if ledger is None else os.fspath(ledger),
    }
    target = {"mechanism": OPACUS, "dataset": None, "event": claim["event"]}
    seeds = {"public": secrets.randbits(63), "coins": secrets.randbits(63)}
    header = dict(mechanism=OPACUS, release_id=None, target=target, claim=claim, audit=audit)
    return _write_plan(signing, header, request, seeds, out)


def _write_plan(signing, header: dict, request: dict, seeds: dict, out) -> Path:
    """Commit to ``seeds`` under a fresh salt, sign, register in ``request["ledger"]`` (refused after an
    audit of the target, :mod:`dpaudit.ledger.plan_rules`), write plan.json and plan.local.json.
    ``header``: the plan's mechanism, release_id (or None), target, claim and audit, in that order."""
    pid = uuid.uuid4().hex
    name = header["mechanism"]
    out = Path(out) if out is not None else Path("audits") / f"{name}-plan-{pid[:8]}"
    if (out / PLAN_FILE).exists():
        raise UsageError(
            f"out must be a folder without a plan, got {str(out)!r} (it holds {PLAN_FILE})."
        )
    check_new_folder(out)  # nor an earlier audit's results: a plan's run would write over them
    salt = secrets.token_hex(32)
    plan = {
        "schema": SCHEMA,
        "id": pid,
        "created_at": now_utc(),
        **header,
        "request": {**request, "out": str(out)},
        "commitment": commitment(salt, seeds),
        "signer": {"key_id": signing.key_id, "public_key": signing.public_text},
    }
    plan["signature"] = signing.sign(_material(plan))
    registered = dict(plan_id=pid, stage="registered", sha256=digest(plan))
    signed = {"commitment": plan["commitment"], "key_id": signing.key_id, "target": plan["target"]}
    with open_ledger(request.get("ledger"), signing_key=signing) as led:
        led.record_plan({**registered, **signed})
    local = {"plan_id": pid, "not_for_publication": NOT_FOR_PUBLICATION, "salt": salt}
    write_json_atomic(out / PLAN_LOCAL_FILE, {**local, "seeds": seeds, "key": str(signing.path)})
    return write_json_atomic(out / PLAN_FILE, plan)


def plan_entries(entries) -> dict:
    """plan id -> {"registered": (seq, signer, payload) or None, "runs": [audit ids, in ledger order],
    "results": {audit id: sha256 of its FIRST result}, "later_results": [audit ids of further result
    entries], "orphan_results": [audit ids of results before or without their run]} from the
    ledger's ``plan`` entries given as (seq, signer, payload). Only a run's first result counts: a
    later one (written around :meth:`Ledger.record_plan`, which refuses it) is what an edit looks like."""
    out: dict = {}
    for seq, signer, p in entries:
        empty = dict(registered=None, runs=[], results={}, later_results=[], orphan_results=[])
        rec = out.setdefault(p.get("plan_id"), empty)
        stage, aid = p.get("stage"), p.get("audit_id")
        if stage == "registered":
            rec["registered"] = rec["registered"] or (seq, signer, p)
        elif stage == "run" and aid not in rec["runs"]:
            rec["runs"].append(aid)
        elif stage == "result":
            _add_result(rec, aid, p.get("sha256"))
    return out


def _add_result(rec: dict, aid, sha) -> None:
    if aid not in rec["runs"]:
        rec["orphan_results"].append(aid)
    elif aid in rec["results"]:
        rec["later_results"].append(aid)
    else:
        rec["results"][aid] = sha


def _ledger_plans(led) -> dict:
    return plan_entries((e.seq, e.signer, e.payload) for e in led.entries(kind=sg.PLAN_KIND))


@dataclass
class PlanRun:
    """One run under a plan, as the engines see it (``AuditOptions.plan``, ``run_one_run(plan=)``):
    ``started`` records the run before it computes anything, ``finished`` its result's digest;
    ``reveal`` is what its audit file publishes."""

    plan: dict
    salt: str
    seeds: dict
    key: str | None
    ledger: str | None
    path: str
    runs: int = 0  # runs of this plan in the ledger, this one included (set by started)

    @property
    def reveal(self) -> dict:
        return {"id": self.plan["id"], "salt": self.salt, "seeds": self.seeds, "path": self.path}

    def _record(self, **payload) -> dict:
        with open_ledger(self.ledger, signing_key=self.key) as led:
            led.record_plan({"plan_id": self.plan["id"], **payload})
            return _ledger_plans(led)[self.plan["id"]]

    def started(self, audit_id: str) -> None:
        self.runs = len(self._record(stage="run", audit_id=audit_id)["runs"])

    def finished(self, audit_id: str, shareable: dict) -> None:
        self._record(stage="result", audit_id=audit_id, sha256=digest(shareable))


def _check_registered(plan: dict, ledger) -> None:
    """The ledger registered exactly this plan.json (DataError otherwise)."""
    with open_ledger(ledger, create=False) as led:
        reg = _ledger_plans(led).get(plan["id"], {}).get("registered")
    if reg is None:
        raise DataError(
            f"plan {plan['id']} must be registered in the ledger as it is, got no registration."
        )
    if reg[2].get("sha256") != digest(plan):
        raise DataError(
            f"plan {plan['id']} must be registered in the ledger as it is, got a registration of "
            "another plan.json (edited after registering)."
        )


def open_plan(path: str | os.PathLike, ledger: str | os.PathLike | None = None) -> PlanRun:
    """The :class:`PlanRun` of plan.json at ``path`` (or its folder), after checking that it is
    signed by its key, that plan.local.json's salt and seeds are the ones committed to, and that the
    ledger (``ledger``, default the one the plan was written with) registered exactly this plan.json
    (DataError otherwise: nothing runs); the run's entries go to that ledger."""
    p = Path(path)
    p = p / PLAN_FILE if p.is_dir() else p
    plan = read_json(p, "audit plan")
    if plan.get("schema") != SCHEMA or not signature_ok(plan):
        raise DataError(
            f"plan must be a dpaudit audit plan signed by the key it names, got {str(p)!r} (edited after signing, or not a plan)."
        )
    local = read_json(
        p.parent / PLAN_LOCAL_FILE, "plan local file (salt and seeds, beside plan.json)"
    )
    committed = commitment(local.get("salt"), local.get("seeds"))
    if local.get("plan_id") != plan["id"] or committed != plan["commitment"]:
        raise DataError(
            f"{PLAN_LOCAL_FILE} must hold the salt and seeds plan {plan['id']} commits to, got others."
        )
    ledger = plan["request"].get("ledger") if ledger is None else os.fspath(ledger)
    _check_registered(plan, ledger)
    first = results_in(p.parent)
    if first:  # before anything runs: a second run would replace the first run's files
        raise UsageError(
            f"plan must be run once, got a second run of plan {plan['id']}: its first run is in "
            f"{str(first[0].parent)!r} ({first[0].name!r}, never overwritten); write a new plan for another run."
        )
    return PlanRun(plan, local["salt"], local["seeds"], local.get("key"), ledger, str(p.resolve()))


def load_plan(
    path: str | os.PathLike, ledger: str | os.PathLike | None = None
) -> tuple[AuditRequest, PlanRun]:
    """The request a plan fixes and its :class:`PlanRun` (checked by :func:`open_plan`; ``ledger``: where it
    is registered, if not where it was written)."""
    run = open_plan(path, ledger)
    refuse_reproducible_noise(run.plan["request"].get("reproducible_noise"))
    if run.plan["mechanism"] == OPACUS:
        raise UsageError(
            f"plan must be run by dpaudit (an Opacus plan runs in your training script: `dpaudit audit opacus SCRIPT.py "
            f"--plan {run.path}` or OpacusCanaries.from_plan(model, {run.path!r})), got plan {run.plan['id']} for opacus."
        )
    return AuditRequest(
        **{**run.plan["request"], "ledger": run.ledger}, seed=int(run.seeds["public"])
    ), run

"""The ledger's rules for ``plan`` entries (:meth:`dpaudit.ledger.book.Ledger.record_plan`), shared with
``dpaudit verify`` (:mod:`dpaudit.reports.verify`), which holds a ledger export to the same rules.

A plan names its **target** (what it audits: ``{"release": ID}``, or ``{"mechanism", "dataset", "event"}``
for an audit of a fresh run of a mechanism). Pre-registration is only worth something when nothing about the
target was seen first and nothing is recorded twice: a plan is registered before any audit of its target (an
``audit`` entry, or a run of another plan of the same target); each run has one result, the first.
"""

from __future__ import annotations

from ..errors import UsageError

#: Stages of a ``plan`` entry.
PLAN_STAGES = ("registered", "run", "result")


def same_target(target, other) -> bool:
    """Two plan targets name the same thing (an unnamed target, from an older plan, is never the same)."""
    return isinstance(target, dict) and bool(target) and target == other


def audits_of_target(target: dict, entries) -> list[tuple[int, str]]:
    """(seq, audit id) of every audit of ``target`` among ``entries`` ((seq, kind, payload), ledger order):
    ``audit`` entries (a release's audits by its id; a fresh run's by mechanism and dataset) and the runs
    of plans registered with the same target."""
    planned = {p.get("plan_id") for _, kind, p in entries if _registers(kind, p, target)}
    return [
        (seq, str(p.get("audit_id")))
        for seq, kind, p in entries
        if (kind == "plan" and p.get("stage") == "run" and p.get("plan_id") in planned)
        or (kind == "audit" and _audits(target, p))
    ]


def _registers(kind: str, p: dict, target: dict) -> bool:
    """A ``plan`` entry that registers a plan for ``target``."""
    return (
        kind == "plan" and p.get("stage") == "registered" and same_target(target, p.get("target"))
    )


def _audits(target: dict, audit: dict) -> bool:
    """An ``audit`` entry's payload audits ``target``."""
    if "release" in target:
        return audit.get("release_id") == target["release"]
    named = (audit.get("mechanism"), audit.get("dataset_name"))
    return (
        audit.get("release_id") is None
        and target.get("dataset") is not None
        and named == (target.get("mechanism"), target.get("dataset"))
    )


def recorded_plan_entry(payload: dict, entries, path) -> str | None:
    """The entry that already records ``payload`` (a resumed run), else None. ``entries``: the ledger's
    ``plan`` and ``audit`` entries as (seq, entry id, kind, payload). Refused (UsageError, nothing
    written): a malformed payload; a plan registered twice, or after an audit of its target; a run of
    an unregistered plan; a result of no recorded run, or a second result of a run with another digest."""
    key = _checked_key(payload)
    plans = [(eid, p) for _, eid, kind, p in entries if kind == "plan"]
    registered = any(_key(p)[:2] == (key[0], "registered") for _, p in plans)
    if registered == (key[1] == "registered"):
        why = "is already registered" if registered else "is not registered in it"
        raise UsageError(
            f"plan must be registered once in ledger {path} before it runs, got plan {key[0]} "
            f"that {why}."
        )
    if key[1] == "registered":
        _refuse_late_registration(payload, entries, path)
    if key[1] == "result":
        return _recorded_result(payload, plans, path)
    return next((eid for eid, p in plans if _key(p) == key), None)


def _key(p: dict) -> tuple:
    return p.get("plan_id"), p.get("stage"), p.get("audit_id")


def _checked_key(payload: dict) -> tuple:
    """``(plan_id, stage, audit_id)`` of a plan entry's payload; a malformed one is refused."""
    key = _key(payload)
    named_run = (key[1] != "registered") == isinstance(key[2], str)
    if key[1] not in PLAN_STAGES or not isinstance(key[0], str) or not named_run:
        raise UsageError(
            f"plan entry must have a plan_id, a stage in {', '.join(PLAN_STAGES)} and, for a "
            f"run, its audit_id; got {payload!r}."
        )
    return key


def target_label(target: dict) -> str:
    """A plan target in words (``release ID``, or ``MECHANISM on DATASET``)."""
    if "release" in target:
        return f"release {str(target['release'])[:12]}"
    return str(target.get("mechanism")) + (
        f" on {target['dataset']}" if target.get("dataset") else ""
    )


def _refuse_late_registration(payload: dict, entries, path) -> None:
    target = payload.get("target")
    seen = audits_of_target(target, [(s, kind, p) for s, _, kind, p in entries]) if target else []
    if seen:
        raise UsageError(
            f"registration of an audit plan must come before any audit of its target "
            f"({target_label(target)}), got {len(seen)} audit(s) of it already in ledger {path} "
            f"(first: {seen[0][1]})."
        )


def _recorded_result(payload: dict, plans, path) -> str | None:
    """A run's one result: the entry recording the same digest (a resumed run), else None (append it)."""
    pid, aid = payload["plan_id"], payload["audit_id"]
    if not any(_key(p) == (pid, "run", aid) for _, p in plans):
        raise UsageError(
            f"result must follow its run's entry in ledger {path}, got a result of run {aid} "
            f"that plan {pid} never started."
        )
    first = next(((eid, p) for eid, p in plans if _key(p) == (pid, "result", aid)), None)
    if first is not None and first[1].get("sha256") != payload.get("sha256"):
        raise UsageError(
            f"result of run {aid} under plan {pid} must be recorded once (the first counts), "
            f"got a second with another digest ({str(payload.get('sha256'))[:12]}, recorded "
            f"{str(first[1].get('sha256'))[:12]})."
        )
    return None if first is None else first[0]

"""What an audit's trials cost the private data, and its ``audit`` entry in the ledger, written before any trial runs.
The rule and which audits are recorded: docs/ledger.md, "Audits on the private data"; a target names its private dataset
with :meth:`~dpaudit.audits.targets.AuditTarget.private_data` (None: no entry).
"""

from __future__ import annotations

from pathlib import Path

from ..ledger.book import open_ledger
from ..ledger.compose import sequential
from ..records import read_json, write_json_atomic

_RESUME_FILE = "ledger.json"  # in OUT/.checkpoint: the entry an interrupted audit already recorded


def trial_cost(roles: dict) -> tuple[object | None, str | None, int]:
    """(event, unbounded reason, trials) of the trials of ``roles`` (role -> (target, runs)).

    ``event`` is the sequential composition of every trial's event (None when unbounded)."""
    events, reason, trials = [], None, 0
    for role, (t, n) in roles.items():
        trials += int(n)
        ev = getattr(t, "claimed_event", None)
        if not t.noise:
            who = "the no-noise control" if role == "no-noise" else "the audit"
            reason = reason or f"{who} trains without DP noise"
        elif ev is None:
            reason = reason or "the trials' privacy event is unknown (no claimed event)"
        elif t.uncertified_sampler:
            reason = reason or f"the trials use the uncertified {t.uncertified_sampler} sampler"
        else:
            events += [ev] * int(n)
    return (None if reason else sequential(events)), reason, trials


def record_audit_cost(target, roles: dict, audit_id: str, options, plan_key: str = "") -> str:
    """Record the audit's cost in the ledger before its trials run; returns the audit id used.

    ``options``: the audit's :class:`~dpaudit.audits.engine.AuditOptions` (its ``ledger_path``,
    ``release_id`` and ``out_dir``, where the checkpoints are). No entry (and ``audit_id``
    unchanged) for a target that names no private dataset. An audit resumed from a checkpoint of
    the same plan (``plan_key``: the checkpoints' fingerprints, so that only an audit that really
    resumes its finished chunks qualifies) reuses the entry recorded when it started."""
    scope = target.private_data()
    if scope is None:
        return audit_id
    event, reason, trials = trial_cost(roles)
    checkpoints = None if options.out_dir is None else Path(options.out_dir) / ".checkpoint"
    resume = _resumed_id(checkpoints, plan_key)
    with open_ledger(options.ledger_path) as led:
        if resume is not None and any(
            e.id == resume for e in led.entries(dataset=scope["dataset"], kind="audit")
        ):
            return resume
        led.record_audit(
            audit_id=audit_id,
            dataset=scope["dataset"],
            partition=scope["partition"],
            adjacency=target.adjacency,
            event=event,
            trials=trials,
            mechanism=target.mechanism,
            unbounded_reason=reason,
            release_id=options.release_id,
        )
    if checkpoints is not None:
        write_json_atomic(checkpoints / _RESUME_FILE, {"plan": plan_key, "audit_id": audit_id})
    return audit_id


def _resumed_id(checkpoints: Path | None, plan_key: str) -> str | None:
    f = None if checkpoints is None else checkpoints / _RESUME_FILE
    if f is None or not f.is_file():
        return None
    try:
        d = read_json(f, "checkpoint ledger record")
    except Exception:  # noqa: BLE001 - a torn file: record the audit again (over-counting is safe)
        return None
    return d.get("audit_id") if plan_key and d.get("plan") == plan_key else None

"""Audit orchestration: "audit a fresh request" and "audit a release", through the mechanism contract.

This is the library behind ``dpaudit audit MECHANISM ...`` (the CLI only parses). Both paths
are the same four steps: a request (the family's :class:`~dpaudit.requests.Request`, built from
an :class:`~dpaudit.requests.AuditRequest` by :func:`family_request`, or rebuilt from a release by
:func:`dpaudit.release_compat.release_request`), the mechanism's plan of it (``plan_of_audit``: the
same code path as its release), for a release the one check that the plan is the release's
(:func:`~dpaudit.mechanisms.contract.check_plan_matches_release`), then ``mechanism.audit_target(plan, canary, ...)``.
"""

from __future__ import annotations

import dataclasses
import os

from .audits.canaries import audit_family, check_canary
from .catalogue import ALIASES, CATALOGUE, lookup, names
from .errors import UsageError
from .mechanisms import registry
from .records import Release, read_release
from .release_compat import release_request
from .requests import AuditRequest
from .validation import one_of, positive_int

#: Privacy units an audit accepts (user: the DP-SGD head models only).
PRIVACY_UNITS = ("record", "user")


def auditable_entry(mechanism: str):
    """The catalogue entry of an auditable ``mechanism`` (name or alias; entries with canaries)."""
    one_of("mechanism", mechanism, tuple(a for a, n in ALIASES.items() if CATALOGUE[n].canaries))
    return lookup(mechanism)


def entry_canary(entry, canary: str | None) -> str:
    """``canary`` (default: the entry's first), one of the entry's canaries."""
    return check_canary(audit_family(entry), canary or entry.canaries[0])


def check_privacy_unit(
    mechanism: str, privacy_unit: str, records_per_user: int | None, user_ids=None
) -> int | None:
    """Validate the privacy unit request before anything is loaded; returns G (None for records).

    ``user`` needs a DP-SGD head model and ``records_per_user`` G >= 1; ``record`` refuses G and
    user ids (a request for user-level privacy is never silently ignored).
    """
    one_of("privacy_unit", privacy_unit, PRIVACY_UNITS)
    if privacy_unit == "record":
        if records_per_user is not None or user_ids is not None:
            raise UsageError(
                f"privacy_unit must be user when records_per_user or user ids are given, got {privacy_unit!r}."
            )
        return None
    if auditable_entry(mechanism).family != "dp-sgd-head":
        raise UsageError(
            f"mechanism must be a DP-SGD head model ({', '.join(names(family='dp-sgd-head'))}) for privacy_unit user, got {mechanism!r}."
        )
    if records_per_user is None:
        raise UsageError(
            "records_per_user must be given (an integer G >= 1) with privacy_unit user, got none."
        )
    return positive_int("records_per_user", records_per_user)


def check_release_unit(release, privacy_unit: str | None, records_per_user: int | None) -> None:
    """An audit of a release takes its privacy unit from the release: a requested unit or G that
    says otherwise is refused (never silently ignored). ``privacy_unit=None``: not requested."""
    if privacy_unit in (None, "record") and records_per_user is None:
        return
    unit = one_of("privacy_unit", privacy_unit or "record", PRIVACY_UNITS)
    g_rel = (release.config or {}).get("records_per_user")
    if unit != release.privacy_unit or (records_per_user is not None and records_per_user != g_rel):
        raise UsageError(
            f"privacy_unit and records_per_user must match the release ({release.privacy_unit}"
            f"{f', G={g_rel}' if g_rel is not None else ''}) or be omitted, got {unit}"
            f"{f', G={records_per_user}' if records_per_user is not None else ''}."
        )


# ------------------------------------------------------------------------------ a fresh request


def family_request(entry, audit: AuditRequest):
    """The entry's Request from the audit's fields of the same names (epsilon default: the
    entry's ``default_epsilon``); a field the request type lacks must be left at its default."""
    rtype = entry.request_type()
    known = {f.name for f in rtype.option_fields()}
    given = _given_fields(audit)
    _check_known(given, known, audit.mechanism)
    kw = {k: v for k, (v, _) in given.items() if k in known}  # to_dict: paths as strings
    if "epsilon" in known and audit.epsilon is None:
        kw["epsilon"] = entry.default_epsilon
    if "model" in known:
        kw["model"] = entry.name
    return rtype(**kw)


def _check_known(given: dict, known: set, mechanism: str) -> None:
    """A field the request type lacks must be left at its default."""
    bad = [k for k, (v, changed) in given.items() if changed and k not in known]
    if bad:
        raise UsageError(
            f"{bad[0]} must not be given for {mechanism} (its request has {', '.join(sorted(known))}), got {given[bad[0]][0]!r}."
        )


def _given_fields(audit: AuditRequest) -> dict:
    """name -> (value, differs from its default) of the audit's fields that describe the request."""
    skip = ("mechanism", "canary", "no_noise", *audit.RUN_FIELDS)
    given = audit.to_dict()
    values = {
        f.name: (given[f.name], f.default) for f in audit.option_fields() if f.name not in skip
    }
    return {k: (v, v != default) for k, (v, default) in values.items() if v is not None}


def build_target(mechanism: str, **fields):
    """The prepared audit target of ``mechanism`` for :class:`~dpaudit.requests.AuditRequest`
    ``fields`` (``epsilon``, ``dataset``, ``width``, ``privacy_unit``, ...; see its fields)."""
    return target_for(AuditRequest(mechanism=mechanism, **fields))


def target_for(audit: AuditRequest):
    """The prepared audit target of a fresh :class:`~dpaudit.requests.AuditRequest`: the family's
    request (:func:`family_request`), its plan, the mechanism's ``audit_target``."""
    entry = auditable_entry(audit.mechanism)
    unit = audit.settings
    check_privacy_unit(audit.mechanism, unit.privacy_unit, unit.records_per_user, unit.user_ids)
    return generic_target(
        entry.name, family_request(entry, audit), canary=audit.canary, no_noise=audit.no_noise
    )


def generic_target(mechanism: str, request, *, canary: str | None = None, no_noise: bool = False):
    """The audit target of ``request`` through the contract: the mechanism's own plan (public
    quantities: the same code path as its release) and its ``audit_target(plan, canary)``."""
    entry = auditable_entry(mechanism)
    mech = registry.mechanism(entry.name)
    canary = entry_canary(entry, canary)
    return mech.audit_target(mech.plan_of_audit(request), canary, no_noise=no_noise)


def target_claim(target) -> dict:
    """What an audit target claims (public facts of its plan or release; nothing is trained).

    Args:
        target: a prepared audit target (``mechanism.audit_target``, :func:`target_for`).

    Returns:
        dict with ``event``, ``accountant``, ``adjacency``, ``delta``, ``claimed_epsilon``: the
        claim an audit of ``target`` tests (a one-run audit, a plan, a white-box audit).
    """
    stated = ("accountant", "adjacency", "delta", "claimed_epsilon")
    return {"event": target.claimed_event, **{name: getattr(target, name) for name in stated}}


# ------------------------------------------------------------------------------ a release


def target_from_release(
    release,
    *,
    canary: str | None = None,
    data_dir: str | os.PathLike | None = None,
    no_noise: bool = False,
    mechanism: str | None = None,
    user_ids=None,
):
    """The prepared audit target reproducing a release (``Release`` or path), by the module's steps
    with ``data_dir`` where the auditor keeps the data: the release's claim (its epsilon under its
    own accountant and its recorded event) is what is audited, on data whose public identity must
    be the release's. ``mechanism`` (the CLI's MECHANISM), when given, must name the release's
    mechanism. ``user_ids`` (array or ``.npy`` path): a user-level release's users (default: its
    request's ``user_ids`` file, else the public grouping); an old release that names its user-ids
    file only in its command line is refused unless they are given.
    """
    rel = release if isinstance(release, Release) else read_release(release)
    entry = _release_entry(rel, mechanism)
    req = release_request(rel)
    if user_ids is not None and rel.privacy_unit != "user":
        raise UsageError(
            f"user ids must only be given for a user-level release, got a {rel.privacy_unit}-level release of {rel.mechanism}."
        )
    # where the auditor keeps the data, and the users it was made with (a user-level release's plan loads them)
    given = {"data_dir": None if data_dir is None else os.fspath(data_dir), "user_ids": user_ids}
    known = {f.name for f in dataclasses.fields(req)}
    req = dataclasses.replace(
        req, **{k: v for k, v in given.items() if v is not None and k in known}
    )
    mech = registry.mechanism(entry.name)
    # checked against the release (contract.check_plan_matches_release)
    plan = mech.plan_of_release(req, rel)
    return mech.audit_target(
        plan, entry_canary(entry, canary), release=rel, user_ids=user_ids, no_noise=no_noise
    )


def _release_entry(rel, mechanism: str | None):
    named = ALIASES.get(mechanism, mechanism)
    if mechanism is not None and named != ALIASES.get(rel.mechanism, rel.mechanism):
        raise UsageError(
            f"mechanism argument must match the release's mechanism {rel.mechanism!r}, got {mechanism!r}."
        )
    if rel.mechanism not in ALIASES or not lookup(rel.mechanism).canaries:
        auditable = sorted({n for n, e in CATALOGUE.items() if e.canaries})
        raise UsageError(
            f"release mechanism must be one of {', '.join(auditable)}, got {rel.mechanism!r}."
        )
    if rel.non_private:
        raise UsageError(
            "release must carry a privacy claim to be audited, got a non-private release."
        )
    entry = lookup(rel.mechanism)
    if entry.audit_only:  # gaussian releases are not produced by dpaudit train
        raise UsageError(f"release mechanism must be a trained model, got {rel.mechanism!r}.")
    return entry

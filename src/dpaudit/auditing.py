"""Audit orchestration: "audit a fresh request" and "audit a release", through the mechanism contract.

This is the library behind ``dpaudit audit MECHANISM ...`` (the CLI only parses). Both paths
are the same four steps: a request (the family's :class:`~dpaudit.requests.Request`, built from
an :class:`~dpaudit.requests.AuditRequest` by :func:`family_request`, or rebuilt from a release by
:func:`dpaudit.release_compat.release_request`), the mechanism's plan of it (:func:`plan_of`: the
same code path as its release), for a release the one check that the plan is the release's
(:func:`~dpaudit.mechanisms.contract.check_plan_matches_release`), then ``mechanism.audit_target(plan, canary, ...)``.

Layer 6 (docs/architecture.md): above the mechanisms it orchestrates; the audits core
(:mod:`dpaudit.audits`) never imports this module.
"""

from __future__ import annotations

import dataclasses
import os

from .catalogue import ALIASES, CATALOGUE, lookup, names
from .accounting.events import event_from_dict
from .audits.targets import prepared
from .mechanisms.user_head_audit import UserHeadTarget
from .errors import DataError, UsageError
from .mechanisms.contract import check_request_matches
from .records import Release, read_release
from .release_compat import release_request
from .requests import AuditRequest
from .validation import one_of, open_unit, positive_finite, positive_int

#: Privacy units an audit accepts (user: the DP-SGD head models only).
PRIVACY_UNITS = ("record", "user")


def auditable_entry(mechanism: str):
    """The catalogue entry of an auditable ``mechanism`` (name or alias; entries with canaries)."""
    one_of("mechanism", mechanism, tuple(a for a, n in ALIASES.items() if CATALOGUE[n].canaries))
    return lookup(mechanism)


def entry_canary(entry, canary: str | None) -> str:
    """``canary`` (default: the entry's first), one of the entry's canaries."""
    canary = canary or entry.canaries[0]
    if canary not in entry.canaries:
        fam = "head" if entry.family == "dp-sgd-head" else entry.name
        raise UsageError(f"canary must be one of {', '.join(entry.canaries)} for {fam} models, got {canary!r}.")
    return canary


def check_privacy_unit(mechanism: str, privacy_unit: str, records_per_user: int | None, user_ids=None) -> int | None:
    """Validate the privacy unit request before anything is loaded; returns G (None for records).

    ``user`` needs a DP-SGD head model and ``records_per_user`` G >= 1; ``record`` refuses G and
    user ids (a request for user-level privacy is never silently ignored).
    """
    one_of("privacy_unit", privacy_unit, PRIVACY_UNITS)
    if privacy_unit == "record":
        if records_per_user is not None or user_ids is not None:
            raise UsageError(f"privacy_unit must be user when records_per_user or user ids are given, got {privacy_unit!r}.")
        return None
    if auditable_entry(mechanism).family != "dp-sgd-head":
        raise UsageError(f"mechanism must be a DP-SGD head model ({', '.join(names(family='dp-sgd-head'))}) for privacy_unit user, got {mechanism!r}.")
    if records_per_user is None:
        raise UsageError("records_per_user must be given (an integer G >= 1) with privacy_unit user, got none.")
    return positive_int("records_per_user", records_per_user)


def check_release_unit(release, privacy_unit: str | None, records_per_user: int | None) -> None:
    """An audit of a release takes its privacy unit from the release: a requested unit or G that
    says otherwise is refused (never silently ignored). ``privacy_unit=None``: not requested."""
    if privacy_unit in (None, "record") and records_per_user is None:
        return
    unit = one_of("privacy_unit", privacy_unit or "record", PRIVACY_UNITS)
    g_rel = (release.config or {}).get("records_per_user")
    if unit != release.privacy_unit or (records_per_user is not None and records_per_user != g_rel):
        raise UsageError(f"privacy_unit and records_per_user must match the release ({release.privacy_unit}"
                         f"{f', G={g_rel}' if g_rel is not None else ''}) or be omitted, got {unit}"
                         f"{f', G={records_per_user}' if records_per_user is not None else ''}.")


# ------------------------------------------------------------------------------ a fresh request


def family_request(entry, audit: AuditRequest):
    """The entry's Request from the audit's fields of the same names (epsilon default: the
    entry's ``default_epsilon``); a field the request type lacks must be left at its default."""
    rtype = entry.request_type()
    known = {f.name for f in dataclasses.fields(rtype)}
    given = _given_fields(audit)
    bad = [k for k, (v, changed) in given.items() if changed and k not in known]
    if bad:
        raise UsageError(f"{bad[0]} must not be given for {audit.mechanism} (its request has {', '.join(sorted(known))}), got {given[bad[0]][0]!r}.")
    kw = {k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, (v, _) in given.items() if k in known}
    if "epsilon" in known and audit.epsilon is None:
        kw["epsilon"] = entry.default_epsilon
    if "model" in known:
        kw["model"] = entry.name
    return rtype(**kw)


def _given_fields(audit: AuditRequest) -> dict:
    """name -> (value, differs from its default) of the audit's fields that describe the request."""
    skip = ("mechanism", "canary", "no_noise", *audit.RUN_FIELDS)
    values = {f.name: (getattr(audit, f.name), f.default) for f in dataclasses.fields(audit) if f.name not in skip}
    return {k: (v, v != default) for k, (v, default) in values.items() if v is not None}


def build_target(mechanism: str, **fields):
    """The prepared audit target of ``mechanism`` for :class:`~dpaudit.requests.AuditRequest`
    ``fields`` (``epsilon``, ``dataset``, ``width``, ``privacy_unit``, ...; see its fields)."""
    return target_for(AuditRequest(mechanism=mechanism, **fields))


def target_for(audit: AuditRequest):
    """The prepared audit target of a fresh :class:`~dpaudit.requests.AuditRequest`: the family's
    request (:func:`family_request`), its plan, the mechanism's ``audit_target``."""
    entry = auditable_entry(audit.mechanism)
    check_privacy_unit(audit.mechanism, audit.privacy_unit, audit.records_per_user, audit.user_ids)
    req = family_request(entry, audit)
    if getattr(req, "privacy_unit", "record") == "user" and entry.family == "dp-sgd-head":
        return _user_head_target(req, entry_canary(entry, audit.canary), audit.no_noise)
    return generic_target(entry.name, req, canary=audit.canary, no_noise=audit.no_noise)


def generic_target(mechanism: str, request, *, canary: str | None = None, no_noise: bool = False):
    """The audit target of ``request`` through the contract: the mechanism's own plan (public
    quantities: the same code path as its release) and its ``audit_target(plan, canary)``."""
    entry = lookup(mechanism)
    if not entry.canaries:
        raise UsageError(f"mechanism must be auditable (a catalogue entry with canaries), got {mechanism!r}.")
    mech = entry.mechanism()
    canary = entry_canary(entry, canary)
    return mech.audit_target(plan_of(mech, request), canary, no_noise=no_noise)


def plan_of(mech, request):
    """``mech``'s plan of ``request``: validate, load (public facts of the data), plan."""
    request = mech.validate(request)
    return mech.plan(request, mech.data_info(request, mech.load(request)))


# ------------------------------------------------------------------------------ a release


def target_from_release(release, *, canary: str | None = None, data_dir: str | os.PathLike | None = None,
                        no_noise: bool = False, mechanism: str | None = None, user_ids=None):
    """The prepared audit target reproducing a release (``Release`` or path).

    The release's request (:func:`~dpaudit.release_compat.release_request`), its plan with
    ``data_dir`` where the auditor keeps the data (the mechanism's ``plan_of_release``, checked), then the
    mechanism's ``audit_target(plan, canary, release=...)``: the release's claim (its epsilon under
    its own accountant and its recorded event) is what is audited, on data whose public identity
    must be the release's. ``mechanism`` (the CLI's MECHANISM), when given, must name the
    release's mechanism. ``user_ids`` (array or ``.npy`` path): a user-level release's users
    (default: its request's ``user_ids`` file, else the public grouping); an old release that
    names its user-ids file only in its command line is refused unless they are given.
    """
    rel = release if isinstance(release, Release) else read_release(release)
    entry = _release_entry(rel, mechanism)
    req = release_request(rel)
    if user_ids is not None and rel.privacy_unit != "user":
        raise UsageError(f"user ids must only be given for a user-level release, got a {rel.privacy_unit}-level release of {rel.mechanism}.")
    if rel.privacy_unit == "user" and entry.family == "dp-sgd-head":
        return _user_head_release_target(req, rel, canary=entry_canary(entry, canary), data_dir=data_dir, no_noise=no_noise, user_ids=user_ids)
    if data_dir is not None and "data_dir" in {f.name for f in dataclasses.fields(req)}:
        req = dataclasses.replace(req, data_dir=os.fspath(data_dir))  # where the auditor keeps the data
    mech = entry.mechanism()
    plan = mech.plan_of_release(req, rel)  # checked against the release (contract.check_plan_matches_release)
    return mech.audit_target(plan, entry_canary(entry, canary), release=rel, user_ids=user_ids, no_noise=no_noise)


def _release_entry(rel, mechanism: str | None):
    if mechanism is not None and ALIASES.get(mechanism, mechanism) != ALIASES.get(rel.mechanism, rel.mechanism):
        raise UsageError(f"mechanism argument must match the release's mechanism {rel.mechanism!r}, got {mechanism!r}.")
    if rel.mechanism not in ALIASES or not lookup(rel.mechanism).canaries:
        auditable = sorted({n for n, e in CATALOGUE.items() if e.canaries})
        raise UsageError(f"release mechanism must be one of {', '.join(auditable)}, got {rel.mechanism!r}.")
    if rel.non_private:
        raise UsageError("release must carry a privacy claim to be audited, got a non-private release.")
    entry = lookup(rel.mechanism)
    if entry.audit_only:  # gaussian releases are not produced by dpaudit train
        raise UsageError(f"release mechanism must be a trained model, got {rel.mechanism!r}.")
    return entry


# ------------------------------------------------------------------------------ user-level heads
# Still built here: a user-level head audit defaults to a public grouping of the rows into users
# of G (and an old release to its recorded users), which the DP-SGD mechanism's plan cannot load
# yet; record-level heads go through DPSGDMechanism.audit_target like every other family.


def _user_head_target(req, canary: str, no_noise: bool):
    """A fresh user-level head target from its family request ``req``."""
    t = UserHeadTarget(model=req.model, records_per_user=req.records_per_user, dataset=req.dataset, data_dir=req.data_dir,
                       epsilon=positive_finite("epsilon", req.epsilon), delta=open_unit("delta", req.delta), canary=canary, seed=req.seed,
                       epochs=req.epochs, user_ids=req.user_ids, profile=req.profile)
    return prepared(t, no_noise)


def _user_head_release_target(req, rel, *, canary, data_dir, no_noise, user_ids):
    """A user-level head target reproducing ``rel`` (its recorded sigma, schedule, claim, identity)."""
    ds, cfg = rel.dataset or {}, rel.config or {}
    check_request_matches(model=(req.model, rel.mechanism), dataset=(req.dataset, ds.get("name")), seed=(req.seed, int(rel.seed)),
                          privacy_unit=(req.privacy_unit, rel.privacy_unit), records_per_user=(req.records_per_user, cfg.get("records_per_user")))
    common = dict(dataset=ds.get("name"), data_dir=data_dir, epsilon=float(rel.target_epsilon or rel.epsilon), delta=float(rel.delta),
                  canary=canary, seed=int(req.seed), noise_multiplier=float(rel.noise_multiplier),
                  schedule=(float(rel.sample_rate), int(rel.steps), int(rel.normalizer)), profile=ds.get("profile"), split_seed=ds.get("split_seed"),
                  claimed=float(rel.epsilon), expected_sha256=ds.get("sha256"), expected_identity=ds, event=event_from_dict(rel.guarantee),
                  accountant=rel.accountant, model=req.model)
    return prepared(_user_head_from_release(req, rel, common, user_ids), no_noise)


def _user_head_from_release(req, rel, common, user_ids):
    cfg, ds = rel.config or {}, rel.dataset or {}
    if rel.adjacency != "add-remove-user":
        raise DataError(f"a user-level release must have adjacency add-remove-user, got {rel.adjacency!r}.")
    if cfg.get("records_per_user") is None:
        raise DataError("release must record records_per_user for a user-level audit, got none.")
    user_ids = req.user_ids if user_ids is None else user_ids
    if user_ids is None and rel.request is None and "--user-ids" in (rel.command or "").split():
        raise UsageError("user ids must be given (--user-ids FILE.npy) to audit this release: it predates recorded requests and names "
                         "its user-ids file only in its command line, which is never parsed; got none.")
    return UserHeadTarget(records_per_user=int(cfg["records_per_user"]), user_ids=user_ids, epochs=cfg.get("epochs"), batch_size=cfg.get("batch_size"),
                          expected_user_ids_sha256=ds.get("user_ids_sha256"), expected_n_users=cfg.get("n_users"), **common)

"""``dpaudit audit MODEL --one-run --canaries M``: one training run, m canaries, one_run.json.

The library behind the CLI option (the CLI only parses): :func:`run_one_run` builds what the
ordinary audit would audit (a DP-SGD head target, or the DP-SGD configuration of a module model),
hands it to its score producer, then to :func:`~dpaudit.audits.one_run.one_run_bounds`.

Privacy contract: the canaries' inclusion coins and the DP noise come from a private
:class:`~dpaudit.noise.NoiseSource` (OS entropy unless ``reproducible_noise``); only the public
seed fixes the canaries themselves. ``no_noise`` is the control (noise removed, clipping and
sampling kept): its bounds must be large and it never counts as a violation.
"""

from __future__ import annotations

import dataclasses
import os
import time
import uuid
from pathlib import Path

from .auditing import target_claim, target_for, target_from_release
from .audit_outputs import shareable_one_run
from .audits.one_run import OneRunResult, one_run_bounds, plan_coins, write_one_run
from .audits.power_runs import one_run_power_of
from .catalogue import names
from .errors import UsageError
from .ledger.book import open_ledger
from .mechanisms.dpsgd.module_training import resolve_device
from .mechanisms.dpsgd.head_audit import HeadTarget
from .mechanisms.dpsgd.one_run_heads import heads_one_run
from .mechanisms.dpsgd.one_run_modules import modules_one_run
from .mechanisms.dpsgd.user_head_audit import UserHeadTarget
from .progress import JobProgress
from .records import Release, read_release
from .releasing import make_noise_source
from .requests import AuditRequest
from .validation import positive_int

#: Trainable DP-SGD models audited through :mod:`dpaudit.mechanisms.dpsgd.one_run_modules`.
MODULE_MODELS = names(family="dp-sgd-module")


def audit_device(a: AuditRequest) -> str:
    """The device an audit trains on (``--device``): a one-run audit of :data:`MODULE_MODELS` may
    use cuda; every other audit runs on the CPU (auto: cpu; cuda refused before any data load)."""
    one_run = (
        a.protocol.one_run or a.protocol.canaries is not None
    ) and a.threat_model == "final-model"
    return resolve_device(a.device, supported=one_run and a.mechanism in MODULE_MODELS)


def module_target(a: AuditRequest, release=None):
    """The trial audit target of a module model
    (:class:`~dpaudit.mechanisms.dpsgd.module_audit.ModuleTarget`) for its one-run or white-box
    audit: built from the release's plan (checked against the release, trained with its optimizer
    settings, its recorded schedule, noise and claim), else from a fresh plan of ``a``'s mechanism
    at its (epsilon, delta), dataset (default digits), profile and epochs."""
    if release is not None:
        return target_from_release(release, data_dir=a.data.data_dir)
    kept = ("mechanism", "epsilon", "delta", "data_dir", "profile", "epochs")
    fields = {name: getattr(a, name) for name in kept}  # grouped options read by their names
    return target_for(AuditRequest(**fields, dataset=a.data.dataset or "digits"))


def run_one_run(
    audit: AuditRequest,
    *,
    out_dir: str | os.PathLike | None = None,
    command: str | None = None,
    record: bool = True,
    ledger_path=None,
    plan=None,
) -> OneRunResult:
    """One-run audit of ``audit.mechanism`` (a DP-SGD head model or dp-dense / dp-cnn /
    dp-attention) with ``audit.protocol.canaries`` canaries of ``audit.protocol.one_run_kind``; ``audit.release``
    (a Release or its path) audits the recorded configuration and claim. Returns the
    :class:`~dpaudit.audits.one_run.OneRunResult` and writes ``one_run.json`` (shareable) and
    ``one_run_local.json`` under ``out_dir`` when given.

    ``record``: the one training run is an ``audit`` entry in the ledger at ``ledger_path``
    (its event once; unbounded with ``no_noise``), written before it runs (docs/ledger.md).

    ``plan`` (a :class:`dpaudit.audit_plans.PlanRun`): a pre-registered run, its inclusion coins
    from the plan's committed seed (:func:`~dpaudit.audits.one_run.plan_coins`)."""
    m = positive_int("canaries", audit.protocol.canaries, 2)
    rel, release_id, release_path = _audited_release(audit)
    name = rel.mechanism if rel is not None else audit.mechanism
    noise = make_noise_source(seed=audit.seed, reproducible_noise=audit.trials.reproducible_noise)
    run_id = uuid.uuid4().hex
    cost = (ledger_path, release_id, run_id) if record else None
    coins = None if plan is None else plan_coins(plan.seeds["coins"], m)
    if plan is not None:
        plan.started(run_id)
    t0 = time.perf_counter()
    claim, scores = _train_and_score(name, rel, audit, m=m, noise=noise, cost=cost, coins=coins)
    t1 = time.perf_counter()
    # the claim dict's keys are the bounds' keywords (its event is the claim)
    bounds = one_run_bounds(scores, confidence=audit.confidence, claim=claim.pop("event"), **claim)
    t2 = time.perf_counter()
    result = OneRunResult(
        bounds=bounds,
        mechanism=name,
        noise=not audit.no_noise,
        command=command,
        release_id=release_id,
        release_path=release_path,
        timings={"train_and_score_s": t1 - t0, "analysis_s": t2 - t1},
        id=run_id,
        plan=None if plan is None else plan.reveal,
        power=one_run_power_of(bounds),
    )
    if out_dir is not None:
        write_one_run(result, out_dir)
    if plan is not None:
        plan.finished(run_id, shareable_one_run(result.to_dict()))
    return result


def _audited_release(audit: AuditRequest) -> tuple[Release | None, str | None, str | None]:
    """(the release audited, its id, its resolved path): all None without one.

    Raises:
        UsageError: the request names a module model other than the release's.
    """
    if audit.release is None:
        return None, None, None
    given = isinstance(audit.release, Release)
    rel = audit.release if given else read_release(audit.release)
    if rel.mechanism in MODULE_MODELS and audit.mechanism not in (None, rel.mechanism):
        raise UsageError(
            f"mechanism argument must match the release's mechanism {rel.mechanism!r}, got {audit.mechanism!r}."
        )
    return rel, rel.id, None if given else str(Path(audit.release).resolve())


def _train_and_score(name, rel, a: AuditRequest, *, m, noise, cost, coins):
    """(claim dict, OneRunScores) of one training run with ``m`` canaries of the target the
    ordinary audit builds: a module model's (record level) or a DP-SGD head model's."""
    module = name in MODULE_MODELS
    device = resolve_device(a.device) if module else None  # before the data are loaded
    target = _module_target(name, rel, a) if module else _head_target(rel, a)
    if cost is not None:  # (ledger path, release id, run id): the run's cost, before it trains
        event = None if a.no_noise else target.claimed_event
        dataset = target.private_data()["dataset"]
        record_run_cost(target.mechanism, dataset, target.adjacency, event, *cost)
    seed = a.seed if rel is None else int(rel.seed)
    run = dict(canaries=m, noise=noise, kind=a.one_run_kind, noise_on=not a.no_noise, coins=coins)
    with JobProgress("steps") as bar:
        run.update(seed=seed, progress=bar.steps(f"one-run training ({m} canaries)"))
        if module:
            setup = (target.model, target.prepared, target.config)
            scores = modules_one_run(*setup, device=device, **run)
        else:
            scores = heads_one_run(target, **run)
    claim = target_claim(target)
    claim.update(delta=float(target.delta), claimed_epsilon=float(claim["claimed_epsilon"]))
    return claim, scores


def _module_target(name, rel, a: AuditRequest):
    """The target of dp-dense / dp-cnn / dp-attention (record level only)."""
    if a.settings.privacy_unit != "record":
        raise UsageError(
            f"privacy unit for a one-run audit of {name} must be record (user level: DP-SGD head models), got {a.settings.privacy_unit!r}."
        )
    return module_target(a, rel)


def record_run_cost(mechanism, dataset, adjacency, event, ledger_path, release_id, run_id) -> None:
    """Record one training run of an audit (a one-run or white-box audit) as an ``audit`` entry of
    the ledger, before it runs (:meth:`Ledger.record_audit`): its ``event`` once on the training
    partition of ``dataset``, unbounded when the run trains without DP noise (``event`` None).

    Args:
        mechanism, dataset, adjacency: what the run trains, on which records, under which adjacency.
        event: the run's DP event; None for the no-noise control.
        ledger_path, release_id, run_id: the ledger, the audited release (or None), the entry's id.

    Raises:
        BudgetExceededError: the entry would push a cap that counts audits over its budget
            (nothing is written).
    """
    with open_ledger(ledger_path) as led:
        led.record_audit(
            audit_id=run_id,
            dataset=dataset,
            partition="train",
            adjacency=adjacency,
            event=event,
            trials=1,
            mechanism=mechanism,
            unbounded_reason=None if event is not None else _NO_NOISE_RUN,
            release_id=release_id,
        )


#: Why the ledger counts a no-noise one-run control as unbounded.
_NO_NOISE_RUN = "the no-noise one-run control trains without DP noise"


def _head_target(rel, a: AuditRequest):
    """The target of a DP-SGD head model, record or user level (built as the ordinary audit builds
    it; a user-level release or ``privacy_unit="user"`` gives canary users)."""
    if rel is not None:
        target = target_from_release(
            rel, data_dir=a.data.data_dir, mechanism=a.mechanism, user_ids=a.settings.user_ids
        )
    else:
        target = target_for(dataclasses.replace(a, canary=None, no_noise=False))
    if not isinstance(target, (HeadTarget, UserHeadTarget)):
        raise UsageError(
            f"mechanism must be a DP-SGD head model or one of {', '.join(MODULE_MODELS)} for a one-run audit, "
            f"got {a.mechanism!r}."
        )
    return target

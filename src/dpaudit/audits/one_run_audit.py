"""``dpaudit audit MODEL --one-run --canaries M``: one training run, m canaries, one_run.json.

The library behind the CLI option (the CLI only parses). :func:`run_one_run` builds what the
ordinary audit would audit -- the head target of a DP-SGD head model (``audits/build.py``, from
the flags or from ``--release``), or the DP-SGD configuration of ``dp-dense`` / ``dp-cnn`` /
``dp-attention`` (the release's recorded schedule and noise, or the release protocol at
(epsilon, delta)) -- hands it to the score producer
(:func:`~dpaudit.audits.one_run_heads.heads_one_run` or
:func:`~dpaudit.audits.one_run_modules.modules_one_run`), then to
:func:`~dpaudit.audits.one_run.one_run_bounds` against the claimed event, and writes
``one_run.json``.

Privacy contract: the canaries' inclusion coins and the DP noise come from a private
:class:`~dpaudit.noise.NoiseSource` (OS entropy unless ``reproducible_noise``); only the public
seed fixes the canaries themselves. ``no_noise`` is the control (noise removed, clipping and
sampling kept): its bounds must be large and it never counts as a violation.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ..errors import UsageError
from .one_run import OneRunResult, one_run_bounds, write_one_run

#: Trainable DP-SGD models audited through :mod:`dpaudit.audits.one_run_modules`.
MODULE_MODELS = ("dp-dense", "dp-cnn", "dp-attention")


def _noise(reproducible_noise: bool, seed: int):
    from ..noise import NoiseSource

    return NoiseSource("reproducible", seed=seed) if reproducible_noise else NoiseSource()


def _module_setup(mechanism: str, *, release, epsilon, delta, dataset, data_dir, profile, epochs):
    """(model, data, DPSGDConfig, claim dict) for a dp-dense / dp-cnn / dp-attention audit."""
    from ..accounting.events import event_from_dict
    from ..data import load_dataset
    from ..mechanisms.dpsgd import DPSGDConfig
    from .one_run_modules import module_config

    if release is not None:
        ds = release.dataset or {}
        data = load_dataset(ds.get("name") or "digits", data_dir=data_dir, split_seed=ds.get("split_seed"), profile=ds.get("profile"))
        cfg = DPSGDConfig(sample_rate=float(release.sample_rate), steps=int(release.steps), normalizer=int(release.normalizer),
                          noise_multiplier=float(release.noise_multiplier), clipping_norm=float(release.clipping_norm or 1.0))
        claim = dict(event=event_from_dict(release.guarantee), accountant=release.accountant, adjacency=release.adjacency,
                     delta=float(release.delta), claimed_epsilon=float(release.epsilon))
        return release.mechanism, data, cfg, claim
    from ..validation import open_unit, positive_finite

    eps = positive_finite("epsilon", 2.0 if epsilon is None else epsilon)
    delta = open_unit("delta", delta)
    data = load_dataset(dataset or "digits", data_dir=data_dir, profile=profile)
    cfg, event = module_config(mechanism, data, epsilon=eps, delta=delta, epochs=epochs)
    claim = dict(event=event, accountant="rdp", adjacency="add-remove-record", delta=delta, claimed_epsilon=None)
    return mechanism, data, cfg, claim


def run_one_run(mechanism: str, *, canaries: int, release=None, epsilon: float | None = None, delta: float = 1e-5,
                dataset: str | None = None, data_dir=None, profile: str | None = None, epochs: int | None = None, seed: int = 42,
                no_noise: bool = False, kind: str = "gradient", confidence: float = 0.95, reproducible_noise: bool = False,
                out_dir: str | os.PathLike | None = None, command: str | None = None, privacy_unit: str = "record",
                records_per_user: int | None = None, user_ids=None, record: bool = True, ledger_path=None) -> OneRunResult:
    """One-run audit of ``mechanism`` (a DP-SGD head model or dp-dense / dp-cnn / dp-attention)
    with ``canaries`` canaries of ``kind``; ``release`` (a Release or its path) audits the
    recorded configuration and claim. Returns the :class:`~dpaudit.audits.one_run.OneRunResult`
    and writes ``one_run.json`` (shareable) and ``one_run_local.json`` under ``out_dir`` when given.

    ``record``: the one training run on the private data is recorded in the ledger at
    ``ledger_path`` as an ``audit`` entry (its event once; unbounded with ``no_noise``) before it
    runs, refused when the dataset's cap includes audits and would be exceeded."""
    from ..validation import positive_int

    m = positive_int("canaries", canaries)
    if m < 2:
        raise UsageError(f"canaries must be an integer >= 2, got {canaries!r}.")
    rel = None
    release_id = release_path = None
    if release is not None:
        from ..records import Release, read_release

        rel = release if isinstance(release, Release) else read_release(release)
        release_id = rel.id
        release_path = None if isinstance(release, Release) else str(Path(release).resolve())
        if rel.mechanism in MODULE_MODELS and mechanism not in (None, rel.mechanism):
            raise UsageError(f"MECHANISM must match the release's mechanism {rel.mechanism!r}, got {mechanism!r}.")
    name = rel.mechanism if rel is not None else mechanism
    noise = _noise(reproducible_noise, seed)
    t0 = time.perf_counter()
    if name in MODULE_MODELS:
        from .one_run_modules import modules_one_run

        if privacy_unit != "record":
            raise UsageError(f"privacy unit for a one-run audit of {name} must be record (user level: DP-SGD head models), got {privacy_unit!r}.")

        model, data, cfg, claim = _module_setup(name, release=rel, epsilon=epsilon, delta=delta, dataset=dataset, data_dir=data_dir,
                                                profile=profile, epochs=epochs)
        if record:
            _record_cost(name, data.name, "add-remove-record", None if no_noise else claim["event"], ledger_path, release_id)
        scores = modules_one_run(model, data, cfg, canaries=m, noise=noise, seed=seed if rel is None else int(rel.seed), kind=kind,
                                 noise_on=not no_noise)
    else:
        claim, scores = _heads(mechanism, rel, m=m, epsilon=epsilon, delta=delta, dataset=dataset, data_dir=data_dir, profile=profile,
                               epochs=epochs, seed=seed, no_noise=no_noise, kind=kind, noise=noise, privacy_unit=privacy_unit,
                               records_per_user=records_per_user, user_ids=user_ids,
                               record=(ledger_path, release_id) if record else None)
    t1 = time.perf_counter()
    bounds = one_run_bounds(scores, delta=claim["delta"], confidence=confidence, claim=claim["event"], accountant=claim["accountant"],
                            adjacency=claim["adjacency"], claimed_epsilon=claim["claimed_epsilon"])
    t2 = time.perf_counter()
    result = OneRunResult(bounds=bounds, mechanism=name, noise=not no_noise, command=command, release_id=release_id,
                          release_path=release_path, timings={"train_and_score_s": t1 - t0, "analysis_s": t2 - t1})
    if out_dir is not None:
        write_one_run(result, out_dir)
    return result


def _record_cost(mechanism, dataset, adjacency, event, ledger_path, release_id) -> None:
    """The one training run's ``audit`` entry (before it runs; :meth:`Ledger.record_audit`)."""
    import uuid

    from ..ledger.book import open_ledger

    with open_ledger(ledger_path) as led:
        led.record_audit(audit_id=uuid.uuid4().hex, dataset=dataset, partition="train", adjacency=adjacency, event=event, trials=1,
                         mechanism=mechanism, unbounded_reason=None if event is not None else "the no-noise one-run control trains without DP noise",
                         release_id=release_id)


def _heads(mechanism, rel, *, m, epsilon, delta, dataset, data_dir, profile, epochs, seed, no_noise, kind, noise, privacy_unit="record",
           records_per_user=None, user_ids=None, record=None):
    """(claim dict, OneRunScores) of a DP-SGD head model, record or user level (built as the ordinary
    audit builds it; a user-level release or ``privacy_unit="user"`` gives canary users)."""
    from .build import build_target, target_from_release
    from .heads import HeadTarget
    from .one_run_heads import heads_one_run
    from .user_level import UserHeadTarget

    if rel is not None:
        target = target_from_release(rel, data_dir=data_dir, mechanism=mechanism, user_ids=user_ids)
        seed = int(rel.seed)
    else:
        target = build_target(mechanism, epsilon=epsilon, delta=delta, dataset=dataset, data_dir=data_dir, seed=seed, epochs=epochs,
                              profile=profile, privacy_unit=privacy_unit, records_per_user=records_per_user, user_ids=user_ids)
    if not isinstance(target, (HeadTarget, UserHeadTarget)):
        raise UsageError(f"mechanism must be a DP-SGD head model or one of {', '.join(MODULE_MODELS)} for a one-run audit, "
                         f"got {mechanism!r}.")
    if record is not None:  # (ledger path, release id): the run's cost, before it trains
        scope = target.private_data()
        _record_cost(target.mechanism, scope["dataset"], target.adjacency, None if no_noise else target.claimed_event, *record)
    scores = heads_one_run(target, canaries=m, noise=noise, seed=seed, kind=kind, noise_on=not no_noise)
    claim = dict(event=target.claimed_event, accountant=getattr(target, "accountant", "rdp"), adjacency=target.adjacency,
                 delta=float(target.delta), claimed_epsilon=float(target.claimed_epsilon))
    return claim, scores

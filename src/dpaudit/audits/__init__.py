"""dpaudit.audits: empirical privacy audits with canaries (Jagielski, Ullman & Oprea 2020).

Quick use::

    from dpaudit.auditing import build_target
    from dpaudit.audits import run_audit
    result = run_audit(build_target("mixmin", canary="max-clip", epsilon=1.0), runs=2000, out_dir="audits/mixmin")
    result.epsilon_lower_bound, result.ceiling, result.gdp_estimate, result.controls["no-noise"]

Bring your own mechanism::

    from dpaudit.audits import audit_callable
    audit_callable(lambda include, rng: my_mechanism(data, include, rng), my_score, runs=2000,
                   claimed_epsilon=1.0, delta=1e-5)

The modules: docs/architecture.md. Each mechanism's own target lives beside it (e.g.
:mod:`dpaudit.mechanisms.dpsgd.head_audit`); targets from names and releases: :mod:`dpaudit.auditing`.
Trials run on the built-in process pool or on any executor of :mod:`dpaudit.sweeps.executors`
(``run_audit(..., executor=...)``, e.g. a Dask cluster).

The imports below are the package's public API (one list: no ``__all__`` repeating it).
"""

# ruff: noqa: F401

from .engine import AUDIT_FILE, CONTROLS, SCORES_FILE, AuditResult, audit_callable, audit_scores
from .engine import evaluate_scores, plan_trials, read_audit, run_audit, violated, write_audit
from .targets import AuditTarget, CallableTarget

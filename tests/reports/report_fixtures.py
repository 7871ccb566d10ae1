"""Builders for report tests: real Release records and real audit records (dpaudit.audits.engine).

Releases carry a real guarantee whose claimed epsilon is computed by the rdp accountant, so
claim cards recompute to the same value. Audits come from the audit engine on synthetic scores
(``audit_scores``) or from a real Gaussian-mechanism audit (``run_audit``); "constructed"
records are real records with a field replaced, to pin the report's rules on exact values.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from dpaudit.accounting import SubsampledGaussian, compute_epsilon
from dpaudit.records import Release, write_json_atomic, write_release

#: The public dataset identity a current release publishes (no hash of the private data).
DATASET = {
    "name": "digits",
    "kind": "image",
    "profile": "default",
    "split_seed": 0,
    "split_sizes": {"train": 1000, "val": 200, "test": 597},
    "n_features": 64,
    "n_classes": 10,
    "source_files": ["digits.csv"],
}
#: What older dpaudit versions published: unkeyed hashes of the prepared data and the source files.
OLD_DATASET = {**DATASET, "sha256": "ab" * 32, "source_files": {"digits.csv": "cd" * 32}}

_EPS_CACHE: dict = {}


def rdp_eps(noise_multiplier: float, sample_rate: float, steps: int, delta: float = 1e-5) -> float:
    key = (noise_multiplier, sample_rate, steps, delta)
    if key not in _EPS_CACHE:
        _EPS_CACHE[key] = compute_epsilon(
            SubsampledGaussian(noise_multiplier, sample_rate, steps), delta=delta, accountant="rdp"
        ).epsilon
    return _EPS_CACHE[key]


def make_release(
    out_dir: Path,
    *,
    mechanism: str = "dp-rvfl",
    noise_multiplier: float = 1.0,
    sample_rate: float = 0.05,
    steps: int = 100,
    delta: float = 1e-5,
    seed: int = 0,
    target_epsilon: float | None = None,
    metrics: dict | None = None,
    non_private: bool = False,
    epsilon: float | None = None,
    dataset: dict | None = None,
    **extra,
) -> Release:
    """Write a release.json under ``out_dir``; ``epsilon`` overrides the (correct) rdp claim."""
    if non_private:
        guarantee, claim, eps_map = {"type": "non-private"}, float("inf"), {}
    else:
        guarantee = SubsampledGaussian(noise_multiplier, sample_rate, steps).to_dict()
        claim = rdp_eps(noise_multiplier, sample_rate, steps, delta) if epsilon is None else epsilon
        eps_map = {"rdp": claim}
    rel = Release(
        mechanism=mechanism,
        dataset=dict(dataset or DATASET),
        adjacency="add-remove-record",
        accountant="rdp",
        epsilon=claim,
        delta=delta,
        guarantee=guarantee,
        seed=seed,
        noise_source={"source": "os-entropy", "seed": None, "secret": True},
        target_epsilon=None
        if non_private
        else (target_epsilon if target_epsilon is not None else claim),
        noise_multiplier=None if non_private else noise_multiplier,
        sample_rate=sample_rate,
        steps=steps,
        steps_executed=steps,
        clipping_norm=1.0,
        normalizer=50,
        non_private=non_private,
        epsilons=eps_map,
        config={
            "hidden": 128,
            "dp_sgd": {"noise_multiplier": noise_multiplier, "lr": 0.01},
            "seeds": {"model_seed": seed},
        },
        metrics=metrics if metrics is not None else {"accuracy": 0.9, "f1_macro": 0.88},
        command=f"dpaudit train {mechanism} --eps {target_epsilon or claim:g} --seed {seed}"
        if not non_private
        else f"dpaudit train {mechanism} --non-private --seed {seed}",
        git_commit="0123456789abcdef",
        **extra,
    )
    write_release(rel, out_dir)
    return rel


def synthetic_audit(
    *,
    claimed_epsilon: float = 1.0,
    per_world: int = 500,
    shift: float = 0.0,
    seed: int = 0,
    mechanism: str = "dp-rvfl",
    canary: str = "max-clip",
):
    """A real AuditResult from the audit engine on Gaussian scores shifted by ``shift`` in the IN world."""
    from dpaudit.audits.engine import audit_scores

    rng = np.random.default_rng(seed)
    s_in = rng.normal(shift, 1.0, per_world)
    s_out = rng.normal(0.0, 1.0, per_world)
    res = audit_scores(
        s_in,
        s_out,
        delta=1e-5,
        claimed_epsilon=claimed_epsilon,
        seed=seed,
        mechanism=mechanism,
        canary=canary,
    )
    return res, s_in, s_out


def write_audit_record(out_dir: Path, result, s_in=None, s_out=None, **replace) -> dict:
    """Write ``result`` (optionally with fields replaced) as audit.json (+ scores.npz)."""
    from dpaudit.audits.engine import write_audit

    if replace:
        result = result.replace(**replace)
    scores = None
    if s_in is not None:
        s = np.concatenate([s_in, s_out])
        w = np.concatenate([np.ones(s_in.size, bool), np.zeros(s_out.size, bool)])
        scores = {"main": (s, w, np.zeros(s.size, bool), w)}
        result = result.replace(scores_file="scores.npz")
    write_audit(result, out_dir, scores=scores)
    return json.loads((Path(out_dir) / "audit.json").read_text())


def write_raw_audit(out_dir: Path, record: dict) -> None:
    write_json_atomic(Path(out_dir) / "audit.json", record)


def truncate(path: Path) -> None:
    text = path.read_text()
    path.write_text(text[: len(text) // 2])

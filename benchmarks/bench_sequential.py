"""Sequential (anytime-valid) audits against the fixed-N claimed-curve test on the same simulated scores,
and the time of the power line.

Scores are the likelihood-ratio statistic of one Gaussian release (canary out: N(0, 1); in: N(mu, 1),
mu = 1 / sigma_actual), the worlds of the sequential plan (balanced batches). The claim: eps 4 at
delta 1e-5 (sigma exactly calibrated), 95 % confidence.

- caught: sigma_actual = sigma / 2 (a 2x noise understatement), --broken audits of up to --runs trials:
  the sequential test's stop (median, quartiles) and detection rate; the fixed-N test (SELECT 30 %) on
  the first N trials of the same scores at N = the sequential median and at N = --runs;
- false positives: sigma_actual = sigma (a correct mechanism, exactly at its claim), --correct audits:
  the share flagged by each test on the same scores (fixed-N at N = --runs), and the sequential stop;
- power: wall time of dpaudit.audits.power.audit_power for a few claims (median of --repeat calls).

--jax PATH (jax_privacy's auditing.py, loaded from that file) adds, on the same first N scores as the
fixed-N test, the share of audits where jax_privacy's CanaryScoreAuditor(in = world 1, out = world 0)
epsilon_clopper_pearson (one-sided, Bonferroni over thresholds) and epsilon_from_gdp, at significance
0.05, exceed the claim (fixed N only: neither is valid at a data-dependent stopping time).

Usage: PYTHONPATH=src python benchmarks/bench_sequential.py [--broken 200] [--correct 1000] [--runs 2000] [--jax PATH]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def _audit(scores, plan, curve):
    from dpaudit.audits import sequential as sq

    test = sq.SequentialTest(curve, plan, confidence=0.95, criterion=sq.criterion_for(curve))
    _, look, reason = sq.run_sequential(lambda a, b: scores[a:b], test)
    return look.trials, reason == "violation"


def _fixed(scores, world, n, event, seed):
    from dpaudit.audits.curves import curve_test
    from dpaudit.audits.engine import _select
    from dpaudit.noise import public_rng

    select = _select(public_rng(seed, 0xF1), world[:n], 0.3)
    return curve_test(
        scores[:n], world[:n], select, event=event, delta=1e-5, confidence=0.95, accountant="pld"
    )["violated"]


def _jax_flags(jax, scores, world, n: int, claim: float) -> tuple[bool, bool]:
    """jax_privacy's CP and GDP estimates on the first ``n`` scores exceed ``claim``."""
    w = np.asarray(world[:n], dtype=bool)
    aud = jax.CanaryScoreAuditor(scores[:n][w], scores[:n][~w])
    return aud.epsilon_clopper_pearson(0.05, 1e-5) > claim, aud.epsilon_from_gdp(0.05, 1e-5) > claim


def _simulate(
    k_factor: float, reps: int, runs: int, fixed_at: list[int], seed0: int, jax=None
) -> dict:
    from dpaudit.accounting.events import SubsampledGaussian
    from dpaudit.audits import sequential as sq
    from dpaudit.audits.curves import claimed_curve
    from dpaudit.audits.gaussian import calibrate_exact

    sigma = calibrate_exact(4.0, 1e-5)
    event = SubsampledGaussian(sigma, 1.0, 1)
    curve = claimed_curve(event)
    rng = np.random.default_rng(seed0)
    stops, seq_hits, fixed_hits = [], 0, {n: 0 for n in fixed_at}
    jax_hits = {n: np.zeros(2) for n in fixed_at}
    t0 = time.perf_counter()
    for r in range(reps):
        plan = sq.plan_sequential(runs, seed=seed0 + r)
        scores = rng.normal(size=runs) + plan.world / (sigma * k_factor)
        used, hit = _audit(scores, plan, curve)
        stops.append(used)
        seq_hits += hit
        for n in fixed_at:
            fixed_hits[n] += _fixed(scores, plan.world, n, event, seed0 + r)
            if jax is not None:
                jax_hits[n] += _jax_flags(jax, scores, plan.world, n, 4.0)
    q = np.percentile(stops, [25, 50, 75])
    return {
        "reps": reps,
        "median": float(q[1]),
        "q25": float(q[0]),
        "q75": float(q[2]),
        "seq_rate": seq_hits / reps,
        "fixed": {n: h / reps for n, h in fixed_hits.items()},
        "seconds": time.perf_counter() - t0,
        "jax": {n: h / reps for n, h in jax_hits.items()} if jax is not None else None,
    }


def _jax_line(res: dict) -> str:
    if res["jax"] is None:
        return ""
    return "; jax_privacy on the same scores: " + ", ".join(
        f"N = {n}: CP {h[0]:.1%}, GDP {h[1]:.1%}" for n, h in res["jax"].items()
    )


def _power_times(repeat: int) -> list[tuple[str, float, str]]:
    from dpaudit.accounting.events import SubsampledGaussian
    from dpaudit.audits.curves import claimed_curve
    from dpaudit.audits.gaussian import calibrate_exact
    from dpaudit.audits.power import audit_power

    cases = [
        (
            "Gaussian claim eps 4, 2,000 trials",
            2000,
            4.0,
            claimed_curve(SubsampledGaussian(calibrate_exact(4.0, 1e-5), 1.0, 1)),
            False,
        ),
        (
            "same, sequential",
            2000,
            4.0,
            claimed_curve(SubsampledGaussian(calibrate_exact(4.0, 1e-5), 1.0, 1)),
            True,
        ),
        (
            "Gaussian claim eps 1, 1,000 trials",
            1000,
            1.0,
            claimed_curve(SubsampledGaussian(calibrate_exact(1.0, 1e-5), 1.0, 1)),
            False,
        ),
        (
            "DP-SGD claim (sigma 1, q 0.01, T 1000; PLD curve cached), 1,000 trials",
            1000,
            2.0,
            claimed_curve(SubsampledGaussian(1.0, 0.01, 1000)),
            False,
        ),
        ("no event, eps 2, 1,000 trials", 1000, 2.0, None, False),
    ]
    out = []
    for name, n, eps, curve, seq in cases:
        if curve is not None:
            curve.fnr(
                np.array([0.5])
            )  # the audit has computed its curve already: time the power line alone
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            p = audit_power(
                trials=n, delta=1e-5, claimed_epsilon=eps, curve=curve, sequential_mode=seq
            )
            times.append(time.perf_counter() - t0)
        out.append((name, statistics.median(times), p.line()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--broken", type=int, default=200)
    ap.add_argument("--correct", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--jax",
        default="",
        help="path of jax_privacy's auditing.py: its estimators on the same scores",
    )
    a = ap.parse_args()
    from eps_lb_validity import load_jax

    jax = load_jax(a.jax) if a.jax else None
    caught = _simulate(0.5, a.broken, a.runs, [200, 300, a.runs], 0, jax)
    print(
        f"2x understatement at claim 4, {caught['reps']} audits of up to {a.runs} trials ({caught['seconds']:.1f} s): "
        f"sequential stop median {caught['median']:.0f} (quartiles {caught['q25']:.0f}-{caught['q75']:.0f}), caught "
        f"{caught['seq_rate']:.1%}; fixed-N caught {caught['fixed'][200]:.1%} at N = 200, {caught['fixed'][300]:.1%} at N = 300, {caught['fixed'][a.runs]:.1%} at N = {a.runs}{_jax_line(caught)}"
    )
    correct = _simulate(1.0, a.correct, a.runs, [a.runs], 10_000, jax)
    print(
        f"correct mechanism at claim 4, {correct['reps']} audits ({correct['seconds']:.1f} s): flagged sequential "
        f"{correct['seq_rate']:.2%}, fixed-N (N = {a.runs}) {correct['fixed'][a.runs]:.2%}; sequential stop median "
        f"{correct['median']:.0f} (quartiles {correct['q25']:.0f}-{correct['q75']:.0f}){_jax_line(correct)}"
    )
    for name, sec, line in _power_times(a.repeat):
        print(f"power line, {name}: {sec * 1000:.1f} ms  [{line}]")


if __name__ == "__main__":
    main()

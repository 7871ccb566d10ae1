"""How the SELECT/EVAL split moves the audit statistics (why the default is 0.3).

Two score models, 2,000 trials, 95 % confidence, delta 1e-5, for each SELECT fraction given:
- the exact Gaussian mechanism (sensitivity 1, sigma exactly calibrated for eps 1, 2, 4; score =
  the output; claim = the Gaussian event, pld accountant), and the unclipped canary (3x the
  sensitivity) at a claim of eps 1 (violated in how many seeds);
- the DP-RVFL digits trajectory scores at eps 2 (q 0.05, T 200, sigma 1.7934 RDP-calibrated),
  drawn from their exact law (at the canary's dead coordinate the recorded sum is N(0, sigma^2)
  plus 1 at each step the canary is sampled; heads.trajectory_log_lr scores it).
Prints the mean claimed-curve and Clopper-Pearson eps_LB over the seeds.

Usage: .venv/bin/python benchmarks/bench_select_fraction.py [--fractions 0.5 0.3 0.2] [--seeds 10]
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.5, 0.3, 0.2])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--runs", type=int, default=2000)
    a = ap.parse_args()

    from dpaudit.accounting.events import SubsampledGaussian
    from dpaudit.audits.engine import evaluate_scores, plan_trials
    from dpaudit.mechanisms.dpsgd.head_audit import trajectory_log_lr
    from dpaudit.audits.stats import gdp_mu_for_epsilon

    print(f"{a.runs} trials, seeds 0-{a.seeds - 1}, 95 % confidence, delta 1e-5")
    print(
        "| scores | claim | SELECT fraction | claimed-curve eps_LB (mean) | CP eps_LB (mean) | violated | seconds |"
    )
    print("|---|---|---|---|---|---|---|")
    cases = [
        ("exact Gaussian", 1.0, 1.0),
        ("exact Gaussian", 2.0, 1.0),
        ("exact Gaussian", 4.0, 1.0),
        ("unclipped canary (3x)", 1.0, 3.0),
    ]
    for frac in a.fractions:
        for name, eps, shift in cases:
            sigma = 1.0 / gdp_mu_for_epsilon(eps, 1e-5)
            event = SubsampledGaussian(sigma, 1.0, 1)
            cc, cp, bad, t0 = [], [], 0, time.perf_counter()
            for seed in range(a.seeds):
                plan = plan_trials(a.runs, seed=seed, select_fraction=frac)
                s = (
                    np.random.default_rng([seed, 7]).normal(size=a.runs) * sigma
                    + shift * plan.world
                )
                r = evaluate_scores(
                    s, plan.world, plan.select, delta=1e-5, event=event, accountant="pld"
                )
                cc.append(r["claimed_curve"]["family_epsilon"])
                cp.append(r["clopper_pearson_epsilon"])
                bad += bool(r["claimed_curve"]["violated"])
            print(
                f"| {name} | {eps:g} | {frac:g} | {np.mean(cc):.3f} | {np.mean(cp):.3f} | {bad}/{a.seeds} | {time.perf_counter() - t0:.1f} |",
                flush=True,
            )
        sigma, q, steps = 1.7934, 0.05, 200
        event = SubsampledGaussian(sigma, q, steps)
        cc, cp, bad, t0 = [], [], 0, time.perf_counter()
        for seed in range(a.seeds):
            plan = plan_trials(a.runs, seed=seed, select_fraction=frac)
            rng = np.random.default_rng([seed, 0x51D])
            x = rng.normal(scale=sigma, size=(a.runs, steps)) + (
                (rng.random((a.runs, steps)) < q) & plan.world[:, None]
            )
            s = trajectory_log_lr(x, sample_rate=q, noise_multiplier=sigma, clipping_norm=1.0)
            r = evaluate_scores(
                s, plan.world, plan.select, delta=1e-5, event=event, accountant="rdp"
            )
            cc.append(r["claimed_curve"]["family_epsilon"])
            cp.append(r["clopper_pearson_epsilon"])
            bad += bool(r["claimed_curve"]["violated"])
        print(
            f"| DP-RVFL digits trajectory (exact law) | 2 (rdp) | {frac:g} | {np.mean(cc):.3f} | {np.mean(cp):.3f} | {bad}/{a.seeds} | {time.perf_counter() - t0:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()

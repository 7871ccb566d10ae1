"""The trajectory threat model of DP-SGD heads, side by side with the final model.

DP-RVFL on the embedded digits at the claimed eps (default 2, RDP-calibrated, delta 1e-5), max-clip
canary, ``--runs`` trials per threat model (default 2,000), 95 % confidence, reproducible noise
(seeded: the numbers can be re-created). For each seed and threat model it prints the deciding
claimed-curve eps_LB, the Clopper-Pearson eps_LB, the GDP estimate and the AUC, and the fraction of
the claim the claimed-curve bound reaches (acceptance: trajectory >= 40 % of the claim at eps 2).

``--simulate N`` also draws, for seeds 0..N-1, the trajectory scores from their exact law instead of
training (at the canary's coordinate the data gradient is zero, so the recorded sum is
N(0, (sigma C)^2) noise plus C at each step the canary is sampled, independently over steps:
exactly what the engine records) and runs the same claimed-curve test on them: the mean over
seeds of what the trajectory audit certifies, at a fraction of the cost.

Usage:
  .venv/bin/python benchmarks/bench_trajectory.py [--runs 2000] [--seeds 0] [--eps 2] [--workers 1]
      [--threat-models trajectory final-model] [--simulate 5]
"""

from __future__ import annotations

import argparse
import time

import torch

torch.set_num_threads(1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--eps", type=float, default=2.0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--threat-models", nargs="*", default=["trajectory", "final-model"])
    ap.add_argument(
        "--simulate",
        type=int,
        default=0,
        help="seeds of the exact-law simulation of the trajectory scores (0: none)",
    )
    a = ap.parse_args()

    from dpaudit.audits.engine import run_audit
    from dpaudit.mechanisms.dpsgd.head_audit import HeadTarget

    base = HeadTarget(epsilon=a.eps)
    base.prepare()
    print(
        f"dp-rvfl digits, claim eps {base.claimed_epsilon:.3f} (rdp), config {base.describe()['config']['noise_multiplier']:.4f} sigma, "
        f"q {base._config.sample_rate}, T {base._config.steps}; {a.runs} trials per audit"
    )
    print(
        "| threat model | seed | claimed-curve eps_LB | % of claim | CP eps_LB | GDP est. [interval] | AUC | seconds |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for tm in a.threat_models:
        t = base.with_threat_model(tm)
        for seed in a.seeds:
            t0 = time.perf_counter()
            r = run_audit(
                t, runs=a.runs, seed=seed, controls=(), reproducible_noise=True, workers=a.workers
            ).to_dict()
            dt = time.perf_counter() - t0
            g = r["gdp_estimate"]
            lo, hi = g["epsilon_interval"]
            cc = r.get("claimed_curve") or {}
            eps_cc = float(cc.get("family_epsilon", cc.get("epsilon_lower_bound", float("nan"))))
            print(
                f"| {tm} | {seed} | {eps_cc:.3f} | {100 * eps_cc / r['claimed_epsilon']:.0f} % | {float(r.get('clopper_pearson_epsilon') or 0):.3f} | "
                f"{g['epsilon']:.2f} [{lo:.2f}, {hi:.2f}] | {r['auc']:.3f} | {dt:.0f} |",
                flush=True,
            )
    if a.simulate:
        simulate(base, a.runs, a.simulate)


def simulate(base, runs: int, seeds: int) -> None:
    import numpy as np

    from dpaudit.audits.engine import evaluate_scores, plan_trials
    from dpaudit.mechanisms.dpsgd.head_audit import trajectory_log_lr

    cfg = base._config
    q, steps, sigma, c = cfg.sample_rate, cfg.steps, cfg.noise_multiplier, cfg.clipping_norm
    print(f"exact-law simulation of the trajectory scores, {runs} trials per seed")
    print("| seed | claimed-curve eps_LB | CP eps_LB | GDP est. |")
    print("|---|---|---|---|")
    got = []
    for seed in range(seeds):
        plan = plan_trials(runs, seed=seed)
        rng = np.random.default_rng([seed, 0x51D])
        x = rng.normal(scale=sigma * c, size=(runs, steps)) + c * (
            (rng.random((runs, steps)) < q) & plan.world[:, None]
        )
        s = trajectory_log_lr(x, sample_rate=q, noise_multiplier=sigma, clipping_norm=c)
        ev = evaluate_scores(
            s, plan.world, plan.select, delta=base.delta, event=base.claimed_event, accountant="rdp"
        )
        eps = float(ev["claimed_curve"]["family_epsilon"])
        got.append(eps)
        print(
            f"| {seed} | {eps:.3f} | {ev['clopper_pearson_epsilon']:.3f} | {ev['gdp_estimate']['epsilon']:.2f} |",
            flush=True,
        )
    print(
        f"mean claimed-curve eps_LB over seeds 0-{seeds - 1}: {np.mean(got):.3f} ({100 * np.mean(got) / base.claimed_epsilon:.0f} % of the claim)"
    )


if __name__ == "__main__":
    main()

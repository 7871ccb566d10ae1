"""Comparison statistics (dpaudit.audits.stats.comparison_statistics): power and speed.

Gaussian mechanism (mu-GDP, mu calibrated to eps in {2, 4} at delta = 1e-5; the score is the
output, the exact privacy-loss statistic), 2,000 trials split by the engine's plan_trials (seeds
0-4): today's SELECT/EVAL Clopper-Pearson eps_LB next to the Bonferroni CP eps_LB on all trials,
and the wall / CPU time of the whole comparison block; then the AUROC bootstrap alone (2,000 EVAL
trials, 1,000 resamples).

    python benchmarks/bench_comparison_stats.py
"""

from __future__ import annotations

import time

import numpy as np

from dpaudit.audits import stats
from dpaudit.audits.engine import evaluate_scores, plan_trials

DELTA = 1e-5


def main() -> None:
    for eps in (2.0, 4.0):
        mu = stats.gdp_mu_for_epsilon(eps, DELTA)
        sel_eval, bonf, wall, cpu = [], [], [], []
        for seed in range(5):
            p = plan_trials(2000, seed=seed)
            s = np.random.default_rng(seed).normal(size=2000) + mu * p.world
            sel_eval.append(
                evaluate_scores(s, p.world, p.select, delta=DELTA)["epsilon_lower_bound"]
            )
            t, c = time.perf_counter(), time.process_time()
            r = stats.comparison_statistics(s, p.world, p.select, "greater", delta=DELTA, seed=seed)
            wall.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
            bonf.append(r["cp_bonferroni"]["epsilon_lower_bound"])
        print(
            f"eps={eps:g} (mu={mu:.3f}): SELECT/EVAL CP {np.round(sel_eval, 3).tolist()} mean {np.mean(sel_eval):.3f} | "
            f"cp_bonferroni {np.round(bonf, 3).tolist()} mean {np.mean(bonf):.3f} | "
            f"comparison_statistics wall {min(wall):.3f}-{max(wall):.3f} s, CPU {min(cpu):.3f}-{max(cpu):.3f} s"
        )
    rng = np.random.default_rng(0)
    w = np.arange(2000) % 2 == 0
    s = rng.normal(size=2000) + w
    stats.auroc_bootstrap(s, w, "greater")  # warm-up
    wall, cpu = [], []
    for _ in range(5):
        t, c = time.perf_counter(), time.process_time()
        stats.auroc_bootstrap(s, w, "greater")
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    print(
        f"auroc_bootstrap, 2,000 trials, 1,000 resamples: wall median {np.median(wall):.3f} s, CPU median {np.median(cpu):.3f} s"
    )


if __name__ == "__main__":
    main()

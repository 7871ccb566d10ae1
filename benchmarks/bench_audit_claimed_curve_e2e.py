"""The claimed-curve statistic through the normal audit path (engine integration).

``run_audit`` on the built-in gaussian target (its claim is the event SubsampledGaussian(sigma,
1, 1) with the pld accountant, the exact epsilon), 2,000 trials, seeds 0-4, no controls,
reproducible noise derived from the seed, 95 % confidence, delta 1e-5. For each case it prints
the deciding claimed-curve eps_LB (audit.json ``epsilon_lower_bound``), the Clopper–Pearson
eps_LB of the same audit (``clopper_pearson_epsilon``), how many seeds are VIOLATED, and the
wall / CPU seconds of the whole audit (trials + all statistics).

Usage (from the repository root):
  .venv/bin/python benchmarks/bench_audit_claimed_curve_e2e.py
"""

from __future__ import annotations

import time

from dpaudit.audits.engine import run_audit
from dpaudit.audits.gaussian import GaussianTarget

CASES = [
    ("unclipped canary (3x sensitivity), claim eps 1", dict(epsilon=1.0, broken_noise_factor=3.0)),
    ("exact Gaussian, eps 1", dict(epsilon=1.0)),
    ("exact Gaussian, eps 2", dict(epsilon=2.0)),
]


def main() -> None:
    for name, kw in CASES:
        rows = []
        for seed in range(5):
            t0, c0 = time.perf_counter(), time.process_time()
            r = run_audit(
                GaussianTarget.for_epsilon(**kw),
                runs=2000,
                seed=seed,
                controls=(),
                reproducible_noise=True,
            )
            rows.append(
                (
                    r.epsilon_lower_bound,
                    r.clopper_pearson_epsilon,
                    r.violated,
                    time.perf_counter() - t0,
                    time.process_time() - c0,
                )
            )
        mean = sum(x[0] for x in rows) / len(rows)
        print(
            f"{name} | claimed-curve eps_LB: {' '.join(f'{x[0]:.2f}' for x in rows)} (mean {mean:.2f}) | CP eps_LB: "
            f"{' '.join(f'{x[1]:.2f}' for x in rows)} (mean {sum(x[1] for x in rows) / len(rows):.2f}) | violated "
            f"{sum(x[2] for x in rows)}/5 | wall s {' '.join(f'{x[3]:.2f}' for x in rows)} | cpu s {' '.join(f'{x[4]:.2f}' for x in rows)}"
        )


if __name__ == "__main__":
    main()

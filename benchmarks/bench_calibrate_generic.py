"""Generic calibration: calibrate_noise_multiplier before/after, and pld vs exact.

Part 1 (runs on old and new code): calibrate_noise_multiplier on a few DP-SGD configurations;
prints the noise multiplier (repr, to compare bit for bit), the epsilon and the number of
accountant calls. Run it once with PYTHONPATH pointing at the old tree to compare.
Part 2 (new code only): generic `calibrate` of a plain Gaussian with pld against the analytic
Gaussian mechanism (Balle & Wang 2018), computed here with scipy.

    .venv/bin/python benchmarks/bench_calibrate_generic.py
"""

from __future__ import annotations

import math

from scipy import optimize
from scipy.stats import norm

from dpaudit.accounting import calibration as cal

CONFIGS = [
    (1.0, 0.01, 1000, "rdp", "add-remove-record"),
    (8.0, 0.25, 120, "rdp", "add-remove-record"),
    (0.5, 1.0, 10, "rdp", "replace-record"),
    (2.0, 0.05, 50, "pld", "add-remove-record"),
    (1.0, 0.01, 100, "pld", "replace-record"),
    (2.0, 0.25, 120, "prv", "add-remove-record"),
]


def exact_sigma(eps: float, delta: float, sensitivity: float) -> float:
    def d(s: float) -> float:
        a, b = sensitivity / (2 * s), eps * s / sensitivity
        return norm.cdf(a - b) - math.exp(eps + norm.logcdf(-a - b)) - delta

    return optimize.brentq(d, 1e-3, 1e4, xtol=1e-13)


def main() -> None:
    calls = [0]
    real = cal.compute_epsilon

    def counted(*a, **k):
        calls[0] += 1
        return real(*a, **k)

    cal.compute_epsilon = counted
    print(
        "| target eps | q | T | accountant | adjacency | noise multiplier | epsilon | accountant calls |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for t, q, steps, acc, adj in CONFIGS:
        calls[0] = 0
        r = cal.calibrate_noise_multiplier(
            target_epsilon=t,
            delta=1e-5,
            sample_rate=q,
            steps=steps,
            accountant=acc,
            adjacency=adj,
            use_cache=False,
        )
        print(
            f"| {t:g} | {q:g} | {steps} | {acc} | {adj} | {r.noise_multiplier!r} | {r.epsilon:.10f} | {calls[0]} |"
        )
    cal.compute_epsilon = real
    if not hasattr(cal, "calibrate"):
        return
    from dpaudit.accounting import SubsampledGaussian

    print()
    print("| adjacency | T | pld sigma | exact sigma | relative excess | pld epsilon | calls |")
    print("|---|---|---|---|---|---|---|")
    for adj, sens in (("add-remove-record", 1.0), ("replace-record", 2.0)):
        for steps in (1, 16):
            r = cal.calibrate(
                lambda s: SubsampledGaussian(s, 1.0, steps),
                "pld",
                target_epsilon=1.0,
                delta=1e-5,
                adjacency=adj,
            )
            ex = math.sqrt(steps) * exact_sigma(1.0, 1e-5, sens)
            print(
                f"| {adj} | {steps} | {r.parameter:.6f} | {ex:.6f} | {r.parameter / ex - 1:.2e} | {r.epsilon:.6f} | {r.evaluations} |"
            )


if __name__ == "__main__":
    main()

"""Speed of DP-MixMin's mixture stage (targets: one run < 0.1 s; 2,000 batched runs < 30 s).

Synthetic proxy predictions with the audit's shape: k = 14 sources, n = 9,000 records, expected
batch B = 1,000 (q = 1/9), 200 steps, BCE, sigma calibrated for eps = 1 at delta = 1e-5.

    python benchmarks/bench_mixmin.py [--threads 1] [--runs 2000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from dpaudit.accounting import calibrate_noise_multiplier
from dpaudit.mechanisms.mixmin.solver import (
    MixMinCanary,
    MixMinConfig,
    max_clip_direction,
    run_mixmin,
    run_mixmin_runs,
)
from dpaudit.noise import NoiseSource


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    n, k, B, steps = 9000, 14, 1000, 200
    rng = np.random.default_rng(0)
    probs = 1 / (1 + np.exp(-rng.normal(size=(n, k))))
    y = (rng.random(n) < probs[:, 3]).astype(float)
    q = B / n
    sigma = calibrate_noise_multiplier(
        target_epsilon=1.0, delta=1e-5, sample_rate=q, steps=steps
    ).noise_multiplier
    cfg = MixMinConfig(
        k=k,
        loss="bce",
        noise_multiplier=sigma,
        sample_rate=q,
        expected_batch_size=float(B),
        steps=steps,
        clipping_norm=13.0,
        step_size=0.5,
    )
    noise = NoiseSource()
    run_mixmin(probs, y, cfg, noise=noise)  # warm-up
    single = []
    for _ in range(a.repeats):
        t = time.perf_counter()
        run_mixmin(probs, y, cfg, noise=noise)
        single.append(time.perf_counter() - t)
    print(
        f"one run (k={k}, n={n}, B={B}, {steps} steps, float64 numpy): median {statistics.median(single):.4f} s, "
        f"min {min(single):.4f} s over {a.repeats} (target < 0.1 s)"
    )
    canary = MixMinCanary(kind="gradient", direction=max_clip_direction(np.arange(k, dtype=float)))
    cin = np.arange(a.runs) % 2 == 0
    t = time.perf_counter()
    w = run_mixmin_runs(probs, y, cfg, noise=noise, runs=a.runs, canary=canary, canary_in=cin)
    el = time.perf_counter() - t
    print(
        f"{a.runs} runs of the one loop with a max-clip canary in half of them (float64, {a.threads} thread(s)): "
        f"{el:.2f} s (target < 30 s); weights shape {w.shape}"
    )


if __name__ == "__main__":
    main()

"""Cost of the noise sources: cryptographic (ChaCha20) vs the default (PCG64 / MT19937).

Gaussian draws of DP-SGD-sized noise vectors (numpy float64 and torch float32), Poisson masks,
textbook Laplace doubles, and the exact discrete Laplace sampler used by DP-ELM.
Run:  .venv/bin/python benchmarks/bench_noise_sources.py [--repeats 7]
Prints median wall-clock seconds per call (single thread) and the slowdown of cryptographic.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from dpaudit.mechanisms.elm.laplace import discrete_laplace
from dpaudit.noise import NoiseSource


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(1)
    default, crypto = NoiseSource("os-entropy"), NoiseSource("cryptographic")
    # 7,850 = logistic head on MNIST (785 x 10); 2,010 ~ RVFL binary head; 100k / 1M: larger models.
    sizes = [2_010, 7_850, 100_000, 1_000_000]
    rows = []
    for n in sizes:
        rows.append(
            (
                f"gaussian_numpy n={n:,}",
                timed(lambda: default.gaussian_numpy(n, 1.0), args.repeats),
                timed(lambda: crypto.gaussian_numpy(n, 1.0), args.repeats),
            )
        )
        rows.append(
            (
                f"gaussian_torch f32 n={n:,}",
                timed(lambda: default.gaussian_torch((n,), 1.0), args.repeats),
                timed(lambda: crypto.gaussian_torch((n,), 1.0), args.repeats),
            )
        )
    rows.append(
        (
            "poisson_mask n=51,000",
            timed(lambda: default.poisson_mask(51_000, 0.005), args.repeats),
            timed(lambda: crypto.poisson_mask(51_000, 0.005), args.repeats),
        )
    )
    rows.append(
        (
            "textbook laplace n=200",
            timed(lambda: default.laplace(200, 60.0), args.repeats),
            timed(lambda: crypto.laplace(200, 60.0), args.repeats),
        )
    )
    rows.append(
        (
            "textbook laplace n=1,000,000",
            timed(lambda: default.laplace(1_000_000, 60.0), args.repeats),
            timed(lambda: crypto.laplace(1_000_000, 60.0), args.repeats),
        )
    )
    # DP-ELM at L=10, K=10: 200 noised entries, real scale 60 on the 2^-40 grid.
    rows.append(
        (
            "discrete laplace n=200 (DP-ELM L=10)",
            timed(lambda: discrete_laplace(default, 200, 60 * 2**40), args.repeats),
            timed(lambda: discrete_laplace(crypto, 200, 60 * 2**40), args.repeats),
        )
    )
    print(
        f"# {platform.processor() or platform.machine()}, python {platform.python_version()}, torch threads 1, median of {args.repeats}"
    )
    print(f"{'draw':40s} {'default s':>12s} {'crypto s':>12s} {'crypto/default':>15s}")
    for name, a, b in rows:
        print(f"{name:40s} {a:12.6f} {b:12.6f} {b / a:15.2f}")
    # A DP-SGD run of T = 2000 steps (MNIST, Table 2) with one Gaussian draw per step:
    for n in (7_850, 1_000_000):
        a = timed(lambda: default.gaussian_torch((n,), 1.0), args.repeats)
        b = timed(lambda: crypto.gaussian_torch((n,), 1.0), args.repeats)
        print(
            f"noise for 2000 steps of {n:,} parameters: default {2000 * a:.2f} s, cryptographic {2000 * b:.2f} s"
        )


if __name__ == "__main__":
    main()

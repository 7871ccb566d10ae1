"""Speed of the frozen DP-RVFL feature transform on MNIST (one thread), and its physical limit.

    DPAUDIT_DATA_DIR=../shared/data .venv/bin/python benchmarks/bench_features.py [--repeats 5]

Prints the median wall time of ``build_features("rvfl", 784, seed).transform(x_train, bias_column=True)``
(51,000 x 784 -> [x, tanh(x W + b), 1], float32) and of the test-set transform, the GFLOP of the
hidden-layer GEMM, this CPU's single-thread float32 GEMM rate (torch.mm on a square matrix) and the
resulting lower bound on the transform's time, and a checksum of the features (to compare code
versions: run it with PYTHONPATH=/path/to/other/src and compare the printed max difference file).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch


def _median_time(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        out = None  # free the previous result first: its pages are not reused for free
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def sgemm_rate(size: int = 2048, repeats: int = 5) -> float:
    """GFLOP/s of one thread's float32 torch.mm on a square matrix (median of ``repeats``)."""
    a, b = torch.rand(size, size), torch.rand(size, size)
    c = torch.empty(size, size)
    torch.mm(a, b, out=c)
    t, _ = _median_time(lambda: torch.mm(a, b, out=c), repeats)
    return 2 * size**3 / t / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument(
        "--save",
        default=None,
        help="write the training features to this .npy file (to compare versions)",
    )
    a = ap.parse_args()
    torch.set_num_threads(1)
    from dpaudit.data import load_dataset
    from dpaudit.mechanisms.dpsgd.features import build_features

    data = load_dataset("mnist")
    x_tr, x_te = data.x_train, data.x_test
    print(
        f"x_train {x_tr.shape} {x_tr.dtype} (C-contiguous {x_tr.flags.c_contiguous}), x_test {x_te.shape} {x_te.dtype}"
    )
    feats = build_features("rvfl", data.n_features, a.seed)
    t_tr, z = _median_time(lambda: feats.transform(x_tr, bias_column=True), a.repeats)
    t_te, _ = _median_time(lambda: feats.transform(x_te), a.repeats)
    n, d = x_tr.shape
    L = feats.hidden_units
    gflop = 2.0 * n * d * L / 1e9
    rate = sgemm_rate()
    print(f"train transform: median {t_tr:.3f} s over {a.repeats} (z {z.shape} {z.dtype})")
    print(f"test transform:  median {t_te:.3f} s over {a.repeats}")
    print(
        f"hidden-layer GEMM {gflop:.2f} GFLOP; single-thread sgemm {rate:.1f} GFLOP/s -> GEMM alone >= {gflop / rate:.3f} s"
    )
    print(f"features checksum: sum {float(np.sum(z, dtype=np.float64)):.6f}")
    if a.save:
        np.save(a.save, z)


if __name__ == "__main__":
    main()

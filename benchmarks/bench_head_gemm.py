"""The head kernel's two products at the MNIST DP-RVFL step shape (b = 255 rows, d+1 = 985, K = 10),
one thread: the logits as W Z1^T (K, b) or Z1 W^T (b, K) with NumPy, the gradient R Z1 with NumPy,
and both with torch, for the figures quoted by ``dpsgd_core._clipped_sum_kernel`` and BENCHMARKS.md.

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_head_gemm.py
"""

from __future__ import annotations

import time

import numpy as np

B, D1, K, REPS = 255, 985, 10, 2000


def _us(f) -> float:
    f()
    t = time.perf_counter()
    for _ in range(REPS):
        f()
    return (time.perf_counter() - t) / REPS * 1e6


def main() -> None:
    rng = np.random.default_rng(0)
    z = rng.random((B, D1), dtype=np.float32)
    w = rng.random((K, D1), dtype=np.float32)
    r, rt, out = (
        np.empty((K, B), np.float32),
        np.empty((B, K), np.float32),
        np.empty((K, D1), np.float32),
    )
    print(f"numpy logits W Z1^T (K, b): {_us(lambda: np.matmul(w, z.T, out=r)):.1f} us")
    print(f"numpy logits Z1 W^T (b, K): {_us(lambda: np.matmul(z, w.T, out=rt)):.1f} us")
    print(f"numpy gradient R Z1:        {_us(lambda: np.matmul(r, z, out=out)):.1f} us")
    import torch

    torch.set_num_threads(1)
    zt, wt, rt_t, ot = (torch.from_numpy(a) for a in (z, w, r, out))
    print(f"torch logits W Z1^T:        {_us(lambda: torch.mm(wt, zt.t(), out=rt_t)):.1f} us")
    print(f"torch gradient R Z1:        {_us(lambda: torch.mm(rt_t, zt, out=ot)):.1f} us")


if __name__ == "__main__":
    main()

"""User-level vs record-level DP-SGD: cost per step of the linear-head and module trainers.

Synthetic data (public seed 0): n records of d features, K classes; users with a heavy-tailed
number of records (geometric sizes, a few users with 1,000 records). Reports seconds per step
and steps per second for
  - record-level DP-SGD (train_heads / train_module_dp_sgd), batch B records;
  - user-level DP-SGD with one record per user (must equal record level: checked);
  - user-level DP-SGD on the heavy-tailed users at G in {1, 8, 64}, batch B users.

Usage (from the repository root):
  .venv/bin/python benchmarks/bench_user_level.py [--n 50000] [--d 232] [--classes 2] [--steps 200] [--batch 256]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

torch.set_num_threads(1)

from dpaudit.mechanisms.dpsgd.module_training import DPSGDConfig, train_module_dp_sgd  # noqa: E402
from dpaudit.mechanisms.dpsgd.models import Dense  # noqa: E402
from dpaudit.mechanisms.dpsgd.loop import UserSampling, train_heads  # noqa: E402
from dpaudit.data.users import index_users  # noqa: E402
from dpaudit.noise import NoiseSource  # noqa: E402


def heavy_tailed_ids(n: int, rng: np.random.Generator) -> np.ndarray:
    sizes = list(rng.geometric(0.2, size=n))  # mean 5 records per user
    sizes[:3] = [1000, 1000, 1000]
    ids = np.repeat(np.arange(len(sizes)), sizes)[:n]
    rng.shuffle(ids)
    return ids


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--d", type=int, default=232)
    ap.add_argument("--classes", type=int, default=2)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--module-steps", type=int, default=20)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    z = rng.normal(size=(args.n, args.d)).astype(np.float32)
    y = rng.integers(0, args.classes, args.n)
    binary = args.classes == 2
    ids = heavy_tailed_ids(args.n, rng)
    n_users = index_users(ids).n_users
    print(
        f"n={args.n} d={args.d} K={args.classes} users={n_users} (3 with 1,000 records) steps={args.steps} batch={args.batch}"
    )

    def cfg(units: int, steps: int) -> DPSGDConfig:
        q = min(1.0, args.batch / units)
        return DPSGDConfig(
            sample_rate=q, steps=steps, normalizer=max(1, int(q * units)), noise_multiplier=1.0
        )

    def timed(label, fn, steps):
        t = time.perf_counter()
        out = fn()
        s = time.perf_counter() - t
        print(f"  {label:44s} {1e3 * s / steps:8.2f} ms/step  {steps / s:8.1f} steps/s")
        return out

    print("linear head")
    c = cfg(args.n, args.steps)
    a = timed(
        "record level",
        lambda: train_heads(
            z, y, args.classes, c, noise=NoiseSource("reproducible", seed=1), binary_logit=binary
        ),
        args.steps,
    )
    b = timed(
        "user level, one record per user (G=8)",
        lambda: train_heads(
            z,
            y,
            args.classes,
            c,
            users=UserSampling(index_users(np.arange(args.n)), 8),
            noise=NoiseSource("reproducible", seed=1),
            binary_logit=binary,
        ),
        args.steps,
    )
    print(f"  identical weights: {np.array_equal(a.weight, b.weights[0])}")
    cu = cfg(n_users, args.steps)
    for g in (1, 8, 64):
        timed(
            f"user level, heavy-tailed users, G={g}",
            lambda: train_heads(
                z,
                y,
                args.classes,
                cu,
                users=UserSampling(index_users(ids), g),
                noise=NoiseSource("reproducible", seed=1),
                binary_logit=binary,
            ),
            args.steps,
        )

    print("dense module (64-32-K), per-sample gradients with torch.func")
    x = torch.as_tensor(z)
    yt = torch.as_tensor(y)
    ms = args.module_steps
    loss = "bce" if binary else "cross_entropy"
    k_out = 1 if binary else args.classes

    def module():
        torch.manual_seed(0)
        return Dense(args.d, (64, 32), k_out)

    c = cfg(args.n, ms)
    timed(
        "record level",
        lambda: train_module_dp_sgd(
            module(), x, yt, c, noise=NoiseSource("reproducible", seed=1), loss=loss
        ),
        ms,
    )
    cu = cfg(n_users, ms)
    for g in (1, 8):
        timed(
            f"user level, heavy-tailed users, G={g}",
            lambda: train_module_dp_sgd(
                module(),
                x,
                yt,
                cu,
                users=UserSampling(ids, g),
                noise=NoiseSource("reproducible", seed=1),
                loss=loss,
            ),
            ms,
        )


if __name__ == "__main__":
    main()

"""For the DP-SGD heads: one-run audits of dp-rvfl on digits (`heads_one_run`).

Each audit trains the head ONCE (release protocol: 10 epochs, batch 64, q = 0.05, T = 200,
RDP-calibrated sigma) with m Dirac gradient canaries in zero-gradient coordinates (plus all-zero
feature columns beyond them); bounds from :func:`dpaudit.audits.one_run.one_run_bounds`
(delta 1e-5, confidence 0.95). Prints the no-noise control against its ceiling and, with noise,
Steinke and f-DP eps_LB per seed (soundness: never above the claim).

Usage:
  .venv/bin/python benchmarks/bench_one_run_heads.py [--canaries 1000] [--seeds 5] [--eps 1 2]
"""

from __future__ import annotations

import argparse
import time

import torch

torch.set_num_threads(1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--canaries", type=int, default=1000)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--eps", type=float, nargs="+", default=[1.0, 2.0])
    a = ap.parse_args()

    from dpaudit.mechanisms.dpsgd.head_audit import HeadTarget
    from dpaudit.audits.one_run import one_run_bounds
    from dpaudit.mechanisms.dpsgd.one_run_heads import heads_one_run
    from dpaudit.noise import NoiseSource

    for eps in a.eps:
        t = HeadTarget(epsilon=eps)
        t.prepare()
        if eps == a.eps[0]:
            t0 = time.perf_counter()
            s = heads_one_run(
                t,
                canaries=a.canaries,
                noise=NoiseSource("reproducible", seed=0),
                seed=0,
                noise_on=False,
            )
            b = one_run_bounds(s, delta=t.delta)
            st = b["steinke"]
            print(
                f"no-noise control, m = {a.canaries}: Steinke eps_LB {st['epsilon_lower_bound']:.3f} of ceiling {st['ceiling']:.3f} "
                f"({100 * st['epsilon_lower_bound'] / st['ceiling']:.0f} %), extra zero features {s.info['extra_zero_features']}, "
                f"{time.perf_counter() - t0:.1f} s",
                flush=True,
            )
        for seed in range(a.seeds):
            t0 = time.perf_counter()
            s = heads_one_run(
                t,
                canaries=a.canaries,
                noise=NoiseSource("reproducible", seed=1000 + seed),
                seed=seed,
            )
            b = one_run_bounds(
                s, delta=t.delta, claim=t.claimed_event, claimed_epsilon=t.claimed_epsilon
            )
            fdp = (b.get("fdp") or {}).get("epsilon_lower_bound")
            print(
                f"claim eps {t.claimed_epsilon:.3f} seed {seed}: Steinke eps_LB {b['steinke']['epsilon_lower_bound']:.3f}, "
                f"f-DP eps_LB {'—' if fdp is None else f'{float(fdp):.3f}'}, {time.perf_counter() - t0:.1f} s",
                flush=True,
            )


if __name__ == "__main__":
    main()

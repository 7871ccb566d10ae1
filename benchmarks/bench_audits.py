"""Audit speed: trials per second of the batched targets, 1 vs 2 worker processes.

Targets of the audit issue (2 cores):
  - DP-MixMin 2,000-trial audit (k = 14, n_mix = 9,000, B = 1,000, 200 steps) under 30 s;
  - DP-RVFL on MNIST (full protocol: 10 epochs, batch 256) 1,000-trial audit under 15 minutes.

Usage (from the repository root):
  .venv/bin/python benchmarks/bench_audits.py mixmin [--runs 2000] [--workers 1 2]
  .venv/bin/python benchmarks/bench_audits.py mixmin-task --data-dir ../shared/data   # mnist-mix: set-up costs, 500 trials
  .venv/bin/python benchmarks/bench_audits.py rvfl --data-dir ../shared/data [--runs 1000] [--workers 2]
  .venv/bin/python benchmarks/bench_audits.py rvfl --data-dir ../shared/data --runs 128   # a quick extrapolation

Only the main audit is timed (controls off); reproducible noise so runs are comparable.
The DP-MixMin configuration is synthetic (k = 14 proxy columns, uniform in (0.01, 0.99)) because
the paper's NIH data is not available; the cost depends on k, n_mix, B and steps only.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

torch.set_num_threads(1)


def bench_mixmin(runs: int, workers: list[int]) -> None:
    from dpaudit.audits.engine import run_audit
    from dpaudit.mechanisms.mixmin.audit import MixMinTarget, mixmin_config_for

    rng = np.random.default_rng(0)
    n, k = 9000, 14
    probs = rng.uniform(0.01, 0.99, size=(n, k))
    labels = (rng.uniform(size=n) < probs[:, 0]).astype(float)
    cfg, claimed = mixmin_config_for(
        n_mix=n, k=k, epsilon=1.0, delta=1e-5, expected_batch_size=1000, steps=200
    )
    t = MixMinTarget(probs, labels, cfg, claimed, 1e-5, canary="max-clip")
    print(
        f"DP-MixMin audit: k={k}, n_mix={n}, B=1000, steps=200, sigma={cfg.noise_multiplier:.4f}, runs={runs}"
    )
    for w in workers:
        t0 = time.perf_counter()
        r = run_audit(
            t, runs=runs, seed=0, controls=(), workers=w, reproducible_noise=True, progress=True
        )
        dt = time.perf_counter() - t0
        cpu = r.timings["cpu_seconds"]
        print(
            f"  workers={w}: {dt:.1f} s wall ({runs / dt:.0f} trials/s), {cpu:.1f} CPU-s in trials "
            f"(2 quiet cores: ~{cpu / 2:.1f} s); eps_LB={r.epsilon_lower_bound:.3f} "
            f"(claim {r.claimed_epsilon:.3f}), GDP estimate {r.gdp_estimate['epsilon']:.3f}"
        )


def bench_mixmin_task(data_dir: str | None, repeats: int = 3) -> None:
    """Where the time of `dpaudit audit mixmin --task mnist-mix` goes: start-up pieces, task build,
    and one 500-trial chunk (CPU seconds: robust to a shared machine)."""
    import resource

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    c0 = cpu()
    import torchvision.datasets  # noqa: F401  (what dpaudit.data.images uses to read the MNIST files)

    print(f"import torchvision.datasets: {cpu() - c0:.2f} CPU-s (torch already imported)")
    from dpaudit.auditing import build_target
    from dpaudit.mechanisms.mixmin.tasks import load_task, train_proxies
    from dpaudit.noise import NoiseSource

    c0 = cpu()
    task = load_task("mnist-mix", data_dir=data_dir)
    c1 = cpu()
    train_proxies(task)
    c2 = cpu()
    t = build_target(
        "mixmin", task="mnist-mix", canary="max-clip", data_dir=data_dir
    )  # proxies cached in memory now
    c3 = cpu()
    print(
        f"load_task {c1 - c0:.2f}, train_proxies {c2 - c1:.2f}, rest of the target build {c3 - c2:.2f} CPU-s "
        f"(n_mix={t.probs.shape[0]}, k={t.probs.shape[1]}, q={t.config.sample_rate:.4f}, sigma={t.config.noise_multiplier:.4f})"
    )
    inserted = np.random.default_rng(0).random(500) < 0.5
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        t.scores(inserted, NoiseSource("reproducible", seed=1))
        print(
            f"  500 trials: {time.perf_counter() - w0:.2f} s wall, {time.process_time() - c0:.2f} CPU-s"
        )


def bench_rvfl(runs: int, workers: list[int], data_dir: str | None, chunk: int) -> None:
    from dpaudit.audits.engine import run_audit
    from dpaudit.mechanisms.dpsgd.head_audit import HeadTarget

    t = HeadTarget(
        model="dp-rvfl", dataset="mnist", data_dir=data_dir, epsilon=2.0, canary="max-clip"
    )
    t0 = time.perf_counter()
    t.prepare()
    setup = time.perf_counter() - t0
    c = t._config
    print(
        f"DP-RVFL MNIST audit (full protocol): q={c.sample_rate:.5f}, steps={c.steps}, m0={c.normalizer}, sigma={c.noise_multiplier:.4f}, "
        f"d+1={t._z.shape[1] + 1}, runs={runs}, chunk={chunk}; setup {setup:.1f} s; canary {t._canary_info['why']}"
    )
    for w in workers:
        t0 = time.perf_counter()
        r = run_audit(
            t,
            runs=runs,
            seed=0,
            controls=(),
            workers=w,
            chunk_size=chunk,
            reproducible_noise=True,
            progress=True,
        )
        dt = time.perf_counter() - t0
        cpu = r.timings["cpu_seconds"]
        print(
            f"  workers={w}: {dt:.1f} s wall for {runs} trials ({dt / runs:.3f} s/trial; 1,000 trials ~ {1000 * dt / runs / 60:.1f} min); "
            f"{cpu:.1f} CPU-s ({cpu / runs:.3f} CPU-s/trial; 1,000 trials on 2 quiet cores ~ {1000 * cpu / runs / 2 / 60:.1f} min); "
            f"eps_LB={r.epsilon_lower_bound:.3f} (claim {r.claimed_epsilon:.3f}), GDP estimate {r.gdp_estimate['epsilon']:.3f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("what", choices=["mixmin", "mixmin-task", "rvfl"])
    ap.add_argument("--runs", type=int, default=None)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--data-dir", default=os.environ.get("DPAUDIT_DATA_DIR"))
    ap.add_argument("--chunk", type=int, default=64)
    a = ap.parse_args()
    print(
        f"cpu_count={os.cpu_count()}, torch threads per process={torch.get_num_threads()}, {time.strftime('%Y-%m-%d %H:%M:%S')}"
    )
    if a.what == "mixmin":
        bench_mixmin(a.runs or 2000, a.workers)
    elif a.what == "mixmin-task":
        bench_mixmin_task(a.data_dir)
    else:
        bench_rvfl(a.runs or 1000, a.workers, a.data_dir, a.chunk)


if __name__ == "__main__":
    main()

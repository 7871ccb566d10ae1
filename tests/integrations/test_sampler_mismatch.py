"""A fast check: the trajectory audit of benchmarks/bench_sampler_mismatch.py rules out the Poisson
claim of shuffled fixed-size batches, and does not flag the Poisson-sampled training it describes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

_spec = importlib.util.spec_from_file_location(
    "bench_sampler_mismatch", Path(__file__).parents[2] / "benchmarks" / "bench_sampler_mismatch.py"
)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

CFG = {
    "n": 12,
    "q": 0.25,
    "epochs": 1,
    "sigma": 0.3,
}  # T = 4 steps; documented in benchmarks/RESULTS-issue28.md


def test_shuffle_puts_the_canary_in_one_batch_per_epoch():
    rng = np.random.default_rng(0)
    batches = list(bench._batches("shuffle", 13, 0.25, 3, rng))
    assert len(batches) == 12 and sum(int(12 in b) for b in batches) == 3
    assert sorted(np.concatenate(batches[:4]).tolist()) == list(range(13))


def test_audit_flags_shuffled_batches_and_not_poisson():
    shuffle = bench.audit("shuffle", runs=1000, seed=0, **CFG)
    poisson = bench.audit("poisson", runs=1000, seed=0, **CFG)
    assert shuffle["violated"] and shuffle["family_eps"] > shuffle["claimed"]
    assert not poisson["violated"] and poisson["family_eps"] < poisson["claimed"]

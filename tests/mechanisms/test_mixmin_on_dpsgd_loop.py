"""DP-MixMin runs through the one DP-SGD loop (``run_dp_sgd``) with results bit-identical to its
former loop of its own: the golden weights were written by that former loop (main before the move,
``python tests/mechanisms/test_mixmin_on_dpsgd_loop.py`` with ``PYTHONPATH`` on the old source),
under reproducible noise, for record and user level, canaries, q < 1 and q = 1."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from dpaudit.mechanisms.dpsgd import loop
from dpaudit.mechanisms.mixmin.solver import MixMinCanary, MixMinConfig, run_mixmin_runs
from dpaudit.noise import NoiseSource

GOLDEN = Path(__file__).with_name("mixmin_loop_golden.json")

#: name: (config fields, seed, runs, privacy-unit and canary options)
CASES = {
    "bce-q0.3": (dict(loss="bce", sample_rate=0.3), 1, 3, {}),
    "bce-q0.3-seed2": (dict(loss="bce", sample_rate=0.3), 2, 3, {}),
    "nll-q0.25": (dict(loss="nll", sample_rate=0.25), 3, 2, {}),
    "mse-q0.5-init": (dict(loss="mse", sample_rate=0.5), 4, 1, {"init": [1, 2, 3, 4]}),
    "bce-q1": (dict(loss="bce", sample_rate=1.0), 5, 2, {}),
    "bce-no-noise": (dict(loss="bce", sample_rate=0.3, noise_multiplier=0.0), 6, 2, {}),
    "user-bce-q0.4": (
        dict(loss="bce", sample_rate=0.4, privacy_unit="user", records_per_user=2),
        7,
        2,
        {"users": True},
    ),
    "gradient-canary": (dict(loss="bce", sample_rate=0.3), 8, 4, {"canary": "gradient"}),
    "record-canary-q1": (dict(loss="mse", sample_rate=1.0), 9, 4, {"canary": "record"}),
    "record-canary": (dict(loss="bce", sample_rate=0.35), 10, 4, {"canary": "record"}),
}


def _weights(name: str) -> np.ndarray:
    fields, seed, runs, extra = CASES[name]
    rng = np.random.default_rng(seed)
    n, k = 60, 4
    probs = rng.uniform(0.05, 0.95, (n, k))
    labels = rng.integers(0, 2, n).astype(float)
    # a normaliser B that is not an integer, as DP-MixMin's q |D_mix| in general is
    settings = dict(noise_multiplier=1.1, expected_batch_size=17.5, steps=12)
    config = MixMinConfig(k=k, clipping_norm=0.8, step_size=0.7, **{**settings, **fields})
    canary = None
    if extra.get("canary") == "gradient":
        canary = MixMinCanary("gradient", direction=np.array([1.0, -1.0, 0.5, -0.5]))
    elif extra.get("canary") == "record":
        canary = MixMinCanary("record", probs=np.array([0.9, 0.1, 0.2, 0.3]), label=0.0)
    return run_mixmin_runs(
        probs,
        labels,
        config,
        noise=NoiseSource("reproducible", seed=seed),
        runs=runs,
        user_ids=rng.integers(0, 15, n) if extra.get("users") else None,
        init=extra.get("init"),
        canary=canary,
        canary_in=None if canary is None else np.arange(runs) % 2 == 0,
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_weights_are_bit_identical_to_the_former_mixmin_loop(name):
    golden = json.loads(GOLDEN.read_text())[name]
    assert [float(v).hex() for v in _weights(name).ravel()] == golden


def test_mixmin_runs_through_the_one_dp_sgd_loop(monkeypatch):
    calls = []
    real = loop.run_dp_sgd
    monkeypatch.setattr(loop, "run_dp_sgd", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    _weights("bce-q0.3")
    assert calls == [1]


def test_the_loops_planted_noise_fault_reaches_mixmin(plant_fault):
    """The loop's one noise filler is DP-MixMin's too: halving its noise changes the weights."""
    clean = _weights("bce-q0.3")
    plant_fault("half-noise")
    assert not np.allclose(_weights("bce-q0.3"), clean, rtol=1e-6, atol=0)


if __name__ == "__main__":  # write the golden file from the code on PYTHONPATH
    out = {name: [float(v).hex() for v in _weights(name).ravel()] for name in sorted(CASES)}
    Path(sys.argv[1] if len(sys.argv) > 1 else GOLDEN).write_text(json.dumps(out, indent=1) + "\n")

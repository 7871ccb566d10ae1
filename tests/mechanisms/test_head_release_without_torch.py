"""A linear head's release (frozen features, the one DP-SGD loop, the Gaussian sampler, metrics)
runs on NumPy alone: torch is never imported (its import alone is ~1.6 s of a ~3 s command,
BENCHMARKS.md section 4). Modules still train with torch, through NumPy views of their parameters."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import torch

from dpaudit.mechanisms.dpsgd import core as dpsgd_core
from dpaudit.mechanisms.dpsgd.core import DPSGDConfig, NoisyStep
from dpaudit.noise import NoiseSource


def test_a_dp_rvfl_release_never_imports_torch(tmp_path):
    code = (
        "import sys, json\n"
        "from dpaudit.cli import app\n"
        "from typer.testing import CliRunner\n"
        f"r = CliRunner().invoke(app, ['train', 'dp-rvfl', '--eps', '2', '--epochs', '1', '--out', {str(tmp_path / 'r')!r}, "
        f"'--ledger', {str(tmp_path / 'l.sqlite')!r}, '--json'])\n"
        "assert r.exit_code == 0, r.output\n"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'release': json.loads(r.stdout[r.stdout.index('{'):])}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["torch"] is False
    assert (
        got["release"]["timings"]["blas_threads"] == dpsgd_core.HEAD_BLAS_THREADS
    )  # the head's training, published
    assert got["release"]["steps_executed"] == got["release"]["steps"]


def test_noisy_step_on_tensors_updates_them_through_numpy_views():
    """Module parameters stay tensors (autograd needs them); the step writes into their memory."""
    cfg = DPSGDConfig(sample_rate=0.1, steps=2, normalizer=4, noise_multiplier=1.0)
    p = torch.zeros(3, 2, requires_grad=True)
    step = NoisyStep([p], cfg, noise=NoiseSource("reproducible", seed=3))
    assert isinstance(step.sums[0], torch.Tensor) and step.sums[0].shape == p.shape
    step.sums[0].fill_(0.5)
    step.apply(1)
    assert p.requires_grad and bool(torch.all(p.detach() != 0))
    q = np.zeros((3, 2), dtype=np.float32)
    arr = NoisyStep([q], cfg, noise=NoiseSource("reproducible", seed=3))
    assert isinstance(arr.sums[0], np.ndarray)
    arr.sums[0][...] = 0.5
    arr.apply(1)
    np.testing.assert_allclose(q, p.detach().numpy(), rtol=1e-6)  # the same draws, the same update

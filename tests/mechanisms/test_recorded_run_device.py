"""A recorder reads the noisy step's host buffers: on a device other than the CPU they do not hold
the privatised sums, so such a run is refused rather than recorded from stale memory."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dpaudit.errors import UsageError
from dpaudit.mechanisms.dpsgd.core import DPSGDConfig, NoisyStep
from dpaudit.mechanisms.dpsgd.loop import _check_recordable
from dpaudit.noise import NoiseSource


def _config() -> DPSGDConfig:
    return DPSGDConfig(
        sample_rate=0.5, steps=2, normalizer=4, noise_multiplier=1.0, clipping_norm=1.0
    )


def test_a_recorder_on_another_device_is_refused():
    off_cpu = SimpleNamespace(device_sums=SimpleNamespace(device=torch.device("cuda", 0)))
    with pytest.raises(UsageError, match=r"device must be the CPU .* got cuda:0\."):
        _check_recordable(off_cpu, recorder=object())
    _check_recordable(off_cpu, recorder=None)  # no recorder: nothing read, nothing refused


def test_a_recorder_on_the_cpu_reads_the_privatised_sums():
    noise = NoiseSource("reproducible", seed=3)
    params = [torch.zeros(3, dtype=torch.float64)]
    step = NoisyStep(params, _config(), noise=noise)
    _check_recordable(step, recorder=object())  # module sums on the CPU share the host memory
    step.sums[0].fill_(2.0)
    seen = []
    step.apply(1, SimpleNamespace(record=lambda t, arrays: seen.append(arrays[0].copy())))
    assert seen[0].shape == (3,) and not np.allclose(seen[0], 2.0)  # the noise is in what it read
    np.testing.assert_array_equal(step.sums[0].numpy(), seen[0] / 4)  # then divided by m0

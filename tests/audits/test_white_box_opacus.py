"""The white-box step audit of an Opacus run (dpaudit.integrations.white_box) through a real
``PrivacyEngine`` on a tiny synthetic model: a correct run is not flagged, a noise multiplier
lowered after ``make_private`` (the claim read at attach) is caught, no-noise shows d = 1 exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from dpaudit.errors import UsageError
from dpaudit.integrations.white_box import OpacusWhiteBox

N, BATCH = 256, 32


def _train(sigma: float, *, epochs: int = 6, lowered_after: float = 1.0, canaries: int = 2000):
    from opacus import PrivacyEngine

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(60, 40), nn.ReLU(), nn.Linear(40, 3))
    wb = OpacusWhiteBox(model, canaries=canaries, seed=1, tensors=["0.weight"], noise_seed=5)
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(
        torch.randn(N, 60, generator=g), torch.randint(0, 3, (N,), generator=g)
    )
    model, opt, loader = PrivacyEngine(accountant="rdp").make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=torch.utils.data.DataLoader(data, batch_size=BATCH),
        noise_multiplier=sigma,
        max_grad_norm=1.0,
    )
    wb.attach(opt, data_loader=loader)
    opt.noise_multiplier = (
        sigma * lowered_after
    )  # the bug: the noise changed after the claim was made
    for _ in range(epochs):
        for x, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    return wb


def test_correct_opacus_run_is_not_flagged_and_is_close():
    wb = _train(1.0)
    b = wb.audit(delta=1e-5)
    assert wb.claim().steps == 6 * (N // BATCH) and wb.claim().sample_rate == pytest.approx(
        BATCH / N
    )
    assert not b.violation and b.epsilon_lb > 0.7 * b.claimed_epsilon


def test_noise_lowered_after_make_private_is_caught():
    assert _train(1.0, lowered_after=0.8).audit(delta=1e-5).violation


def test_no_noise_shows_the_canary_exactly():
    obs = _train(0.0, epochs=1, canaries=50).observations()
    assert np.allclose(obs.values, obs.sampled.astype(float), atol=1e-5)


def test_attach_refuses_a_plain_optimizer():
    model = nn.Linear(3, 2)
    with pytest.raises(UsageError, match="optimizer must be one Opacus DPOptimizer"):
        OpacusWhiteBox(model, canaries=2).attach(
            torch.optim.SGD(model.parameters(), lr=0.1), sample_rate=0.1
        )

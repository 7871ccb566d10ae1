"""The Opacus one-run integration through a real ``PrivacyEngine`` on a tiny synthetic model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from dpaudit.audits.one_run import one_run_bounds
from dpaudit.errors import UsageError
from dpaudit.integrations.opacus import OpacusCanaries

N, BATCH, LR = 64, 16, 0.5


class Tiny(nn.Module):
    """``side`` reads input features that are zero in every record: no data gradient on its weight."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.side = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x[:, :4]) + self.side(x[:, 4:])


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.zeros(N, 8)
    x[:, :4] = torch.randn(N, 4, generator=g)
    return torch.utils.data.TensorDataset(x, torch.randint(0, 3, (N,), generator=g))


def _train(sigma: float, canaries: int | None, *, epochs: int = 6, seed: int = 0):
    """Train once with Opacus; returns (canaries, model, per-step noise, accountant history)."""
    from opacus import PrivacyEngine

    torch.manual_seed(
        seed
    )  # model init, Poisson batches and Opacus noise all from the global generator
    model = Tiny()
    c = (
        OpacusCanaries(model, canaries=canaries, seed=1, tensors=["side.weight"], noise_seed=7)
        if canaries
        else None
    )
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    loader = torch.utils.data.DataLoader(_data(), batch_size=BATCH)
    engine = PrivacyEngine(accountant="rdp")
    model, opt, loader = engine.make_private(
        module=model, optimizer=opt, data_loader=loader, noise_multiplier=sigma, max_grad_norm=1.0
    )
    if c is not None:
        c.attach(opt, data_loader=loader)
    import opacus.optimizers.optimizer as dpo

    noises = []
    generate = dpo._generate_noise

    def record(*args, **kwargs):  # Opacus's own noise draw (add_noise looks it up in its module)
        z = generate(*args, **kwargs)
        noises.append(z.clone())
        return z

    dpo._generate_noise = record
    try:
        for _ in range(epochs):
            for x, y in loader:
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
    finally:
        dpo._generate_noise = generate
    return c, model, noises, list(engine.accountant.history)


def test_no_noise_included_canaries_move_exactly_as_designed():
    c, model, _, _ = _train(0.0, 12)
    s = c.scores(model)
    assert c.sample_rate == pytest.approx(BATCH / N) and c.steps == 6 * (N // BATCH)
    # SGD with zero noise and no data gradient on side.weight: each sampled step of an included
    # canary moves its coordinate by -LR * C / expected_batch_size; excluded ones never move.
    expected = LR * 1.0 * c.sampled / BATCH
    np.testing.assert_allclose(s.scores, expected, rtol=1e-5, atol=1e-7)
    assert np.all(c.sampled[~c.included] == 0) and np.all(c.sampled[c.included] > 0)
    order = np.argsort(-s.scores)
    k = int(c.included.sum())
    assert c.included[order[:k]].all() and not c.included[order[k:]].any()  # perfect separation
    assert one_run_bounds(s, delta=1e-5)["steinke"]["epsilon_lower_bound"] > 0


def test_opacus_noise_and_accounting_are_unchanged():
    _, _, noise_plain, hist_plain = _train(1.0, None)
    c, _, noise_canary, hist_canary = _train(1.0, 12)
    assert c.sampled.sum() > 0  # canaries were really injected
    assert len(noise_plain) == len(noise_canary) == 24 * 4  # one draw per parameter tensor per step
    assert all(
        torch.equal(a, b) for a, b in zip(noise_plain, noise_canary)
    )  # the same draws, bit for bit
    assert hist_plain == hist_canary == [(1.0, BATCH / N, 24)]
    assert c.claim().noise_multiplier == 1.0 and c.claim().steps == 24


def test_misuse_is_refused():
    model = Tiny()
    with pytest.raises(UsageError, match="tensors must name trainable parameters"):
        OpacusCanaries(model, canaries=3, tensors=["nope.weight"])
    with pytest.raises(UsageError, match="canaries must be at most 12"):
        OpacusCanaries(model, canaries=13, tensors=["side.weight"])
    c = OpacusCanaries(model, canaries=3, tensors=["side.weight"])
    with pytest.raises(UsageError, match="optimizer must be an Opacus DPOptimizer"):
        c.attach(torch.optim.SGD(model.parameters(), lr=0.1), sample_rate=0.1)

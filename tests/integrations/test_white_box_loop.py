"""The white-box step audit of a plain PyTorch DP-SGD loop recorded with PipelineCheck
(LoopWhiteBox.watch, clip(clipped=), noise(noisy=)): a correct loop is not flagged and comes
close to its claim, a 0.8 sigma loop is caught in one run, the no-noise control shows each canary
exactly, the null control shows nothing, and misuse is refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from dpaudit.errors import UsageError
from dpaudit.integrations.pipeline import PipelineCheck
from dpaudit.integrations.white_box import LoopWhiteBox

N, Q, C, SIGMA, STEPS, DELTA = 200, 0.1, 1.0, 1.0, 60, 1e-5


def _data(seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, 40, generator=g), torch.randint(0, 30, (N,), generator=g), g


def _clipped_sum(model, xb, yb) -> dict:
    """Per-sample gradients clipped jointly to C and summed (the loop's own clipping)."""
    from dpaudit.mechanisms.dpsgd.core import per_sample_clipped_sum

    params = {n: p.detach() for n, p in model.named_parameters()}
    if len(xb) == 0:
        return {n: torch.zeros_like(p) for n, p in params.items()}
    return per_sample_clipped_sum(model, params, xb, yb, C)


def plain_loop(
    *, noise_factor: float = 1.0, null: bool = False, canaries: int = 1000, seed: int = 0
):
    """A user's plain loop: Poisson batches, own clipping, own noise (``noise_factor`` times the
    declared std: the planted understatement), SGD on the noisy sum over the public m0 = N q."""
    torch.manual_seed(seed)
    model = nn.Linear(40, 30)
    x, y, gen = _data(seed)
    check = PipelineCheck(
        noise_multiplier=SIGMA, sample_rate=Q, steps=STEPS, max_grad_norm=C, dataset_size=N
    )
    LoopWhiteBox(
        model, canaries=canaries, tensors=["weight"], seed=1, noise_seed=seed, null=null
    ).watch(check)
    for _ in range(STEPS):
        mask = torch.rand(N, generator=gen) < Q
        summed = _clipped_sum(model, x[mask], y[mask])
        check.clip(int(mask.sum()), C, clipped=summed)
        noisy = {
            n: s + noise_factor * SIGMA * C * torch.randn(s.shape, generator=gen)
            for n, s in summed.items()
        }
        check.noise(SIGMA, C, noisy=noisy)
        with torch.no_grad():
            for n, p in model.named_parameters():
                p -= 0.1 * noisy[n] / (N * Q)
        check.step()
    return check


def test_a_correct_plain_loop_is_not_flagged_and_is_close_to_its_claim():
    check = plain_loop()
    rec = check.record(DELTA)
    bound = check.canaries.audit(delta=DELTA)
    assert check.canaries.claim().steps == STEPS and bound.steps == STEPS
    assert not bound.violation and bound.epsilon_lb > 0.7 * bound.claimed_epsilon
    assert rec["white_box"]["epsilon_lb"] == pytest.approx(bound.epsilon_lb)
    assert "white-box-epsilon" not in {f["code"] for f in rec["findings"]}


def test_noise_at_080_sigma_is_caught_in_one_run():
    rec = plain_loop(noise_factor=0.8).record(DELTA)
    assert rec["white_box"]["violation"] and rec["certified"] == "not certified: pipeline findings"
    assert "white-box-epsilon" in {f["code"] for f in rec["findings"]}


def test_the_no_noise_control_shows_each_canary_exactly():
    check = plain_loop(noise_factor=0.0, canaries=50)
    obs = check.canaries.observations()
    assert np.allclose(obs.values, obs.sampled.astype(float), atol=1e-5) and obs.sampled.any()
    assert check.canaries.audit(delta=DELTA).violation


def test_the_null_control_shows_nothing():
    bound = plain_loop(null=True).canaries.audit(delta=DELTA)
    assert not bound.violation and bound.sensitivity_lower < 0.2


def test_misuse_is_refused_in_one_line():
    model = nn.Linear(4, 3)
    with pytest.raises(UsageError, match="must be declared for white-box canaries"):
        LoopWhiteBox(model, canaries=4).watch(PipelineCheck(sample_rate=0.1, max_grad_norm=1.0))
    check = PipelineCheck(noise_multiplier=1.0, sample_rate=0.1, max_grad_norm=1.0)
    sums = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    with pytest.raises(UsageError, match="must watch this check"):
        check.clip(3, 1.0, clipped=sums)
    LoopWhiteBox(model, canaries=4).watch(check)
    with pytest.raises(UsageError, match="watch a check once"):
        LoopWhiteBox(model, canaries=4).watch(check)
    check.clip(3, 1.0, clipped=sums)
    with pytest.raises(UsageError, match="noisy must be given"):
        check.noise(1.0, 1.0)
    with pytest.raises(UsageError, match="two clipped sums"):
        check.clip(3, 1.0, clipped=sums)
    with pytest.raises(UsageError, match="contiguous"):
        wbox = LoopWhiteBox(model, canaries=4, tensors=["weight"]).watch(
            PipelineCheck(noise_multiplier=1.0, sample_rate=0.1, max_grad_norm=1.0)
        )
        wbox.before_noise({"weight": torch.zeros(4, 3).t()})

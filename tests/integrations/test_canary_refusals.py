"""Opacus canaries and the loop's white-box canaries choose their coordinates and read their
sample rate through the same checks, so they refuse bad input with the same one-line messages."""

from __future__ import annotations

import pytest
from torch import nn

from dpaudit.errors import UsageError
from dpaudit.integrations.opacus import OpacusCanaries
from dpaudit.integrations.white_box import LoopWhiteBox


@pytest.mark.parametrize("canaries_of", [OpacusCanaries, LoopWhiteBox])
def test_more_canaries_than_coordinates_is_refused_alike(canaries_of):
    model = nn.Linear(3, 2)  # 6 weights and 2 biases
    with pytest.raises(
        UsageError, match=r"^canaries must be at most 6 \(coordinates of weight\), got 7\.$"
    ):
        canaries_of(model, canaries=7, tensors=["weight"])


@pytest.mark.parametrize("rate", [0.0, 1.5])
def test_white_box_sample_rate_outside_the_unit_interval_is_refused(rate):
    canaries = LoopWhiteBox(nn.Linear(3, 2), canaries=4)
    with pytest.raises(UsageError, match=rf"^sample_rate must be in \(0, 1\], got {rate}\.$"):
        canaries.declare(noise_multiplier=1.0, sample_rate=rate, max_grad_norm=1.0)

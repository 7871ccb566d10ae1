"""The commitment of an audit plan binds its seeds, and the one-run coins follow from the committed seed alone."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from dpaudit.audit_plans import commitment
from dpaudit.audits.one_run import plan_coins

seeds = st.fixed_dictionaries(
    {"public": st.integers(0, 2**63 - 1)}, optional={"coins": st.integers(0, 2**63 - 1)}
)
salts = st.text("0123456789abcdef", min_size=64, max_size=64)


@settings(max_examples=200, deadline=None)
@given(salts, seeds, seeds)
def test_commitment_binds_the_seeds(salt, a, b):
    assert (commitment(salt, a) == commitment(salt, b)) == (a == b)
    assert commitment(salt, a) == commitment(
        salt, dict(reversed(list(a.items())))
    )  # key order never matters


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**63 - 1), st.integers(2, 400))
def test_plan_coins_are_a_function_of_the_committed_seed(seed, m):
    coins = plan_coins(seed, m)
    assert coins.dtype == bool and coins.shape == (m,)
    assert np.array_equal(coins, plan_coins(seed, m))
    assert np.array_equal(
        plan_coins(seed, m + 7)[:m], coins
    )  # a prefix: m changes nothing before it


def test_plan_coins_are_fair():
    coins = plan_coins(12345, 200_000)
    assert abs(coins.mean() - 0.5) < 0.005  # 4.5 standard deviations

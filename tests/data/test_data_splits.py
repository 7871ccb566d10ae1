"""The public split rule: Table 1 sizes, determinism by seed, disjointness, no value dependence."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaudit.data.splits import DEFAULT_SPLIT_SEED, split_counts, split_indices, train_val_indices
from dpaudit.errors import UsageError


@pytest.mark.parametrize(
    "n, train_pct, val_pct, expected",
    [
        (60_000, 85, 15, (51_000, 9_000, 0)),  # MNIST training set (Table 1)
        (50_000, 85, 15, (42_500, 7_500, 0)),  # CIFAR-10 training set (Table 1)
        (68_608, 70, 15, (48_025, 10_291, 10_292)),  # Cardio (Table 1)
        (303, 70, 15, (212, 45, 46)),  # Heart (Table 1)
    ],
)
def test_split_counts_match_table_1(n, train_pct, val_pct, expected):
    assert split_counts(n, train_pct, val_pct) == expected


def test_default_seed_is_the_papers_primary_heart_seed():
    assert DEFAULT_SPLIT_SEED == 2026


@settings(max_examples=50, deadline=None)
@given(
    n=st.integers(0, 2000),
    seed=st.integers(0, 2**32),
    train=st.integers(0, 100),
    val=st.integers(0, 100),
)
def test_split_is_a_disjoint_cover_and_deterministic(n, seed, train, val):
    val = min(val, 100 - train)
    a = split_indices(n, seed, train, val)
    b = split_indices(n, seed, train, val)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    allidx = np.concatenate(a)
    assert len(allidx) == n
    np.testing.assert_array_equal(np.sort(allidx), np.arange(n))
    assert len(a[0]) == (train * n) // 100 and len(a[1]) == (val * n) // 100


def test_different_seeds_give_different_partitions():
    a = split_indices(303, 2026, 70, 15)[0]
    b = split_indices(303, 2027, 70, 15)[0]
    assert not np.array_equal(np.sort(a), np.sort(b))


def test_train_val_indices_cover_training_set():
    tr, va = train_val_indices(1000, 7, 85)
    assert len(tr) == 850 and len(va) == 150
    assert len(np.intersect1d(tr, va)) == 0


def test_split_counts_rejects_negative_n():
    with pytest.raises(UsageError, match="n must be an integer >= 0"):
        split_counts(-1, 70, 15)

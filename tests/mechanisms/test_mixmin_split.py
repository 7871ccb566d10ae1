"""DP-MixMin's D_mix / D_ft split and the task's public / private division.

Parallel composition of the two stages is sound under add/remove adjacency only if a neighbouring
dataset (one record, or one user, more or less) changes that record's (user's) side of the split
and nothing else. A dataset name must mean one set of private records, whatever ``--seed``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaudit.errors import UsageError
from dpaudit.mechanisms.mixmin.tasks import (
    load_digits_task,
    load_heart_task,
    load_mnist_task,
    mixture_split,
)

RHO = st.floats(min_value=0.02, max_value=0.98)
SEED = st.integers(min_value=0, max_value=2**31 - 1)


def _sides(n_or_ids, rho, seed, user_ids=None):
    """(D_mix, D_ft) as sets of record ids, or None where the split refuses (an empty side)."""
    ids = np.arange(n_or_ids) if np.ndim(n_or_ids) == 0 else np.asarray(n_or_ids)
    try:
        mix, ft = mixture_split(n_or_ids, rho, seed, user_ids)
    except UsageError as e:
        assert "must not be empty" in str(e) or "must leave" in str(e)
        return None
    return set(ids[mix].tolist()), set(ids[ft].tolist())


@settings(max_examples=60, deadline=None)
@given(n=st.integers(min_value=1, max_value=400), rho=RHO, seed=SEED, add=st.booleans())
def test_adding_or_removing_one_record_moves_only_that_record(n, rho, seed, add):
    # Records are rows 0..n-1 of a source file; the neighbour has row n appended (add) or the
    # last row removed. Written against the positional form, which both old and new code accept.
    small, big = (n, n + 1) if add else (n - 1, n) if n > 1 else (1, 2)
    a, b = _sides(small, rho, seed), _sides(big, rho, seed)
    if a is None or b is None:
        return
    changed = big - 1  # the record that is in one dataset only
    assert a[0] ^ b[0] <= {changed} and a[1] ^ b[1] <= {changed}
    assert (a[0] ^ b[0]) | (a[1] ^ b[1]) == {
        changed
    }  # and it is on exactly one side of the bigger one


@settings(max_examples=60, deadline=None)
@given(
    ids=st.lists(st.integers(min_value=0, max_value=10**9), min_size=2, max_size=300, unique=True),
    rho=RHO,
    seed=SEED,
    which=st.integers(min_value=0),
)
def test_removing_any_record_by_stable_id_moves_only_that_record(ids, rho, seed, which):
    ids = np.array(ids)
    gone = int(ids[which % len(ids)])
    a, b = _sides(ids, rho, seed), _sides(ids[ids != gone], rho, seed)
    if a is None or b is None:
        return
    assert a[0] - {gone} == b[0] and a[1] - {gone} == b[1]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=6), min_size=2, max_size=60),
    rho=RHO,
    seed=SEED,
    new_size=st.integers(min_value=1, max_value=6),
    add=st.booleans(),
)
def test_adding_or_removing_one_user_moves_only_that_users_records(sizes, rho, seed, new_size, add):
    # Users 0..m-1 own consecutive rows; the neighbour gains user m (its rows appended) or loses
    # the last user. Every other user's records stay on their side.
    uid = np.repeat(np.arange(len(sizes)), sizes)
    if add:
        small, big = uid, np.concatenate([uid, np.full(new_size, len(sizes))])
    else:
        small, big = uid[uid != len(sizes) - 1], uid
    a, b = _sides(len(small), rho, seed, small), _sides(len(big), rho, seed, big)
    if a is None or b is None:
        return
    changed = set(range(len(small), len(big)))  # the rows of the user in the bigger dataset only
    assert a[0] ^ b[0] <= changed and a[1] ^ b[1] <= changed
    assert (b[0] & changed) in (set(), changed)  # the user's records move together
    big_mix = np.zeros(len(big), dtype=bool)
    big_mix[list(b[0])] = True
    for u in np.unique(big):  # user-aligned
        assert len(set(big_mix[big == u].tolist())) == 1


@pytest.mark.parametrize("rho", [0.05, 0.3, 0.5, 0.9])
@pytest.mark.parametrize("seed", [0, 1, 42])
def test_rho_is_respected(rho, seed):
    n = 20_000
    mix, ft = mixture_split(n, rho, seed)
    sd = np.sqrt(n * rho * (1 - rho))
    assert abs(len(mix) - rho * n) <= 5 * sd  # Binomial(n, rho): fails with probability < 1e-6
    assert len(mix) + len(ft) == n and not set(mix.tolist()) & set(ft.tolist())
    # independent draws per seed: the overlap of two seeds' D_mix is Binomial(n, rho^2)
    other, _ = mixture_split(n, rho, seed + 1000)
    both = len(np.intersect1d(mix, other))
    assert abs(both - rho * rho * n) <= 5 * np.sqrt(n * rho * rho * (1 - rho * rho))
    users = np.arange(n) // 4
    umix, _ = mixture_split(n, rho, seed, users)
    k = len(np.unique(users[umix]))
    assert abs(k - rho * n / 4) <= 5 * np.sqrt(n / 4 * rho * (1 - rho))


def test_empty_side_is_a_one_line_usage_error():
    for seed in range(20):  # one record: one side is always empty; never forced into D_mix
        with pytest.raises(UsageError, match=r"^D_(mix|ft) must not be empty, got .*rho=0\.5") as e:
            mixture_split(1, 0.5, seed)
        assert "\n" not in str(e.value)
    with pytest.raises(UsageError, match="rho must be in the open interval"):
        mixture_split(10, 0.0, seed=0)
    with pytest.raises(UsageError, match="record_ids must be distinct"):
        mixture_split(np.array([3, 3, 4]), 0.5, seed=0)


# ---------------------------------------------------------------------------------------------
# Point 2: the task, not --seed, fixes which records are private


def _rows(x, labels) -> list:
    return sorted(r.tobytes() + bytes([int(c)]) for r, c in zip(x, labels))


def _check_fixed_division(load, **kw):
    a, b = load(seed=42, **kw), load(seed=43, **kw)
    # the private training records are the same records for both seeds (by content) ...
    assert _rows(a.private_x[a.train_idx], a.private_records[a.train_idx]) == _rows(
        b.private_x[b.train_idx], b.private_records[b.train_idx]
    )
    for part in ("train_idx", "val_idx", "test_idx"):
        np.testing.assert_array_equal(
            a.record_ids[getattr(a, part)], b.record_ids[getattr(b, part)]
        )
    # ... and no record that is private (train, val or test) is public source data
    if a.public_record_ids is not None:
        assert not set(a.record_ids.tolist()) & set(a.public_record_ids.tolist())
        np.testing.assert_array_equal(a.public_record_ids, b.public_record_ids)
    return a


def test_digits_private_records_do_not_depend_on_seed():
    from sklearn.datasets import load_digits

    t = _check_fixed_division(load_digits_task)
    x = (load_digits().data / 16.0).astype(np.float32)
    np.testing.assert_array_equal(t.private_x, x[t.record_ids])  # ids are the source rows
    np.testing.assert_array_equal(t.public_x, x[t.public_record_ids])
    assert len(t.record_ids) + len(t.public_record_ids) == len(x)


def test_mnist_private_records_do_not_depend_on_seed(data_dir):
    from dpaudit.data import load_mnist_raw

    try:
        t = _check_fixed_division(load_mnist_task, data_dir=data_dir)
    except Exception as e:  # noqa: BLE001 - a data dir without MNIST is a visible skip, not a pass
        if "mnist" in str(e).lower() and "not found" in str(e).lower():
            pytest.skip(f"MNIST not under {data_dir}: {e}")
        raise
    x_tr = load_mnist_raw(data_dir)[0]
    tr_ids = t.record_ids[t.train_idx]
    np.testing.assert_array_equal(
        (t.private_x[t.train_idx[:500]] * 255).round().astype(np.uint8),
        x_tr[tr_ids[:500]].reshape(500, -1),
    )


def test_heart_private_split_does_not_depend_on_seed(data_dir):
    _check_fixed_division(load_heart_task, data_dir=data_dir)

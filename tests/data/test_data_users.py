"""User ids, user-boundary splits and the refusal of record-level splits of user data."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaudit.data import load_dataset
from dpaudit.data.base import PreparedDataset
from dpaudit.data.splits import split_counts, split_indices, train_val_indices
from dpaudit.data.users import (
    USER_SPLIT_PERCENT,
    attach_user_ids,
    check_user_split,
    index_users,
    load_user_ids,
    split_by_users,
    unsplit,
)
from dpaudit.errors import DataError, UsageError


def test_index_users_first_appearance_order():
    ids = np.array([5, 5, 3, 9, 3, 5, 1])
    ix = index_users(ids)
    assert ix.ids.tolist() == [5, 3, 9, 1]
    assert ix.counts.tolist() == [3, 2, 1, 1]
    assert ix.offsets.tolist() == [0, 3, 5, 6, 7]
    assert ix.order.tolist() == [0, 1, 5, 2, 4, 3, 6]
    # each user's slice of `order` holds exactly the records carrying its id, ascending
    for u in range(ix.n_users):
        recs = ix.order[ix.offsets[u] : ix.offsets[u + 1]]
        assert recs.tolist() == np.flatnonzero(ids == ix.ids[u]).tolist()


def test_index_users_singletons_are_records():
    ids = np.array([40, 7, 13, 2])  # distinct ids, any values: user u is record u
    ix = index_users(ids)
    assert ix.order.tolist() == [0, 1, 2, 3] and ix.counts.tolist() == [1, 1, 1, 1]


def test_index_users_strings_and_refusals():
    ix = index_users(np.array(["bob", "al", "bob"]))
    assert ix.ids.tolist() == ["bob", "al"] and ix.counts.tolist() == [2, 1]
    with pytest.raises(DataError, match="integer or string"):
        index_users(np.array([1.0, 2.0]))
    with pytest.raises(DataError, match="1-D"):
        index_users(np.zeros((2, 2), dtype=int))
    with pytest.raises(DataError, match="at least one id"):
        index_users(np.array([], dtype=int))


def test_split_by_users_integer_cut_points_and_reproducible():
    ids = np.repeat(np.arange(103), 1 + np.arange(103) % 4)  # 103 users, 1-4 records each
    tr, va, te = split_by_users(ids, split_seed=7)
    n_tr, n_va, n_te = split_counts(103, *USER_SPLIT_PERCENT)
    assert [np.unique(ids[p]).size for p in (tr, va, te)] == [n_tr, n_va, n_te] == [72, 15, 16]
    assert np.array_equal(np.sort(np.concatenate([tr, va, te])), np.arange(ids.size))
    for p in (
        tr,
        va,
        te,
    ):  # records listed user by user, each user's records contiguous and ascending
        u = ids[p]
        starts = np.flatnonzero(np.r_[True, u[1:] != u[:-1]])
        assert np.unique(u).size == starts.size
        assert np.all(np.diff(p)[u[1:] == u[:-1]] > 0)
    again = split_by_users(ids, split_seed=7)
    assert all(np.array_equal(a, b) for a, b in zip((tr, va, te), again))
    other = split_by_users(ids, split_seed=8)
    assert not np.array_equal(tr, other[0])
    check_user_split(ids[tr], ids[va], ids[te])


@pytest.mark.parametrize("n,seed", [(1797, 2026), (303, 5), (10, 0)])
def test_split_by_users_with_singleton_users_is_the_record_split(n, seed):
    ids = np.random.default_rng(seed).permutation(10 * n)[:n]  # distinct ids, arbitrary values
    for ours, ref in zip(split_by_users(ids, split_seed=seed), split_indices(n, seed, 70, 15)):
        assert np.array_equal(ours, ref)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(0, 30), min_size=1, max_size=200),
    st.integers(0, 2**32),
    st.integers(0, 100),
)
def test_split_by_users_never_splits_a_user(raw, seed, train_percent):
    ids = np.array(raw)
    val_percent = (100 - train_percent) // 2
    parts = split_by_users(
        ids, split_seed=seed, train_percent=train_percent, val_percent=val_percent
    )
    assert sum(p.size for p in parts) == ids.size
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(ids.size))
    sets = [set(ids[p].tolist()) for p in parts]
    assert not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2])
    n_users = np.unique(ids).size
    assert len(sets[0]) == (train_percent * n_users) // 100


def test_check_user_split_refuses_shared_users():
    with pytest.raises(DataError, match="partitions train and test share 1 user"):
        check_user_split(np.array([1, 2, 3]), np.array([4]), np.array([3, 5]))
    with pytest.raises(DataError, match="train and val share 2 user"):
        check_user_split(np.array(["a", "b"]), np.array(["b", "a"]))
    check_user_split(np.array([1, 2]), np.array([3]), np.array([], dtype=int))


def _digits():
    return load_dataset("digits")


@pytest.mark.parametrize("name", ["digits", "breast-cancer"])
def test_unsplit_inverts_the_registry_split(name):
    ds = load_dataset(name)
    x, y = unsplit(ds)
    tr, va, te = split_indices(len(y), ds.split_seed, 70, 15)
    for idx, part in zip((tr, va, te), ("train", "val", "test")):
        assert np.array_equal(x[idx], getattr(ds, f"x_{part}"))
        assert np.array_equal(y[idx], getattr(ds, f"y_{part}"))


def test_unsplit_inverts_the_registry_split_heart(data_dir):
    ds = load_dataset("heart", data_dir=data_dir)
    x, y = unsplit(ds)
    tr, va, te = split_indices(len(y), ds.split_seed, 70, 15)
    assert np.array_equal(x[tr], ds.x_train) and np.array_equal(y[te], ds.y_test)


def test_unsplit_official_test_rule():
    rng = np.random.default_rng(0)
    x_off, y_off = rng.normal(size=(40, 3)).astype(np.float32), rng.integers(0, 10, 40)
    x_te, y_te = rng.normal(size=(6, 3)).astype(np.float32), rng.integers(0, 10, 6)
    tr, va = train_val_indices(40, 11, 85)
    ds = PreparedDataset(
        "mnist", "image", x_off[tr], y_off[tr], x_off[va], y_off[va], x_te, y_te, 10, 11
    )
    x, y = unsplit(ds)
    assert np.array_equal(x, np.concatenate([x_off, x_te])) and np.array_equal(
        y, np.concatenate([y_off, y_te])
    )


def test_attach_user_ids_resplits_by_users():
    ds = _digits()
    n = sum(len(p) for p in (ds.y_train, ds.y_val, ds.y_test))
    ids = np.arange(n) // 3  # 3 consecutive rows per user (loader order)
    du = attach_user_ids(ds, ids)
    x, y = unsplit(ds)
    tr, va, te = split_by_users(ids, split_seed=ds.split_seed)
    assert np.array_equal(du.x_train, x[tr]) and np.array_equal(du.y_test, y[te])
    assert np.array_equal(du.user_ids["train"], ids[tr])
    check_user_split(du.user_ids["train"], du.user_ids["val"], du.user_ids["test"])
    ident = du.identity()
    assert ident["n_users"] == {
        "val": np.unique(ids[va]).size,
        "test": np.unique(ids[te]).size,
    }  # the training count is private
    # who the users are is never published (a hash of the ids would tell neighbours apart): only counts
    assert (
        "user_ids_sha256" not in ident
        and isinstance(du.user_ids_sha256, str)
        and ds.user_ids_sha256 is None
    )
    with pytest.raises(DataError, match="already split by users"):
        attach_user_ids(du, ids)


def test_attach_user_ids_refuses_record_level_split_and_partial_ids():
    ds = _digits()
    # ids per partition of the *record* split: users straddle train and test -> refused
    n = sum(len(p) for p in (ds.y_train, ds.y_val, ds.y_test))
    ids = np.arange(n) // 3
    tr, va, te = split_indices(n, ds.split_seed, 70, 15)
    with pytest.raises(DataError, match="must be split by users, not by records"):
        attach_user_ids(ds, {"train": ids[tr], "val": ids[va], "test": ids[te]})
    with pytest.raises(DataError, match="user_ids for partition val are missing"):
        attach_user_ids(ds, {"train": np.arange(len(ds.y_train))})
    with pytest.raises(DataError, match="one id per row of dataset digits before splitting"):
        attach_user_ids(ds, np.arange(len(ds.y_train)))
    with pytest.raises(UsageError, match="user_ids must map train"):
        attach_user_ids(ds, {"training": ids})
    # disjoint per-partition ids are accepted as they are
    ok = {
        "train": np.arange(len(ds.y_train)),
        "val": -1 - np.arange(len(ds.y_val)),
        "test": 10**6 + np.arange(len(ds.y_test)),
    }
    du = attach_user_ids(ds, ok)
    assert np.array_equal(du.x_train, ds.x_train) and du.user_ids["val"][0] == -1


def test_load_user_ids(tmp_path):
    p = tmp_path / "ids.npy"
    np.save(p, np.array([3, 1, 3]))
    assert load_user_ids(p).tolist() == [3, 1, 3]
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(DataError, match="without pickles"):
        load_user_ids(tmp_path / "obj.npy")
    np.save(tmp_path / "f.npy", np.array([1.5, 2.0]))
    with pytest.raises(DataError, match="integer or string"):
        load_user_ids(tmp_path / "f.npy")
    with pytest.raises(DataError, match="not found"):
        load_user_ids(tmp_path / "missing.npy")
    (tmp_path / "junk.npy").write_bytes(b"not numpy")
    with pytest.raises(DataError, match="not a readable"):
        load_user_ids(tmp_path / "junk.npy")


def test_prepared_dataset_field_is_optional():
    ds = _digits()
    assert ds.user_ids is None
    assert dataclasses.replace(ds, notes="x").identity().keys() == ds.identity().keys()

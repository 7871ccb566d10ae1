"""``with_users``: the one rule by which a user-level audit and a user-level audit's plan find their users."""

from __future__ import annotations

import numpy as np

from dpaudit.data import load_dataset
from dpaudit.data.users import n_rows
from dpaudit.mechanisms.dpsgd.user_head_audit import synthetic_user_ids, with_users


def test_users_come_from_the_data_then_the_given_ids_then_the_public_grouping(tmp_path):
    data = load_dataset("digits")
    ids = np.arange(n_rows(data)) // 5
    given, how_given = with_users(data, ids, 3, seed=1)
    assert how_given == "given user ids" and given.user_ids is not None
    path = tmp_path / "ids.npy"
    np.save(path, ids)
    from_file, _ = with_users(data, str(path), 3, seed=1)
    assert all(np.array_equal(from_file.user_ids[p], given.user_ids[p]) for p in given.user_ids)
    # a dataset already split by users keeps its own ids, whatever else is given
    kept, how_kept = with_users(given, np.zeros(n_rows(data), dtype=np.int64), 3, seed=1)
    assert kept is given and how_kept == "user ids of the prepared dataset"
    grouped, how_grouped = with_users(data, None, 3, seed=1)
    assert how_grouped.startswith("synthetic: all rows grouped into users of 3")
    expected, _ = with_users(data, synthetic_user_ids(n_rows(data), 3, 1), 3, seed=1)
    assert all(np.array_equal(grouped.user_ids[p], expected.user_ids[p]) for p in expected.user_ids)

"""User ids per record, user-boundary splits, and the record grouping user-level DP-SGD uses.

User-level DP (DP-MixMin paper, section 2 and appendix A.9; McMahan et al. 2018) protects all records of one user: neighbouring
datasets differ by the whole contribution D_u of one user (adjacency ``add-remove-user``). Two consequences for the data side:

- **Splits follow user boundaries** (paper 000, section 2: post-processing and parallel composition hold for user-level DP
  only then): :func:`split_by_users` cuts a public, seeded permutation of the users with the record split's rule and generator
  (with one record per user it *is* the record split); :func:`check_user_split` refuses partitions that share a user.
- **User ids are given by the analyst** (a ``user_ids`` array with one id per record).

Loader order: ``--user-ids FILE.npy`` holds one id per row of the dataset *before* splitting, in the order
:func:`dpaudit.data.load_dataset` reads the rows: the official training rows then the official test rows for MNIST / CIFAR-10, the
file order for every other dataset. :func:`unsplit` restores that order from a prepared dataset by inverting the public record
split (the inverse is pinned by a test that re-splits and compares). A user-level dataset is always re-split 70 / 15 / 15 *by
users* (:data:`USER_SPLIT_PERCENT`), including MNIST / CIFAR-10, whose official test set may share users with the training rows.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError, UsageError
from ..lazy import lazy_import
from ..validation import non_negative_int
from .base import PreparedDataset, partitions
from .rows import RowSet
from .splits import permutation, split_counts, split_indices, train_val_indices

np = lazy_import("numpy")

#: (train_percent, val_percent) of users for a user-level split; the test part is the remainder.
USER_SPLIT_PERCENT = (70, 15)

#: Datasets whose test partition is an official test set (loader order: train rows, then test).
OFFICIAL_TEST_DATASETS = ("mnist", "cifar10")
#: Percent of the official training rows kept for training in their record split.
OFFICIAL_TRAIN_PERCENT = 85

PARTITIONS = ("train", "val", "test")


# ---------------------------------------------------------------- ids and grouping


def as_user_ids(user_ids, name: str = "user_ids") -> np.ndarray:
    """``user_ids`` as a 1-D integer or string array (one id per record). Floating-point ids are refused (NaN is not equal to
    itself and 1.0 vs 1 is ambiguous), as are object arrays: convert ids to integers or strings first."""
    a = np.asarray(user_ids)
    if a.ndim != 1:
        raise DataError(f"{name} must be a 1-D array with one id per record, got shape {a.shape}.")
    if a.dtype.kind not in "iuUS":
        raise DataError(f"{name} must be an integer or string array, got dtype {a.dtype}.")
    return a


@dataclass(frozen=True)
class UserIndex:
    """Records grouped by user; users numbered 0..n_users-1 in order of first appearance. ``order`` lists record indices grouped
    by user (user 0's records first, each user's records in ascending record order), ``offsets[u]:offsets[u+1]`` is user u's slice
    of ``order``, and ``ids[u]`` is user u's id. With one record per user, user u is record u, so Poisson sampling of users is
    Poisson sampling of records (what makes user-level DP-SGD with G = 1 and singleton users bit-identical to record-level
    DP-SGD)."""

    ids: np.ndarray
    order: np.ndarray
    offsets: np.ndarray

    @property
    def n_users(self) -> int:
        return int(self.ids.shape[0])

    @property
    def n_records(self) -> int:
        return int(self.order.shape[0])

    @property
    def counts(self) -> np.ndarray:
        """|D_u| for every user (int64)."""
        return np.diff(self.offsets)

    def describe(self) -> dict:
        c = self.counts
        return {
            "n_users": self.n_users,
            "n_records": self.n_records,
            "records_per_user_min": int(c.min()),
            "records_per_user_max": int(c.max()),
            "records_per_user_mean": float(c.mean()),
        }


def index_users(user_ids) -> UserIndex:
    """Group records by user id (users in order of first appearance). No Python loop over users."""
    ids = as_user_ids(user_ids)
    if ids.size == 0:
        raise DataError("user_ids must hold at least one id, got an empty array.")
    uniq, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    # unique-sorted position -> rank of first appearance
    by_first = np.argsort(first, kind="stable")
    rank = np.empty_like(by_first)
    rank[by_first] = np.arange(by_first.size)
    user = rank[inverse.reshape(-1)].astype(np.int64)
    order = np.argsort(user, kind="stable").astype(np.int64)
    counts = np.bincount(user, minlength=by_first.size)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return UserIndex(ids=uniq[by_first], order=order, offsets=offsets)


# ---------------------------------------------------------------- splits


def split_by_users(
    user_ids,
    *,
    split_seed: int,
    train_percent: int = USER_SPLIT_PERCENT[0],
    val_percent: int = USER_SPLIT_PERCENT[1],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Record index arrays (train, val, test) of a split along user boundaries: the users (numbered by first appearance) are
    split by the record split's rule and generator (:mod:`dpaudit.data.splits`), and every record follows its user, listed user
    by user in permuted order. With one record per user the result *is* :func:`~dpaudit.data.splits.split_indices`."""
    split_seed = non_negative_int("split_seed", split_seed)
    index = index_users(user_ids)
    try:
        n_tr, n_va, _ = split_counts(index.n_users, int(train_percent), int(val_percent))
    except ValueError:
        raise UsageError(
            f"train_percent and val_percent must be integers with sum <= 100, got {train_percent} and {val_percent}."
        ) from None
    perm = permutation(index.n_users, split_seed)
    counts = index.counts

    def records_of(users: np.ndarray) -> np.ndarray:
        k = counts[users]
        first = np.cumsum(k) - k
        local = np.arange(int(k.sum()), dtype=np.int64) - np.repeat(first, k)
        return index.order[np.repeat(index.offsets[users], k) + local]

    return (
        records_of(perm[:n_tr]),
        records_of(perm[n_tr : n_tr + n_va]),
        records_of(perm[n_tr + n_va :]),
    )


def check_user_split(train_ids, val_ids=None, test_ids=None) -> None:
    """Refuse partitions that share a user (a record-level split of user data; see the module docstring)."""
    parts = {"train": as_user_ids(train_ids, "train user_ids")}
    for name, ids in (("val", val_ids), ("test", test_ids)):
        if ids is not None:
            parts[name] = as_user_ids(ids, f"{name} user_ids")
    for a, b in itertools.combinations(parts, 2):
        if parts[a].size == 0 or parts[b].size == 0:
            continue
        kinds = {parts[a].dtype.kind, parts[b].dtype.kind}
        if len(kinds) > 1 and kinds - {"i", "u"}:  # integers of any width compare; others do not
            raise DataError(
                f"user ids of {a} and {b} must have the same kind (integer or string), got {parts[a].dtype} and {parts[b].dtype}."
            )
        shared = np.intersect1d(parts[a], parts[b])
        if shared.size:
            raise DataError(
                f"partitions {a} and {b} share {shared.size} user(s) (e.g. {shared[0]!r}): user-level data must be split "
                "by users, not by records (use dpaudit.data.users.split_by_users)."
            )


# ---------------------------------------------------------------- prepared datasets


def unsplit(prepared: PreparedDataset) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of every row of a registry dataset, in loader order (before its record split). Inverts the public split of
    :mod:`dpaudit.data.registry`: ``split_indices(n, seed, 70, 15)`` for tabular data and digits;
    ``train_val_indices(n_official_train, seed, 85)`` followed by the official test rows for MNIST / CIFAR-10."""
    if prepared.user_ids is not None:
        raise DataError(
            f"dataset {prepared.name} is already split by users; user ids cannot be attached again."
        )
    seed = int(prepared.split_seed)
    x_parts = (prepared.x_train, prepared.x_val, prepared.x_test)
    y_parts = (prepared.y_train, prepared.y_val, prepared.y_test)
    n = sum(len(p) for p in y_parts)
    if prepared.name in OFFICIAL_TEST_DATASETS:  # the official test rows follow the training rows
        n_off = len(prepared.y_train) + len(prepared.y_val)
        (tr, va), te = train_val_indices(n_off, seed, OFFICIAL_TRAIN_PERCENT), np.arange(n_off, n)
    else:
        tr, va, te = split_indices(n, seed, 70, 15)
    if (len(tr), len(va), len(te)) != tuple(len(p) for p in y_parts):
        raise DataError(
            f"dataset {prepared.name} was not split by the registry rule; pass per-partition user ids."
        )
    x = np.empty((n,) + prepared.x_train.shape[1:], dtype=prepared.x_train.dtype)
    y = np.empty(n, dtype=prepared.y_train.dtype)
    for idx, xp, yp in zip((tr, va, te), x_parts, y_parts):
        x[idx], y[idx] = xp, yp
    return x, y


def n_rows(prepared: PreparedDataset) -> int:
    """Rows of the dataset before splitting (all partitions)."""
    return sum(int(len(p)) for p in (prepared.y_train, prepared.y_val, prepared.y_test))


def split_prepared_by_users(
    prepared: PreparedDataset,
    user_ids,
    *,
    split_seed: int | None = None,
    train_percent: int = USER_SPLIT_PERCENT[0],
    val_percent: int = USER_SPLIT_PERCENT[1],
) -> PreparedDataset:
    """Re-split a registry dataset along user boundaries. ``user_ids`` holds one id per row in loader order (see the module
    docstring). All rows are pooled and split with :func:`split_by_users` (``split_seed`` defaults to the dataset's). The result
    carries ``user_ids`` per partition and notes how it was split."""
    ids = as_user_ids(user_ids)
    total = n_rows(prepared)
    if ids.shape[0] != total:
        raise DataError(
            f"user_ids must hold one id per row of dataset {prepared.name} before splitting ({total} rows), got {ids.shape[0]}."
        )
    seed = int(prepared.split_seed if split_seed is None else split_seed)
    x, y = unsplit(prepared)
    tr, va, te = split_by_users(
        ids, split_seed=seed, train_percent=train_percent, val_percent=val_percent
    )
    if tr.size == 0:
        raise DataError(
            f"the user split of dataset {prepared.name} left no user in the training partition ({index_users(ids).n_users} users)."
        )
    note = (
        f"re-split {train_percent}/{val_percent}/{100 - train_percent - val_percent} by users "
        "(seeded permutation of users, integer cut points)"
    )
    return dataclasses.replace(
        prepared,
        **partitions(x, y, tr, va, te),
        split_seed=seed,
        user_ids={"train": ids[tr], "val": ids[va], "test": ids[te]},
        notes=(prepared.notes + " " if prepared.notes else "") + note + ".",
        # Re-split: which source rows train reads is not tracked; the ledger counts every row of the source as read privately
        # (fail closed).
        rows=tuple(RowSet(r.source, "private", None) for r in prepared.rows if r.role == "private"),
    )


def attach_user_ids(
    prepared: PreparedDataset, user_ids, *, split_seed: int | None = None
) -> PreparedDataset:
    """A prepared dataset with user ids, split along user boundaries. ``user_ids`` is either a mapping ``{"train": ..., "val":
    ..., "test": ...}`` with one id per row of each partition (checked: no user in two partitions), or one array with an id per
    row of the dataset before splitting (then re-split by users, :func:`split_prepared_by_users`). An array holding ids for the
    training partition only is refused: nothing would show that validation and test hold other users."""
    if isinstance(user_ids, dict):
        unknown = set(user_ids) - set(PARTITIONS)
        if unknown or "train" not in user_ids:
            raise UsageError(
                f"user_ids must map train (and optionally val, test) to arrays, got keys {sorted(user_ids)!r}."
            )
        out = {}
        for p in PARTITIONS:
            n = len(getattr(prepared, f"y_{p}"))
            ids = user_ids.get(p)
            if ids is None:
                if n:
                    raise DataError(
                        f"user_ids for partition {p} are missing ({n} rows): every partition's users must be known to check the split."
                    )
                ids = np.empty(0, dtype=as_user_ids(user_ids["train"]).dtype)
            ids = as_user_ids(ids, f"{p} user_ids")
            if ids.shape[0] != n:
                raise DataError(f"{p} user_ids must hold one id per row ({n}), got {ids.shape[0]}.")
            out[p] = ids
        check_user_split(out["train"], out["val"], out["test"])
        if prepared.user_ids is not None:
            raise DataError(f"dataset {prepared.name} already carries user ids.")
        return dataclasses.replace(prepared, user_ids=out)
    return split_prepared_by_users(prepared, user_ids, split_seed=split_seed)


def load_user_ids(path: str | os.PathLike) -> np.ndarray:
    """Read a ``.npy`` file of user ids (one per row; integers or strings; no pickles)."""
    p = Path(path)
    try:
        a = np.load(p, allow_pickle=False)
    except FileNotFoundError:
        raise DataError(f"user ids file not found: {p}.") from None
    except (ValueError, OSError) as e:
        raise DataError(
            f"user ids file {p} is not a readable .npy array without pickles: {str(e).splitlines()[0]}."
        ) from None
    if isinstance(a, np.lib.npyio.NpzFile):  # pragma: no cover - np.load of .npz
        raise DataError(f"user ids file {p} must be a .npy array, got an .npz archive.")
    return as_user_ids(a, f"user ids in {p.name}")

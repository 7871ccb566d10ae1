"""array_sha256 (a dataset's identity, compared against the ledger's recorded digests) hashes
exactly dtype, shape and the bytes of ``tobytes()``, whatever the array's layout or size."""

from __future__ import annotations

import hashlib

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dpaudit.data.base import array_sha256


def _reference(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(str(a.dtype).encode() + str(a.shape).encode() + a.tobytes())
    return h.hexdigest()


DTYPES = st.sampled_from(["float32", "float64", "int64", ">i4", "uint8", "bool"])


@settings(max_examples=60, deadline=None)
@given(
    dt=DTYPES,
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5),
    data=st.data(),
    order=st.sampled_from(["C", "F", "strided"]),
)
def test_digest_is_dtype_shape_and_tobytes(dt, shape, data, order):
    a = data.draw(hnp.arrays(np.dtype(dt), shape))
    if order == "F":
        a = np.asfortranarray(a)
    elif order == "strided" and a.ndim:
        a = a[::2]
    assert array_sha256(a, a.T) == _reference(np.ascontiguousarray(a), np.ascontiguousarray(a.T))


def test_known_digest():
    # Pinned: a change of the format would make every recorded dataset digest differ.
    assert (
        array_sha256(np.arange(6, dtype=np.float32).reshape(2, 3))
        == "b438c5d786e1b613aa64ec714cb7157d230f98c8d68854da82b4f471d73c9acf"
    )
    assert array_sha256(np.zeros(0, dtype=np.int64)) == hashlib.sha256(b"int64(0,)").hexdigest()


def _dataset(**arrays):
    import dataclasses

    from dpaudit.data.base import BackgroundDigest, PreparedDataset

    rng = np.random.default_rng(0)
    six = {
        p + s: rng.random((9, 4)).astype(np.float32) if p == "x" else np.arange(9)
        for s in ("_train", "_val", "_test")
        for p in ("x", "y")
    }
    job = BackgroundDigest()
    for s in ("_train", "_val", "_test"):
        job.add(six["x" + s], six["y" + s])
    data = PreparedDataset("d", "tabular", **six, n_classes=2, split_seed=1, digest_job=job)
    return dataclasses.replace(data, **arrays), six


def test_background_digest_is_array_sha256_of_the_added_arrays():
    data, six = _dataset()
    order = [six[k] for k in ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test")]
    assert data.digest_job.digest_of(order) == array_sha256(*order) == data.sha256


def test_a_dataset_with_other_arrays_is_hashed_anew_not_given_the_loaders_digest():
    # A neighbouring dataset made with dataclasses.replace keeps the loader's job: its digest
    # must be its own (a shared one would merge two datasets' budgets in the ledger).
    x = np.ones((9, 4), dtype=np.float32)
    data, six = _dataset(x_train=x)
    assert data.digest_job.digest_of((x,)) is None
    assert data.sha256 == array_sha256(
        x, *(six[k] for k in ("y_train", "x_val", "y_val", "x_test", "y_test"))
    )
    assert data.sha256 != _dataset()[0].sha256


def test_a_failed_background_update_raises_rather_than_give_a_partial_digest():
    import pytest

    from dpaudit.data.base import BackgroundDigest

    job = BackgroundDigest()
    job.add(np.arange(3), np.array([None], dtype=object))  # object arrays have no bytes to hash
    with pytest.raises(TypeError):
        job.digest_of(job.arrays)

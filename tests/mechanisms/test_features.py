"""FrozenFeatures.transform against the plain formula (x' = x P, z = [x', tanh(x' W + b)], [z, 1]).

The transform writes chunk by chunk into one preallocated array through torch's GEMM; these tests
compare it, in float32 and float64, with a float64 reference written the obvious way.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpaudit.errors import UsageError
from dpaudit.mechanisms.dpsgd.features import FEATURE_KINDS, build_features


def _reference(f, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(z, scale): z in float64 from the formula; scale bounds the rounding of each entry's sums."""
    x = np.asarray(x, dtype=np.float64)
    xr, xr_scale = (
        (x @ f.projection, np.abs(x) @ np.abs(f.projection))
        if f.projection is not None
        else (x, np.abs(x))
    )
    parts, scales = [], []
    if f.direct_link:
        parts.append(xr)
        scales.append(xr_scale)
    if f.weight is not None:
        parts.append(np.tanh(xr @ f.weight + f.bias))
        scales.append(xr_scale @ np.abs(f.weight) + np.abs(f.bias))  # tanh is 1-Lipschitz
    return np.concatenate(parts, axis=1), np.concatenate(scales, axis=1)


@pytest.mark.parametrize("kind", FEATURE_KINDS)
@pytest.mark.parametrize("d", [30, 1100])  # 1100 > 1024: with the Gaussian projection
def test_transform_equals_the_formula_in_float32(kind, d):
    rng = np.random.default_rng(d)
    x = rng.random((37, d), dtype=np.float32)
    f = build_features(kind, d, 5)
    ref, scale = _reference(f, x)
    z = f.transform(x, chunk=16)  # 37 rows: two full chunks and a partial one
    assert z.dtype == np.float32 and z.shape == ref.shape == (37, f.output_dim)
    # float32 sums of up to d + 1 terms: error well below 1e-5 of the sum of magnitudes
    assert np.all(np.abs(z - ref) <= 1e-5 * scale + 1e-7)


@pytest.mark.parametrize("kind", ["rvfl", "elm-sgd", "logistic-projected"])
def test_transform_float64_is_the_formula_and_chunks_do_not_matter(kind):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(23, 1030))
    f = build_features(kind, 1030, 9)
    ref, _ = _reference(f, x)
    z_small = f.transform(x, chunk=5, dtype=np.float64)
    z_big = f.transform(x, dtype=np.float64)
    np.testing.assert_allclose(z_small, ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(z_big, ref, rtol=1e-12, atol=1e-12)


def test_bias_column_appends_ones_and_changes_nothing_else():
    rng = np.random.default_rng(2)
    x = rng.random((50, 784), dtype=np.float32)
    f = build_features("rvfl", 784, 42)
    z = f.transform(x, chunk=16)
    z1 = f.transform(x, chunk=16, bias_column=True)
    assert z1.shape == (50, 985)
    np.testing.assert_array_equal(z1[:, :-1], z)
    np.testing.assert_array_equal(z1[:, -1], np.ones(50, dtype=np.float32))


def test_any_input_layout_and_dtype_gives_the_same_features():
    rng = np.random.default_rng(3)
    x8 = rng.integers(0, 256, size=(40, 64), dtype=np.uint8)
    f = build_features("rvfl", 64, 1)
    base = f.transform(x8.astype(np.float32), chunk=8)
    ro = x8.astype(np.float32)
    ro.flags.writeable = False
    wide = np.zeros((40, 128), dtype=np.float32)
    wide[:, ::2] = x8
    for x in (
        x8,
        x8.astype(np.float64),
        ro,
        wide[:, ::2],
        np.asfortranarray(x8.astype(np.float32)),
    ):
        np.testing.assert_allclose(f.transform(x, chunk=8), base, rtol=0, atol=2e-6)
    assert not ro.flags.writeable  # the input is only read


def test_other_dtypes_are_refused():
    f = build_features("rvfl", 20, 2)
    with pytest.raises(UsageError, match="dtype must be one of float32, float64, got 'float16'"):
        f.transform(np.zeros((3, 20)), dtype=np.float16)


@pytest.mark.parametrize("kind", FEATURE_KINDS)
def test_feature_dim_matches_the_built_features(kind):
    # The plan counts the noised head weights from public dimensions (so the sampler-tail
    # check runs before anything is reserved); it must equal what the run builds.
    from dpaudit.mechanisms.dpsgd.features import PROJECTION_THRESHOLD, feature_dim

    for n_inputs in (13, PROJECTION_THRESHOLD + 1):
        assert feature_dim(kind, n_inputs) == build_features(kind, n_inputs, seed=1).output_dim

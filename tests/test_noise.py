"""Noise sources: secrecy of the default stream, reproducibility on request, the ChaCha20 stream,
and distribution tests (Kolmogorov-Smirnov, moments) of every sampler on every source."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dpaudit import noise as noise_mod
from dpaudit.errors import UsageError
from dpaudit.noise import NOISE_SOURCES, NoiseSource, public_rng

KEY = bytes(range(32))
N = 20_000
P_MIN = 1e-3  # fixed seeds / keys: a deterministic test, not a flaky one


def fixed_sources() -> dict[str, NoiseSource]:
    """One source of each kind with fixed randomness (os-entropy shares reproducible's code path)."""
    return {
        "reproducible": NoiseSource("reproducible", seed=7),
        "cryptographic": NoiseSource._cryptographic_with_key(KEY),
    }


SOURCE_KINDS = ["reproducible", "cryptographic"]


def test_source_names_and_specs():
    assert NOISE_SOURCES == ("os-entropy", "reproducible", "cryptographic", "reproducible-secret")
    assert NoiseSource().spec.to_dict()["secret"] is True
    assert NoiseSource().spec.seed is None
    r = NoiseSource("reproducible", seed=3).spec.to_dict()
    assert r["source"] == "reproducible" and r["seed"] == 3 and r["secret"] is False
    c = NoiseSource("cryptographic").spec.to_dict()
    assert (
        c["source"] == "cryptographic"
        and c["seed"] is None
        and c["secret"] is True
        and "ChaCha20" in c["generator"]
    )
    # a secret noise seed: reproducible, never recorded, its own stream
    s = NoiseSource("reproducible-secret", seed=2**200 + 3).spec.to_dict()
    assert s["seed"] is None and s["secret"] is True and s["reproducible"] == "secret-seed"
    a, b = NoiseSource("reproducible-secret", seed=3), NoiseSource("reproducible-secret", seed=3)
    assert np.array_equal(a.gaussian_numpy(8, 1.0), b.gaussian_numpy(8, 1.0))
    assert not np.array_equal(
        NoiseSource("reproducible-secret", seed=3).gaussian_numpy(8, 1.0),
        NoiseSource("reproducible", seed=3).gaussian_numpy(8, 1.0),
    )
    with pytest.raises(UsageError, match="noise_source must be one of"):
        NoiseSource("pcg")
    with pytest.raises(ValueError):
        NoiseSource("reproducible")


def test_chacha20_stream_is_the_rfc8439_keystream():
    # RFC 8439, appendix A.1, test vector 1: all-zero key, nonce and counter.
    expected = bytes.fromhex(
        "76b8e0ada0f13d90405d6ae55386bd28bdd219b8a08ded1aa836efcc8b770dc7"
        "da41597c5157488d7724e03fb8d84a376a43b8f41518a11cc387b669b2ee6586"
    )
    s = noise_mod._ChaCha20Stream(key=bytes(32))
    assert s.read(10) + s.read(54) == expected  # split reads continue the same stream


def test_chacha20_rekeys_before_the_counter_can_wrap(monkeypatch):
    monkeypatch.setattr(noise_mod, "_REKEY_BYTES", 64)
    s = noise_mod._ChaCha20Stream()
    first = s.read(64)
    second = s.read(64)  # forces a fresh os.urandom key
    assert len(second) == 64 and first != second
    assert s._used == 64


def test_default_noise_is_not_determined_by_the_seed():
    a, b = NoiseSource("os-entropy"), NoiseSource("os-entropy")
    assert not np.array_equal(a.gaussian_numpy(16, 1.0), b.gaussian_numpy(16, 1.0))
    c, d = NoiseSource("cryptographic"), NoiseSource("cryptographic")
    assert c.random_bytes(32) != d.random_bytes(32)


def test_reproducible_noise_is_determined_by_the_seed_and_differs_from_the_public_stream():
    a, b = NoiseSource("reproducible", seed=5), NoiseSource("reproducible", seed=5)
    for f in (
        lambda s: s.gaussian_numpy(8, 1.0),
        lambda s: s.laplace(8, 1.0),
        lambda s: s.poisson_mask(64, 0.5),
        lambda s: s.gaussian_torch((4,), 1.0).numpy(),
        lambda s: np.frombuffer(s.random_bytes(16), np.uint8),
    ):
        assert np.array_equal(f(a), f(b))
    assert not np.array_equal(
        NoiseSource("reproducible", seed=6).gaussian_numpy(8, 1.0),
        NoiseSource("reproducible", seed=5).gaussian_numpy(8, 1.0),
    )
    assert not np.array_equal(
        NoiseSource("reproducible", seed=5).numpy.random(8), public_rng(5).random(8)
    )


def test_fixed_key_cryptographic_source_is_deterministic():
    a, b = NoiseSource._cryptographic_with_key(KEY), NoiseSource._cryptographic_with_key(KEY)
    assert np.array_equal(a.gaussian_numpy(9, 2.0), b.gaussian_numpy(9, 2.0))
    assert np.array_equal(a.laplace(9, 2.0), b.laplace(9, 2.0))


@pytest.mark.parametrize("kind", SOURCE_KINDS)
def test_uniform_has_53_bit_resolution_and_range(kind):
    u = fixed_sources()[kind].uniform((100, 50))
    assert u.shape == (100, 50) and u.dtype == np.float64
    assert u.min() >= 0.0 and u.max() < 1.0
    k = u * 2.0**53
    assert np.array_equal(k, np.floor(k))
    assert stats.kstest(u.ravel(), "uniform").pvalue > P_MIN


@pytest.mark.parametrize("kind", SOURCE_KINDS)
@pytest.mark.parametrize("std", [1.0, 3.5])
def test_gaussian_numpy_ks_and_moments(kind, std):
    z = fixed_sources()[kind].gaussian_numpy(N, std)
    assert z.shape == (N,) and z.dtype == np.float64
    assert stats.kstest(z, "norm", args=(0.0, std)).pvalue > P_MIN
    se = std / np.sqrt(N)
    assert abs(z.mean()) < 5 * se
    assert abs(z.var() / std**2 - 1.0) < 5 * np.sqrt(2.0 / N)
    assert abs(stats.kurtosis(z, fisher=False) - 3.0) < 5 * np.sqrt(24.0 / N)
    assert abs(stats.skew(z)) < 5 * np.sqrt(6.0 / N)


@pytest.mark.parametrize("kind", SOURCE_KINDS)
def test_gaussian_torch_ks_dtype_and_shape(kind):
    t = fixed_sources()[kind].gaussian_torch((100, 200), 2.0, dtype=torch.float64)
    assert t.shape == (100, 200) and t.dtype == torch.float64
    assert stats.kstest(t.numpy().ravel(), "norm", args=(0.0, 2.0)).pvalue > P_MIN
    assert fixed_sources()[kind].gaussian_torch((3,), 1.0).dtype == torch.float32


@pytest.mark.parametrize("kind", SOURCE_KINDS)
@pytest.mark.parametrize("scale", [0.5, 60.0])
def test_textbook_laplace_ks_and_moments(kind, scale):
    x = fixed_sources()[kind].laplace(N, scale)
    assert np.all(np.isfinite(x))
    assert stats.kstest(x, "laplace", args=(0.0, scale)).pvalue > P_MIN
    # Laplace(b): mean 0, variance 2 b^2, kurtosis 6; var of the sample variance = (kurt - 1) var^2 / n.
    assert abs(x.mean()) < 5 * np.sqrt(2 * scale**2 / N)
    assert abs(x.var() / (2 * scale**2) - 1.0) < 5 * np.sqrt(5.0 / N)


def test_textbook_laplace_has_no_infinite_tail():
    # The extreme uniforms map to finite values: |x| <= b * ln(2^53).
    src = NoiseSource("reproducible", seed=0)
    src.numpy = type(
        "Fixed",
        (),
        {"integers": staticmethod(lambda lo, hi, size, dtype: np.array([0, hi - 1], dtype=dtype))},
    )()
    x = src.laplace(2, 1.0)
    assert np.all(np.isfinite(x)) and np.all(np.abs(x) <= 53 * np.log(2) + 1e-9)


@pytest.mark.parametrize("kind", SOURCE_KINDS)
@pytest.mark.parametrize("q", [0.005, 0.3])
def test_poisson_mask_rate(kind, q):
    m = fixed_sources()[kind].poisson_mask(200_000, q)
    assert m.dtype == bool and m.shape == (200_000,)
    assert stats.binomtest(int(m.sum()), m.size, q).pvalue > P_MIN


def test_os_entropy_samplers_moments():
    # Not seedable by design; same generator code as "reproducible". Loose 6-sigma bounds.
    src = NoiseSource()
    z = src.gaussian_numpy(N, 1.0)
    assert abs(z.mean()) < 6 / np.sqrt(N) and abs(z.var() - 1) < 6 * np.sqrt(2 / N)
    x = src.laplace(N, 1.0)
    assert abs(x.mean()) < 6 * np.sqrt(2 / N) and abs(x.var() / 2 - 1) < 6 * np.sqrt(5 / N)


def test_random_bytes_uniform_and_aux_seed():
    for src in fixed_sources().values():
        b = np.frombuffer(src.random_bytes(51_200), dtype=np.uint8)
        counts = np.bincount(b, minlength=256)
        assert stats.chisquare(counts).pvalue > P_MIN
        s = src.aux_seed()
        assert 0 <= s < 2**63


@settings(max_examples=25, deadline=None)
@given(shape=st.one_of(st.integers(0, 7), st.lists(st.integers(0, 4), min_size=0, max_size=3)))
def test_shapes_are_respected_by_every_sampler(shape):
    for src in fixed_sources().values():
        expect = (shape,) if isinstance(shape, int) else tuple(shape)
        assert src.uniform(shape).shape == expect
        assert src.gaussian_numpy(shape, 1.0).shape == expect
        assert src.laplace(shape, 1.0).shape == expect
        assert tuple(src.gaussian_torch(expect, 1.0).shape) == expect

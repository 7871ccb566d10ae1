"""The Gaussian sampler of every DP path has a known, documented truncation
radius, its tail delta is accounted for, and it is N(0, 1).

The first two tests are the evidence against the old code: torch's float32 ``randn`` (the old DP
noise path) is Box–Muller on a 24-bit grid, so its radius is capped at sqrt(48 ln 2) = 5.768;
the default DP noise path must reach the documented radius sqrt(212 ln 2) = 12.12 when its
uniform generator produces its extreme values. Only ``NoiseSource`` and the trainers' filler are
imported at module level, so on the old code the second test fails by its assertion.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dpaudit.mechanisms.dpsgd.core import gaussian_filler
from dpaudit.noise import NoiseSource

#: Independent of the code under test: radius of u1 = 2^-106 (53 bits, lowest cell refined).
DOCUMENTED_RADIUS = math.sqrt(212.0 * math.log(2.0))
#: torch.randn float32: u1 = 1 - k 2^-24 >= 2^-24, radius sqrt(48 ln 2).
TORCH_FLOAT32_RADIUS = math.sqrt(48.0 * math.log(2.0))


class _ExtremeStream:
    """A keystream that always returns all-one bits: every uniform at its largest value k = 2^b - 1,
    i.e. u1 at its smallest (2^-53, then refined to 2^-106) and u2 just below 1 (angle ~ 2 pi)."""

    def read_into(self, buf):
        buf.view(np.uint8)[...] = 0xFF
        return buf

    def uint64(self, count):
        return self.read_into(np.empty(count, dtype=np.uint64))


def test_torch_randn_float32_is_box_muller_on_a_24_bit_grid():
    """The old DP noise path. For >= 16 values torch pairs z[j] and z[j + 8] of each block of 16
    (r cos, r sin with r^2 = -2 ln(1 - u), u = k 2^-24): for small radii 2^24 (1 - exp(-r^2/2))
    is within rounding of an integer, which it would not be for finer uniforms, so every radius is
    at most sqrt(-2 ln 2^-24) = 5.768."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(1 << 21, generator=g, dtype=torch.float32).double().numpy().reshape(-1, 2, 8)
    r2 = z[:, 0, :] ** 2 + z[:, 1, :] ** 2
    k = -np.expm1(-r2 / 2.0) * 2.0**24  # = k when u = k 2^-24
    small = k < 400  # where float32 rounding of z still resolves the grid
    assert small.sum() > 20
    assert np.all(np.abs(k[small] - np.round(k[small])) < 0.05)
    # a 53-bit sampler would put these fractional parts anywhere: check the test can tell
    u53 = np.random.default_rng(0).random(small.sum()) * 400
    assert np.mean(np.abs(u53 - np.round(u53)) < 0.05) < 0.3
    assert (
        math.sqrt(-2.0 * math.log(2.0**-24))
        == pytest.approx(TORCH_FLOAT32_RADIUS)
        == pytest.approx(5.768, abs=1e-3)
    )
    assert np.sqrt(r2).max() <= TORCH_FLOAT32_RADIUS


@pytest.mark.parametrize("kind", ["reproducible", "os-entropy", "cryptographic"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_default_dp_noise_path_reaches_the_documented_radius(kind, dtype):
    """Feed the source's uniform generator its extreme output: the trainers' noise (the filler used
    by every DP-SGD loop) and the float64 draws reach |z| = sqrt(212 ln 2) = 12.12 sigma, not less
    (no hidden cap, e.g. 5.77 for float32 torch.randn) and not more."""
    src = NoiseSource(kind, seed=0 if kind == "reproducible" else None)
    src._gauss = _ExtremeStream()
    out = np.empty((3, 5), dtype=dtype)
    z = gaussian_filler(src, out, 2.0)() / 2.0
    assert np.abs(z).max() >= 8.0  # the old path (24-bit randn) cannot exceed 5.77
    assert np.abs(z).max() == pytest.approx(DOCUMENTED_RADIUS, rel=1e-6)
    z64 = src.gaussian_numpy(7, 1.0)
    assert np.abs(z64).max() == pytest.approx(DOCUMENTED_RADIUS, rel=1e-12)
    assert src.gaussian_torch((4,), 1.0, dtype=torch.float32).abs().max().item() == pytest.approx(
        DOCUMENTED_RADIUS, rel=1e-6
    )


# ------------------------------------------------------------------- the sampler as a function


def test_box_muller_largest_attainable_radius():
    from dpaudit.noise import MAX_RADIUS, TAIL_MASS_PER_PAIR, U1_MIN, box_muller, refine_lowest_cell

    assert U1_MIN == 2.0**-106 and TAIL_MASS_PER_PAIR == 2.0**-106
    assert MAX_RADIUS == pytest.approx(DOCUMENTED_RADIUS, rel=1e-15)
    # exp(-R^2 / 2) is the ideal mass beyond R (chi-square with 2 degrees of freedom)
    assert stats.chi2.sf(MAX_RADIUS**2, 2) == pytest.approx(TAIL_MASS_PER_PAIR, rel=1e-9)
    u1 = np.array([U1_MIN, 2.0**-53, 0.5, 1.0])
    for u2 in (np.zeros(4), np.zeros(4, dtype=np.float32)):
        z = box_muller(u1, u2)
        assert z.dtype == u2.dtype and z.shape == (2, 4)
        expect = np.sqrt(-2.0 * np.log(u1))
        np.testing.assert_allclose(z[0], expect, rtol=1e-6 if u2.dtype == np.float32 else 1e-15)
        np.testing.assert_array_equal(z[1], 0.0)
    assert box_muller(u1[:1], np.array([0.25]))[1, 0] == pytest.approx(
        DOCUMENTED_RADIUS, rel=1e-15
    )  # sin(pi/2)
    assert box_muller(u1[1:2], np.array([0.5]))[0, 0] == pytest.approx(
        -math.sqrt(106 * math.log(2)), rel=1e-15
    )
    # the refinement: only the lowest cell moves, into (0, 2^-53], smallest 2^-106
    v = np.array([2.0**-53, 0.75, 2.0**-53, 2.0**-52])
    refine_lowest_cell(v, lambda m: np.array([1 - 2.0**-53, 0.0][:m]))
    assert v.tolist() == [2.0**-106, 0.75, 2.0**-53, 2.0**-52]
    # inputs are not modified unless scratch=True
    a, b = np.array([0.3]), np.array([0.1])
    box_muller(a, b)
    assert a[0] == 0.3 and b[0] == 0.1


@pytest.mark.parametrize("kind", ["reproducible", "cryptographic"])
def test_no_uniform_below_the_documented_minimum(kind):
    src = NoiseSource(kind, seed=1 if kind == "reproducible" else None)
    src._gauss = _ExtremeStream()
    assert src._u1(5).min() == 2.0**-106
    src2 = NoiseSource(kind, seed=1 if kind == "reproducible" else None)
    u1 = src2._u1(200_000)
    assert u1.min() > 0.0 and u1.max() <= 1.0
    k = (1.0 - u1) * 2.0**53  # u1 = 1 - k 2^-53
    assert np.array_equal(k, np.floor(k))


# ------------------------------------------------------------------- distribution


@pytest.mark.parametrize("kind", ["reproducible", "cryptographic"])
def test_float32_path_is_standard_normal(kind):
    """KS, moments and pair independence of the trainers' float32 draws (many small requests, as
    in a training loop, crossing chunk boundaries)."""
    src = (
        NoiseSource(kind, seed=11)
        if kind == "reproducible"
        else NoiseSource._cryptographic_with_key(bytes(range(32)))
    )
    out = np.empty(7850, dtype=np.float32)
    fill = gaussian_filler(src, out, 3.0)
    z = np.concatenate([fill().copy() for _ in range(60)]).astype(np.float64) / 3.0
    n = z.size
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert abs(z.mean()) < 5 / math.sqrt(n)
    assert abs(z.var() - 1) < 5 * math.sqrt(2 / n)
    assert abs(stats.kurtosis(z, fisher=False) - 3) < 5 * math.sqrt(24 / n)
    # tails: P(|z| > 3) by a binomial test
    assert stats.binomtest(int(np.sum(np.abs(z) > 3)), n, 2 * stats.norm.sf(3)).pvalue > 1e-3
    # the two halves of a pair (r cos, r sin) are independent: uncorrelated squares
    from dpaudit.noise import _CHUNK_PAIRS

    src2 = NoiseSource("reproducible", seed=12)
    c = src2.gaussian_torch((2 * _CHUNK_PAIRS,), 1.0).double().numpy()
    a, b = c[:_CHUNK_PAIRS], c[_CHUNK_PAIRS:]
    assert abs(np.corrcoef(a**2, b**2)[0, 1]) < 5 / math.sqrt(_CHUNK_PAIRS)
    assert abs(np.corrcoef(a, b)[0, 1]) < 5 / math.sqrt(_CHUNK_PAIRS)


def test_float64_and_float32_requests_are_reproducible_and_independent_of_request_sizes():
    a, b = NoiseSource("reproducible", seed=5), NoiseSource("reproducible", seed=5)
    x = np.concatenate([a.gaussian_torch((n,), 1.0).numpy() for n in (3, 1000, 50_000, 7)])
    y = b.gaussian_torch((x.size,), 1.0).numpy()
    np.testing.assert_array_equal(x, y)  # the float32 stream does not depend on how it is cut
    np.testing.assert_array_equal(a.gaussian_numpy(9, 1.0), b.gaussian_numpy(9, 1.0))
    # a buffered float32 draw never changes the Poisson masks (their own generator)
    c, d = NoiseSource("reproducible", seed=6), NoiseSource("reproducible", seed=6)
    c.gaussian_torch((5,), 1.0)
    np.testing.assert_array_equal(c.poisson_mask(1000, 0.3), d.poisson_mask(1000, 0.3))


# ------------------------------------------------------------------- tail delta


def _reference_tail(n: int, eps: float, delta: float) -> Fraction:
    """(e^eps + 1) tau, tau = n 2^-106, in exact arithmetic (e^eps as the float math.exp gives)."""
    return (Fraction(math.exp(eps)) + 1) * Fraction(n, 2**106)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 10**15), eps=st.floats(0.01, 50.0), delta=st.floats(1e-12, 0.1))
def test_noise_tail_delta_matches_the_derivation(n, eps, delta):
    from dpaudit.noise import noise_tail_delta

    got = noise_tail_delta(n, eps, delta)
    assert got == pytest.approx(float(_reference_tail(n, eps, delta)), rel=1e-12, abs=0.0)
    assert noise_tail_delta(n + 1, eps, delta) >= got and noise_tail_delta(n, eps + 1, delta) >= got


def test_noise_tail_delta_edges_and_refusal():
    from dpaudit.errors import UsageError
    from dpaudit.noise import check_noise_tail, gaussian_run_tail, noise_tail_delta

    assert noise_tail_delta(0, 2.0, 1e-5) == 0.0
    assert noise_tail_delta(2**106, 1.0, 1e-5) == math.inf
    assert noise_tail_delta(10, 800.0, 1e-5) == math.inf
    assert check_noise_tail(1e-7, 1e-5) == 1e-7
    with pytest.raises(
        UsageError, match=r"noise tail delta must be at most 1% of delta=1e-05, got 1.01e-07"
    ):
        check_noise_tail(1.01e-7, 1e-5)
    with pytest.raises(UsageError, match="noise tail delta must be at most 1%"):
        gaussian_run_tail(2000, 9850, 80.0, 1e-5)  # e^80 overwhelms 2^-106


def _builtin_configurations():
    """(name, steps, noised values per step, epsilon, delta) of every built-in configuration,
    dimensions taken from the code."""
    from dpaudit.accounting import dp_sgd_schedule
    from dpaudit.mechanisms.dpsgd.features import build_features
    from dpaudit.mechanisms.mixmin.mechanism import default_downstream, default_mixture
    from dpaudit.mechanisms.mixmin.tasks import load_task

    mnist_head = 10 * (build_features("rvfl", 784, 42).output_dim + 1)  # (784 + 200 + 1) x 10
    cardio_head = 1 * (build_features("rvfl", 32, 42).output_dim + 1)  # binary: one logit
    mnist = dp_sgd_schedule(51_200, 256, 10)  # q = 0.005, T = 2000 (the headline run)
    cardio = dp_sgd_schedule(48_120, 256, 30)  # q = 0.00532, T = 5640
    users = dp_sgd_schedule(8_933, 256, 30)  # user-level on Cardio-sized data (8,933 users)
    digits = load_task("digits-mix", seed=42)
    mix = default_mixture("digits-mix")
    ds = default_downstream(digits)
    ft = dp_sgd_schedule(
        len(digits.train_idx), ds.finetune_batch_size, ds.finetune_epochs
    )  # D_ft <= all training records
    assert (mnist.sample_rate, mnist.steps, cardio.steps) == (0.005, 2000, 5640) and abs(
        cardio.sample_rate - 0.00532
    ) < 1e-5
    from dpaudit.mechanisms.dpsgd.models import build_module

    def params(model):  # every trainable parameter of a module is noised at every step
        m = build_module(
            model, kind="image", n_features=784, n_classes=10, image_shape=(1, 28, 28), seed=42
        )
        return sum(p.numel() for p in m.parameters() if p.requires_grad)

    return [
        *[
            (f"dp-{m} mnist eps 8", mnist.steps, params(m), 8.0, 1e-5)
            for m in ("dense", "cnn", "attention")
        ],
        ("dp-rvfl mnist eps 2", mnist.steps, mnist_head, 2.0, 1e-5),
        ("dp-rvfl mnist eps 8", mnist.steps, mnist_head, 8.0, 1e-5),
        ("dp-rvfl cardio eps 2", cardio.steps, cardio_head, 2.0, 1e-5),
        ("dp-rvfl cardio user-level eps 2", users.steps, cardio_head, 2.0, 1e-5),
        ("dp-mixmin digits-mix mixture eps 1", mix.steps, digits.k, 1.0, 1e-5),
        ("dp-mixmin digits-mix fine-tuning eps 1", ft.steps, ds.hidden + 1, 1.0, 1e-5),
        ("dp-mixmin mnist-mix mixture eps 1", default_mixture("mnist-mix").steps, 10, 1.0, 1e-5),
    ]


def test_tail_of_every_builtin_configuration_is_below_one_percent_of_delta():
    from dpaudit.noise import noise_tail_delta

    for name, steps, d, eps, delta in _builtin_configurations():
        tail = noise_tail_delta(steps * d, eps, delta)
        assert 0.0 < tail <= 0.01 * delta, name
        assert tail == pytest.approx(float(_reference_tail(steps * d, eps, delta)), rel=1e-12)
    # the old sampler (24-bit uniforms, tau1 = 2^-24 per pair) fails the same test by far
    steps, d = 2000, 9850
    tau_old = min(1.0, steps * (d // 2) * 2.0**-24)
    assert tau_old > 0.5


# ------------------------------------------------------------------- every DP path


def test_every_dp_noise_path_uses_the_sampler(monkeypatch):
    """Count calls of the documented sampler and make torch's Gaussian samplers raise: every DP
    noise path of the package (record / user level, linear heads / modules, single / batched
    runs, DP-MixMin Algorithms 1 and 2 and its batched runner, the Gaussian audit target) must
    draw through dpaudit.noise.box_muller."""
    from dpaudit import noise as noise_mod
    from dpaudit.audits.gaussian import GaussianTarget
    from dpaudit.mechanisms.dpsgd.module_training import DPSGDConfig, train_module_dp_sgd
    from dpaudit.mechanisms.mixmin.solver import MixMinConfig, run_mixmin, run_mixmin_runs
    from dpaudit.data.users import index_users
    from dpaudit.mechanisms.dpsgd.loop import UserSampling, train_heads

    calls = []
    real = noise_mod.box_muller
    monkeypatch.setattr(noise_mod, "box_muller", lambda *a, **k: calls.append(1) or real(*a, **k))

    def forbidden(*a, **k):
        raise AssertionError("DP noise drawn with torch's own Gaussian sampler")

    rng = np.random.default_rng(0)
    n, d = 40, 4
    z, y = rng.normal(size=(n, d)), rng.integers(0, 2, n)
    users = np.repeat(np.arange(10), 4)
    cfg = DPSGDConfig(sample_rate=0.3, steps=3, normalizer=12, noise_multiplier=1.0)
    module = torch.nn.Sequential(
        torch.nn.Linear(d, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2)
    ).double()
    x = torch.as_tensor(z)
    with monkeypatch.context() as m:
        m.setattr(torch, "randn", forbidden)
        m.setattr(torch, "normal", forbidden)
        m.setattr(torch.Tensor, "normal_", forbidden)
        paths = {
            "record head": lambda s: train_heads(z, y, 2, cfg, noise=s),
            "user head": lambda s: train_heads(
                z, y, 2, cfg, users=UserSampling(index_users(users), 2), noise=s
            ),
            "record module": lambda s: train_module_dp_sgd(
                module, x, torch.as_tensor(y), cfg, noise=s
            ),
            "user module": lambda s: train_module_dp_sgd(
                module, x, torch.as_tensor(y), cfg, users=UserSampling(users, 2), noise=s
            ),
            "batched heads": lambda s: train_heads(z, y, 2, cfg, noise=s, runs=3),
            "batched user heads": lambda s: train_heads(
                z, y, 2, cfg, users=UserSampling(index_users(users), 2), noise=s, runs=3
            ),
            "mixmin record": lambda s: run_mixmin(
                np.abs(z) / np.abs(z).sum(1, keepdims=True),
                y,
                MixMinConfig(
                    k=d,
                    loss="bce",
                    noise_multiplier=1.0,
                    sample_rate=0.5,
                    expected_batch_size=20.0,
                    steps=3,
                    clipping_norm=1.0,
                    step_size=0.5,
                ),
                noise=s,
            ),
            "mixmin user": lambda s: run_mixmin(
                np.abs(z) / np.abs(z).sum(1, keepdims=True),
                y,
                MixMinConfig(
                    k=d,
                    loss="bce",
                    noise_multiplier=1.0,
                    sample_rate=0.5,
                    expected_batch_size=5.0,
                    steps=3,
                    clipping_norm=1.0,
                    step_size=0.5,
                    privacy_unit="user",
                    records_per_user=2,
                ),
                noise=s,
                user_ids=users,
            ),
            "mixmin runs": lambda s: run_mixmin_runs(
                np.abs(z) / np.abs(z).sum(1, keepdims=True),
                y,
                MixMinConfig(
                    k=d,
                    loss="bce",
                    noise_multiplier=1.0,
                    sample_rate=0.5,
                    expected_batch_size=20.0,
                    steps=3,
                    clipping_norm=1.0,
                    step_size=0.5,
                ),
                noise=s,
                runs=4,
            ),
            "gaussian audit target": lambda s: GaussianTarget(noise_multiplier=1.0).scores(
                np.array([True, False, True]), s
            ),
        }
        for kind in ("reproducible", "cryptographic"):
            for name, run in paths.items():
                before = len(calls)
                run(NoiseSource(kind, seed=3 if kind == "reproducible" else None))
                assert len(calls) > before, (kind, name)


def test_every_float32_angle_has_unit_bounded_accurate_trigonometry():
    """The float32 path's angles are 2 pi k 2^-24 (k < 2^24: every one is checked): NumPy's float32
    cos and sin (the sampler's since heads stopped importing torch) never exceed 1 in magnitude, so
    |z| <= r still holds, and stay within 2 float32 ulps of the exact values."""
    from dpaudit.noise import box_muller

    u2 = (np.arange(2**24, dtype=np.float64) * 2.0**-24).astype(np.float32)
    z = box_muller(np.ones(u2.size), u2)  # r = sqrt(-2 ln 1) = 0: only the angle, so scale by hand
    angle = u2 * np.float32(2.0 * math.pi)
    c, s = np.cos(angle), np.sin(angle)
    assert np.abs(c).max() <= 1.0 and np.abs(s).max() <= 1.0 and np.all(z == 0.0)
    exact = angle.astype(np.float64)
    assert (
        np.abs(c - np.cos(exact)).max() <= 2 * 2.0**-24
        and np.abs(s - np.sin(exact)).max() <= 2 * 2.0**-24
    )


def test_float64_log_of_the_radius_is_correctly_rounded_at_the_tails():
    """The radius's float64 log (NumPy) against the exact logarithm at the smallest uniforms the
    sampler draws, where the tail statement is made (module docstring of dpaudit.noise)."""
    u1 = np.array(
        [
            2.0**-106,
            2.0**-105,
            (1 - 2.0**-53) * 2.0**-53,
            2.0**-53,
            2.0**-52,
            3 * 2.0**-53,
            0.5,
            1 - 2.0**-53,
        ]
    )
    got = np.log(u1.copy())
    for x, g in zip(u1, got):
        assert abs(g - math.log(x)) <= abs(math.log(x)) * 2.0**-52  # within one ulp

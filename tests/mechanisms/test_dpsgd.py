"""The DP-SGD engine against slow, obviously-correct references (autograd loops, torch Adam)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaudit.errors import UsageError
from dpaudit.mechanisms.dpsgd import core as dpsgd_core
from dpaudit.mechanisms.dpsgd.module_training import DPSGDConfig
from dpaudit.mechanisms.dpsgd.loop import SumUnits, run_dp_sgd, train_heads
from dpaudit.mechanisms.dpsgd.core import (
    AdamState,
    adam_update,
    head_clipped_sum,
    head_probabilities,
    poisson_indices,
)
from dpaudit.noise import NoiseSource

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")


def _cfg(**kw):
    base = dict(sample_rate=0.5, steps=5, normalizer=3, noise_multiplier=1.0)
    base.update(kw)
    return DPSGDConfig(**base)


def test_config_validation():
    with pytest.raises(UsageError, match="noise_multiplier must be"):
        _cfg(noise_multiplier=0.0)
    with pytest.raises(UsageError, match="sample_rate must be"):
        _cfg(sample_rate=0.0)
    with pytest.raises(UsageError, match="normalizer must be"):
        _cfg(normalizer=0)
    assert _cfg(noise_multiplier=0.0, non_private=True).noise_std == 0.0
    assert _cfg(noise_multiplier=2.0, clipping_norm=0.5).noise_std == 1.0


def test_adam_matches_torch_optim_adam():
    rng = np.random.default_rng(0)
    p0 = rng.normal(size=(4, 7))
    grads = rng.normal(size=(25, 4, 7)) * 10 ** rng.uniform(-6, 1, size=(25, 1, 1))
    cfg = _cfg(lr=3e-3, betas=(0.8, 0.99), adam_eps=1e-7)
    ours = torch.tensor(p0)
    state = AdamState.zeros_like([ours])
    ref = torch.nn.Parameter(torch.tensor(p0))
    opt = torch.optim.Adam([ref], lr=3e-3, betas=(0.8, 0.99), eps=1e-7, weight_decay=0.0)
    for g in grads:
        adam_update([ours], [torch.tensor(g)], state, cfg)
        ref.grad = torch.tensor(g)
        opt.step()
    assert torch.equal(
        ours, ref.detach()
    )  # bit for bit (float64 here; float32 in test_mixmin_tasks)


def _reference_clipped_sum(w, z, y, c, binary_logit, clip=True):
    """Per-example autograd loop on an explicit torch loss, clipped one by one (eq. 4)."""
    total = torch.zeros_like(torch.as_tensor(w))
    for zi, yi in zip(z, y):
        wt = torch.tensor(w, requires_grad=True)
        z1 = torch.cat([torch.as_tensor(zi), torch.ones(1, dtype=torch.float64)])
        s = wt @ z1
        if binary_logit:
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                s, torch.tensor([float(yi)], dtype=torch.float64)
            )
        else:
            loss = torch.nn.functional.cross_entropy(s.unsqueeze(0), torch.tensor([int(yi)]))
        (g,) = torch.autograd.grad(loss, wt)
        if clip:
            g = g * min(1.0, c / float(g.norm()))
        total += g
    return total.numpy()


@pytest.mark.parametrize("binary_logit,k", [(False, 4), (True, 1)])
@pytest.mark.parametrize("c", [1.0, 0.05, 100.0])
def test_closed_form_clipped_sum_matches_autograd_loop(binary_logit, k, c):
    rng = np.random.default_rng(1)
    n, d = 9, 6
    z = rng.normal(size=(n, d)) * 3
    y = rng.integers(0, 2 if binary_logit else k, n)
    w = rng.normal(size=(k, d + 1))
    z1 = np.concatenate([z, np.ones((n, 1))], axis=1)
    got = head_clipped_sum(w, z1, np.linalg.norm(z1, axis=1), y, c, binary_logit=binary_logit)
    np.testing.assert_allclose(
        got, _reference_clipped_sum(w, z, y, c, binary_logit), rtol=1e-10, atol=1e-12
    )
    got_unclipped = head_clipped_sum(
        w, z1, np.linalg.norm(z1, axis=1), y, c, binary_logit=binary_logit, clip=False
    )
    np.testing.assert_allclose(
        got_unclipped,
        _reference_clipped_sum(w, z, y, c, binary_logit, clip=False),
        rtol=1e-10,
        atol=1e-12,
    )


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 12),
    d=st.integers(1, 8),
    k=st.integers(2, 5),
    scale=st.floats(1e-3, 1e3),
    c=st.floats(1e-3, 10.0),
    seed=st.integers(0, 2**31),
)
def test_each_clipped_contribution_is_bounded(n, d, k, scale, c, seed):
    """Sensitivity: one example's contribution to the clipped sum never exceeds C."""
    rng = np.random.default_rng(seed)
    z1 = np.concatenate([rng.normal(size=(n, d)) * scale, np.ones((n, 1))], axis=1)
    y = rng.integers(0, k, n)
    w = rng.normal(size=(k, d + 1))
    norms = np.linalg.norm(z1, axis=1)
    for i in range(n):
        single = head_clipped_sum(w, z1[i : i + 1], norms[i : i + 1], y[i : i + 1], c)
        assert np.linalg.norm(single) <= c * (1 + 1e-9)
    full = head_clipped_sum(w, z1, norms, y, c)
    rest = head_clipped_sum(w, z1[1:], norms[1:], y[1:], c) if n > 1 else np.zeros_like(full)
    assert np.linalg.norm(full - rest) <= c * (1 + 1e-9)  # add/remove one record


def test_clipped_sum_matches_opacus_dp_optimizer_float64():
    """The closed-form head clipped sum equals Opacus's clip_and_accumulate on the same batch."""
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    rng = np.random.default_rng(2)
    n, d, k = 17, 11, 5
    z = rng.normal(size=(n, d)) * 2
    y = rng.integers(0, k, n)
    torch.manual_seed(
        2
    )  # fixed weights: an unseeded draw made the comparison flaky (Opacus divides by norm + 1e-6)
    lin = torch.nn.Linear(d, k).double()
    w = torch.cat([lin.weight.detach(), lin.bias.detach()[:, None]], dim=1).numpy().copy()
    gsm = GradSampleModule(lin)
    opt = DPOptimizer(
        torch.optim.SGD(gsm.parameters(), lr=0.1),
        noise_multiplier=0.0,
        max_grad_norm=0.7,
        expected_batch_size=n,
        loss_reduction="sum",
    )
    loss = torch.nn.functional.cross_entropy(gsm(torch.tensor(z)), torch.tensor(y), reduction="sum")
    loss.backward()
    opt.clip_and_accumulate()
    ref = torch.cat([lin.weight.summed_grad, lin.bias.summed_grad[:, None]], dim=1).numpy()
    z1 = np.concatenate([z, np.ones((n, 1))], axis=1)
    got = head_clipped_sum(w, z1, np.linalg.norm(z1, axis=1), y, 0.7)
    # Opacus divides by (norm + 1e-6); the exact rule is min(1, C / norm): relative gap ~1e-6.
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-8)


def test_poisson_indices_is_bernoulli():
    """Gap sampling gives Bernoulli(q) inclusion: per-index rate q, counts Binomial(n, q)."""
    rng = np.random.default_rng(3)
    n, q, trials = 50, 0.1, 20000
    counts = np.zeros(n)
    sizes = []
    for ix in poisson_indices(rng, trials, n, q):
        assert np.all(np.diff(ix) > 0) and (ix.size == 0 or (ix[0] >= 0 and ix[-1] < n))
        counts[ix] += 1
        sizes.append(ix.size)
    sizes = np.asarray(sizes)
    rate = counts / trials
    assert np.all(np.abs(rate - q) < 5 * np.sqrt(q * (1 - q) / trials))
    assert abs(sizes.mean() - n * q) < 5 * np.sqrt(n * q * (1 - q) / trials)
    assert abs(sizes.var() - n * q * (1 - q)) < 0.1 * n * q * (1 - q)
    assert abs(np.mean(sizes == 0) - (1 - q) ** n) < 0.01
    assert all(ix.size == 7 for ix in poisson_indices(rng, 3, 7, 1.0))


class _ScriptedNoise(NoiseSource):
    """Deterministic 'private' randomness so that the engine's arithmetic can be checked exactly."""

    def __init__(self, masks, noise_value):
        super().__init__("reproducible", seed=0)
        self.masks = list(masks)
        self.noise_value = noise_value
        self.mask_calls = 0

    def poisson_mask(self, n, sample_rate):
        self.mask_calls += 1
        return np.asarray(self.masks.pop(0), dtype=bool)

    def gaussian_torch(self, shape, std, dtype=torch.float32):
        return torch.full(shape, self.noise_value * std, dtype=dtype)


def test_engine_normalizer_noise_and_empty_batches(monkeypatch):
    masks = [[1, 0, 1], [0, 0, 0], [1, 1, 1], [0, 0, 0]]
    noise = _ScriptedNoise(masks, noise_value=0.25)
    cfg = DPSGDConfig(
        sample_rate=0.3, steps=4, normalizer=7, noise_multiplier=2.0, clipping_norm=0.5
    )
    seen_grads, seen_idx = [], []
    real_step = dpsgd_core.Adam.step

    def spy(self, grads, t):  # the sanitised gradient Adam receives (shared step of every trainer)
        seen_grads.append(np.array(grads[0]))
        real_step(self, grads, t)

    monkeypatch.setattr(dpsgd_core.Adam, "step", spy)

    def clipped_sum(params, idx):
        seen_idx.append(idx.tolist())
        return [torch.full((2,), float(len(idx)), dtype=torch.float64)]

    p = torch.zeros(2, dtype=torch.float64)
    steps = run_dp_sgd(SumUnits(clipped_sum, 3), [p], cfg, noise=noise)
    assert steps == 4 and noise.mask_calls == 4
    assert seen_idx == [[0, 2], [0, 1, 2]]  # never called for an empty batch
    noise_term = 0.25 * 2.0 * 0.5  # noise_value * sigma * C
    expected = [(2 + noise_term) / 7, noise_term / 7, (3 + noise_term) / 7, noise_term / 7]
    assert [float(g[0]) for g in seen_grads] == pytest.approx(expected, rel=1e-12)
    assert np.all(p.numpy() != 0)  # empty batches still updated (noise-only steps)


@pytest.mark.parametrize("n,q", [(40, 0.2), (6, 0.1)])  # the second has many empty batches
def test_one_head_run_matches_slow_reference_float64(n, q):
    """Fast trainer == per-example autograd loop + torch Adam, replaying the same private draws."""
    rng = np.random.default_rng(4)
    d, k = 5, 3
    z = rng.normal(size=(n, d))
    y = rng.integers(0, k, n)
    init = rng.normal(size=(k, d + 1)) * 0.1
    cfg = DPSGDConfig(
        sample_rate=q, steps=12, normalizer=8, noise_multiplier=0.8, clipping_norm=0.9
    )
    fast = train_heads(
        z, y, k, cfg, noise=NoiseSource("reproducible", seed=9), init=init, dtype=torch.float64
    )
    assert fast.steps_executed == 12

    noise = NoiseSource("reproducible", seed=9)
    w = torch.nn.Parameter(torch.tensor(init))
    opt = torch.optim.Adam([w], lr=cfg.lr, betas=cfg.betas, eps=cfg.adam_eps)
    empty = 0
    for _ in range(cfg.steps):
        idx = dpsgd_core.poisson_batch(noise, 1, n, cfg.sample_rate)[0]
        empty += idx.size == 0
        g = torch.tensor(
            _reference_clipped_sum(w.detach().numpy(), z[idx], y[idx], cfg.clipping_norm, False)
        )
        g = g + noise.gaussian_torch(
            (k, d + 1), cfg.noise_multiplier * cfg.clipping_norm, dtype=torch.float64
        )
        w.grad = g / cfg.normalizer
        opt.step()
    np.testing.assert_allclose(fast.weights[0], w.detach().numpy(), rtol=1e-9, atol=1e-12)
    assert (empty > 2) == (n == 6)


def test_private_noise_comes_from_the_noise_source():
    rng = np.random.default_rng(5)
    z, y = rng.normal(size=(30, 4)), rng.integers(0, 2, 30)
    cfg = _cfg(steps=10, sample_rate=0.3, normalizer=9)
    a = train_heads(z, y, 2, cfg, noise=NoiseSource("reproducible", seed=1)).weights[0]
    b = train_heads(z, y, 2, cfg, noise=NoiseSource("reproducible", seed=1)).weights[0]
    c = train_heads(z, y, 2, cfg, noise=NoiseSource("reproducible", seed=2)).weights[0]
    e1 = train_heads(z, y, 2, cfg, noise=NoiseSource("os-entropy")).weights[0]
    e2 = train_heads(z, y, 2, cfg, noise=NoiseSource("os-entropy")).weights[0]
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c) and not np.allclose(e1, e2)


def test_cryptographic_source_goes_through_poisson_mask():
    noise = NoiseSource("cryptographic")
    calls = []
    orig = noise.poisson_mask
    noise.poisson_mask = lambda n, q: calls.append(n) or orig(n, q)  # instance attribute spy
    flat, offsets = dpsgd_core.poisson_batch(noise, 2, 100, 0.5)
    assert calls == [100, 100] and offsets.shape == (3,) and offsets[-1] == flat.size


def test_linear_head_learns_separable_data():
    rng = np.random.default_rng(6)
    n = 600
    y = rng.integers(0, 3, n)
    z = rng.normal(size=(n, 5)) * 0.3
    z[np.arange(n), y] += 2.0
    cfg = DPSGDConfig(sample_rate=0.1, steps=300, normalizer=60, noise_multiplier=0.5, lr=0.05)
    res = train_heads(z, y, 3, cfg, noise=NoiseSource("reproducible", seed=3))
    acc = (head_probabilities(res.weights[0], z).argmax(1) == y).mean()
    assert acc > 0.95
    binary = train_heads(
        z[y < 2], y[y < 2], 2, cfg, noise=NoiseSource("reproducible", seed=3), binary_logit=True
    )
    assert binary.weights.shape == (1, 1, 6)
    assert (head_probabilities(binary.weights[0], z[y < 2]).argmax(1) == y[y < 2]).mean() > 0.95


def test_linear_head_input_validation():
    cfg = _cfg()
    with pytest.raises(UsageError, match="labels must be"):
        train_heads(
            np.zeros((3, 2)), np.array([0, 1, 5]), 3, cfg, noise=NoiseSource("reproducible", seed=0)
        )
    with pytest.raises(UsageError, match="init must have shape"):
        train_heads(
            np.zeros((3, 2)),
            np.array([0, 1, 1]),
            2,
            cfg,
            noise=NoiseSource("reproducible", seed=0),
            init=np.zeros((2, 2)),
        )


def test_z_with_bias_column_is_the_same_training():
    rng = np.random.default_rng(7)
    z, y = rng.normal(size=(50, 4)), rng.integers(0, 3, 50)
    cfg = _cfg(steps=6, sample_rate=0.3, normalizer=15)
    plain = train_heads(
        z, y, 3, cfg, noise=NoiseSource("reproducible", seed=4), dtype=torch.float64
    ).weights[0]
    z1 = np.concatenate([z, np.ones((50, 1))], axis=1)
    pre = train_heads(
        z1,
        y,
        3,
        cfg,
        noise=NoiseSource("reproducible", seed=4),
        dtype=torch.float64,
        z_has_bias_column=True,
    ).weights[0]
    np.testing.assert_array_equal(plain, pre)
    with pytest.raises(UsageError, match="column of ones"):
        train_heads(z, y, 3, cfg, noise=NoiseSource("reproducible", seed=4), z_has_bias_column=True)


def test_poisson_flat_runs_are_independent_bernoulli_blocks():
    """All runs in one draw: run r's mask is block r of one Bernoulli(q) sequence, so the masks are
    independent across runs, also at the block boundaries (index n-1 of run r, index 0 of run r+1)."""
    rng = np.random.default_rng(8)
    runs, n, q = 40000, 6, 0.3
    flat, offsets = dpsgd_core.poisson_flat(rng, runs, n, q)
    assert offsets.shape == (runs + 1,) and offsets[0] == 0 and offsets[-1] == flat.size
    mask = np.zeros((runs, n), dtype=bool)
    run_of = np.repeat(np.arange(runs), np.diff(offsets))
    mask[run_of, flat] = True
    assert mask.sum() == flat.size  # no index twice in a run
    se = np.sqrt(q * (1 - q) / runs)
    assert np.all(np.abs(mask.mean(0) - q) < 5 * se)
    both_boundary = np.mean(mask[:-1, n - 1] & mask[1:, 0])
    both_same_index = np.mean(mask[:-1, 2] & mask[1:, 2])
    for p in (both_boundary, both_same_index):
        assert abs(p - q * q) < 5 * np.sqrt(q * q * (1 - q * q) / runs)


@pytest.mark.parametrize(
    "shape", [(3, 4), (2, 70_001)]
)  # the second spans three blocks of the array passes
def test_loop_adam_equals_torch_adam_float64(shape):
    """The loop's Adam (NumPy, in blocks) == torch.optim.Adam, step for step."""
    rng = np.random.default_rng(12)
    cfg = DPSGDConfig(sample_rate=0.1, steps=5, normalizer=3, noise_multiplier=1.0, lr=0.01)
    w0 = rng.normal(size=shape)
    w = w0.copy()
    adam = dpsgd_core.Adam([w], cfg)
    p = torch.nn.Parameter(torch.tensor(w0))
    opt = torch.optim.Adam([p], lr=cfg.lr, betas=cfg.betas, eps=cfg.adam_eps)
    for t in range(1, 40):
        g = rng.normal(size=shape) * 10.0 ** rng.integers(-6, 1)
        adam.step([g.copy()], t)
        p.grad = torch.tensor(g)
        opt.step()
    np.testing.assert_allclose(w, p.detach().numpy(), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("fused", [True, False])
def test_module_adam_equals_torch_adam_float64(fused):
    """A module's Adam (tensors: torch's fused kernel, or the single-tensor fallback) == torch.optim.Adam."""
    rng = np.random.default_rng(12)
    cfg = DPSGDConfig(sample_rate=0.1, steps=5, normalizer=3, noise_multiplier=1.0, lr=0.01)
    w0 = rng.normal(size=(3, 4))
    w = w0.copy()
    adam = dpsgd_core.Adam([torch.from_numpy(w)], cfg)
    assert adam.tensors
    if not fused:
        adam.fused = None
    p = torch.nn.Parameter(torch.tensor(w0))
    opt = torch.optim.Adam([p], lr=cfg.lr, betas=cfg.betas, eps=cfg.adam_eps)
    for t in range(1, 40):
        g = rng.normal(size=(3, 4)) * 10.0 ** rng.integers(-6, 1)
        adam.step([torch.from_numpy(g.copy())], t)
        p.grad = torch.tensor(g)
        opt.step()
    np.testing.assert_allclose(w, p.detach().numpy(), rtol=1e-12, atol=1e-14)


def test_loop_adam_float32_stays_within_rounding_of_torch_adam():
    """float32 parameters (every head): the same arithmetic in float32, not promoted to float64."""
    rng = np.random.default_rng(14)
    cfg = DPSGDConfig(sample_rate=0.1, steps=5, normalizer=3, noise_multiplier=1.0, lr=0.01)
    w = rng.normal(size=(10, 985)).astype(np.float32)
    p = torch.nn.Parameter(torch.tensor(w))
    adam, opt = (
        dpsgd_core.Adam([w], cfg),
        torch.optim.Adam([p], lr=cfg.lr, betas=cfg.betas, eps=cfg.adam_eps),
    )
    for t in range(1, 30):
        g = rng.normal(size=w.shape).astype(np.float32)
        adam.step([g], t)
        p.grad = torch.from_numpy(g)
        opt.step()
    assert w.dtype == np.float32 and adam.m[0].dtype == np.float32
    np.testing.assert_allclose(w, p.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_gap_extension_keeps_bernoulli_rates():
    """When the first block of gaps falls short (forced here: one gap), further gaps continue the
    same Bernoulli(q) sequence."""
    rng = np.random.default_rng(13)
    n, q, trials = 40, 0.2, 20000
    counts = np.zeros(n)
    for _ in range(trials):
        ix = dpsgd_core._extend_gaps(rng, np.cumsum(rng.geometric(q, size=1)), n, q)
        assert np.all(np.diff(ix) > 0) and (ix.size == 0 or (ix[0] >= 0 and ix[-1] < n))
        counts[ix] += 1
    assert np.all(np.abs(counts / trials - q) < 5 * np.sqrt(q * (1 - q) / trials))


@pytest.mark.parametrize(
    "source,runs", [("reproducible", 1), ("reproducible", 5), ("cryptographic", 3)]
)
def test_poisson_batch_is_gap_sampling_on_the_sources_generator(source, runs):
    """The one sampler of every trainer draws, for numpy-backed sources, exactly the gap samples of
    poisson_indices on the source's own generator (same order)."""
    seed = 21 if source == "reproducible" else None
    a = NoiseSource(source, seed=seed)
    b = a if source == "cryptographic" else NoiseSource(source, seed=seed)
    for _ in range(3):
        flat, offsets = dpsgd_core.poisson_batch(a, runs, 500, 0.03)
        assert offsets.shape == (runs + 1,) and offsets[-1] == flat.size
        if source == "reproducible":
            want = dpsgd_core.poisson_indices(b.numpy, runs, 500, 0.03)
            for r in range(runs):
                np.testing.assert_array_equal(flat[offsets[r] : offsets[r + 1]], want[r])
        else:
            assert all(np.all(np.diff(flat[offsets[r] : offsets[r + 1]]) > 0) for r in range(runs))


def test_noisy_adam_step_is_noise_then_normaliser_then_adam():
    """The shared step: sum + N(0, (sigma C)^2) from the source, / m0, torch.optim.Adam."""
    cfg = DPSGDConfig(
        sample_rate=0.1, steps=3, normalizer=7, noise_multiplier=1.5, clipping_norm=0.4, lr=0.02
    )
    w = torch.tensor([[0.3, -0.2], [0.1, 0.5]], dtype=torch.float64)
    ref = torch.nn.Parameter(w.clone())
    opt = torch.optim.Adam([ref], lr=cfg.lr, betas=cfg.betas, eps=cfg.adam_eps)
    step = dpsgd_core.NoisyStep([w], cfg, noise=NoiseSource("reproducible", seed=2))
    twin = NoiseSource("reproducible", seed=2)
    for t in range(1, 4):
        s = torch.full((2, 2), 0.1 * t, dtype=torch.float64)
        step.sums[0].copy_(s)
        step.apply(t)
        ref.grad = (s + twin.gaussian_torch((2, 2), 1.5 * 0.4, dtype=torch.float64)) / 7
        opt.step()
    np.testing.assert_allclose(w.numpy(), ref.detach().numpy(), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("n_classes", [0, 1, -3])
def test_fewer_than_two_classes_is_one_rule(n_classes):
    """Zero, one or a negative number of classes all break the one rule a head needs (at least
    two classes): the message names it, not the positive-integer rule."""
    with pytest.raises(UsageError) as err:
        dpsgd_core.head_outputs(n_classes, binary_logit=False)
    assert str(err.value) == f"n_classes must be an integer >= 2, got {n_classes}."

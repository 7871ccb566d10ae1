"""The ghost-clipping kernel (mechanisms/dpsgd/ghost_clip.py) against the vmap(grad) reference kernels:
every model, record and user units, both per-layer paths (ghost norm, materialised gradient),
inputs whose units are all clipped or none clipped; and it is the kernel releases and audits run."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaudit.data import load_dataset
from dpaudit.mechanisms.dpsgd import core as dpsgd_core, ghost_clip, user_level
from dpaudit.mechanisms.dpsgd.module_training import DPSGDConfig, train_module_dp_sgd
from dpaudit.mechanisms.dpsgd.loop import UserSampling
from dpaudit.mechanisms.dpsgd.models import CNN1d, CNN2d, CompactAttention, Dense
from dpaudit.mechanisms.dpsgd.one_run_modules import modules_one_run
from dpaudit.noise import NoiseSource

MODELS = {  # (module, input shape, classes, loss); dropout 0: both kernels see the same function
    "dense": (lambda: Dense(12, (8, 6), 3, dropout=0.0), (12,), 3, "cross_entropy"),
    "dense-binary": (lambda: Dense(12, (8, 6), 1, dropout=0.0), (12,), 2, "bce"),
    "cnn2d": (lambda: CNN2d((1, 8, 8), 4), (1, 8, 8), 4, "cross_entropy"),
    "cnn2d-rgb": (lambda: CNN2d((3, 4, 4), 3), (3, 4, 4), 3, "cross_entropy"),
    "cnn1d": (lambda: CNN1d(10, 1), (10,), 2, "bce"),
    "attention": (lambda: CompactAttention((1, 8, 8), 3), (1, 8, 8), 3, "cross_entropy"),
}
PATHS = {"auto": None, "ghost": True, "materialised": False}


def _case(model: str, n: int, seed: int, scale: float):
    make, shape, k, loss = MODELS[model]
    torch.manual_seed(seed)
    module = make().double()
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn((n, *shape), generator=g, dtype=torch.float64) * scale
    y = torch.randint(0, k, (n,), generator=g)
    return module, {nm: p.detach() for nm, p in module.named_parameters()}, x, y, loss


def _force(monkeypatch, path: str) -> None:
    if PATHS[path] is not None:
        monkeypatch.setattr(ghost_clip, "_use_ghost", lambda *a: PATHS[path])


def _close(ours: dict, ref: dict) -> None:
    assert set(ours) == set(ref)
    for name in ref:
        torch.testing.assert_close(ours[name], ref[name], rtol=1e-9, atol=1e-12)


def _norms(params, x, y, module, loss, seg=None):
    """Per-unit gradient norms by the reference (unclipped per-sample gradients)."""
    gs = dpsgd_core.per_sample_grads(module, params, x, y, loss)
    flat = torch.cat([g.reshape(x.shape[0], -1) for g in gs.values()], 1)
    if seg is not None:
        k = torch.as_tensor(np.bincount(seg), dtype=flat.dtype)
        flat = (
            torch.zeros(len(k), flat.shape[1], dtype=flat.dtype).index_add_(
                0, torch.as_tensor(seg), flat
            )
            / k[:, None]
        )
    return flat.norm(dim=1)


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("regime", ["all clipped", "none clipped", "mixed"])
def test_record_units_equal_the_vmap_kernel(monkeypatch, model, path, regime):
    module, params, x, y, loss = _case(model, 9, 0, 3.0)
    norms = _norms(params, x, y, module, loss)
    c = {
        "all clipped": float(norms.min()) / 10,
        "none clipped": float(norms.max()) * 10,
        "mixed": float(norms.median()),
    }[regime]
    _force(monkeypatch, path)
    for clip in (False, True):
        ours = ghost_clip.ghost_clipped_sum(module, x, y, c, loss=loss, clip=clip)
        _close(
            ours, dpsgd_core.per_sample_clipped_sum(module, params, x, y, c, loss=loss, clip=clip)
        )
    # every unit contributes norm <= C, so the sum's norm is <= n C
    assert float(torch.cat([v.reshape(-1) for v in ours.values()]).norm()) <= 9 * c * (1 + 1e-9)


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("model", sorted(MODELS))
def test_user_units_equal_the_vmap_kernel(monkeypatch, model, path):
    module, params, x, y, loss = _case(model, 12, 1, 2.0)
    seg = np.array(
        [0, 0, 1, 2, 2, 2, 3, 4, 4, 4, 4, 5]
    )  # users of 1 to 4 records (cross terms matter)
    k, rows = np.bincount(seg), np.arange(12)
    norms = _norms(params, x, y, module, loss, seg)
    _force(monkeypatch, path)
    for c in (float(norms.min()) / 10, float(norms.median()), float(norms.max()) * 10):
        for clip in (True, False):
            ref = user_level.user_module_clipped_sum(
                module, params, x, y, rows, seg, k, c, loss=loss, clip=clip
            )
            _close(
                ghost_clip.ghost_clipped_sum(module, x, y, c, loss=loss, clip=clip, seg=seg, k=k),
                ref,
            )


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from(sorted(MODELS)),
    st.lists(st.integers(1, 4), min_size=1, max_size=6),
    st.floats(-3.0, 3.0),
    st.floats(-4.0, 4.0),
    st.integers(1, 7),
    st.sampled_from(sorted(PATHS)),
    st.integers(0, 10**6),
)
def test_module_kernel_equals_the_reference_on_random_units(
    model, sizes, log_scale, log_c, max_chunk, path, seed
):
    """The seam (chunked by max_chunk rows, units never split) on random users, input scales from
    1e-3 to 1e3 and clipping norms from 1e-4 to 1e4, against the vmap user kernel."""
    n = sum(sizes)
    module, params, x, y, loss = _case(model, n + 3, seed % 1000, 10.0**log_scale)
    rows = np.random.default_rng(seed).permutation(n + 3)[:n]  # a unit's rows anywhere in the data
    seg = np.repeat(np.arange(len(sizes)), sizes)
    k = np.array(sizes)
    with pytest.MonkeyPatch.context() as mp:
        _force(mp, path)
        ours = ghost_clip.module_clipped_sum(
            module, params, x, y, rows, 10.0**log_c, loss=loss, seg=seg, k=k, max_chunk=max_chunk
        )
    ref = user_level.user_module_clipped_sum(
        module, params, x, y, rows, seg, k, 10.0**log_c, loss=loss, max_chunk=max_chunk
    )
    _close(ours, ref)


class _Shared(torch.nn.Module):
    """A Linear applied twice (to a 2-token sequence, then to rows), a frozen Linear and an unused
    one: still ghost."""

    def __init__(self):
        super().__init__()
        self.a, self.frozen, self.out = (
            torch.nn.Linear(5, 5),
            torch.nn.Linear(5, 4),
            torch.nn.Linear(4, 3),
        )
        self.unused = torch.nn.Conv1d(1, 2, 3)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        h = torch.tanh(self.a(torch.stack([x, x.flip(1)], 1))).mean(1)
        return self.out(self.frozen(torch.tanh(self.a(h))))


class _Normed(torch.nn.Module):
    """A trainable LayerNorm: not covered, so the seam falls back to the vmap kernel."""

    def __init__(self):
        super().__init__()
        self.fc, self.norm = torch.nn.Linear(5, 3), torch.nn.LayerNorm(3)

    def forward(self, x):
        return self.norm(self.fc(x))


@pytest.mark.parametrize("path", sorted(PATHS))
def test_reused_and_frozen_layers_and_the_fallback(monkeypatch, path):
    _force(monkeypatch, path)
    g = torch.Generator().manual_seed(2)
    x, y = (
        torch.randn(8, 5, generator=g, dtype=torch.float64) * 3,
        torch.randint(0, 3, (8,), generator=g),
    )
    rows, seg, k = np.arange(8), np.array([0, 0, 0, 1, 2, 2, 3, 3]), np.array([3, 1, 2, 2])
    for module in (_Shared().double(), _Normed().double()):
        params = {
            nm: p.detach() for nm, p in module.named_parameters() if p.requires_grad
        }  # the trained ones
        ours = ghost_clip.module_clipped_sum(module, params, x, y, rows, 0.5)
        _close(ours, dpsgd_core.per_sample_clipped_sum(module, params, x, y, 0.5))
        ref_users = user_level.user_module_clipped_sum(module, params, x, y, rows, seg, k, 0.5)
        _close(
            ghost_clip.module_clipped_sum(module, params, x, y, rows, 0.5, seg=seg, k=k), ref_users
        )
    assert (
        ghost_clip.ghost_layers(_Shared()) is not None
        and ghost_clip.ghost_layers(_Normed()) is None
    )


def test_the_planted_clipping_fault_reaches_the_ghost_kernel(plant_fault):
    module, params, x, y, loss = _case("cnn2d", 6, 3, 3.0)
    honest = ghost_clip.ghost_clipped_sum(module, x, y, 1e-3, loss=loss)
    plant_fault("skip-clip")
    faulty = ghost_clip.ghost_clipped_sum(module, x, y, 1e-3, loss=loss)
    assert not torch.allclose(honest["fc2.bias"], faulty["fc2.bias"], atol=1e-2)
    _close(
        faulty, dpsgd_core.per_sample_clipped_sum(module, params, x, y, 1e-3, loss=loss)
    )  # same fault in both kernels


@pytest.mark.parametrize("model", ["dense", "cnn", "attention"])
def test_releases_and_one_run_audits_run_the_ghost_kernel(monkeypatch, model):
    """Every module model's training goes through ghost_clipped_sum (not the fallback), record and
    user units; and its weights after a short reproducible run match the vmap kernel's closely."""
    digits = load_dataset("digits")
    calls = []
    real = ghost_clip.ghost_clipped_sum

    def spy(*a, **kw):
        out = real(*a, **kw)
        calls.append((out is not None, kw.get("seg") is not None))
        return out

    monkeypatch.setattr(ghost_clip, "ghost_clipped_sum", spy)
    cfg = DPSGDConfig(sample_rate=0.05, steps=3, normalizer=64, noise_multiplier=1.0)
    modules_one_run(
        f"dp-{model}", digits, cfg, canaries=20, noise=NoiseSource("reproducible", seed=0), seed=0
    )
    assert calls and all(ok and not user for ok, user in calls)
    calls.clear()
    x, y = digits.x_train[:200].reshape(200, 1, 8, 8), digits.y_train[:200]
    weights = []
    for fallback in (False, True):
        if fallback:
            monkeypatch.setattr(ghost_clip, "ghost_layers", lambda m: None)
        torch.manual_seed(0)
        m = {
            "dense": lambda: Dense(64, (32, 16), 10, dropout=0.0),
            "cnn": lambda: CNN2d((1, 8, 8)),
            "attention": lambda: CompactAttention((1, 8, 8)),
        }[model]()
        train_module_dp_sgd(
            m,
            x,
            y,
            cfg,
            users=UserSampling(np.arange(200) // 3, 2),
            noise=NoiseSource("reproducible", seed=5),
        )
        train_module_dp_sgd(m, x, y, cfg, noise=NoiseSource("reproducible", seed=6))
        weights.append(torch.cat([p.detach().reshape(-1) for p in m.parameters()]))
        if not fallback:
            assert calls and all(ok for ok, _ in calls) and any(user for _, user in calls)
    torch.testing.assert_close(
        weights[0], weights[1], rtol=1e-4, atol=1e-5
    )  # float32 rounding only

"""Trainable-representation path: torch.func per-sample clipping == Opacus, and the baselines' shapes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpaudit.errors import UsageError
from dpaudit.mechanisms.dpsgd.module_training import DPSGDConfig, train_module_dp_sgd
from dpaudit.mechanisms.dpsgd.core import per_sample_clipped_sum
from dpaudit.mechanisms.dpsgd.models import (
    CNN1d,
    CNN2d,
    CompactAttention,
    Dense,
    build_module,
    sinusoidal_positions_2d,
)
from dpaudit.noise import NoiseSource

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")


def _opacus_clipped_sum(module, x, y, c, loss):
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    gsm = GradSampleModule(module, loss_reduction="sum")  # the loss below is a sum over examples
    opt = DPOptimizer(
        torch.optim.SGD(gsm.parameters(), lr=0.1),
        noise_multiplier=0.0,
        max_grad_norm=c,
        expected_batch_size=len(x),
        loss_reduction="sum",
    )
    out = gsm(x)
    if loss == "bce":
        value = torch.nn.functional.binary_cross_entropy_with_logits(
            out.reshape(-1), y.double(), reduction="sum"
        )
    else:
        value = torch.nn.functional.cross_entropy(out, y, reduction="sum")
    value.backward()
    samples = {n: p.grad_sample.detach().clone() for n, p in module.named_parameters()}
    opt.clip_and_accumulate()
    result = {n: p.summed_grad.detach().clone() for n, p in module.named_parameters()}
    gsm._close()
    return result, samples


@pytest.mark.parametrize(
    "make,shape,loss,k",
    [
        (lambda: Dense(12, (8, 6), 3, dropout=0.0), (12,), "cross_entropy", 3),
        (lambda: Dense(12, (8, 6), 1, dropout=0.0), (12,), "bce", 2),
        (lambda: CNN2d((1, 8, 8), 4), (1, 8, 8), "cross_entropy", 4),
        (lambda: CNN1d(10, 1), (10,), "bce", 2),
        (lambda: CompactAttention((1, 8, 8), 3), (1, 8, 8), "cross_entropy", 3),
    ],
    ids=["dense", "dense-binary", "cnn2d", "cnn1d", "attention"],
)
def test_per_sample_clipped_sum_matches_opacus_float64(make, shape, loss, k):
    torch.manual_seed(0)
    module = make().double().train()  # dropout 0 in these tests: both paths see the same function
    g = torch.Generator().manual_seed(1)
    x = torch.randn((7, *shape), generator=g, dtype=torch.float64) * 2
    y = torch.randint(0, k, (7,), generator=g)
    params = {n: p.detach() for n, p in module.named_parameters()}
    ours = per_sample_clipped_sum(module, params, x, y, 0.3, loss=loss)
    ref, samples = _opacus_clipped_sum(module, x, y, 0.3, loss)
    assert set(ours) == set(ref)
    # 1) Opacus's own clipped sum. It divides by (norm + 1e-6) instead of norm, so each clipped
    #    example may differ by up to ~1e-6 * C in norm.
    for name in ref:
        torch.testing.assert_close(ours[name], ref[name], rtol=1e-5, atol=len(x) * 0.3 * 2e-6)
    # 2) Opacus's per-sample gradients with the exact rule min(1, C / ||g_i||): equal to rounding.
    norms = torch.sqrt(sum(g.reshape(len(x), -1).pow(2).sum(1) for g in samples.values()))
    coef = torch.clamp(0.3 / norms, max=1.0)
    for name, g in samples.items():
        torch.testing.assert_close(
            ours[name], torch.tensordot(coef, g, dims=([0], [0])), rtol=1e-10, atol=1e-12
        )
    # 3) Without clipping (non-private path): the plain sum of Opacus's per-sample gradients.
    plain = per_sample_clipped_sum(module, params, x, y, 0.3, loss=loss, clip=False)
    for name, g in samples.items():
        torch.testing.assert_close(plain[name], g.sum(0), rtol=1e-10, atol=1e-12)


def test_paper_parameter_counts():
    """Trainable counts of the CIFAR-10 baselines in Table 6 of the paper."""
    dense = build_module(
        "dense", kind="image", n_features=3072, n_classes=10, image_shape=(3, 32, 32)
    )
    cnn = build_module("cnn", kind="image", n_features=3072, n_classes=10, image_shape=(3, 32, 32))
    assert sum(p.numel() for p in dense.parameters()) == 820_874
    assert sum(p.numel() for p in cnn.parameters()) == 545_098
    mnist_cnn = build_module(
        "cnn", kind="image", n_features=784, n_classes=10, image_shape=(1, 28, 28)
    )
    assert (
        mnist_cnn.conv1.out_channels == 16
        and mnist_cnn.conv2.out_channels == 32
        and mnist_cnn.fc1.out_features == 128
    )
    tab = build_module("dense", kind="tabular", n_features=32, n_classes=2)
    assert (tab.fc1.out_features, tab.fc2.out_features, tab.fc3.out_features) == (64, 32, 1)
    att = build_module(
        "attention", kind="image", n_features=784, n_classes=10, image_shape=(1, 28, 28)
    )
    assert att.positions.shape == (49, 32) and not any(
        n == "positions" for n, _ in att.named_parameters()
    )
    with pytest.raises(UsageError, match="kind must be image"):
        build_module("attention", kind="tabular", n_features=32, n_classes=2)


def test_build_module_is_seeded_and_leaves_global_rng_alone():
    state = torch.get_rng_state()
    a = build_module("cnn", kind="tabular", n_features=32, n_classes=2, seed=1)
    b = build_module("cnn", kind="tabular", n_features=32, n_classes=2, seed=1)
    c = build_module("cnn", kind="tabular", n_features=32, n_classes=2, seed=2)
    assert torch.equal(state, torch.get_rng_state())
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters()))


def test_sinusoidal_positions_are_fixed_and_distinct():
    p = sinusoidal_positions_2d(7, 7, 32)
    assert p.shape == (49, 32) and torch.all(p.abs() <= 1)
    assert torch.unique(p, dim=0).shape[0] == 49


def test_train_module_dp_sgd_counts_steps_and_learns():
    rng = np.random.default_rng(0)
    n = 200
    y = rng.integers(0, 2, n)
    x = rng.normal(size=(n, 6)).astype(np.float32) * 0.3
    x[:, 0] += np.where(y == 1, 1.5, -1.5)
    module = build_module("dense", kind="tabular", n_features=6, n_classes=2, seed=0)
    cfg = DPSGDConfig(sample_rate=0.2, steps=60, normalizer=40, noise_multiplier=0.3, lr=0.01)
    steps = train_module_dp_sgd(
        module, x, y, cfg, noise=NoiseSource("reproducible", seed=0), loss="bce"
    )
    assert steps == 60
    module.eval()
    with torch.no_grad():
        pred = (module(torch.tensor(x)).reshape(-1) > 0).numpy()
    assert (pred == y).mean() > 0.9

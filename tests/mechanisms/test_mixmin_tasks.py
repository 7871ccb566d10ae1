"""Tasks, proxies (public data only), splits and the bring-your-own proxy file loader."""

from __future__ import annotations

import numpy as np
import pytest

from dpaudit.errors import DataError, UsageError
from dpaudit.mechanisms.mixmin.tasks import (
    DIGIT_TARGETS,
    load_digits_task,
    load_heart_task,
    load_mnist_task,
    load_proxy_predictions,
    mixture_split,
    synthetic_user_ids,
    train_proxies,
)


def test_digits_task_structure():
    t = load_digits_task(seed=1)
    assert t.k == 10 and t.shared_inputs and tuple(t.targets) == DIGIT_TARGETS
    assert np.all(t.public_y.sum(axis=1) == 1)
    n = len(t.private_x)
    idx = np.concatenate([t.train_idx, t.val_idx, t.test_idx])
    assert sorted(idx.tolist()) == list(range(n))
    y3 = t.targets["digit-3"]
    np.testing.assert_array_equal(y3, (t.private_records == 3).astype(int))
    loops = t.targets["loops-0689"]
    np.testing.assert_array_equal(loops, np.isin(t.private_records, [0, 6, 8, 9]).astype(int))
    # the private training records are fixed by the task: the same for every target and seed
    assert (
        t.data_digest()
        == load_digits_task(seed=1).data_digest()
        == load_digits_task(seed=2).data_digest()
    )


def test_proxies_are_probabilities_and_deterministic():
    t = load_digits_task(seed=3)
    p = train_proxies(t).predict(t.private_x[:20])
    assert p.shape == (20, 10) and np.all((p >= 0) & (p <= 1))
    np.testing.assert_allclose(p.sum(axis=1), 1, atol=1e-6)  # one multi-class proxy (joint mode)


@pytest.mark.parametrize("users", [False, True])
def test_mixture_split_is_disjoint_and_user_aligned(users):
    uid = synthetic_user_ids(200, 4, seed=0) if users else None
    mix, ft = mixture_split(200, 0.1, seed=5, user_ids=uid)
    assert set(mix).isdisjoint(ft) and len(mix) + len(ft) == 200
    if users:
        assert set(uid[mix]).isdisjoint(uid[ft])
        assert 1 <= len(set(uid[mix])) <= 15  # Binomial(50 users, 0.1): mean 5, sd 2.1
    else:
        assert 5 <= len(mix) <= 35  # Binomial(200, 0.1): mean 20, sd 4.2 (keyed per-record draws)
    with pytest.raises(UsageError, match="rho must be in the open interval"):
        mixture_split(10, 1.0, seed=0)


def _write(tmp_path, **arrays):
    p = tmp_path / "proxy.npz"
    np.savez(p, **arrays)
    return p


def test_proxy_file_round_trip(tmp_path):
    probs = np.random.default_rng(0).uniform(size=(30, 3))
    p = _write(
        tmp_path,
        probs=probs,
        labels=np.zeros(30),
        user_ids=np.arange(30) % 7,
        source_names=np.array(["a", "b", "c"]),
    )
    pp = load_proxy_predictions(p)
    assert (
        pp.source_names == ("a", "b", "c")
        and pp.probs.shape == (30, 3)
        and pp.user_ids.shape == (30,)
    )


@pytest.mark.parametrize(
    "arrays, bad",
    [
        ({"probs": np.full((4, 2), 0.5)}, "labels"),
        ({"labels": np.zeros(4)}, "probs"),
        ({"probs": np.array([[0.5, np.nan]] * 4), "labels": np.zeros(4)}, "probs"),
        ({"probs": np.full((4, 2), 1.5), "labels": np.zeros(4)}, "probs"),
        ({"probs": np.full((4, 2), 0.5), "labels": np.zeros(3)}, "labels"),
        (
            {"probs": np.full((4, 2), 0.5), "labels": np.zeros(4), "user_ids": np.zeros(2)},
            "user_ids",
        ),
        (
            {"probs": np.full((4, 2), 0.5), "labels": np.zeros(4), "source_names": np.array(["x"])},
            "source_names",
        ),
    ],
)
def test_malformed_proxy_file_names_the_array(tmp_path, arrays, bad):
    p = _write(tmp_path, **arrays)
    with pytest.raises(DataError) as e:
        load_proxy_predictions(p)
    msg = str(e.value)
    assert f"'{bad}'" in msg and "\n" not in msg


def test_unreadable_proxy_file(tmp_path):
    p = tmp_path / "x.npz"
    p.write_bytes(b"not a zip")
    with pytest.raises(DataError, match="not a readable .npz"):
        load_proxy_predictions(p)
    with pytest.raises(DataError, match="not found"):
        load_proxy_predictions(tmp_path / "missing.npz")


def test_mnist_task_on_the_registry_split(data_dir):
    # public sources = the registry mnist's 9,000 validation images, private = its 51,000
    # training images (the former division's public half held 25,000 images mnist trains on)
    t = load_mnist_task(seed=42, data_dir=data_dir)
    assert t.public_x.shape == (9000, 784) and len(t.train_idx) == 51000
    assert len(t.val_idx) == 5000 and len(t.test_idx) == 5000
    # the public sources and the private training images are disjoint sets of training images
    pub = {hash(r.tobytes()) for r in (t.public_x[:2000] * 255).astype(np.uint8)}
    priv = {hash(r.tobytes()) for r in (t.private_x[t.train_idx][:2000] * 255).astype(np.uint8)}
    assert len(pub & priv) <= 5  # MNIST has a handful of duplicate images
    for name in ("digit-3", "loops-0689", "small-0to4", "ink-heavy"):
        assert 0.05 < t.targets[name].mean() < 0.95


def test_heart_task(data_dir):
    t = load_heart_task(seed=0, data_dir=data_dir)
    assert t.source_names == ("hungarian", "switzerland", "va") and not t.shared_inputs
    assert len(t.private_x) == 303 and set(np.unique(t.public_source)) == {0, 1, 2}
    p = train_proxies(t).predict(t.private_x[:10])
    assert p.shape == (10, 3) and np.all((p >= 0) & (p <= 1))


@pytest.mark.parametrize("loss", ["softmax", "bce"])
def test_proxy_training_is_torch_optim_adam_bit_for_bit(loss):
    """fit() steps with dpsgd.adam_update (no torch._dynamo import); the weights are exactly
    those of torch.optim.Adam on the same batches, in float32."""
    import torch

    from dpaudit.mechanisms.mixmin.tasks import fit, new_mlp, torch_generator

    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 20)).astype(np.float32)
    y = rng.integers(0, 5, 600) if loss == "softmax" else rng.uniform(size=(600, 5))
    ours, ref = new_mlp(20, 16, 5, 1, 7), new_mlp(20, 16, 5, 1, 7)
    fit(ours, x, y, loss=loss, epochs=3, key=(1,), batch_size=64, lr=3e-3)
    g = torch_generator(1)
    xt = torch.as_tensor(x)
    tt = torch.as_tensor(y, dtype=torch.int64 if loss == "softmax" else torch.float32)
    opt = torch.optim.Adam(ref.parameters(), lr=3e-3)
    for _ in range(3):
        perm = torch.randperm(600, generator=g)
        for s in range(0, 600, 64):
            idx = perm[s : s + 64]
            out = ref(xt[idx])
            if loss == "softmax":
                lv = torch.nn.functional.cross_entropy(out, tt[idx])
            else:
                lv = torch.nn.functional.binary_cross_entropy_with_logits(out, tt[idx])
            opt.zero_grad()
            lv.backward()
            opt.step()
    for a, b in zip(ours.parameters(), ref.parameters()):
        assert torch.equal(a, b)

"""User-level DP-SGD: exact reduction to record-level DP-SGD, per-user sensitivity, references."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from itertools import combinations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dpaudit.accounting import SubsampledGaussian, compute_epsilon
from dpaudit.data import load_dataset
from dpaudit.data.users import index_users
from dpaudit.errors import AccountingMismatchError, DataError, UsageError
from dpaudit.mechanisms.dpsgd import core as dpsgd_core, mechanism as dpsgd_release, user_level
from dpaudit.mechanisms.dpsgd.module_training import DPSGDConfig, train_module_dp_sgd
from dpaudit.mechanisms.dpsgd.loop import UserSampling, train_heads
from dpaudit.mechanisms.dpsgd.models import Dense
from dpaudit.mechanisms.dpsgd.user_level import (
    sample_user_records,
    user_head_clipped_sum,
    user_module_clipped_sum,
)
from dpaudit.noise import NoiseSource
from dpaudit.releasing import release
from dpaudit.requests import DPSGDRequest
from dpaudit.mechanisms.dpsgd.mechanism import DPSGDMechanism
from dpaudit.records import read_release


def _cfg(**kw):
    base = dict(
        sample_rate=0.2, steps=30, normalizer=8, noise_multiplier=1.3, clipping_norm=0.7, lr=1e-2
    )
    base.update(kw)
    return DPSGDConfig(**base)


def _record_masks(monkeypatch):
    """Record every Poisson sample the engine draws."""
    seen = []
    real = dpsgd_core.poisson_batch

    def spy(*a, **kw):
        flat, offsets = real(*a, **kw)
        seen.append(flat[offsets[0] : offsets[1]].copy())
        return flat, offsets

    monkeypatch.setattr(dpsgd_core, "poisson_batch", spy)
    return seen


# ---------------------------------------------------------------- within-user sampling


def test_sample_user_records_takes_min_g_without_replacement():
    ids = np.repeat(np.arange(6), [1, 2, 5, 9, 3, 12])
    np.random.default_rng(0).shuffle(ids)
    ix = index_users(ids)
    noise = NoiseSource("reproducible", seed=3)
    sampled = np.array([0, 2, 3, 5])
    rows, seg, k = sample_user_records(ix, sampled, 4, noise)
    assert k.tolist() == [min(4, c) for c in ix.counts[sampled]]
    assert np.bincount(seg).tolist() == k.tolist()
    for j, u in enumerate(sampled):
        r = rows[seg == j]
        assert np.all(ids[r] == ix.ids[u]) and np.unique(r).size == r.size  # no repeats
        if ix.counts[u] <= 4:
            assert sorted(r.tolist()) == np.flatnonzero(ids == ix.ids[u]).tolist()


def test_small_users_draw_no_private_randomness():
    ix = index_users(np.repeat(np.arange(5), [1, 2, 3, 1, 2]))
    noise = NoiseSource("reproducible", seed=1)
    before = noise.numpy.bit_generator.state
    sample_user_records(ix, np.arange(5), 3, noise)
    assert noise.numpy.bit_generator.state == before
    sample_user_records(ix, np.arange(5), 2, noise)  # user 2 has 3 > 2 records: draws
    assert noise.numpy.bit_generator.state != before


@pytest.mark.parametrize("source", ["reproducible", "crypto"])
def test_within_user_subsets_are_uniform(source):
    """Every 2-subset of a 5-record user is equally likely (chi-square at a fixed seed)."""
    ids = np.array([0, 1, 1, 1, 1, 1, 2])
    ix = index_users(ids)
    noise = (
        NoiseSource("reproducible", seed=11)
        if source == "reproducible"
        else NoiseSource._cryptographic_with_key(bytes(range(32)))
    )
    pairs = {p: i for i, p in enumerate(combinations(range(1, 6), 2))}
    counts = np.zeros(len(pairs))
    for _ in range(3000):
        rows, seg, k = sample_user_records(ix, np.array([1]), 2, noise)
        counts[pairs[tuple(sorted(rows.tolist()))]] += 1
    assert stats.chisquare(counts).pvalue > 1e-3


# ---------------------------------------------------------------- exact reduction to record level


@pytest.mark.parametrize("n_classes,binary", [(3, False), (2, True)])
@pytest.mark.parametrize("g", [1, 4])
def test_one_record_per_user_head_equals_record_level(monkeypatch, n_classes, binary, g):
    rng = np.random.default_rng(5)
    n = 240
    z = rng.normal(size=(n, 6)).astype(np.float32) * 2
    y = rng.integers(0, n_classes, n)
    init = rng.uniform(-0.3, 0.3, size=(1 if binary else n_classes, 7))
    ids = rng.permutation(10**6)[:n]  # distinct, arbitrary user ids
    cfg = _cfg()
    masks = _record_masks(monkeypatch)
    a = train_heads(
        z,
        y,
        n_classes,
        cfg,
        noise=NoiseSource("reproducible", seed=9),
        init=init,
        binary_logit=binary,
    )
    record_masks = list(masks)
    masks.clear()
    b = _user_head(
        z,
        y,
        ids,
        n_classes,
        cfg,
        records_per_user=g,
        noise=NoiseSource("reproducible", seed=9),
        init=init,
        binary_logit=binary,
    )
    assert len(masks) == len(record_masks) == cfg.steps
    assert all(np.array_equal(p, q) for p, q in zip(masks, record_masks))
    assert np.array_equal(a.weights, b.weights)
    assert a.steps_executed == b.steps_executed == cfg.steps
    assert not np.allclose(b.weights[0][:, :-1], init[:, :-1])  # it trained


def test_one_record_per_user_module_equals_record_level(monkeypatch):
    rng = np.random.default_rng(2)
    n = 60
    x = torch.tensor(rng.normal(size=(n, 5)), dtype=torch.float32)
    y = torch.tensor(rng.integers(0, 3, n))
    torch.manual_seed(0)
    m1 = Dense(5, (8, 6), 3, dropout=0.2)  # dropout: per-example masks must match too
    m2 = copy.deepcopy(m1)
    cfg = _cfg(sample_rate=0.3, steps=6, normalizer=18)
    masks = _record_masks(monkeypatch)
    s1 = train_module_dp_sgd(m1, x, y, cfg, noise=NoiseSource("reproducible", seed=4), max_chunk=7)
    record_masks = list(masks)
    masks.clear()
    s2 = train_module_dp_sgd(
        m2,
        x,
        y,
        cfg,
        users=UserSampling(np.arange(n) * 3 + 1, 3),
        noise=NoiseSource("reproducible", seed=4),
        max_chunk=7,
    )
    assert s1 == s2 == cfg.steps
    assert all(np.array_equal(p, q) for p, q in zip(masks, record_masks))
    for (n1, p1), (n2, p2) in zip(m1.named_parameters(), m2.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2), n1


# ---------------------------------------------------------------- references


def _reference_user_head_sum(w, z, y, groups, c, binary, clip=True):
    """Autograd on the explicit mean loss of each user's records, clipped per user (Algorithm 2)."""
    total = torch.zeros_like(torch.as_tensor(w, dtype=torch.float64))
    for rows in groups:
        wt = torch.tensor(w, dtype=torch.float64, requires_grad=True)
        z1 = torch.cat(
            [
                torch.as_tensor(z[rows], dtype=torch.float64),
                torch.ones(len(rows), 1, dtype=torch.float64),
            ],
            1,
        )
        s = z1 @ wt.T
        if binary:
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                s[:, 0], torch.as_tensor(y[rows], dtype=torch.float64)
            )
        else:
            loss = torch.nn.functional.cross_entropy(s, torch.as_tensor(y[rows]))
        (g,) = torch.autograd.grad(loss, wt)  # mean over the user's records
        if clip:
            g = g * min(1.0, c / float(g.norm()))
        total += g
    return total.numpy()


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize("c", [0.05, 1.0, 1e3])
def test_user_head_clipped_sum_matches_autograd(binary, c):
    rng = np.random.default_rng(7)
    n, d = 50, 4
    k_out = 1 if binary else 3
    z = rng.normal(size=(n, d)) * 3
    y = rng.integers(0, 2 if binary else 3, n)
    ids = rng.integers(0, 12, n)
    ix = index_users(ids)
    w = rng.normal(size=(k_out, d + 1))
    rows, seg, k = sample_user_records(
        ix, np.arange(ix.n_users), 3, NoiseSource("reproducible", seed=0)
    )
    z1t = torch.as_tensor(np.hstack([z, np.ones((len(z), 1))]), dtype=torch.float64)
    ours = user_head_clipped_sum(
        w,
        z1t.numpy(),
        torch.linalg.vector_norm(z1t, dim=1).numpy(),
        y,
        rows,
        seg,
        k,
        c,
        binary_logit=binary,
    )
    groups = [rows[seg == j] for j in range(k.size)]
    ref = _reference_user_head_sum(w, z, y, groups, c, binary)
    np.testing.assert_allclose(ours, ref, rtol=1e-10, atol=1e-12)
    unclipped = user_head_clipped_sum(
        w,
        z1t.numpy(),
        torch.linalg.vector_norm(z1t, dim=1).numpy(),
        y,
        rows,
        seg,
        k,
        c,
        binary_logit=binary,
        clip=False,
    )
    np.testing.assert_allclose(
        unclipped,
        _reference_user_head_sum(w, z, y, groups, c, binary, clip=False),
        rtol=1e-10,
        atol=1e-12,
    )


@pytest.mark.parametrize("max_chunk", [1000, 5])
def test_user_module_clipped_sum_matches_autograd(max_chunk):
    rng = np.random.default_rng(3)
    n = 40
    x = torch.tensor(rng.normal(size=(n, 4)) * 2, dtype=torch.float64)
    y = torch.tensor(rng.integers(0, 3, n))
    torch.manual_seed(1)
    m = Dense(4, (6, 5), 3, dropout=0.0).double()
    ids = np.concatenate(
        [np.zeros(12, int), rng.integers(1, 9, n - 12)]
    )  # user 0: 12 rows > max_chunk 5
    ix = index_users(ids)
    rows, seg, k = sample_user_records(
        ix, np.arange(ix.n_users), 12, NoiseSource("reproducible", seed=0)
    )
    params = {n_: p.detach() for n_, p in m.named_parameters()}
    c = 0.5
    ours = user_module_clipped_sum(m, params, x, y, rows, seg, k, c, max_chunk=max_chunk)
    ref = {n_: torch.zeros_like(p) for n_, p in params.items()}
    for j in range(k.size):
        r = torch.as_tensor(rows[seg == j])
        m.zero_grad()
        torch.nn.functional.cross_entropy(m(x[r]), y[r]).backward()
        gs = {n_: p.grad.clone() for n_, p in m.named_parameters()}
        norm = math.sqrt(sum(float(g.pow(2).sum()) for g in gs.values()))
        for n_ in ref:
            ref[n_] += gs[n_] * min(1.0, c / norm)
    for n_ in ref:
        torch.testing.assert_close(ours[n_], ref[n_], rtol=1e-9, atol=1e-11)


# ---------------------------------------------------------------- sensitivity: one user moves <= C


def _heavy_user_data(g_heavy=1000, seed=0):
    rng = np.random.default_rng(seed)
    light = rng.integers(1, 6, size=30)
    ids = np.concatenate([np.zeros(g_heavy, int), np.repeat(np.arange(1, 31), light)])
    n = ids.size
    z = rng.normal(size=(n, 8)) * 5  # large features: every per-record gradient norm >> C
    y = rng.integers(0, 3, n)
    return ids, z, y


@pytest.mark.parametrize("g", [1000, 10])
def test_user_with_1000_records_moves_the_noiseless_update_at_most_c(g):
    ids, z, y = _heavy_user_data()
    c = 1.0
    w = np.random.default_rng(1).normal(size=(3, 9))
    z1t = torch.as_tensor(np.hstack([z, np.ones((len(z), 1))]), dtype=torch.float64)
    z1, zn = z1t.numpy(), torch.linalg.vector_norm(z1t, dim=1).numpy()

    def update(keep):
        ix = index_users(ids[keep])
        rows, seg, k = sample_user_records(
            ix, np.arange(ix.n_users), g, NoiseSource("reproducible", seed=2)
        )
        return user_head_clipped_sum(w, z1[keep], zn[keep], y[keep], rows, seg, k, c)

    with_heavy = update(np.ones(ids.size, bool))
    without = update(ids != 0)
    moved = np.linalg.norm(with_heavy - without)
    assert 0.5 * c < moved <= c * (1 + 1e-12)
    # the same removal under record-level clipping moves the sum by far more than C
    record_level = dpsgd_core.head_clipped_sum(w, z1[ids == 0], zn[ids == 0], y[ids == 0], c)
    assert np.linalg.norm(record_level) > 50 * c


def test_user_with_1000_records_module_update_bounded():
    ids, z, y = _heavy_user_data(seed=4)
    x = torch.tensor(z, dtype=torch.float64)
    yt = torch.tensor(y)
    torch.manual_seed(3)
    m = Dense(8, (6, 5), 3, dropout=0.0).double()
    params = {n_: p.detach() for n_, p in m.named_parameters()}
    c = 0.3

    def total(keep):
        ix = index_users(ids[keep])
        rows, seg, k = sample_user_records(
            ix, np.arange(ix.n_users), 1000, NoiseSource("reproducible", seed=2)
        )
        s = user_module_clipped_sum(
            m,
            params,
            x[torch.as_tensor(keep)],
            yt[torch.as_tensor(keep)],
            rows,
            seg,
            k,
            c,
            max_chunk=256,
        )
        return torch.cat([v.reshape(-1) for v in s.values()])

    moved = float((total(np.ones(ids.size, bool)) - total(ids != 0)).norm())
    assert moved <= c * (1 + 1e-9)


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.integers(1, 40), min_size=2, max_size=12),
    st.integers(1, 50),
    st.floats(0.01, 10.0),
    st.integers(0, 10**6),
)
def test_removing_any_user_moves_the_clipped_sum_at_most_c(sizes, g, c, seed):
    rng = np.random.default_rng(seed)
    ids = np.repeat(np.arange(len(sizes)), sizes)
    rng.shuffle(ids)
    z = rng.normal(size=(ids.size, 3)) * rng.uniform(0.1, 20)
    y = rng.integers(0, 2, ids.size)
    w = rng.normal(size=(1, 4))
    z1t = torch.as_tensor(np.hstack([z, np.ones((len(z), 1))]), dtype=torch.float64)
    z1, zn = z1t.numpy(), torch.linalg.vector_norm(z1t, dim=1).numpy()
    victim = int(rng.integers(0, len(sizes)))

    def clipped(keep):
        ix = index_users(ids[keep])
        rows, seg, k = sample_user_records(
            ix, np.arange(ix.n_users), g, NoiseSource("reproducible", seed=seed)
        )
        return user_head_clipped_sum(
            w, z1[keep], zn[keep], y[keep], rows, seg, k, c, binary_logit=True
        )

    # removing the victim leaves every other user's sampled records unchanged when no user has more
    # than G records; otherwise compare the victim's own contribution directly.
    if max(sizes) <= g:
        moved = np.linalg.norm(clipped(np.ones(ids.size, bool)) - clipped(ids != victim))
    else:
        moved = np.linalg.norm(clipped(ids == victim))
    assert moved <= c * (1 + 1e-12)


# ---------------------------------------------------------------- the release


def _digits_user_ids(per_user=3):
    ds = load_dataset("digits")
    n = len(ds.y_train) + len(ds.y_val) + len(ds.y_test)
    return ds, np.arange(n) // per_user


def test_release_records_user_level_accounting(tmp_path):
    from dpaudit.ledger.book import open_ledger

    ds, ids = _digits_user_ids()
    rel = release(
        DPSGDMechanism(user_ids=ids),
        DPSGDRequest(
            model="dp-rvfl",
            privacy_unit="user",
            records_per_user=2,
            dataset="digits",
            epsilon=3.0,
            delta=1e-5,
            epochs=2,
            batch_size=64,
            reproducible_noise=True,
            reference_size=419,
        ),
        out_dir=tmp_path / "run",
        progress=False,
    )
    n_users = rel.config[
        "reference_size"
    ]  # the declared number of training users (1797 rows // 3 -> 599 users, 70 % of them)
    j = math.ceil(n_users / 64)
    assert (
        rel.adjacency == "add-remove-user"
        and rel.privacy_unit == "user"
        and rel.accountant == "rdp"
    )
    assert rel.config["records_per_user"] == 2 and rel.config["batch_size_unit"] == "users"
    assert (
        n_users == int(0.7 * 599) and "train" not in rel.dataset["n_users"]
    )  # the actual count is private: never published
    assert rel.sample_rate == 1.0 / j and rel.steps == 2 * j and rel.normalizer == n_users // j
    assert rel.steps_executed == rel.steps
    event = SubsampledGaussian(rel.noise_multiplier, rel.sample_rate, rel.steps)
    assert rel.guarantee == event.to_dict()
    assert (
        rel.epsilon
        == compute_epsilon(event, delta=1e-5, adjacency="add-remove-user").epsilon
        <= 3.0
    )
    assert read_release(tmp_path / "run").to_dict() == rel.to_dict()  # round-trips through JSON
    stored = json.loads((tmp_path / "run" / "release.json").read_text())
    assert stored["privacy_unit"] == "user" and stored["adjacency"] == "add-remove-user"
    assert "--privacy-unit user --records-per-user 2" in stored["command"]
    with open_ledger() as ledger:
        (entry,) = ledger.entries(dataset="digits", kind="release")
    assert (
        entry.payload["adjacency"] == "add-remove-user"
        and entry.payload["privacy_unit"] == "user"
        and entry.payload["release_id"] == rel.id
    )


def test_steps_mismatch_withholds_the_release(tmp_path, monkeypatch):
    ds, ids = _digits_user_ids()
    real = dpsgd_release.train_heads

    def short(*a, **kw):
        out = real(*a, **kw)
        return dataclasses.replace(out, steps_executed=out.steps_executed - 1)

    monkeypatch.setattr(dpsgd_release, "train_heads", short)
    with pytest.raises(AccountingMismatchError, match="steps executed"):
        release(
            DPSGDMechanism(user_ids=ids),
            DPSGDRequest(
                model="dp-rvfl",
                privacy_unit="user",
                records_per_user=2,
                epsilon=3.0,
                epochs=2,
                batch_size=64,
                reproducible_noise=True,
                reference_size=419,
            ),
            out_dir=tmp_path / "run",
            progress=False,
            record=False,
        )
    assert not (tmp_path / "run" / "release.json").exists()


def test_user_level_refusals(tmp_path):
    ds, ids = _digits_user_ids()
    with pytest.raises(UsageError, match="user_ids must be given"):
        release(
            "dp-rvfl",
            DPSGDRequest(
                model="dp-rvfl", privacy_unit="user", records_per_user=2, reference_size=419
            ),
            out_dir=tmp_path,
            progress=False,
        )
    with pytest.raises(UsageError, match="records_per_user must be an integer >= 1"):
        release(
            DPSGDMechanism(user_ids=ids),
            DPSGDRequest(model="dp-rvfl", privacy_unit="user", records_per_user=0),
            out_dir=tmp_path,
            progress=False,
        )
    with pytest.raises(
        UsageError, match="reference_size must be given"
    ):  # no definition declares a number of users
        release(
            DPSGDMechanism(user_ids=ids),
            DPSGDRequest(model="dp-rvfl", privacy_unit="user", records_per_user=2),
            out_dir=tmp_path,
            progress=False,
        )
    n = len(ids)
    from dpaudit.data.splits import split_indices

    tr, va, te = split_indices(n, ds.split_seed, 70, 15)
    with pytest.raises(DataError, match="not by records"):
        release(
            DPSGDMechanism(user_ids={"train": ids[tr], "val": ids[va], "test": ids[te]}),
            DPSGDRequest(
                model="dp-rvfl",
                dataset=ds.name,
                privacy_unit="user",
                records_per_user=2,
                reference_size=419,
            ),
            prepared=ds,
            out_dir=tmp_path,
            progress=False,
        )
    with pytest.raises(UsageError, match="one id per training record"):
        _user_head(
            np.zeros((4, 2)),
            np.zeros(4, int),
            np.arange(3),
            2,
            _cfg(),
            records_per_user=1,
            noise=NoiseSource("reproducible", seed=0),
        )


def test_one_record_per_user_release_equals_record_level_release(tmp_path):
    """End to end on digits: distinct user ids -> same split, schedule, noise, weights, metrics."""
    common = dict(
        dataset="digits",
        epsilon=3.0,
        delta=1e-5,
        epochs=2,
        batch_size=180,
        seed=5,
        reproducible_noise=True,
    )
    rec = release(
        "dp-rvfl",
        DPSGDRequest(model="dp-rvfl", **common),
        out_dir=tmp_path / "rec",
        ledger_path=tmp_path / "l1.sqlite",
        progress=False,
    )
    ids = np.random.default_rng(0).permutation(10**5)[:1797]
    usr = release(
        DPSGDMechanism(user_ids=ids),
        DPSGDRequest(
            model="dp-rvfl", privacy_unit="user", records_per_user=3, reference_size=1257, **common
        ),
        out_dir=tmp_path / "usr",
        ledger_path=tmp_path / "l2.sqlite",
        progress=False,
    )
    assert (
        rec.data_digest == usr.data_digest
    )  # same prepared data (the digest is local only, never published)
    for key in (
        "sample_rate",
        "steps",
        "steps_executed",
        "normalizer",
        "noise_multiplier",
        "epsilon",
        "guarantee",
        "metrics",
    ):
        assert getattr(rec, key) == getattr(usr, key), key
    assert (rec.adjacency, usr.adjacency) == ("add-remove-record", "add-remove-user")
    with (
        np.load(tmp_path / "rec" / "weights.npz") as a,
        np.load(tmp_path / "usr" / "weights.npz") as b,
    ):
        assert np.array_equal(a["head_weight"], b["head_weight"])


def _user_head(z, y, users, n_classes, cfg, *, records_per_user, **kw):
    """One user-level head run, as a user-level release trains it (engine.train_heads with user units)."""
    from dpaudit.data.users import UserIndex, index_users
    from dpaudit.mechanisms.dpsgd.loop import UserSampling, train_heads

    index = users if isinstance(users, UserIndex) else index_users(users)
    return train_heads(z, y, n_classes, cfg, users=UserSampling(index, records_per_user), **kw)

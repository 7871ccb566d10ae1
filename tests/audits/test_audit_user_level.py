"""User-level canary audits (one whole canary user, adjacency add-remove-user) of DP-SGD heads."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dpaudit.auditing import build_target, target_from_release
from dpaudit.audits.engine import run_audit
from dpaudit.mechanisms.dpsgd.head_audit import HeadTarget
from dpaudit.mechanisms.dpsgd import user_head_audit
from dpaudit.mechanisms.dpsgd.loop import CanaryHook
from dpaudit.mechanisms.dpsgd.user_head_audit import (
    UserHeadTarget,
    synthetic_user_ids,
    user_clipped_gradient,
)
from dpaudit.cli import app
from dpaudit.data.users import index_users
from dpaudit.errors import DataError, UsageError
from dpaudit.mechanisms.dpsgd import module_training as dpsgd, core as dpsgd_core, user_level
from dpaudit.mechanisms.dpsgd.module_training import DPSGDConfig
from dpaudit.mechanisms.dpsgd.loop import UserSampling, train_heads
from dpaudit.mechanisms.dpsgd.user_level import sample_user_records, user_head_clipped_sum
from dpaudit.noise import NoiseSource

torch.set_num_threads(1)
runner = CliRunner()


def _features(rng, n, d, k):
    z = rng.normal(size=(n, d))
    z1 = np.concatenate([z, np.ones((n, 1))], axis=1).astype(np.float32)
    return z, z1, np.sqrt(np.einsum("ij,ij->i", z1, z1)), rng.integers(k, size=n)


# ------------------------------------------------------------------ the clipping the audit runs


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    g=st.integers(1, 6),
    clip=st.sampled_from([0.05, 1.0, 50.0]),
    binary=st.booleans(),
    n_users=st.integers(2, 40),
)
def test_gram_and_segment_user_norms_agree(seed, g, clip, binary, n_users):
    """The one user-norm kernel's two algorithms (Gram matrices for small users, segment sums for
    large ones) give the same clipped sums up to float rounding."""
    rng = np.random.default_rng(seed)
    k = 1 if binary else 4
    n = int(rng.integers(n_users, 4 * n_users + 1))
    _, z1, zn, y = _features(rng, n, 7, 2 if binary else k)
    ids = np.concatenate(
        [np.arange(n_users), rng.integers(n_users, size=n - n_users)]
    )  # every user has >= 1 record, sizes vary
    index = index_users(rng.permutation(ids))
    w = (rng.normal(size=(k, 8)) * 0.3).astype(np.float32)
    sampled = np.sort(
        rng.choice(index.n_users, size=int(rng.integers(1, index.n_users + 1)), replace=False)
    )
    rows, seg, kk = sample_user_records(index, sampled, g, NoiseSource("reproducible", seed=seed))
    got = user_head_clipped_sum(
        w, z1, zn, y, rows, seg, kk, clip, binary_logit=binary
    )  # Gram (G <= 6)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(user_level, "GRAM_MAX_RECORDS", 0)
        want = user_head_clipped_sum(
            w, z1, zn, y, rows, seg, kk, clip, binary_logit=binary
        )  # segment sums
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6 * max(1.0, np.abs(want).max()))


def test_gradient_canary_clipping_is_the_mechanism_s_on_explicit_gradients():
    rng = np.random.default_rng(3)
    _, z1, zn, y = _features(rng, 5, 6, 3)
    w = (rng.normal(size=(3, 7)) * 0.5).astype(np.float32)
    rows, seg, kk = (
        np.arange(5),
        np.zeros(5, dtype=np.int64),
        np.array([5]),
    )  # one user holding all five records
    grads = np.stack(
        [
            np.outer(r, z)
            for r, z in zip(
                dpsgd_core.residuals_numpy(
                    z1.astype(np.float64) @ w.T.astype(np.float64), y, False
                ),
                z1,
            )
        ]
    )
    for c in (0.01, 1.0, 1e3):  # clipped and unclipped
        np.testing.assert_allclose(
            user_clipped_gradient(grads, c),
            user_head_clipped_sum(w, z1, zn, y, rows, seg, kk, c),
            rtol=1e-5,
            atol=1e-7,
        )
    e = np.zeros((4, 3, 7))
    e[:, 0, 2] = 1.0
    assert np.array_equal(
        user_clipped_gradient(e, 1.0), e[0]
    )  # G copies of C e_j: exactly C e_j after averaging and clipping


def test_synthetic_user_ids_are_public_groups_of_g():
    ids = synthetic_user_ids(103, 4, seed=7)
    assert np.array_equal(ids, synthetic_user_ids(103, 4, seed=7)) and not np.array_equal(
        ids, synthetic_user_ids(103, 4, seed=8)
    )
    counts = np.bincount(ids)
    assert counts.size == 26 and np.all(counts[:-1] == 4) and counts[-1] == 3
    with pytest.raises(UsageError, match="records_per_user must be an integer >= 1, got 0"):
        synthetic_user_ids(10, 0, seed=1)


# ------------------------------------------------------------- batched trainer vs the mechanism


def _full_batch_config(n_units, steps=4, sigma=0.7):
    # q = 1: no Poisson randomness, so the batched trainer and the single-run mechanism draw the same stream
    return DPSGDConfig(
        sample_rate=1.0,
        steps=steps,
        normalizer=n_units,
        noise_multiplier=sigma,
        clipping_norm=0.5,
        lr=0.05,
    )


def test_batched_run_equals_the_mechanism_bit_for_bit_with_within_user_sampling():
    rng = np.random.default_rng(0)
    z, _, _, y = _features(rng, 60, 5, 3)
    ids = rng.integers(
        12, size=60
    )  # users of very different sizes: within-user sampling (G = 2) draws private keys
    index = index_users(ids)
    cfg = _full_batch_config(index.n_users)
    init = rng.normal(size=(3, 6)) * 0.1
    one = train_heads(
        z,
        y,
        3,
        cfg,
        users=UserSampling(index, 2),
        noise=NoiseSource("reproducible", seed=11),
        init=init,
    )  # a release's run
    many = _user_runs(
        z,
        y,
        index,
        3,
        cfg,
        records_per_user=2,
        noise=NoiseSource("reproducible", seed=11),
        runs=1,
        init=init,
    )
    assert np.array_equal(many.weights[0], one.weights[0])


def test_canary_user_is_one_more_user_of_the_mechanism():
    rng = np.random.default_rng(1)
    z, _, _, y = _features(rng, 40, 5, 3)
    ids = np.repeat(np.arange(10), 4)
    zc, yc = rng.normal(size=(4, 5)), np.array([2, 2, 2, 2])
    cfg = _full_batch_config(10)
    init = rng.normal(size=(3, 6)) * 0.1
    canary = CanaryHook(np.zeros(1, bool), z=zc, y=yc)
    got = _user_runs(
        z,
        y,
        ids,
        3,
        cfg,
        records_per_user=4,
        noise=NoiseSource("reproducible", seed=5),
        runs=1,
        canary=canary,
        canary_in=np.array([True]),
        init=init,
    )
    # the mechanism on the data plus the canary user (its normaliser is public and unchanged)
    want = train_heads(
        np.concatenate([z, zc]),
        np.concatenate([y, yc]),
        3,
        cfg,
        users=UserSampling(index_users(np.concatenate([ids, [99] * 4])), 4),
        noise=NoiseSource("reproducible", seed=5),
        init=init,
    )
    assert np.array_equal(got.weights[0], want.weights[0]) and got.canary_samples.tolist() == [
        cfg.steps
    ]


def test_cryptographic_source_goes_through_its_methods():
    rng = np.random.default_rng(2)
    z, _, _, y = _features(rng, 30, 4, 2)
    cfg = DPSGDConfig(sample_rate=0.3, steps=5, normalizer=3, noise_multiplier=1.0)
    canary = CanaryHook(
        np.zeros(1, bool), gradient=user_clipped_gradient(np.ones((2, 1, 5)), cfg.clipping_norm)
    )
    res = _user_runs(
        z,
        y,
        rng.integers(8, size=30),
        2,
        cfg,
        records_per_user=2,
        noise=NoiseSource("cryptographic"),
        runs=3,
        canary=canary,
        canary_in=np.array([True, False, True]),
        binary_logit=True,
    )
    assert (
        res.weights.shape == (3, 1, 5)
        and np.all(np.isfinite(res.weights))
        and res.steps_executed == 5
    )
    assert res.canary_samples[1] == 0 and np.all(res.canary_samples <= 5)


def test_g1_scores_equal_the_record_level_head_target_bit_for_bit():
    worlds = np.arange(48) % 3 == 0
    for canary in ("max-clip", "mislabeled"):
        rec = HeadTarget(model="dp-rvfl", dataset="digits", epsilon=2.0, canary=canary, epochs=1)
        usr = UserHeadTarget(
            model="dp-rvfl",
            records_per_user=1,
            dataset="digits",
            epsilon=2.0,
            canary=canary,
            epochs=1,
            reference_size=1257,
        )  # the record-level target's declared N0
        a = rec.scores(worlds, NoiseSource("reproducible", seed=9))
        b = usr.scores(worlds, NoiseSource("reproducible", seed=9))
        assert np.array_equal(a, b), canary
        assert usr.claimed_epsilon == rec.claimed_epsilon and usr.adjacency == "add-remove-user"


# ------------------------------------------------------------------------ soundness and power


@pytest.mark.parametrize("eps", [1.0, 2.0])
def test_user_level_max_clip_is_sound(eps):
    t = UserHeadTarget(
        model="dp-rvfl",
        records_per_user=4,
        epsilon=eps,
        canary="max-clip",
        epochs=2,
        reference_size=315,
    )
    r = run_audit(t, runs=800, seed=1, controls=(), reproducible_noise=True)
    assert r.adjacency == "add-remove-user" and r.claimed_epsilon <= eps
    assert r.epsilon_lower_bound <= r.claimed_epsilon
    info = t.describe()
    assert (
        info["config"]["n_users"] == 315 and info["config"]["sample_rate"] == 0.2
    )  # 1797 rows in users of 4, 70 % of users
    assert "zero in every training record" in info["canary_info"]["why"]


def test_mislabeled_user_is_sound_on_logistic_raw():
    t = UserHeadTarget(
        model="logistic-raw",
        records_per_user=3,
        epsilon=2.0,
        canary="mislabeled",
        epochs=2,
        reference_size=419,
    )
    r = run_audit(t, runs=300, seed=0, controls=(), reproducible_noise=True)
    info = r.canary_info
    assert (
        r.mechanism == "logistic-raw"
        and info["records"] == 3
        and len(set(info["test_indices"])) == 3
    )
    assert info["label"] != info["true_label"]
    assert r.epsilon_lower_bound <= r.claimed_epsilon


def test_no_noise_control_finds_large_leakage():
    t = UserHeadTarget(
        model="dp-rvfl",
        records_per_user=4,
        epsilon=2.0,
        canary="max-clip",
        epochs=2,
        reference_size=315,
    )
    r = run_audit(t, runs=400, seed=0, controls=("no-noise", "null"), reproducible_noise=True)
    nn = r.controls["no-noise"]
    assert nn.epsilon_lower_bound > 3.0 and nn.config["noise_multiplier_used"] < 1e-9
    assert r.controls["null"].epsilon_lower_bound < 0.5


def _per_record_clipped_sum(
    w, z1, z1_norm, y, rows, seg, k, clipping_norm, *, binary_logit=False, clip=True
):
    """BROKEN on purpose: clips every record at C and sums them (a user of G records moves the model by up to G C)."""
    return dpsgd_core.head_clipped_sum(
        w,
        z1.take(rows, axis=0),
        z1_norm[rows],
        y[rows],
        clipping_norm,
        binary_logit=binary_logit,
        clip=clip,
    )


def _per_record_clipped_gradient(grads, clipping_norm):
    g = np.asarray(grads, dtype=np.float64)
    norms = np.sqrt((g.reshape(len(g), -1) ** 2).sum(axis=1))
    return (g * np.minimum(1.0, clipping_norm / np.maximum(norms, 1e-30))[:, None, None]).sum(
        axis=0
    )


def test_per_record_clipping_is_caught(monkeypatch):
    # G = 16 records per user: the broken mechanism's canary user moves W[0, j] by 16 C per sampled step.
    t = UserHeadTarget(
        model="dp-rvfl",
        records_per_user=16,
        epsilon=1.0,
        canary="max-clip",
        epochs=4,
        reference_size=79,
    )
    with (
        monkeypatch.context() as mp
    ):  # the planted fault: the shared user kernel, and the canary user's contribution, clip records, not users
        mp.setattr(user_level, "user_head_clipped_sum", _per_record_clipped_sum)
        mp.setattr(user_head_audit, "user_clipped_gradient", _per_record_clipped_gradient)
        r = run_audit(t, runs=1000, seed=0, controls=(), reproducible_noise=True)
    assert r.claimed_epsilon <= 1.0
    assert (
        r.violated and r.epsilon_lower_bound > 1.3 * r.claimed_epsilon
    )  # 1.6 to 2.2 over public seeds 0-2
    real = UserHeadTarget(
        model="dp-rvfl",
        records_per_user=16,
        epsilon=1.0,
        canary="max-clip",
        epochs=4,
        reference_size=79,
    )  # the same calibration (a deterministic function of public values)
    ok = run_audit(real, runs=400, seed=0, controls=(), reproducible_noise=True)
    assert (
        not ok.violated and ok.ceiling > 3.0
    )  # the real mechanism under an audit that could show eps > 3


# ------------------------------------------------------------------------- builders and releases


def test_build_target_user_unit_and_refusals():
    t = build_target(
        "logistic-raw", privacy_unit="user", records_per_user=2, epochs=1, reference_size=629
    )
    assert (
        isinstance(t, UserHeadTarget)
        and t.adjacency == "add-remove-user"
        and t.records_per_user == 2
    )
    no_noise = build_target(
        "dp-rvfl",
        privacy_unit="user",
        records_per_user=2,
        epochs=1,
        reference_size=629,
        no_noise=True,
    )
    assert no_noise.noise is False
    with pytest.raises(UsageError, match="privacy_unit must be one of record, user, got 'team'"):
        build_target("dp-rvfl", privacy_unit="team", records_per_user=2)
    with pytest.raises(UsageError, match="records_per_user must be an integer >= 1, got 0"):
        build_target("dp-rvfl", privacy_unit="user", records_per_user=0)
    with pytest.raises(UsageError, match="records_per_user must be given"):
        build_target("dp-rvfl", privacy_unit="user")
    with pytest.raises(UsageError, match="privacy_unit must be user"):
        build_target("dp-rvfl", records_per_user=4)
    with pytest.raises(UsageError, match="DP-SGD head model"):
        build_target("gaussian", privacy_unit="user", records_per_user=4)


def test_user_level_schedule_is_the_declared_reference_size_not_the_count_of_users():
    """The schedule (q, T, m0) is N0's: a neighbour without one user (or an auditor holding other users) gives
    the same public configuration; a target without N0 is refused before any data are loaded; the counts stay
    local."""
    from dpaudit.audit_outputs import split_audit

    with pytest.raises(UsageError, match="reference_size must be given"):
        UserHeadTarget(
            model="dp-rvfl", records_per_user=4, epochs=1, dataset="no-such-dataset"
        )  # no loading
    with pytest.raises(UsageError, match="reference_size must be given"):
        build_target(
            "dp-rvfl", privacy_unit="user", records_per_user=4, epochs=1, dataset="no-such-dataset"
        )
    ids = np.arange(1797) // 4
    fewer = ids.copy()
    fewer[fewer == ids[0]] = -1  # one user's rows regrouped: the data hold another number of users
    configs = []
    for user_ids in (ids, np.where(fewer < 0, ids.max() + 1, fewer), np.arange(1797) // 5):
        t = UserHeadTarget(
            model="dp-rvfl", records_per_user=4, epochs=1, user_ids=user_ids, reference_size=300
        )
        public, local = split_audit({"config": t.describe()["config"]})
        assert public["config"]["reference_size"] == 300
        assert not {"n_users", "users", "n_train"} & set(public["config"])
        assert local["config"]["n_users"] == t._users.n_users
        schedule = ("sample_rate", "steps", "normalizer", "noise_multiplier")
        configs.append({k: public["config"][k] for k in schedule})
    assert configs[0] == configs[1] == configs[2]


def test_target_from_a_user_level_release(tmp_path):
    from dpaudit.data import load_dataset
    from dpaudit.releasing import release
    from dpaudit.requests import DPSGDRequest

    ds = load_dataset("digits")
    n = len(ds.y_train) + len(ds.y_val) + len(ds.y_test)
    ids = np.arange(n) // 3
    np.save(tmp_path / "ids.npy", ids)
    rel = release(
        "dp-rvfl",
        DPSGDRequest(
            model="dp-rvfl",
            privacy_unit="user",
            user_ids=str(tmp_path / "ids.npy"),
            records_per_user=2,
            epsilon=3.0,
            epochs=1,
            reference_size=419,
        ),
        out_dir=tmp_path / "rel",
        progress=False,
        record=False,
    )
    t = target_from_release(
        tmp_path / "rel", canary="max-clip"
    )  # users from the --user-ids file in the release's command
    assert (
        isinstance(t, UserHeadTarget)
        and t.records_per_user == 2
        and t.adjacency == "add-remove-user"
    )
    assert (
        t.claimed_epsilon == pytest.approx(rel.epsilon)
        and t._config.noise_multiplier == rel.noise_multiplier
    )
    assert (t._config.sample_rate, t._config.steps, t._config.normalizer) == (
        rel.sample_rate,
        rel.steps,
        rel.normalizer,
    )
    assert (
        t.describe()["config"]["n_users"] == rel.config["reference_size"] == 419
        and "n_users" not in rel.config
    )
    r = run_audit(t, runs=100, seed=0, controls=(), reproducible_noise=True)
    assert r.adjacency == "add-remove-user" and r.epsilon_lower_bound <= r.claimed_epsilon
    with pytest.raises(
        DataError,
        match="dataset n_users must equal the release's .*pass the release's --user-ids file",
    ):
        target_from_release(
            tmp_path / "rel", user_ids=np.arange(n) // 2
        )  # the release publishes no user-id hash, only n_users
    d = json.loads(
        runner.invoke(
            app,
            [
                "audit",
                "dp-rvfl",
                "--release",
                str(tmp_path / "rel"),
                "--runs",
                "40",
                "--no-controls",
                "--json",
                "--workers",
                "1",
                "--out",
                str(tmp_path / "a"),
            ],
        ).stdout
    )
    assert d["adjacency"] == "add-remove-user" and d["release_id"] == rel.id
    bad = runner.invoke(
        app,
        [
            "audit",
            "dp-rvfl",
            "--release",
            str(tmp_path / "rel"),
            "--records-per-user",
            "5",
            "--runs",
            "40",
            "--json",
        ],
    )
    assert (
        bad.exit_code == 2
        and "must match the release" in bad.stderr
        and len(bad.stderr.strip().splitlines()) == 1
    )


# ---------------------------------------------------------------------------------------- CLI


def test_cli_user_level_audit_json(tmp_path):
    out = tmp_path / "a"
    r = runner.invoke(
        app,
        [
            "audit",
            "dp-rvfl",
            "--privacy-unit",
            "user",
            "--records-per-user",
            "4",
            "--runs",
            "200",
            "--json",
            "--epochs",
            "2",
            "--workers",
            "1",
            "--reproducible-noise",
            "--reference-size",
            "315",
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert (
        d["adjacency"] == "add-remove-user"
        and d["mechanism"] == "dp-rvfl"
        and d["canary"] == "max-clip"
    )
    assert d["config"]["records_per_user"] == 4 and d["canary_info"]["records"] == 4
    assert d["controls"]["no-noise"]["adjacency"] == "add-remove-user"
    assert d["epsilon_lower_bound"] <= d["claimed_epsilon"] <= 2.0
    assert (
        "--privacy-unit user --records-per-user 4" in d["command"] and "--epochs 2" in d["command"]
    )
    assert "--reference-size 315" in d["command"] and d["config"]["reference_size"] == 315
    assert "users" not in d["config"]
    assert json.loads((out / "audit.json").read_text())["adjacency"] == "add-remove-user"


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--privacy-unit", "user", "--records-per-user", "0"],
            "--records-per-user must be an integer >= 1, got 0.",
        ),
        (
            ["--privacy-unit", "team", "--records-per-user", "4"],
            "--privacy-unit must be one of record, user, got 'team'.",
        ),
        (["--privacy-unit", "user"], "--records-per-user must be given"),
        (["--records-per-user", "4"], "--privacy-unit must be user"),
        (["--privacy-unit", "user", "--records-per-user", "4"], "--reference-size must be given"),
        (
            ["--release", "rel", "--reference-size", "300"],
            "--reference-size must not be given with --release",
        ),
    ],
)
def test_cli_bad_privacy_unit_flags_exit_2_with_one_line(args, message):
    r = runner.invoke(app, ["audit", "dp-rvfl", *args, "--runs", "40", "--json"])
    assert r.exit_code == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def _user_runs(
    z, y, users, n_classes, cfg, *, records_per_user, runs, canary=None, canary_in=None, **kw
):
    """R user-level runs with a canary user, as UserHeadTarget trains them (engine.train_heads)."""
    index = users if hasattr(users, "n_users") else index_users(users)
    hook = (
        None
        if canary is None
        else dataclasses.replace(canary, included=np.asarray(canary_in, dtype=bool))
    )
    return train_heads(
        z,
        y,
        n_classes,
        cfg,
        runs=runs,
        users=UserSampling(index, records_per_user),
        canary=hook,
        **kw,
    )

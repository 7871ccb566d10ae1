"""Releases state their noise sampler and tail delta, refuse a tail above 1 % of
delta before training, and the ledger composes the tails soundly into every total."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dpaudit.accounting import SubsampledGaussian, compute_epsilon
from dpaudit.ledger import compose as lc
from dpaudit.ledger.book import open_ledger
from dpaudit.data.base import PreparedDataset
from dpaudit.errors import UsageError
from dpaudit.records import Release, read_release
from dpaudit.releasing import release
from dpaudit.requests import DPSGDRequest

G1 = SubsampledGaussian(1.0, 0.01, 1000)
SHA = "ab" * 32


def _release(event=G1, *, tail=None, partition="train", epsilon=2.0, delta=1e-5) -> Release:
    return Release(
        mechanism="dp-rvfl",
        dataset={"name": "mnist", "sha256": SHA},
        adjacency="add-remove-record",
        accountant="rdp",
        epsilon=epsilon,
        delta=delta,
        guarantee=event.to_dict(),
        seed=0,
        noise_source={"kind": "os-entropy"},
        partition=partition,
        git_commit=None,
        noise_multiplier=event.noise_multiplier,
        sample_rate=event.sample_rate,
        steps=event.steps,
        clipping_norm=1.0,
        noise_tail_delta=tail,
        noise_sampler=None if tail is None else "test sampler",
    )


def _synthetic(n=300, d=8, n_classes=2, seed=0) -> PreparedDataset:
    rng = np.random.default_rng(seed)

    def part(m):
        y = rng.integers(0, n_classes, m)
        x = rng.normal(size=(m, d)).astype(np.float32) * 0.5
        x[np.arange(m), y % d] += 1.5
        return x, y.astype(np.int64)

    (xt, yt), (xv, yv), (xs, ys) = part(n), part(60), part(100)
    return PreparedDataset(
        name="synthetic",
        kind="tabular",
        x_train=xt,
        y_train=yt,
        x_val=xv,
        y_val=yv,
        x_test=xs,
        y_test=ys,
        n_classes=n_classes,
        split_seed=0,
        profile="default",
        reference_size=n,
    )  # declared N0


# ------------------------------------------------------------------- composition


def test_bounds_with_tails_are_sound_and_tight():
    tau = 1e-9  # far above any real tail: makes the adjustment visible
    plain = lc.bounds(G1, delta=1e-5, adjacency=None)
    b = lc.bounds(G1, delta=1e-5, adjacency=None, noise_tail=tau)
    d1 = b["delta_evaluated"]
    assert b["delta"] == 1e-5 and b["noise_tail"] == tau and d1 < 1e-5
    # the reported epsilon is the ideal composition's at d1 ...
    assert b["epsilon"] == pytest.approx(
        min(
            compute_epsilon(G1, delta=d1, accountant="rdp").epsilon,
            compute_epsilon(G1, delta=d1, accountant="prv").epsilon,
        ),
        rel=1e-12,
    )
    # ... and d1 leaves room for the tails: d1 + (e^eps + 1) tau <= delta
    assert d1 + (math.exp(b["epsilon"]) + 1) * tau <= 1e-5
    assert plain["epsilon"] <= b["epsilon"] <= plain["epsilon"] * 1.01
    # no tail: unchanged; a tail that cannot be covered: unbounded, with the reason
    assert lc.bounds(G1, delta=1e-5, adjacency=None, noise_tail=0.0) == plain
    huge = lc.bounds(G1, delta=1e-5, adjacency=None, noise_tail=1e-6)
    assert huge["epsilon"] == math.inf and huge["bound_by"].startswith("noise tails")


def test_ledger_records_tails_and_composes_their_sum(tmp_path):
    with open_ledger(tmp_path / "l.sqlite") as led:
        a = _release(tail=2e-10)
        b = _release(SubsampledGaussian(1.2, 0.01, 500), tail=3e-10)
        led.record(a)
        led.record(b)
        assert led.get(a.id).payload["noise_tail_delta"] == 2e-10
        rows = led.summary("mnist", accountants=("rdp",))
    total = next(r for r in rows if r["partition"] == lc.DATASET_SCOPE)
    assert total["noise_tail"] == pytest.approx(5e-10, rel=1e-12)
    assert total["delta"] == 1e-5 and total["delta_evaluated"] < 1e-5
    ideal = compute_epsilon(
        lc.sequential([G1, SubsampledGaussian(1.2, 0.01, 500)]),
        delta=total["delta_evaluated"],
        accountant="rdp",
    ).epsilon
    assert total["epsilon"] == pytest.approx(ideal, rel=1e-12)
    assert total["delta_evaluated"] + (math.exp(total["epsilon"]) + 1) * 5e-10 <= 1e-5
    assert total["naive_delta"] == pytest.approx(2e-5 + 5e-10, rel=1e-12)


def test_releases_without_a_tail_key_still_load_and_count_zero(tmp_path):
    with open_ledger(tmp_path / "l.sqlite") as led:
        old = _release()  # noise_tail_delta None: an old release
        led.record(old)
        assert "noise_tail_delta" not in led.get(old.id).payload
        led.record(old)  # recording it again is still a no-op
        total = next(
            r
            for r in led.summary("mnist", accountants=("rdp",))
            if r["partition"] == lc.DATASET_SCOPE
        )
    assert "delta_evaluated" not in total and total["epsilon"] == pytest.approx(
        compute_epsilon(G1, delta=1e-5, accountant="rdp").epsilon
    )
    # an old release.json (no noise_sampler / noise_tail_delta keys) loads
    d = _release().to_dict()
    for k in ("noise_sampler", "noise_tail_delta"):
        d.pop(k)
    r = Release.from_dict(d)
    assert r.noise_sampler is None and r.noise_tail_delta is None
    # an unreadable stored tail fails closed (no bound), never 0
    view = lc.release_view(
        "x",
        "mnist",
        {
            "partition": "train",
            "adjacency": "add-remove-record",
            "guarantee": G1.to_dict(),
            "noise_tail_delta": "garbage",
        },
    )
    assert view.noise_tail_delta == math.inf


# ------------------------------------------------------------------- release paths


def test_dp_sgd_release_states_sampler_and_tail(tmp_path):
    from dpaudit.mechanisms.dpsgd.core import head_outputs
    from dpaudit.mechanisms.dpsgd.features import build_features
    from dpaudit.releasing import release
    from dpaudit.requests import DPSGDRequest
    from dpaudit.noise import GAUSSIAN_SAMPLER_DESCRIPTION, noise_tail_delta

    data = _synthetic()
    rel = release(
        "dp-rvfl",
        DPSGDRequest(model="dp-rvfl", dataset=data.name, epsilon=4.0, epochs=2, batch_size=64),
        prepared=data,
        out_dir=tmp_path / "r",
        progress=False,
        ledger_path=tmp_path / "l.sqlite",
    )
    d = 1 * (build_features("rvfl", 8, rel.seed).output_dim + 1)
    assert head_outputs(2, binary_logit=True) == 1
    assert rel.noise_sampler == GAUSSIAN_SAMPLER_DESCRIPTION
    assert rel.noise_tail_delta == noise_tail_delta(rel.steps * d, rel.epsilon, rel.delta) > 0
    on_disk = json.loads((tmp_path / "r" / "release.json").read_text())
    assert (
        on_disk["noise_tail_delta"] == rel.noise_tail_delta
        and on_disk["noise_sampler"] == GAUSSIAN_SAMPLER_DESCRIPTION
    )
    assert read_release(tmp_path / "r").noise_tail_delta == rel.noise_tail_delta
    with open_ledger(tmp_path / "l.sqlite") as led:
        assert led.get(rel.id).payload["noise_tail_delta"] == rel.noise_tail_delta
    nonpriv = release(
        "logistic-raw",
        DPSGDRequest(model="logistic-raw", dataset=data.name, non_private=True),
        prepared=data,
        out_dir=tmp_path / "n",
        progress=False,
        record=False,
    )
    assert nonpriv.noise_tail_delta == 0.0 and nonpriv.noise_sampler.startswith("none")


def test_release_with_too_large_a_tail_is_refused_before_training(tmp_path, monkeypatch):
    from dpaudit.mechanisms.dpsgd import mechanism as dpsgd_release, schedule as rvfl

    def trained(*a, **k):
        raise AssertionError("training started")

    monkeypatch.setattr(dpsgd_release, "train_heads", trained)  # the DP-SGD release's trainer
    with pytest.raises(
        UsageError,
        match=r"noise tail delta must be at most 1% of delta=1e-05, got .* for this dp-rvfl run",
    ):
        release(
            "dp-rvfl",
            DPSGDRequest(
                model="dp-rvfl", dataset="synthetic", epsilon=80.0, epochs=2, batch_size=64
            ),
            prepared=_synthetic(),
            out_dir=tmp_path / "r",
            progress=False,
            ledger_path=tmp_path / "l.sqlite",
        )
    assert not (tmp_path / "r" / "release.json").exists()
    with open_ledger(tmp_path / "l.sqlite") as led:
        assert led.open_reservations() == []  # the refused run holds no budget


def test_dp_elm_release_states_its_sampler(tmp_path):
    from dpaudit.releasing import release
    from dpaudit.requests import DPELMRequest

    data = _synthetic(n=120, d=6)
    exact = release(
        "dp-elm",
        DPELMRequest(dataset=data.name, width=5, epsilon=2.0),
        prepared=data,
        out_dir=tmp_path / "e",
        record=False,
    )
    assert exact.noise_tail_delta == 0.0 and exact.noise_sampler.startswith(
        "discrete-laplace: exact"
    )
    text = release(
        "dp-elm",
        DPELMRequest(dataset=data.name, width=5, epsilon=2.0, sampler="textbook"),
        prepared=data,
        out_dir=tmp_path / "t",
        record=False,
    )
    n = 5 * 5 + 5 * 2  # gram L x L + cross L x K
    assert text.noise_tail_delta == pytest.approx((math.exp(2.0) + 1) * n * 2.0**-52, rel=1e-12)
    assert text.noise_sampler.startswith("textbook")


def test_mixmin_release_states_sampler_and_tail(tmp_path):
    from dpaudit.noise import GAUSSIAN_SAMPLER_DESCRIPTION, noise_tail_delta
    from dpaudit.releasing import release
    from dpaudit.requests import MixMinRequest

    r = release(
        "mixmin",
        MixMinRequest(epsilon=1.0, seed=42, steps=20, batch_size=100, clipping_norm=1.0),
        out_dir=tmp_path / "m",
        record=False,
    )
    assert r.noise_sampler == GAUSSIAN_SAMPLER_DESCRIPTION
    assert r.noise_tail_delta == noise_tail_delta(20 * 10, r.epsilon, r.delta) > 0

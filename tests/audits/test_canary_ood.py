"""The ``ood-record`` head canary (dpaudit.mechanisms.dpsgd.head_canaries) and the head canary registry."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from dpaudit.audits.engine import run_audit
from dpaudit.catalogue import CATALOGUE, HEAD_CANARIES
from dpaudit.cli import app
from dpaudit.mechanisms.dpsgd.features import build_features
from dpaudit.mechanisms.dpsgd.head_audit import HeadTarget
from dpaudit.mechanisms.dpsgd.head_canaries import CHOOSERS, head_canary, ood_record
from dpaudit.mechanisms.dpsgd.user_head_audit import UserHeadTarget
from dpaudit.noise import NoiseSource


def test_every_head_model_offers_every_registered_canary_and_each_loads():
    for name, entry in CATALOGUE.items():
        if entry.family == "dp-sgd-head":
            assert entry.canaries == tuple(HEAD_CANARIES) and entry.canaries[0] == "max-clip", name
    for kind in HEAD_CANARIES:
        assert head_canary(kind) is CHOOSERS[kind] and CHOOSERS[kind].__name__ == kind.replace(
            "-", "_"
        )


def test_the_choice_reads_only_the_public_schema_and_seed():
    # data with no records at all: the canary needs only n_features (public schema) and the seed
    feats = build_features("logistic-raw", 5, 0)
    target = types.SimpleNamespace(seed=7, _n_classes=3)
    schema = types.SimpleNamespace(n_features=5)
    a, b = ood_record(target, schema, feats, None), ood_record(target, schema, feats, None)
    assert np.array_equal(a.z, b.z) and a.z.shape == (1, 5) and set(np.abs(a.z.ravel())) == {1.0}
    assert (
        a.y.tolist() == b.y.tolist() and 0 <= a.info["label"] < 3 and a.info["kind"] == "ood-record"
    )
    other = ood_record(types.SimpleNamespace(seed=8, _n_classes=3), schema, feats, None)
    assert not np.array_equal(a.z, other.z)  # another public seed, another canary
    user = ood_record(target, schema, feats, 3)  # a canary user: G copies, one label
    assert (
        user.z.shape == (3, 5)
        and np.array_equal(user.z, np.repeat(a.z, 3, axis=0))
        and user.info["records"] == 3
    )


@pytest.mark.parametrize("unit", ["record", "user"])
def test_ood_record_audit_is_sound_at_record_and_user_level(unit):
    torch.set_num_threads(1)
    t = (
        HeadTarget(model="logistic-raw", canary="ood-record", epochs=1)
        if unit == "record"
        else UserHeadTarget(
            model="dp-rvfl", canary="ood-record", epochs=1, records_per_user=3, reference_size=419
        )
    )
    r = run_audit(t, runs=200, seed=0, controls=(), reproducible_noise=True)
    assert r.canary_info["kind"] == "ood-record" and r.epsilon_lower_bound <= r.claimed_epsilon


def _separation(target) -> float:
    worlds = np.array([True, False] * 200)
    s = target.scores(worlds, NoiseSource("reproducible", seed=0))
    return float(
        (s[worlds].mean() - s[~worlds].mean()) / np.sqrt(0.5 * (s[worlds].var() + s[~worlds].var()))
    )


def test_half_noise_plant_raises_the_ood_record_separation(plant_fault):
    """The canary goes through the release's kernels: halving the step noise (a planted fault)
    raises the in/out separation of its scores (mean difference over the pooled standard deviation;
    measured 0.37 -> 0.64, dp-rvfl, digits, eps 8, 400 trials: standard error about 0.1)."""
    torch.set_num_threads(1)
    clean = _separation(HeadTarget(model="dp-rvfl", canary="ood-record", epochs=2, epsilon=8.0))
    plant_fault("half-noise")
    faulty = _separation(HeadTarget(model="dp-rvfl", canary="ood-record", epochs=2, epsilon=8.0))
    assert clean > 0.1 and faulty > clean + 0.15


def test_cli_audits_with_the_ood_record_canary_and_records_it(tmp_path):
    out = tmp_path / "a"
    r = CliRunner().invoke(
        app,
        [
            "audit",
            "dp-rvfl",
            "--canary",
            "ood-record",
            "--runs",
            "16",
            "--no-controls",
            "--epochs",
            "1",
            "--reproducible-noise",
            "--out",
            str(out),
            "--ledger",
            str(tmp_path / "l.sqlite"),
        ],
    )
    assert r.exit_code == 0, r.output
    rec = json.loads((out / "audit.json").read_text())
    assert rec["canary_info"]["kind"] == "ood-record" and rec["canary"] == "ood-record"

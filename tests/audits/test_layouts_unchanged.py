"""The white-box bound record, a plan's claim, target and audit blocks and the Gaussian target's
description are written from key tables; these pin their exact JSON text (key order included) as the hand-written dicts wrote it.

The digests are SHA-256 of ``json.dumps`` of each record without sorting (the layout a file
gets), taken from the code before the tables (commit 6e56f31).
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from dpaudit.accounting.events import SubsampledGaussian
from dpaudit.audit_plans import make_plan, opacus_plan
from dpaudit.audits import white_box
from dpaudit.audits.gaussian import GaussianTarget
from dpaudit.ledger import signing as sg
from dpaudit.ledger.book import open_ledger
from dpaudit.requests import AuditRequest

WHITE_BOX_KEYS = [
    "threat_model",
    "epsilon_lb",
    "claimed_epsilon",
    "delta",
    "confidence",
    "accountant",
    "violation",
    "noise_multiplier_upper",
    "sensitivity_lower",
    "sample_rate_lower",
    "steps",
    "observations",
    "claimed_event",
]
WHITE_BOX_DIGESTS = [
    "1078615f9b08bf8082a0ee5c0e715e5c27260b13702ec8816d09b60d81ed07ba",
    "2197d9f0227310c2628ffaffc614ee242cff3c79479e565100926c53578b9015",
]
PLAN_DIGESTS = {
    "opacus": "e0e4962d16e8bd520dc645df62a37150d0f8cfc605777c0f433ad1bbb7a007d8",
    "gaussian": "d670f68ce5efe8f6b8aea349e18af40689b20544450db6b706cc98fc106e04ef",
    "dp-dense": "5e0c4141408f7340a6c165a2172d1a5c8c49defe18a025c5a1f36ee84de021df",
}


def _digest(record: dict) -> str:
    return hashlib.sha256(json.dumps(record).encode()).hexdigest()


def test_white_box_bound_records_keep_their_layout():
    claim = SubsampledGaussian(1.0, 0.1, 50)
    rng_steps, rng_final = np.random.default_rng(1), np.random.default_rng(2)
    steps = white_box.simulate_steps(rng_steps, noise=0.9, rate=0.1, steps=50, canaries=20)
    final = white_box.simulate_final(rng_final, noise=0.9, rate=0.1, steps=50, canaries=200)
    records = [
        white_box.step_bound(steps, claimed=claim, delta=1e-5).to_dict(),
        white_box.final_bound(final, claimed=claim, delta=1e-5).to_dict(),
    ]
    assert [list(r) for r in records] == [WHITE_BOX_KEYS, WHITE_BOX_KEYS]
    assert [_digest(r) for r in records] == WHITE_BOX_DIGESTS


@pytest.fixture
def signing_key(tmp_path, monkeypatch):
    monkeypatch.setenv("DPAUDIT_LEDGER", str(tmp_path / "ledger.sqlite"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.chdir(tmp_path)
    key = sg.keygen("auditor")
    monkeypatch.setenv(sg.SIGNING_KEY_ENV, str(key.path))
    with open_ledger(None) as led:
        led.register_key()
    return key.path


def test_plan_blocks_keep_their_layout(tmp_path, signing_key):
    event = SubsampledGaussian(1.0, 0.125, 8)
    written = {
        "opacus": opacus_plan(
            event, delta=1e-5, canaries=50, tensors=["side.weight"], out="o", key=signing_key
        ),
        "gaussian": make_plan(
            AuditRequest(mechanism="gaussian", epsilon=1.0, runs=200, out="g"), key=signing_key
        ),
        "dp-dense": make_plan(
            AuditRequest(mechanism="dp-dense", one_run=True, canaries=20, epochs=1, out="m"),
            key=signing_key,
        ),
    }
    blocks = ("mechanism", "release_id", "target", "claim", "audit")
    for name, path in written.items():
        plan = json.loads(path.read_text())
        assert list(plan["claim"]) == ["event", "epsilon", "delta", "adjacency", "accountant"]
        assert _digest({k: plan[k] for k in blocks}) == PLAN_DIGESTS[name], name


def test_gaussian_target_description_keeps_its_layout():
    target = GaussianTarget(noise_multiplier=1.5, canary="natural", broken_noise_factor=2.0, seed=3)
    described = target.describe()
    assert list(described["config"]) == [
        "noise_multiplier",
        "clipping_norm",
        "dimension",
        "n_records",
        "broken_noise_factor",
        "exact_epsilon",
        "seed",
    ]
    assert _digest(described) == "f4bd76180baad1ab45cf522d760a07bada2138240d10bad793c95b4b9c2e875c"


def test_plan_file_keeps_its_key_order(tmp_path, signing_key):
    """plan.json's top-level keys in their written order (taken from the code before the plan's
    header became one record)."""
    event = SubsampledGaussian(1.0, 0.125, 8)
    opacus = opacus_plan(event, delta=1e-5, canaries=50, out="o", key=signing_key)
    trials = make_plan(AuditRequest(mechanism="gaussian", runs=200, out="g"), key=signing_key)
    for path in (opacus, trials):
        assert list(json.loads(path.read_text())) == PLAN_KEYS


PLAN_KEYS = """schema id created_at mechanism release_id target claim audit request commitment
signer signature""".split()


def test_checkpoint_fingerprints_unchanged():
    """A checkpoint resumes only under its fingerprint: these digests (taken from the code before
    its options were read through a key table) keep an interrupted audit resumable."""
    from dpaudit.audits.engine import AuditOptions, _fingerprint

    target = GaussianTarget(noise_multiplier=1.5, seed=3)
    fixed = AuditOptions(runs=40, seed=2, chunk_size=8)
    seeded = AuditOptions(runs=40, seed=2, chunk_size=8, reproducible_noise=True, noise_seed=5)
    digests = [
        (
            _fingerprint(target, "main", 40, o),
            _fingerprint(target.without_noise(), "no-noise", 20, o),
        )
        for o in (fixed, seeded)
    ]
    assert digests == [
        (
            "8f7d03056f01c1557f4a072ce6979efa04fd417e5f3e9d22b8fbe54ee3f7bb67",
            "a46bdc79aa3978149662b63827e178ecd721002e0b799b761d8d27b31daa44b2",
        ),
        (
            "17af8cdbbc0bd187798a836a3730c2dd21ff1a000ae0c9bce7203cdd10456694",
            "33eaf908bc1db9e65e8e26761f62e08ffa038e0064be8cf0a0a05d1d7fc015cf",
        ),
    ]

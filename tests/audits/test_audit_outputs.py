"""Audit outputs publish nothing private, and an audit's cost is on the ledger.

- audit.json / one_run.json hold the shareable part only; score values, data-derived canary
  choices (dead-feature coordinates and their count), DP-MixMin's non-private reference optimum
  and a reproducible noise seed are in audit_local.json / one_run_local.json;
- reports read the shareable part only, also of old files that still carry private keys;
- an audit that trains on the private data is an ``audit`` ledger entry with its composed cost,
  shown beside the releases, counted by a cap only with ``include_audits`` (checked before any
  trial runs).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dpaudit.accounting import compute_epsilon
from dpaudit.accounting.events import SubsampledGaussian
from dpaudit.ledger.book import open_ledger
from dpaudit.audit_outputs import merge_local, split_audit
from dpaudit.audits.engine import read_audit, run_audit
from dpaudit.audits.gaussian import GaussianTarget
from dpaudit.mechanisms.dpsgd.head_audit import HeadTarget, dead_features
from dpaudit.mechanisms.mixmin.audit import MixMinTarget, mixmin_config_for
from dpaudit.errors import BudgetExceededError

DELTA = 1e-5


def _mixmin_target(**kw) -> MixMinTarget:
    rng = np.random.default_rng(0)
    probs = rng.uniform(0.02, 0.98, size=(200, 4))
    labels = (rng.uniform(size=200) < probs[:, 0]).astype(float)
    cfg, claimed = mixmin_config_for(
        n_mix=200, k=4, epsilon=1.0, delta=DELTA, expected_batch_size=50, steps=10
    )
    return MixMinTarget(probs, labels, cfg, claimed, DELTA, canary="max-clip", **kw)


def _head(**kw) -> HeadTarget:
    return HeadTarget(
        model="dp-rvfl",
        dataset="digits",
        epsilon=2.0,
        canary="max-clip",
        epochs=1,
        max_train=120,
        seed=3,
        **kw,
    )


def _text(path) -> str:
    return path.read_text()


def test_mixmin_audit_json_has_no_reference_optimum(tmp_path):
    t = _mixmin_target()
    run_audit(t, runs=8, seed=1, controls=(), out_dir=tmp_path)
    public = json.loads(_text(tmp_path / "audit.json"))
    assert "reference_weights" not in public["config"] and "reference_weights" not in _text(
        tmp_path / "audit.json"
    )
    assert set(public["canary_info"]) == {
        "kind",
        "norm",
    }  # the direction and top sources come from the reference optimum
    local = json.loads(_text(tmp_path / "audit_local.json"))
    assert local["config"]["reference_weights"] == pytest.approx(t._reference.tolist())
    assert "direction" in local["canary_info"] and "top_sources" in local["canary_info"]
    assert local["audit_id"] == public["id"] and "not_for_publication" in local
    assert read_audit(tmp_path).config["reference_weights"] == pytest.approx(
        t._reference.tolist()
    )  # the operator's view


def test_head_audit_json_has_no_dead_feature_information(tmp_path):
    t = _head()
    run_audit(t, runs=8, seed=1, controls=(), out_dir=tmp_path)
    public = json.loads(_text(tmp_path / "audit.json"))
    assert set(public["canary_info"]) == {"kind", "norm"}
    assert not {"coordinate", "why", "dead_features"} & set(public["canary_info"])
    local = json.loads(_text(tmp_path / "audit_local.json"))
    n_dead = int(dead_features(t._z).size)
    assert local["canary_info"]["dead_features"] == n_dead > 0
    assert local["canary_info"]["coordinate"] == [0, int(dead_features(t._z)[0])]
    # no score value either: thresholds are in score units
    assert "threshold" not in public and "threshold" not in (public["claimed_curve"] or {})
    assert "threshold" not in public["comparison"]["cp_bonferroni"] and "threshold" in local


def test_split_is_undone_by_merge_and_old_private_keys_are_dropped(tmp_path):
    full = run_audit(
        GaussianTarget.for_epsilon(epsilon=1.0), runs=40, seed=0, controls=("null",), record=False
    ).to_dict()
    full["config"]["reference_weights"] = [0.5, 0.5]  # as an old DP-MixMin audit.json published it
    full["canary_info"].update(coordinate=[0, 3], dead_features=12)
    public, local = split_audit(full)
    assert merge_local(public, local) == full
    text = json.dumps(public)
    assert (
        "reference_weights" not in text
        and "dead_features" not in text
        and '"threshold"' not in text
    )


def test_report_never_republishes_private_keys_of_an_old_audit(tmp_path):
    from dpaudit.reports.model import build_report

    rec = run_audit(
        GaussianTarget.for_epsilon(epsilon=1.0), runs=40, seed=0, controls=(), record=False
    ).to_dict()
    rec["config"]["reference_weights"] = [
        0.123456789,
        0.876543211,
    ]  # an old file that published them
    rec["canary_info"].update(
        coordinate=[0, 3], dead_features=12, why="input feature 3 is zero in every training record"
    )
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "audit.json").write_text(json.dumps(rec))
    (tmp_path / "a" / "audit_local.json").write_text(json.dumps({"threshold": 42.4242}))
    (tmp_path / "a" / "scores.npz").write_bytes(b"not read")
    rep = json.dumps(build_report([tmp_path], ledger_path=None))
    for secret in (
        "0.123456789",
        "dead_features",
        "zero in every training record",
        "42.4242",
        str(rec["threshold"]),
    ):
        assert secret not in rep, secret
    assert "not covered by the release's privacy claim" in rep


def _summary_row(ledger_path, name):
    with open_ledger(ledger_path) as led:
        return next(r for r in led.summary() if r["dataset"] == name and r["partition"] == "*")


def test_audit_on_private_data_is_a_ledger_entry_with_its_composed_cost(tmp_path):
    led_path = tmp_path / "ledger.sqlite"
    t = _head()
    r = run_audit(t, runs=10, seed=1, controls=("null",), control_runs=6, ledger_path=led_path)
    with open_ledger(led_path) as led:
        (entry,) = led.entries(kind="audit")
    assert entry.id == r.id and entry.dataset == "digits" and entry.payload["trials"] == 16
    ev = t.claimed_event
    assert (
        entry.payload["guarantee"]
        == SubsampledGaussian(ev.noise_multiplier, ev.sample_rate, ev.steps * 16).to_dict()
    )
    row = _summary_row(led_path, "digits")
    composed = SubsampledGaussian(ev.noise_multiplier, ev.sample_rate, ev.steps * 16)
    want = compute_epsilon(
        composed, delta=DELTA, accountant="rdp"
    ).epsilon  # audit totals: the RDP bound
    assert row["audits"] == 1 and row["releases_subtree"] == 0
    assert (
        row["audit_epsilon"] == pytest.approx(want, rel=1e-9) and row["epsilon"] == 0.0
    )  # releases only by default
    assert row["epsilon_with_audits"] == pytest.approx(want, rel=1e-9)
    assert row["audit_epsilon"] > t.claimed_epsilon * 3


def test_no_noise_control_makes_the_audit_unbounded_and_synthetic_audits_need_no_entry(tmp_path):
    led_path = tmp_path / "ledger.sqlite"
    run_audit(
        _head(), runs=8, seed=1, control_runs=4, ledger_path=led_path
    )  # default controls: no-noise too
    row = _summary_row(led_path, "digits")
    assert math.isinf(row["audit_epsilon"]) and row["audit_unbounded_reasons"]
    run_audit(
        GaussianTarget.for_epsilon(epsilon=1.0), runs=8, seed=0, ledger_path=led_path
    )  # synthetic data
    run_audit(
        _mixmin_target(), runs=8, seed=0, controls=(), ledger_path=led_path
    )  # unnamed proxy predictions
    with open_ledger(led_path) as led:
        assert len(led.entries(kind="audit")) == 1


def test_cap_including_audits_refuses_an_audit_before_any_trial(tmp_path, monkeypatch):
    led_path = tmp_path / "ledger.sqlite"
    with open_ledger(led_path) as led:
        led.cap(
            "digits", 3.0, DELTA, include_audits=False
        )  # releases only (--exclude-audits): the audit runs and is recorded
    run_audit(_head(), runs=8, seed=1, controls=(), ledger_path=led_path)
    row = _summary_row(led_path, "digits")
    assert row["remaining"] == pytest.approx(3.0) and row["audit_epsilon"] > 3.0
    with open_ledger(led_path) as led:
        led.cap("digits", 3.0, DELTA, include_audits=True)
    assert _summary_row(led_path, "digits")["remaining"] < 0
    t = _head()
    t.prepare()
    calls = []
    monkeypatch.setattr(
        HeadTarget, "scores", lambda self, c, n: calls.append(1) or np.zeros(len(c))
    )
    with pytest.raises(BudgetExceededError, match="cap includes audits"):
        run_audit(t, runs=8, seed=1, controls=(), ledger_path=led_path)
    assert calls == []
    with open_ledger(led_path) as led:
        assert len(led.entries(kind="audit")) == 1


def test_release_preflight_counts_audits_only_when_the_cap_says_so(tmp_path):
    led_path = tmp_path / "ledger.sqlite"
    with open_ledger(led_path) as led:
        led.record_audit(
            audit_id="a" * 32,
            dataset="heart",
            partition="train",
            adjacency="add-remove-record",
            event=SubsampledGaussian(1.0, 0.1, 2000),
            trials=20,
            mechanism="dp-rvfl",
        )
        led.cap("heart", 2.0, DELTA, include_audits=False)
        planned = dict(
            dataset="heart",
            partition="train",
            event=SubsampledGaussian(2.0, 0.1, 10),
            adjacency="add-remove-record",
        )
        assert led.check(**planned)["allowed"]
        led.cap("heart", 2.0, DELTA, include_audits=True)
        assert not led.check(**planned)["allowed"]
        led.void("a" * 32, "recorded by mistake", published=False)
        assert led.check(**planned)["allowed"] and _summary_row(led_path, "heart")["audits"] == 0


def test_one_run_outputs_are_split_and_recorded(tmp_path):
    from dpaudit.one_run_auditing import run_one_run
    from dpaudit.requests import AuditRequest

    led_path = tmp_path / "ledger.sqlite"
    run_one_run(
        AuditRequest("dp-rvfl", canaries=8, epochs=1, seed=3),
        out_dir=tmp_path,
        ledger_path=led_path,
    )
    public = json.loads(_text(tmp_path / "one_run.json"))
    local = json.loads(_text(tmp_path / "one_run_local.json"))
    assert not {"coordinates", "free_coordinates", "extra_zero_features"} & set(public["info"])
    assert local["info"]["free_coordinates"] > 0 and len(local["info"]["coordinates"]) == 8
    with open_ledger(led_path) as led:
        (entry,) = led.entries(kind="audit")
    assert (
        entry.payload["trials"] == 1
        and entry.dataset == "digits"
        and not entry.payload["non_private"]
    )


def test_cli_cap_include_audits_and_summary_rows(tmp_path, data_dir):
    """The cap reads heart's row count from the real data (skipped, visibly, without it)."""
    from typer.testing import CliRunner

    from dpaudit.cli import app

    runner = CliRunner()
    led_path = tmp_path / "ledger.sqlite"
    with open_ledger(led_path) as led:
        led.record_audit(
            audit_id="b" * 32,
            dataset="heart",
            partition="train",
            adjacency="add-remove-record",
            event=SubsampledGaussian(2.0, 1.0, 50),
            trials=50,
            mechanism="dp-rvfl",
        )
    r = runner.invoke(
        app,
        [
            "ledger",
            "cap",
            "--dataset",
            "heart",
            "--eps",
            "1",
            "--delta",
            "1e-5",
            "--include-audits",
            "--ledger",
            str(led_path),
            "--data-dir",
            str(data_dir),
        ],
    )
    assert r.exit_code == 0 and "counting releases and audits" in r.output
    r = runner.invoke(app, ["ledger", "summary", "--ledger", str(led_path)])
    assert (
        r.exit_code == 0
        and "audits (1)" in r.output
        and "releases + audits" in r.output
        and "1+a" in r.output
    )
    d = json.loads(
        runner.invoke(app, ["ledger", "summary", "--ledger", str(led_path), "--json"]).stdout
    )
    row = next(x for x in d["rows"] if x["partition"] == "*")
    assert (
        row["audits"] == 1
        and row["cap"]["include_audits"]
        and row["remaining"] == pytest.approx(1.0 - row["epsilon_with_audits"])
    )
    from dpaudit.ledger.text import describe as _entry_brief

    with open_ledger(led_path) as led:
        assert _entry_brief(led.get("b" * 32)).startswith(
            "audit of dp-rvfl: 50 trials on heart:train"
        )

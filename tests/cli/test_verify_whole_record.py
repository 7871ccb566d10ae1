"""`dpaudit verify` judges the whole record the bundle's ledger holds, not only the files chosen for
the bundle: every plan of a target (a release, or a fresh run of a mechanism) must be in the bundle;
a plan registered after an audit of its target fails; only a run's first result counts; a release
its signed ledger entry counts as not private fails, whatever its bundled copy says. Small Gaussian
and embedded-digits runs (seconds)."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from dpaudit.audit_plans import digest
from dpaudit.cli import app
from dpaudit.ledger import signing as sg
from dpaudit.ledger.book import open_ledger
from dpaudit.reports import make_bundle
from plan_flow import failed_checks as _failed, ok as _ok, signed_auditor, verify_checks as _checks

runner = CliRunner()
GAUSSIAN_PLAN = ["audit", "plan", "gaussian", "--runs", "16", "--no-controls"]


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    """Four plans of one Gaussian audit, registered first and each run once (a shopper bundles one);
    a release with a planned audit; a release whose noise follows from its published seed."""
    root = tmp_path_factory.mktemp("record")
    led = str(root / "ledger.sqlite")
    with pytest.MonkeyPatch.context() as mp:
        key = signed_auditor(mp, root)
        for i in range(4):
            _ok([*GAUSSIAN_PLAN, "--seed", str(i), "--out", f"g{i}"])
        for i in range(4):
            _ok(["audit", "--plan", f"g{i}/plan.json"])
        _ok(["bundle", "g3", "--out", "shopped"])
        _ok(["bundle", "g0", "g1", "g2", "g3", "--out", "whole"])
        _ok(["train", "dp-rvfl", "--eps", "2", "--epochs", "2", "--out", "rel"])
        _ok(
            [
                "audit",
                "plan",
                "dp-rvfl",
                "--release",
                "rel",
                "--runs",
                "16",
                "--no-controls",
                "--out",
                "a",
            ]
        )
        _ok(["audit", "--plan", "a/plan.json"])
        _ok(["bundle", "rel", "--out", "release-alone"])
        _ok(["bundle", "rel", "a", "--out", "release-whole"])
        _ok(
            [
                "train",
                "dp-rvfl",
                "--eps",
                "2",
                "--epochs",
                "2",
                "--reproducible-noise",
                "--out",
                "repro",
            ]
        )
        _ok(["bundle", "repro", "--out", "repro-bundle"])
        yield {"root": root, "ledger": led, "key": key}


def _plan_id(folder) -> str:
    return json.loads((folder / "plan.json").read_text())["id"]


def test_a_bundle_omitting_plans_of_its_target_fails_naming_them(record):
    root = record["root"]
    failed = _failed(root / "shopped")
    assert [name for name, _ in failed] == ["plans of target"], failed
    detail = failed[0][1]
    assert "4 plans of gaussian in the ledger" in detail
    assert all(_plan_id(root / f"g{i}")[:12] in detail for i in range(3))
    assert _plan_id(root / "g3")[:12] not in detail
    ok, checks = _checks(root / "whole")
    assert ok, [c for c in checks if c["status"] == "FAIL"]
    assert any(
        c["name"] == "plans of target" and "4 plans of gaussian" in c["detail"] for c in checks
    )


def test_a_release_bundled_without_its_planned_audits_fails(record):
    root = record["root"]
    failed = _failed(root / "release-alone")
    assert [name for name, _ in failed] == ["plans of target"], failed
    assert _plan_id(root / "a")[:12] in failed[0][1]
    assert _failed(root / "release-whole") == []


def test_a_plan_registered_after_an_audit_of_its_target_fails(record, tmp_path, monkeypatch):
    """A writer that skips the ledger's refusal (the rule it enforces is plan_rules') cannot pass verify."""
    led = tmp_path / "ledger.sqlite"
    shutil.copyfile(record["ledger"], led)
    for name in ("rel", "a"):
        shutil.copytree(record["root"] / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DPAUDIT_LEDGER", str(led))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(record["root"] / "cfg"))
    monkeypatch.setenv(sg.SIGNING_KEY_ENV, str(record["key"].path))
    late = [
        *GAUSSIAN_PLAN[:2],
        "dp-rvfl",
        "--release",
        "rel",
        "--runs",
        "16",
        "--no-controls",
        "--seed",
        "9",
        "--out",
        "late",
    ]
    refused = runner.invoke(app, late)
    assert refused.exit_code == 2 and "before any audit of its target" in refused.output
    monkeypatch.setattr("dpaudit.ledger.plan_rules._refuse_late_registration", lambda *a: None)
    _ok(late)
    _ok(["audit", "--plan", "late/plan.json"])
    _ok(["bundle", "rel", "a", "late", "--out", "b"])
    failed = _failed(tmp_path / "b")
    assert [name for name, _ in failed] == ["registered first"], failed
    assert failed[0][0] == "registered first" and "after audits of release" in failed[0][1]


def test_only_the_first_result_counts_even_with_an_anchor(record, tmp_path):
    """An edited audit.json plus one more signed result entry for its run: a VIOLATION can no longer be
    turned into "no evidence" by appending; the anchor (published before the edit) does not help."""
    led = tmp_path / "ledger.sqlite"
    shutil.copyfile(record["ledger"], led)
    with open_ledger(led, create=False) as ledger:
        anchor = ledger.head()["hash"]
    for i in range(4):
        shutil.copytree(record["root"] / f"g{i}", tmp_path / f"g{i}")
    audit_file = tmp_path / "g3" / "audit.json"
    audit = json.loads(audit_file.read_text())
    counts = audit["counts"]
    before = dict(counts)
    # the best result these trials could show; an audit already there (its noise is fresh) is edited the other way
    counts.update(tp=counts["tp"] + counts["fn"], fn=0, tn=counts["tn"] + counts["fp"], fp=0)
    if counts == before:
        counts.update(tp=0, fn=before["tp"])
    audit_file.write_text(json.dumps(audit))
    bundle = tmp_path / "b"
    make_bundle([tmp_path / f"g{i}" for i in range(4)], ledger=led, out=bundle)
    edited = json.loads((bundle / "audits" / audit["id"] / "audit.json").read_text())
    with open_ledger(led, signing_key=record["key"].path) as ledger, ledger._store.write():
        # what a writer going around record_plan (which refuses it) appends
        second = {
            "plan_id": audit["plan"]["id"],
            "stage": "result",
            "audit_id": audit["id"],
            "sha256": digest(edited),
        }
        ledger._append(sg.PLAN_KIND, sg.LEDGER_SCOPE, second)
    shutil.rmtree(bundle)
    make_bundle([tmp_path / f"g{i}" for i in range(4)], ledger=led, out=bundle)
    failed = dict(_failed(bundle, "--anchor", anchor))
    assert "second result entry for run" in failed["one result"]
    assert "differs from the result the ledger recorded" in failed["result = ledger"]


def test_a_release_the_ledger_counts_as_not_private_fails(record, tmp_path):
    root = record["root"]
    failed = _failed(root / "repro-bundle")
    assert any(
        n == "private" and "not private" in d and "published seed" in d for n, d in failed
    ), failed
    b = tmp_path / "b"
    shutil.copytree(root / "repro-bundle", b)
    rel = next(b.glob("releases/*/release.json"))
    d = json.loads(rel.read_text())
    d["noise_source"] = {"source": "os-entropy", "seed": None, "secret": True}
    rel.write_text(json.dumps(d))
    (detail,) = [d for name, d in _failed(b) if name == "private"]
    assert "not private" in detail and "copy says private" in detail
    ok = [c for c in _checks(root / "release-whole")[1] if c["name"] == "private"]
    assert [c["status"] for c in ok] == ["pass"]

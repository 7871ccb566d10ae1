"""Pre-registration cannot be shopped or previewed (the ledger's rules for ``plan`` entries,
:mod:`dpaudit.ledger.plan_rules`): a plan is registered before any audit of its target, a run has one
result, and a plan never fixes reproducible noise (refused when written, and when run)."""

from __future__ import annotations


import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpaudit.audit_plans import load_plan
from dpaudit.cli import app
from dpaudit.errors import UsageError
from dpaudit.ledger.book import open_ledger
from plan_flow import failed_checks, ok as _ok, signed_auditor

runner = CliRunner()
PLAN = ["audit", "plan", "gaussian", "--runs", "16", "--no-controls"]


@pytest.fixture
def auditor(tmp_path, monkeypatch):
    """A fresh ledger with a registered key, the working folder ``tmp_path``; returns the ledger path."""
    signed_auditor(monkeypatch, tmp_path)
    return tmp_path / "ledger.sqlite"


def _entries(led) -> int:
    with open_ledger(led, create=False) as ledger:
        return ledger.head()["entries"]


def _refused(args, says: str, led) -> None:
    """Exit 2, one line naming the rule, nothing written to the ledger or the plan folder."""
    before = _entries(led)
    r = runner.invoke(app, [*args, "--out", "refused"])
    assert r.exit_code == 2, r.output
    assert says in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert _entries(led) == before and not (led.parent / "refused").exists()


def test_no_plan_after_a_run_of_the_same_target(auditor):
    _ok([*PLAN, "--out", "p1"])
    _ok([*PLAN, "--seed", "7", "--out", "p2"])  # registered before any audit: fine
    _ok(["audit", "--plan", "p1/plan.json"])
    _refused([*PLAN, "--seed", "8"], "must come before any audit of its target (gaussian)", auditor)
    _ok(["audit", "--plan", "p2/plan.json"])  # plans registered in time still run
    _ok([*PLAN, "--eps", "3", "--out", "p3"])  # another claim is another target


def test_no_plan_after_an_unplanned_audit_of_the_release(auditor):
    _ok(["train", "dp-rvfl", "--eps", "2", "--epochs", "2", "--out", "rel"])
    _ok(["audit", "dp-rvfl", "--release", "rel", "--runs", "16", "--no-controls", "--out", "peek"])
    plan = ["audit", "plan", "dp-rvfl", "--release", "rel", "--runs", "16", "--no-controls"]
    _refused(plan, "before any audit of its target (release", auditor)


def test_a_run_has_one_result(auditor):
    with open_ledger(auditor) as led:
        led.record_plan({"plan_id": "p", "stage": "registered"})
        with pytest.raises(UsageError, match="never started"):
            led.record_plan(
                {"plan_id": "p", "stage": "result", "audit_id": "a", "sha256": "1" * 64}
            )
        led.record_plan({"plan_id": "p", "stage": "run", "audit_id": "a"})
        first = led.record_plan(
            {"plan_id": "p", "stage": "result", "audit_id": "a", "sha256": "1" * 64}
        )
        again = led.record_plan(
            {"plan_id": "p", "stage": "result", "audit_id": "a", "sha256": "1" * 64}
        )
        assert again == first  # a resumed run
        n = len(led.entries(kind="plan"))
        with pytest.raises(UsageError, match="recorded once"):
            led.record_plan(
                {"plan_id": "p", "stage": "result", "audit_id": "a", "sha256": "2" * 64}
            )
        assert len(led.entries(kind="plan")) == n


def test_a_plan_never_fixes_reproducible_noise(auditor, monkeypatch):
    _refused(
        [*PLAN, "--reproducible-noise"],
        "reproducible noise must be off for a planned audit",
        auditor,
    )
    # a plan written around the refusal is refused when run, and fails verify
    with monkeypatch.context() as m:
        m.setattr("dpaudit.audit_plans.refuse_reproducible_noise", lambda reproducible: None)
        _ok([*PLAN, "--reproducible-noise", "--out", "fixed"])
        _ok(["audit", "--plan", "fixed/plan.json"])
        _ok(["bundle", "fixed", "--out", "b"])
    failed = failed_checks("b")
    assert any(n == "plan" and "fixes reproducible noise" in d for n, d in failed), failed
    Path("unrun").mkdir()  # (the run folder itself is refused first: a plan runs once)
    for name in ("plan.json", "plan.local.json"):
        shutil.copy(f"fixed/{name}", f"unrun/{name}")
    with pytest.raises(UsageError, match="reproducible noise must be off"):
        load_plan("unrun/plan.json")

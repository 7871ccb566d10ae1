"""Pre-registered audits and `dpaudit verify`: the walk-through flow on the embedded digits
(train -> audit plan -> audit --plan -> bundle -> verify) at tiny sizes, and each tampering caught and named."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from dpaudit.audit_plans import PLAN_LOCAL_FILE, commitment, load_plan
from dpaudit.audits.one_run import plan_coins
from dpaudit.cli import app
from dpaudit.errors import UsageError
from dpaudit.ledger import signing as sg
from dpaudit.ledger.book import open_ledger
from plan_flow import failed_checks, ok as _ok, signed_auditor

runner = CliRunner()


@pytest.fixture(scope="module")
def flow(tmp_path_factory):
    """One release, a trial plan run twice (the first run kept aside), a one-run plan run once, a
    third registered plan never run, and bundles (each with every plan of the release): the honest
    one, one hiding the second run, one with both."""
    root = tmp_path_factory.mktemp("review")
    led = str(root / "ledger.sqlite")
    with pytest.MonkeyPatch.context() as mp:
        signed_auditor(mp, root)
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
                "--seed",
                "3",
                "--out",
                "a",
            ]
        )
        _ok(
            [
                "audit",
                "plan",
                "dp-rvfl",
                "--release",
                "rel",
                "--one-run",
                "--canaries",
                "20",
                "--out",
                "o",
            ]
        )
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
                "--confidence",
                "0.5",
                "--out",
                "other",
            ]
        )
        _ok(["audit", "--plan", "a/plan.json"])
        _ok(["audit", "--plan", "o/plan.json"])
        _ok(["bundle", "rel", "a", "o", "other/plan.json", "--out", "honest"])
        shutil.copytree("a", "a-run1")
        for f in root.joinpath(
            "a"
        ).iterdir():  # a plan's second run is refused while its first run's files are there
            if f.name not in ("plan.json", PLAN_LOCAL_FILE):
                shutil.rmtree(f) if f.is_dir() else f.unlink()
        second = _ok(["audit", "--plan", "a/plan.json"])
        _ok(["bundle", "rel", "a", "o", "other/plan.json", "--out", "hidden"])
        _ok(["bundle", "rel", "a-run1", "a", "o", "other/plan.json", "--out", "both"])
        yield {"root": root, "second": second.output, "ledger": led}


def _verify(bundle):
    return runner.invoke(app, ["verify", str(bundle)], terminal_width=80)


_failed = failed_checks


def _copy(flow, tmp_path, name="honest"):
    dst = tmp_path / name
    shutil.copytree(flow["root"] / name, dst)
    return dst


def _edit(path, change):
    d = json.loads(path.read_text())
    change(d)
    path.write_text(json.dumps(d))


def _trial_audit(bundle):
    return next(p for p in bundle.glob("audits/*/audit.json"))


def test_honest_bundle_passes_and_holds_shareable_parts_only(flow, tmp_path):
    b = _copy(flow, tmp_path)
    r = _verify(b)
    assert r.exit_code == 0, r.output
    assert "FAIL" not in r.output and "checks passed" in r.output
    assert max(len(line) for line in r.output.splitlines()) <= 80
    names = {p.name for p in b.rglob("*") if p.is_file()}
    assert names == {
        "bundle.json",
        "ledger.json",
        "release.json",
        "audit.json",
        "one_run.json",
        "plan.json",
    }
    assert json.loads((b / "ledger.json").read_text())["fingerprint_key"] is None
    # the revealed seeds are the committed ones, and the one-run coins are the committed coins
    audit = json.loads(_trial_audit(b).read_text())
    plan = json.loads((b / "plans" / audit["plan"]["id"] / "plan.json").read_text())
    assert (
        commitment(audit["plan"]["salt"], audit["plan"]["seeds"]) == plan["commitment"]
        and audit["seeds"]["public"] == 3
    )
    one = json.loads(next(b.glob("audits/*/one_run.json")).read_text())
    assert int(plan_coins(one["plan"]["seeds"]["coins"], 20).sum()) == one["included"]


def test_a_second_run_is_flagged_and_a_hidden_one_fails(flow):
    assert "2 runs of plan" in flow["second"]
    (failed,) = _failed(flow["root"] / "hidden")
    assert (
        failed[0] == "runs"
        and "2 runs of plan" in failed[1]
        and "1 in the bundle; not in the bundle" in failed[1]
    )
    both = runner.invoke(app, ["verify", str(flow["root"] / "both"), "--json"])
    assert both.exit_code == 0, both.output
    assert [c["detail"] for c in json.loads(both.stdout)["checks"] if c["status"] == "note"][
        0
    ].startswith("2 runs of plan")


def _counts(b):
    _edit(_trial_audit(b), lambda d: d["counts"].update(fp=0, fn=0))


def _statistic(b):
    _edit(_trial_audit(b), lambda d: d.update(statistic="clopper-pearson"))


def _plan_statistic(b):
    for p in b.glob("plans/*/plan.json"):
        _edit(p, lambda d: d["audit"].update(statistic="clopper-pearson"))


def _salt(b):
    _edit(_trial_audit(b), lambda d: d["plan"].update(salt="00" * 32))


def _noise_multiplier(b):
    def change(d):
        d["noise_multiplier"] *= 2
        d["guarantee"]["noise_multiplier"] *= 2

    _edit(next(b.glob("releases/*/release.json")), change)


def _drop_entry(b):
    _edit(b / "ledger.json", lambda d: d["rows"].pop(len(d["rows"]) // 2))


@pytest.mark.parametrize(
    "tamper,check,says",
    [
        (_counts, "result = ledger", "differs from the result"),
        (_counts, "audit vs plan", "do not fit the seeded worlds"),
        (_statistic, "audit vs plan", "statistic 'clopper-pearson', planned 'claimed-curve'"),
        (_plan_statistic, "plan", "signature does not verify"),
        (_salt, "audit vs plan", "do not hash to the commitment"),
        (_noise_multiplier, "release = ledger", "noise_multiplier"),
        (_drop_entry, "ledger", "deleted"),
    ],
)
def test_each_tampering_is_caught_and_named(flow, tmp_path, tamper, check, says):
    b = _copy(flow, tmp_path)
    tamper(b)
    failed = _failed(b)
    assert any(name == check and says in detail for name, detail in failed), failed
    r = _verify(b)  # the table names the failed check too
    assert r.exit_code == 1 and any(
        "FAIL" in line and line.split("│")[1].strip() == check
        for line in r.output.splitlines()
        if "│" in line
    )


def test_plan_swapped_for_another_registered_plan(flow, tmp_path):
    b = _copy(flow, tmp_path)
    audit = json.loads(_trial_audit(b).read_text())
    (other,) = [p for p in (flow["root"] / "other").glob("plan.json")]
    mine = b / "plans" / audit["plan"]["id"]
    shutil.rmtree(mine)
    (b / "plans" / "x").mkdir()
    shutil.copyfile(other, b / "plans" / "x" / "plan.json")
    assert any(
        name == "audit vs plan" and "not pre-registered" in detail for name, detail in _failed(b)
    )


def test_plan_runs_exactly_as_planned(flow, tmp_path, monkeypatch):
    monkeypatch.chdir(flow["root"])
    monkeypatch.setenv("DPAUDIT_LEDGER", flow["ledger"])
    r = runner.invoke(app, ["audit", "--plan", "a/plan.json", "--runs", "50"])
    assert r.exit_code == 2 and "--runs must not be given with --plan" in r.output
    assert runner.invoke(app, ["audit", "dp-rvfl", "--plan", "a/plan.json"]).exit_code == 2
    # a plan edited after signing, or seeds other than the committed ones, never run
    shutil.copytree(flow["root"] / "a", tmp_path / "a")
    _edit(tmp_path / "a" / PLAN_LOCAL_FILE, lambda d: d["seeds"].update(public=4))
    with pytest.raises(Exception, match="commits to"):
        load_plan(tmp_path / "a" / "plan.json")
    _edit(tmp_path / "a" / "plan.json", lambda d: d["audit"].update(trials=4000))
    with pytest.raises(Exception, match="signed by the key"):
        load_plan(tmp_path / "a" / "plan.json")


def test_ledger_plan_entries_run_after_registration_once(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    key = sg.keygen("k")
    with open_ledger(tmp_path / "l.sqlite", signing_key=key) as led:
        with pytest.raises(UsageError, match="signed by a registered key"):
            led.record_plan({"plan_id": "p", "stage": "registered"})
        led.register_key()
        with pytest.raises(UsageError, match="not registered"):
            led.record_plan({"plan_id": "p", "stage": "run", "audit_id": "a"})
        led.record_plan({"plan_id": "p", "stage": "registered"})
        with pytest.raises(UsageError, match="already registered"):
            led.record_plan({"plan_id": "p", "stage": "registered"})
        first = led.record_plan({"plan_id": "p", "stage": "run", "audit_id": "a"})
        assert (
            led.record_plan({"plan_id": "p", "stage": "run", "audit_id": "a"}) == first
        )  # a resumed run: one entry
        assert led.verify().ok and len(led.entries(kind="plan")) == 2

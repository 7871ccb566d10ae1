"""A sweep's releases go into the ledger (tagged with the sweep) and caps are enforced up front.

Uses the embedded ``digits`` data (no files needed), two epochs to stay fast.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpaudit.ledger.book import open_ledger
from dpaudit.errors import BudgetExceededError
from dpaudit.sweeps import open_store, parse_spec, run_sweep

SPEC = """
name = "digits-tiny"
models = ["dp-rvfl", "logistic-raw"]
datasets = ["digits"]
epsilons = [2.0]
seeds = [42]
[settings]
delta = 1e-5
epochs = 2
"""
# Secret (default) noise: noise derived from the published seed is not private and a capped
# dataset refuses it, so these budget tests use secret noise.


def test_sweep_releases_are_recorded_and_composed(tmp_path):
    ledger_path = tmp_path / "ledger.sqlite"
    s = run_sweep(parse_spec(SPEC), out=tmp_path, ledger_path=ledger_path)
    assert (s.done, s.failed) == (2, 0), s.failures
    with open_store(tmp_path / "digits-tiny", create=False) as st:
        rows = st.rows(status="done")
    with open_ledger(ledger_path) as led:
        entries = led.entries(dataset="digits", kind="release")
        summary = led.summary("digits")
    assert sorted(e.id for e in entries) == sorted(r.result["release_id"] for r in rows)
    for r in rows:
        rel = json.loads((Path(r.result["release_dir"]) / "release.json").read_text())
        assert rel["config"]["sweep"] == {"name": "digits-tiny", "task": r.key}
        assert rel["epsilon"] <= 2.0 and rel["noise_source"]["source"] == "os-entropy"
        assert Path(r.result["release_dir"]).is_relative_to((tmp_path / "digits-tiny").resolve())
    assert {e.payload["artefact_path"] for e in entries} == {r.result["release_dir"] for r in rows}
    total = next(x for x in summary if x["partition"] == "*")
    assert total["epsilon"] > 2.0  # two runs on the same records cost more than either alone
    # resuming records nothing twice
    again = run_sweep(parse_spec(SPEC), out=tmp_path, ledger_path=ledger_path)
    assert again.ran == 0
    with open_ledger(ledger_path) as led:
        assert len(led.entries(dataset="digits", kind="release")) == 2


def test_a_sweep_over_the_cap_is_refused_before_any_task_runs(tmp_path):
    ledger_path = tmp_path / "ledger.sqlite"
    with open_ledger(ledger_path) as led:
        led.cap("digits", 3.0, 1e-5)
    bigger = parse_spec(SPEC.replace("seeds = [42]", "seeds = [42, 43]"))  # 4 runs at eps 2 > cap 3
    with pytest.raises(BudgetExceededError, match="exceeded"):
        run_sweep(bigger, out=tmp_path, ledger_path=ledger_path)
    with open_store(tmp_path / "digits-tiny", create=False) as st:
        assert st.counts() == {"pending": 4, "done": 0, "failed": 0}
    with open_ledger(ledger_path) as led:
        assert led.entries(dataset="digits", kind="release") == []


def test_ledger_groups_releases_by_sweep(tmp_path):
    """`ledger list/summary --sweep NAME` show what one sweep spent; other releases are left out."""
    import dataclasses

    from typer.testing import CliRunner

    from dpaudit.cli import app
    from dpaudit.records import read_release

    ledger_path = tmp_path / "ledger.sqlite"
    s = run_sweep(parse_spec(SPEC), out=tmp_path, ledger_path=ledger_path)
    assert s.done == 2
    with open_store(tmp_path / "digits-tiny", create=False) as st:
        rows = st.rows(status="done")
    # One more release on the same data, not made by the sweep.
    other = read_release(Path(rows[0].result["release_dir"]) / "release.json")
    config = {k: v for k, v in other.config.items() if k != "sweep"}
    outside = dataclasses.replace(other, id="outside-the-sweep", config=config)
    with open_ledger(ledger_path) as led:
        led.record(outside)
        assert led.sweeps() == {"digits-tiny": 2}
        tags = {e.id: e.payload.get("sweep") for e in led.entries(kind="release")}
        whole = next(r for r in led.summary("digits") if r["partition"] == "*")
        swept = next(r for r in led.summary("digits", sweep="digits-tiny") if r["partition"] == "*")
    assert tags["outside-the-sweep"] is None
    assert {tags[r.result["release_id"]]["task"] for r in rows} == {r.key for r in rows}
    assert (whole["releases_subtree"], swept["releases_subtree"]) == (3, 2)
    assert 2.0 < swept["epsilon"] < whole["epsilon"]
    assert swept["remaining"] is None

    runner = CliRunner()
    res = runner.invoke(
        app, ["ledger", "list", "--sweep", "digits-tiny", "--ledger", str(ledger_path), "--json"]
    )
    assert res.exit_code == 0, res.output
    listed = json.loads(res.stdout)["entries"]
    assert sorted(e["id"] for e in listed) == sorted(r.result["release_id"] for r in rows)
    res = runner.invoke(
        app, ["ledger", "summary", "--sweep", "digits-tiny", "--ledger", str(ledger_path), "--json"]
    )
    assert res.exit_code == 0, res.output
    total = next(r for r in json.loads(res.stdout)["rows"] if r["partition"] == "*")
    assert total["epsilon"] == pytest.approx(swept["epsilon"])
    res = runner.invoke(
        app, ["ledger", "summary", "--sweep", "no-such-sweep", "--ledger", str(ledger_path)]
    )
    assert res.exit_code == 2 and "no-such-sweep" in res.output and "digits-tiny" in res.output
    res = runner.invoke(app, ["ledger", "list", "--ledger", str(ledger_path)])
    assert res.exit_code == 0 and "sweep digits-tiny" in res.output


def test_a_release_recorded_before_sweep_tags_is_still_recognised(tmp_path):
    """Recording the same release again after upgrading is a no-op, not a conflict."""
    from dpaudit.ledger import book as ledger_mod
    from dpaudit.records import read_release

    s = run_sweep(
        parse_spec(SPEC.replace('"logistic-raw"', "")),
        out=tmp_path,
        ledger_path=tmp_path / "l0.sqlite",
    )
    assert s.done == 1
    with open_store(tmp_path / "digits-tiny", create=False) as st:
        (row,) = st.rows(status="done")
    rel = read_release(Path(row.result["release_dir"]) / "release.json")
    path = tmp_path / "old.sqlite"
    saved = ledger_mod._sweep_tag
    ledger_mod._sweep_tag = lambda config: None  # the ledger as it was before sweep tags
    try:
        with open_ledger(path) as led:
            led.record(rel)
    finally:
        ledger_mod._sweep_tag = saved
    with open_ledger(path) as led:
        assert led.record(rel) == rel.id
        assert len(led.entries(kind="release")) == 1


def test_a_sweep_holds_its_budget_while_it_runs_and_its_own_tasks_are_not_refused_by_it(tmp_path):
    # Cap just above what the sweep's two releases need together: the sweep must complete (its
    # tasks' own pre-checks leave the sweep's reservation out), while a release started by
    # someone else during the sweep is refused (the sweep's budget is held, not merely checked).
    from dpaudit.accounting import Composed
    from dpaudit.sweeps.spec import parse_spec as parse
    from dpaudit.sweeps.tasks import planned_event

    ledger_path = tmp_path / "ledger.sqlite"
    spec = parse(SPEC)
    events = [planned_event(t.config())[3] for t in spec.tasks()]
    # What the two planned releases need together by the ledger's own bound (the smallest valid
    # one): each task holds exactly its own reservation, so nothing is counted twice.
    with open_ledger(tmp_path / "scratch.sqlite") as scratch:
        scratch.cap("digits", 100.0, 1e-5)
        both = scratch.check(
            dataset="digits",
            partition="train",
            event=Composed(tuple(events)),
            adjacency="add-remove-record",
        )["needs"]
    with open_ledger(ledger_path) as led:
        led.cap("digits", both * 1.05, 1e-5)
    seen = {}

    def during(task, outcome):
        if "refused" in seen:
            return
        with open_ledger(ledger_path) as led:
            seen["open"] = [e.payload["mechanism"] for e in led.open_reservations("digits")]
            try:
                led.preflight(
                    dataset="digits",
                    partition="train",
                    event=events[0],
                    adjacency="add-remove-record",
                )
                seen["refused"] = False
            except BudgetExceededError:
                seen["refused"] = True

    s = run_sweep(spec, out=tmp_path, ledger_path=ledger_path, on_outcome=during)
    assert (s.done, s.failed) == (2, 0), s.failures
    assert seen == {"open": ["sweep:digits-tiny"], "refused": True}
    with open_ledger(ledger_path) as led:
        assert led.open_reservations() == []  # closed when the sweep ended
        assert len(led.entries(dataset="digits", kind="release")) == 2


def _capped_ledger(tmp_path, spec):
    """A ledger with a generous cap on digits (so the sweep reserves) and what the sweep's two
    planned releases need together by the ledger's own bound."""
    from dpaudit.accounting import Composed
    from dpaudit.sweeps.tasks import planned_event

    events = [planned_event(t.config())[3] for t in spec.tasks()]
    ledger_path = tmp_path / "ledger.sqlite"
    with open_ledger(ledger_path) as led:
        led.cap("digits", 50.0, 1e-5)
        both = led.check(
            dataset="digits",
            partition="train",
            event=Composed(tuple(events)),
            adjacency="add-remove-record",
        )["needs"]
    return ledger_path, both


def _releases_on_disk(tmp_path) -> int:
    return len(list((tmp_path / "digits-tiny").rglob("release.json")))


def _assert_unrecorded_release_keeps_its_budget(tmp_path, ledger_path, both, summary):
    """The written-but-unrecorded release's reservation stays open (spent, and
    voidable), so the ledger still counts what both models cost; a re-run does not train it again."""
    assert _releases_on_disk(tmp_path) == 2
    with open_ledger(ledger_path) as led:
        assert len(led.entries(dataset="digits", kind="release")) == 1
        total = next(r for r in led.summary("digits") if r["partition"] == "*")
        assert total["epsilon"] >= both * (1 - 1e-9)  # both models' budget, not one
        held = [e.id for e in led.open_reservations("digits")]
    assert len(held) == 1 and [u["reservation"] for u in summary.unrecorded] == held
    rid = held[0]
    again = run_sweep(parse_spec(SPEC), out=tmp_path, ledger_path=ledger_path, retry_failed=True)
    assert (
        again.ran == 0 and again.failed == 1 and "not trained again" in again.failures[0]["error"]
    )
    assert _releases_on_disk(tmp_path) == 2
    with open_ledger(ledger_path) as led:
        assert [e.id for e in led.open_reservations("digits")] == [
            rid
        ]  # nothing given back, nothing new held
        led.void(rid, "release recorded by hand")  # visible and voidable
        assert led.open_reservations("digits") == []


def test_a_release_written_but_not_recorded_keeps_its_budget_spent(tmp_path, monkeypatch):
    import sqlite3

    from dpaudit.ledger import book as ledger_mod

    spec = parse_spec(SPEC)
    ledger_path, both = _capped_ledger(tmp_path, spec)
    real, calls = ledger_mod.Ledger._record, []

    def flaky(self, release, artefact_path, *rest):
        calls.append(release.id)
        if len(calls) == 2:  # the second task's release: a transient lock while recording it
            raise sqlite3.OperationalError("database is locked")
        return real(self, release, artefact_path, *rest)

    monkeypatch.setattr(ledger_mod.Ledger, "_record", flaky)
    s = run_sweep(spec, out=tmp_path, ledger_path=ledger_path)
    monkeypatch.setattr(ledger_mod.Ledger, "_record", real)
    assert (s.done, s.failed) == (1, 1) and "not recorded in the ledger" in s.failures[0]["error"]
    _assert_unrecorded_release_keeps_its_budget(tmp_path, ledger_path, both, s)
    assert s.unrecorded[0]["reservation"] in s.failures[0]["error"]


def test_an_interrupt_after_a_release_is_written_keeps_its_budget_spent(tmp_path, monkeypatch):
    from dpaudit.sweeps import tasks as tasks_mod

    spec = parse_spec(SPEC)
    ledger_path, both = _capped_ledger(tmp_path, spec)
    real, calls = tasks_mod.release_result, []

    def interrupted(release, out):
        calls.append(out)
        if len(calls) == 2:  # Ctrl-C just after the second task wrote its release.json
            raise KeyboardInterrupt
        return real(release, out)

    monkeypatch.setattr(tasks_mod, "release_result", interrupted)
    s = run_sweep(spec, out=tmp_path, ledger_path=ledger_path)
    monkeypatch.setattr(tasks_mod, "release_result", real)
    assert s.interrupted and (s.done, s.pending) == (1, 1)
    _assert_unrecorded_release_keeps_its_budget(tmp_path, ledger_path, both, s)

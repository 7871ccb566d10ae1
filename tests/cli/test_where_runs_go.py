"""Where a command's outputs and ledger entries go, said and chosen: ``train`` names its release folder and
ledger entry, a default audit says what its no-noise control does to the dataset's total, ``audit --plan``
takes ``--ledger``, and a refusal by what a ledger holds names the way out (another ``--ledger``)."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from dpaudit.cli import app
from dpaudit.ledger.book import open_ledger

from .plan_flow import ok, signed_auditor

HINT = "use another --ledger for an unrelated experiment."


def _one_line(text: str) -> str:
    return " ".join(text.split())


def test_train_says_where_its_release_and_ledger_entry_went(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = ok(["train", "dp-rvfl", "--epochs", "1", "--out", "runs/r1", "--ledger", "book.sqlite"])
    m = re.search(
        r"^release (\w+) written to runs/r1 \(release\.json, weights\.npz\); ledger book\.sqlite entry (\w+)$",
        r.stdout,
        re.M,
    )
    assert m, r.stdout
    with open_ledger(tmp_path / "book.sqlite", create=False) as led:
        assert led.get(m.group(2)).payload["artefact_path"] == str(
            (tmp_path / "runs" / "r1").resolve()
        )
    assert m.group(1) == m.group(2)


def test_a_default_audit_says_its_no_noise_control_makes_the_total_infinite(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["audit", "dp-rvfl", "--runs", "8", "--control-runs", "4", "--ledger", "book.sqlite"]
    said = _one_line(ok([*args, "--out", "a1"]).stderr)
    assert (
        "the no-noise control trained on 'digits' without DP noise: its releases + audits total is now infinite"
        in said
    )
    assert "in ledger book.sqlite; --no-controls keeps it finite." in said
    with open_ledger(tmp_path / "book.sqlite", create=False) as led:
        assert [e.payload["non_private"] for e in led.entries(kind="audit")] == [
            True
        ]  # what the line says happened
    assert "no-noise control" not in ok([*args, "--out", "a2", "--no-controls"]).stderr


def test_a_plan_runs_into_the_ledger_given_with_ledger(tmp_path, monkeypatch):
    signed_auditor(monkeypatch, tmp_path, ledger=tmp_path / "team.sqlite")
    ok(["audit", "plan", "dp-rvfl", "--runs", "8", "--no-controls", "--out", "p"])
    monkeypatch.delenv(
        "DPAUDIT_LEDGER"
    )  # the plan's own ledger is now the default file, which does not exist
    ok(["audit", "--plan", "p/plan.json", "--ledger", "team.sqlite"])
    with open_ledger(tmp_path / "team.sqlite", create=False) as led:
        stages = [e.payload.get("stage") for e in led.entries() if e.kind == "plan"]
        audits = led.entries(kind="audit")
    assert stages[-2:] == ["run", "result"] and len(audits) == 1
    assert not (tmp_path / ".dpaudit").exists()  # nothing went to the default ledger
    # a ledger that never registered the plan runs nothing
    r = CliRunner().invoke(app, ["audit", "--plan", "p/plan.json", "--ledger", "other.sqlite"])
    assert r.exit_code == 2 and "error:" in r.output


def test_a_budget_refusal_suggests_another_ledger(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ok(
        [
            "ledger",
            "cap",
            "--dataset",
            "digits",
            "--eps",
            "1",
            "--delta",
            "1e-5",
            "--ledger",
            "book.sqlite",
        ]
    )
    r = CliRunner().invoke(
        app, ["train", "dp-rvfl", "--eps", "2", "--epochs", "1", "--ledger", "book.sqlite"]
    )
    assert r.exit_code == 2
    error = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert (
        len(error) == 1
        and error[0].endswith(HINT)
        and "budget of dataset 'digits' exceeded" in error[0]
    )


def test_an_adjacency_mismatch_in_the_ledger_suggests_another_ledger(tmp_path, monkeypatch):
    from dpaudit.accounting.events import PureEpsilon

    monkeypatch.chdir(tmp_path)
    with open_ledger(
        tmp_path / "book.sqlite"
    ) as led:  # another study's release on a dataset of the same name
        led.reserve(
            dataset="digits", partition="train", event=PureEpsilon(0.5), adjacency="replace-record"
        )
    r = CliRunner().invoke(
        app,
        [
            "train",
            "dp-rvfl",
            "--eps",
            "2",
            "--epochs",
            "1",
            "--ledger",
            "book.sqlite",
            "--out",
            "r2",
        ],
    )
    assert r.exit_code == 2, r.output
    error = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert len(error) == 1 and "different adjacency" in error[0] and error[0].endswith(HINT), (
        r.stderr
    )

"""`dpaudit ledger ...` end to end through CliRunner: JSON contracts, exit codes, bad ledgers."""

from __future__ import annotations

import hashlib
import json
import sqlite3

import pytest
from typer.testing import CliRunner

from dpaudit.accounting import Composed, Parallel, SubsampledGaussian, compute_epsilon
from dpaudit.cli import app
from dpaudit.records import Release, write_release

runner = CliRunner()
# Cheap events (no subsampling, few steps) keep the prv accountant fast.
A = SubsampledGaussian(2.0, 1.0, 4)
B = SubsampledGaussian(3.0, 1.0, 9)


def _json(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _release(event, partition="train", dataset="mnist", **kw) -> Release:
    return Release(
        mechanism="dp-rvfl",
        dataset={"name": dataset, "sha256": "cd" * 32},
        adjacency="add-remove-record",
        accountant="rdp",
        epsilon=1.5,
        delta=1e-5,
        guarantee=event.to_dict(),
        seed=3,
        noise_source={"kind": "os-entropy"},
        partition=partition,
        git_commit=None,
        **kw,
    )


def _record(tmp_path, ledger, event, partition="train", name="r") -> str:
    rel = _release(event, partition)
    write_release(rel, tmp_path / name)
    d = _json(
        runner.invoke(
            app, ["ledger", "record", str(tmp_path / name), "--ledger", str(ledger), "--json"]
        )
    )
    assert d == {"id": rel.id, "dataset": "mnist", "partition": partition}
    return rel.id


def _rows(ledger, *extra):
    return _json(
        runner.invoke(app, ["ledger", "summary", "--ledger", str(ledger), "--json", *extra])
    )["rows"]


def test_full_workflow_with_json(tmp_path, data_dir):
    led = tmp_path / "l.sqlite"
    r1 = _record(tmp_path, led, A, name="r1")
    _record(tmp_path, led, A, name="r2")
    d = _json(
        runner.invoke(
            app,
            [
                "ledger",
                "declare-partition",
                "--dataset",
                "mnist",
                "--parent",
                "train",
                "--child",
                "train/mix",
                "--child",
                "train/ft",
                "--declared-by",
                "dp-mixmin",
                "--ledger",
                str(led),
                "--json",
            ],
        )
    )
    assert d["children"] == ["train/mix", "train/ft"] and d["declared_by"] == "dp-mixmin"
    _record(tmp_path, led, B, "train/mix", name="r3")
    _record(tmp_path, led, A, "train/ft", name="r4")
    # the cap declares mnist's rows (read from its files): two `rows` entries before it
    cap = _json(
        runner.invoke(
            app,
            [
                "ledger",
                "cap",
                "--dataset",
                "mnist",
                "--eps",
                "9",
                "--delta",
                "1e-6",
                "--ledger",
                str(led),
                "--json",
                "--data-dir",
                str(data_dir),
            ],
        )
    )
    assert cap["epsilon"] == 9.0 and cap["delta"] == 1e-6

    rows = _rows(led)
    by = {r["partition"]: r for r in rows}
    assert list(by) == ["*", "train", "train/mix", "train/ft"]
    two_a = SubsampledGaussian(2.0, 1.0, 8)
    ref = compute_epsilon(Composed((two_a, Parallel((B, A)))), delta=1e-6, accountant="rdp").epsilon
    assert by["train"]["epsilon_rdp"] == pytest.approx(ref, rel=1e-12)
    assert (
        by["*"]["cap"] == {"epsilon": 9.0, "delta": 1e-6, "include_audits": True}
        and by["*"]["delta"] == 1e-6
    )
    assert by["*"]["remaining"] == pytest.approx(9.0 - by["*"]["epsilon"])
    assert by["train"]["naive_epsilon"] == pytest.approx(4.5)
    assert {"releases", "epsilon_rdp", "epsilon_prv", "naive_epsilon", "cap", "remaining"} <= by[
        "train/mix"
    ].keys()
    assert _rows(led, "--dataset", "mnist") == rows

    listed = _json(runner.invoke(app, ["ledger", "list", "--ledger", str(led), "--json"]))[
        "entries"
    ]
    assert [e["kind"] for e in listed] == [
        "release",
        "release",
        "partition",
        "release",
        "release",
        "rows",
        "rows",
        "cap",
    ]
    assert [e["seq"] for e in listed] == [1, 2, 3, 4, 5, 6, 7, 8]

    shown = _json(runner.invoke(app, ["ledger", "show", r1[:8], "--ledger", str(led), "--json"]))
    assert shown["id"] == r1 and shown["guarantee"] == A.to_dict() and shown["voided_by"] is None
    assert shown["artefact_path"] == str((tmp_path / "r1").resolve())

    # Every void states whether the artefacts were ever published.
    assert "void must state whether the artefacts were ever published" in _one_line_error(
        runner.invoke(app, ["ledger", "void", r1, "--reason", "duplicate", "--ledger", str(led)])
    )
    v = _json(
        runner.invoke(
            app,
            [
                "ledger",
                "void",
                r1,
                "--reason",
                "duplicate",
                "--never-published",
                "--ledger",
                str(led),
                "--json",
            ],
        )
    )
    assert v["target"] == r1 and v["reason"] == "duplicate" and v["artefacts_published"] is False
    assert (
        _json(runner.invoke(app, ["ledger", "show", r1, "--ledger", str(led), "--json"]))[
            "voided_by"
        ]
        == v["id"]
    )
    assert {r["partition"]: r for r in _rows(led)}["train"]["releases"] == 1

    ver = _json(runner.invoke(app, ["ledger", "verify", "--ledger", str(led), "--json"]))
    assert ver["ok"] is True and ver["entries"] == 9 and ver["problems"] == []


def test_human_output_and_default_ledger_from_environment(tmp_path):
    # conftest points DPAUDIT_LEDGER at a fresh file for each test.
    rel = _release(A)
    write_release(rel, tmp_path / "run")
    assert (
        runner.invoke(app, ["ledger", "record", str(tmp_path / "run" / "release.json")]).exit_code
        == 0
    )
    r = runner.invoke(app, ["ledger", "summary"], env={"COLUMNS": "160"})
    assert r.exit_code == 0 and "mnist (total)" in r.stdout and "train" in r.stdout
    r = runner.invoke(app, ["ledger", "list"], env={"COLUMNS": "160"})
    assert r.exit_code == 0 and rel.id[:12] in r.stdout
    r = runner.invoke(app, ["ledger", "verify"])
    assert r.exit_code == 0 and "hash chain intact" in r.stdout
    r = runner.invoke(app, ["ledger", "show", rel.id])
    assert r.exit_code == 0 and "noise_multiplier" in r.stdout


def test_verify_fails_with_exit_1_and_names_the_row(tmp_path):
    led = tmp_path / "l.sqlite"
    ids = [_record(tmp_path, led, A, name=f"r{i}") for i in range(3)]
    conn = sqlite3.connect(led, isolation_level=None)
    conn.execute("DROP TRIGGER entries_no_delete")
    conn.execute("DELETE FROM entries WHERE seq = 2")
    conn.close()
    r = runner.invoke(app, ["ledger", "verify", "--ledger", str(led), "--json"])
    assert r.exit_code == 1
    d = json.loads(r.stdout)
    assert d["ok"] is False
    deleted = [p for p in d["problems"] if p["kind"] == "deleted"]
    assert deleted and deleted[0]["id"] == ids[2] and "between entry #1" in deleted[0]["message"]
    r = runner.invoke(app, ["ledger", "verify", "--ledger", str(led)], env={"COLUMNS": "200"})
    assert r.exit_code == 1 and "FAILED" in r.stdout and ids[2] in r.stdout
    r = runner.invoke(app, ["ledger", "summary", "--ledger", str(led)])
    assert r.exit_code == 2 and "fails verification" in r.stderr


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in result.stderr
    return lines[0]


@pytest.mark.parametrize(
    "command",
    [["summary"], ["list"], ["verify"], ["cap", "--dataset", "x", "--eps", "1", "--delta", "1e-5"]],
)
def test_corrupt_file_gives_one_line_exit_2_and_is_not_overwritten(tmp_path, command):
    led = tmp_path / "ledger.sqlite"
    led.write_bytes(b"\x00garbage" * 100)
    before = hashlib.sha256(led.read_bytes()).hexdigest()
    line = _one_line_error(runner.invoke(app, ["ledger", *command, "--ledger", str(led), "--json"]))
    assert "not an SQLite database" in line
    assert hashlib.sha256(led.read_bytes()).hexdigest() == before


def test_newer_schema_and_unwritable_location_give_exit_2(tmp_path):
    led = tmp_path / "l.sqlite"
    _record(tmp_path, led, A)
    conn = sqlite3.connect(led)
    conn.execute("INSERT INTO schema_version VALUES (5, 'later', '9')")
    conn.commit()
    conn.close()
    before = led.read_bytes()
    assert "schema version 5" in _one_line_error(
        runner.invoke(app, ["ledger", "summary", "--ledger", str(led)])
    )
    assert led.read_bytes() == before
    # A writing command creates a missing ledger (reading ones refuse it: the test below).
    line = _one_line_error(
        runner.invoke(
            app,
            [
                "ledger",
                "cap",
                "--dataset",
                "mnist",
                "--eps",
                "1",
                "--delta",
                "1e-5",
                "--ledger",
                "/proc/dpaudit-x/l.sqlite",
            ],
        )
    )
    assert "cannot create the ledger directory" in line


@pytest.mark.parametrize(
    "command", [["summary"], ["list"], ["verify"], ["show", "abcdef12"], ["head"]]
)
def test_reading_a_missing_ledger_is_an_error_and_creates_nothing(tmp_path, command):
    # A mistyped --ledger once read as an empty, intact ledger (exit 0) and
    # created the file and its folders.
    missing = tmp_path / "typo" / "ledgr.sqlite"
    r = runner.invoke(app, ["ledger", *command, "--ledger", str(missing)])
    assert r.exit_code == 2
    assert "ledger must be an existing ledger file" in _one_line_error(r) and str(
        missing
    ) in _one_line_error(r)
    assert not (tmp_path / "typo").exists()


def test_bad_input_gives_one_line_exit_2(tmp_path):
    led = tmp_path / "l.sqlite"
    rid = _record(tmp_path, led, A)
    assert "--eps must be" in _one_line_error(
        runner.invoke(
            app,
            [
                "ledger",
                "cap",
                "--dataset",
                "mnist",
                "--eps",
                "-1",
                "--delta",
                "1e-5",
                "--ledger",
                str(led),
            ],
        )
    )
    assert "delta must be" in _one_line_error(
        runner.invoke(
            app,
            [
                "ledger",
                "cap",
                "--dataset",
                "mnist",
                "--eps",
                "1",
                "--delta",
                "0",
                "--ledger",
                str(led),
            ],
        )
    )
    assert "entry id must be" in _one_line_error(
        runner.invoke(app, ["ledger", "show", "zzzzzzzz", "--ledger", str(led)])
    )
    assert "reason must be" in _one_line_error(
        runner.invoke(
            app, ["ledger", "void", rid, "--reason", " ", "--never-published", "--ledger", str(led)]
        )
    )
    assert "dataset must be" in _one_line_error(
        runner.invoke(app, ["ledger", "summary", "--dataset", "nope", "--ledger", str(led)])
    )
    declare = [
        "ledger",
        "declare-partition",
        "--dataset",
        "mnist",
        "--child",
        "c",
        "--declared-by",
        "x",
        "--ledger",
        str(led),
    ]
    assert runner.invoke(app, [*declare, "--parent", "b"]).exit_code == 0
    assert "one parent" in _one_line_error(runner.invoke(app, [*declare, "--parent", "a"]))
    assert "not found" in _one_line_error(
        runner.invoke(app, ["ledger", "record", str(tmp_path / "missing"), "--ledger", str(led)])
    )

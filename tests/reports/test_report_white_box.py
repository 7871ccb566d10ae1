"""White-box and crafted-final audits (white_box.json) as report rows, through `dpaudit report`:
verdict, eps_LB against the claim, the bound's ingredients, the controls and the power line; edited
and old records read fail closed. And a one-run row's "underpowered" flag from its power block."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpaudit.cli import app
from dpaudit.records import write_json_atomic
from dpaudit.reports.audit_blocks import ONE_RUN_HEADERS, WHITE_BOX_HEADERS, audit_blocks
from test_report_power import _one_run  # the one-run record of the power rows' tests

runner = CliRunner()


@pytest.fixture(scope="module")
def white_box_json(tmp_path_factory) -> dict:
    """A white-box audit of dp-dense at tiny size, written by the CLI (one run, no controls)."""
    tmp = tmp_path_factory.mktemp("wb")
    r = runner.invoke(
        app,
        [
            "audit",
            "dp-dense",
            "--threat-model",
            "white-box",
            "--canaries",
            "300",
            "--eps",
            "8",
            "--epochs",
            "1",
            "--no-controls",
            "--reproducible-noise",
            "--out",
            str(tmp / "wb"),
            "--ledger",
            str(tmp / "l.sqlite"),
        ],
    )
    assert r.exit_code == 0, r.output
    return json.loads((tmp / "wb" / "white_box.json").read_text())


def _report(folder: Path) -> dict:
    r = runner.invoke(
        app, ["report", str(folder), "--format", "json", "--out", str(folder / "r.json")]
    )
    assert r.exit_code == 0, r.output
    return json.loads((folder / "r.json").read_text())


def _rows(rep: dict, headers: list[str]) -> dict[str, dict]:
    (block,) = [b for b in audit_blocks(rep) if getattr(b, "headers", None) == headers]
    return {row[0]: dict(zip(headers, row)) for row in block.rows}


def _verdicts(rep: dict) -> dict[str, dict]:
    return {Path(v["audits"][0]).parent.name: v for v in rep["sections"]["verdict"]}


def test_a_white_box_audit_is_a_report_row_with_its_verdict_and_power_line(
    tmp_path, white_box_json
):
    write_json_atomic(tmp_path / "run" / "white_box.json", white_box_json)
    rep = _report(tmp_path)
    main = white_box_json["bounds"]["main"]
    (v,) = rep["sections"]["verdict"]
    assert v["status"] == "no-evidence" and v["flags"] == ["white-box"]
    assert v["line"] == (
        "dp-dense (white-box audit, 300 canaries): no evidence of a violation "
        f"(eps_LB {main['epsilon_lb']:.3f} <= claimed {main['claimed_epsilon']:.3f}; "
        "statistic: white-box step bound)"
    )
    row = _rows(rep, WHITE_BOX_HEADERS)["run"]
    assert (
        row["eps_LB"] == f"{main['epsilon_lb']:.3f}"
        and row["claim"] == f"{main['claimed_epsilon']:.3f}"
    )
    assert (
        row["controls (no-noise / null)"] == "not run / not run" and row["status"] == "NO-EVIDENCE"
    )
    power = white_box_json["power"]
    assert row["power (what these canaries can detect)"].startswith(
        f"limit —; at claim {power['at_claim']:.3f}; detects sigma x"
    )
    assert rep["inputs"]["white_boxes"] == [str(tmp_path / "run" / "white_box.json")]


def _edited(record: dict, **main) -> dict:
    out = copy.deepcopy(record)
    out["bounds"]["main"].update(main)
    return out


def test_edited_and_old_white_box_records_read_fail_closed(tmp_path, white_box_json):
    claim = white_box_json["bounds"]["main"]["claimed_epsilon"]
    infinite = _edited(
        white_box_json, epsilon_lb=None, violation=True
    )  # an infinite eps_LB is stored as null
    bad_null = dict(_edited(white_box_json), controls_ok={"no-noise": True, "null": False})
    unseen = dict(_edited(white_box_json), controls_ok={"no-noise": False, "null": True})
    old = {k: v for k, v in white_box_json.items() if k not in ("power", "controls_ok", "runs")}
    leaky = copy.deepcopy(white_box_json)
    leaky["runs"]["main"]["coordinates"] = [1, 2, 3]
    for name, record in {
        "inf": infinite,
        "null": bad_null,
        "unseen": unseen,
        "old": old,
        "leaky": leaky,
        "crafted": dict(white_box_json, threat_model="crafted-final"),
    }.items():
        write_json_atomic(tmp_path / name / "white_box.json", record)
    write_json_atomic(tmp_path / "nomain" / "white_box.json", {"bounds": {}})
    rep = _report(tmp_path)
    v = _verdicts(rep)
    assert (
        v["inf"]["status"] == "violation"
        and f"eps_LB inf > claimed {claim:.3f}" in v["inf"]["line"]
    )
    assert v["null"]["status"] == v["unseen"]["status"] == "inconclusive"
    assert (
        v["old"]["status"] == "no-evidence"
        and v["old"]["mechanism"] == "unknown (white-box audit, n/a canaries)"
    )
    assert (
        v["crafted"]["flags"] == ["crafted-final"]
        and "crafted-final sum bound" in v["crafted"]["line"]
    )
    assert "nomain" not in v and any(
        "nomain" in n["message"] and "no main bound" in n["message"] for n in rep["notes"]
    )
    rows = _rows(rep, WHITE_BOX_HEADERS)
    assert rows["old"]["power (what these canaries can detect)"] == "power: not recorded"
    assert rows["null"]["controls (no-noise / null)"] == "as expected / FAILED"
    assert "coordinates" not in json.dumps(rep)


def test_a_white_box_record_given_as_a_file_is_read_as_one(tmp_path, white_box_json):
    f = tmp_path / "a" / "white_box.json"
    write_json_atomic(f, white_box_json)
    r = runner.invoke(app, ["report", str(f), "--format", "json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert [v["flags"] for v in rep["sections"]["verdict"]] == [["white-box"]]
    assert not any("release skipped" in n["message"] for n in rep["notes"])


def test_one_run_underpowered_flag_reads_the_power_blocks_limit_and_old_records_the_ceiling(
    tmp_path,
):
    """The recorded Steinke ceiling 5.27 is above claim 2; the deciding analysis's limit in the
    power block (0.9) is not: underpowered. Without a power block: the ceiling, as before."""
    power = {
        "trials": 1000,
        "estimator": "f-DP (claimed curve)",
        "claimed_epsilon": 2.0,
        "ceiling": 0.9,
        "at_claim": 0.4,
        "detectable": True,
        "smallest_factor": None,
        "trials_for_90": None,
        "unit": "canaries",
        "kind": "one-run",
    }
    write_json_atomic(tmp_path / "limited" / "one_run.json", _one_run(power=power))
    write_json_atomic(tmp_path / "old" / "one_run.json", _one_run())
    rep = _report(tmp_path)
    v = _verdicts(rep)
    assert (
        "underpowered" in v["limited"]["flags"]
        and "ceiling 0.900 < claimed 2.000" in v["limited"]["line"]
    )
    assert "underpowered" not in v["old"]["flags"] and v["old"]["status"] == "no-evidence"
    assert set(_rows(rep, ONE_RUN_HEADERS)) == {"limited", "old"}

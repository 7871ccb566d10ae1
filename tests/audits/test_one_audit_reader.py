"""One reader of audit records: engine.read_record migrates a record (its controls too) once, and
AuditResult.from_dict, the reports' AuditView and the verdict functions all read what it returns."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from dpaudit.audits import engine, verdicts
from dpaudit.audits.engine import AuditResult, read_record
from dpaudit.reports.audit_view import AuditView

OLD = json.loads(
    (Path(__file__).resolve().parents[1] / "reports" / "data" / "old_records.json").read_text()
)


def _with_old_control() -> dict:
    """A claimed-curve record from before the general bound whose no-noise control is one too."""
    rec = copy.deepcopy(OLD["pre-general-bound"])
    control = {k: v for k, v in rec.items() if k != "controls"}
    rec["controls"] = {"no-noise": {**control, "role": "no-noise", "noise": False}}
    return rec


def test_the_record_a_report_judges_has_its_controls_in_todays_layout_too():
    rec = _with_old_control()
    before = copy.deepcopy(rec)
    record, view = AuditView.read(rec)
    result = AuditResult.from_dict(rec)
    stored = rec["controls"]["no-noise"]["epsilon_lower_bound"]
    read = record["controls"]["no-noise"]["epsilon_lower_bound"]
    assert read == view.no_noise["epsilon_lower_bound"]
    assert read == result.controls["no-noise"].epsilon_lower_bound == result.epsilon_lower_bound
    assert read != stored  # the family figure the old file published is not a general bound
    assert record["controls"]["no-noise"]["claimed_curve"]["family_epsilon"] == stored
    assert rec == before  # the record given is not changed


def test_reading_a_record_again_changes_nothing_and_controls_of_any_shape_are_read():
    rec = _with_old_control()
    once = read_record(rec)
    assert read_record(once) == once
    listed = read_record({**rec, "controls": [rec["controls"]["no-noise"], 3.0]})
    assert listed["controls"] == [once["controls"]["no-noise"], 3.0]
    assert read_record({**rec, "controls": {"a": 1}})["controls"] == {"a": 1}


def test_the_verdict_functions_read_through_the_one_reader():
    assert not hasattr(verdicts, "upgrade") and engine.read_record is read_record
    rec = {k: v for k, v in _with_old_control().items() if k != "claimed_curve"}
    today = read_record(rec)
    # without its block the claimed-curve record is judged on its general eps_LB (the CP one)
    claim = (today["epsilon_lower_bound"] + rec["epsilon_lower_bound"]) / 2
    judged = [{**r, "claimed_epsilon": claim} for r in (today, rec)]
    assert verdicts.violated(judged[0]) is (today["epsilon_lower_bound"] > claim)
    assert AuditResult.from_dict(judged[1]).violated is verdicts.violated(judged[0])

"""Report paths the rest of the suite never ran: bad-input errors, old-layout audit records,
notes of large or partly unverifiable sweeps, the builtin-sweep reproduce command."""

from __future__ import annotations

import pytest
from report_fixtures import make_release, synthetic_audit, write_audit_record, write_raw_audit

from dpaudit.accounting import SubsampledGaussian
from dpaudit.errors import DataError, UsageError
from dpaudit.records import write_json_atomic
from dpaudit.reports import build_report, read_report, write_report
from dpaudit.reports.claim import noise_label
from dpaudit.reports.inputs import load_inputs
from dpaudit.reports.recompute import composed
from dpaudit.reports.sweep import MAX_LISTED, _accounting_notes, sweep_reproduce


def test_bad_report_inputs_are_one_line_errors(tmp_path):
    with pytest.raises(UsageError, match=r"^format must be one of html, md, json, got 'pdf'\.$"):
        write_report({}, tmp_path / "r.pdf", fmt="pdf")
    write_json_atomic(tmp_path / "old.json", {"schema": "dpaudit-report/0"})
    with pytest.raises(DataError, match=r"report schema must be .*, got 'dpaudit-report/0'\.$"):
        read_report(tmp_path / "old.json")
    with pytest.raises(UsageError, match=r"got none\.$"):
        load_inputs([])


def test_an_audit_record_without_a_ceiling_gets_one_from_its_counts(tmp_path):
    res, *_ = synthetic_audit(claimed_epsilon=1.0)
    record = write_audit_record(tmp_path / "a", res)
    stored = record.pop("ceiling")
    write_raw_audit(tmp_path / "a", record)
    (entry,) = build_report([tmp_path])["sections"]["audit"]["audits"]
    assert entry["ceiling_source"] == "computed by the report from the EVAL counts"
    assert entry["ceiling"] == pytest.approx(stored, rel=1e-12)


def test_an_audit_under_another_adjacency_than_its_release_is_flagged(tmp_path):
    rel = make_release(tmp_path / "r1")
    res, *_ = synthetic_audit(claimed_epsilon=rel.epsilon)
    write_audit_record(tmp_path / "a1", res, release_id=rel.id, adjacency="replace-record")
    notes = [n["message"] for n in build_report([tmp_path])["notes"]]
    assert any("uses adjacency replace-record but release" in m for m in notes)


def test_sweep_notes_list_twenty_mismatches_and_count_the_rest():
    mismatch = {"release_id": "a" * 64, "mechanism": "dp-rvfl", "path": "p", "message": "m"}
    acc = {
        "mismatches": [mismatch] * (MAX_LISTED + 3),
        "unverified_releases": [{"message": "no accountant"}],
        "checked": 30,
        "reproducible_noise": 0,
    }
    notes = []
    _accounting_notes("s", acc, notes)
    assert [n.level for n in notes] == ["error"] * (MAX_LISTED + 1) + ["warning"]
    assert notes[MAX_LISTED].message.startswith("sweep s: 3 more releases with an ACCOUNTING")
    assert "1 of 30 release claims could not be recomputed (first: no accountant)" in (
        notes[-1].message
    )


def test_a_builtin_sweep_is_reproduced_with_its_builtin_command():
    entry = {"name": "paper", "path": "/runs/paper", "spec": {"source": "builtin:paper"}}
    repro = sweep_reproduce(entry)
    assert repro["command"] == "dpaudit sweep --builtin paper --out /runs"
    assert "parameters" not in repro  # the command reruns it: no spec copied


def test_noise_labels_of_a_secret_seed_and_of_no_record():
    secret = {"source": "numpy", "reproducible": "secret-seed", "seed": None}
    assert noise_label(secret) == (
        "secure (numpy, reproducible from a secret noise seed kept out of the release)",
        True,
    )
    assert noise_label(None) == ("not recorded", None)


def test_prv_is_not_attempted_where_the_rdp_bound_is_far_out():
    out = composed([SubsampledGaussian(0.3, 1.0, 100).to_dict()], 1e-5, "add-remove-record")
    assert out["rdp"]["epsilon"] > 40 and out["prv"]["epsilon"] is None
    assert out["prv"]["error"].startswith("not attempted: the rdp bound")

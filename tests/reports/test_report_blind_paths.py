"""Report paths the rest of the suite never ran: bad-input errors, old-layout audit records,
notes of large or partly unverifiable sweeps, the builtin-sweep reproduce command."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from report_fixtures import make_release, synthetic_audit, write_audit_record, write_raw_audit

from dpaudit.accounting import SubsampledGaussian
from dpaudit.errors import DataError, UsageError
from dpaudit.ledger.book import open_ledger
from dpaudit.records import write_json_atomic
from dpaudit.reports import build_report, read_report, write_report
from dpaudit.reports import html, markdown
from dpaudit.reports.audit_view import control_of, roc_of
from dpaudit.reports.claim import noise_label
from dpaudit.reports.inputs import load_inputs
from dpaudit.reports.recompute import composed
from dpaudit.reports.sweep import MAX_LISTED, _accounting_notes, sweep_reproduce
from dpaudit.reports.verify import Check, _release_match, make_bundle, verify_bundle
from dpaudit.sweeps import load_records, parse_spec, run_sweep
from dpaudit.sweeps.runner import write_tables
from dpaudit.sweeps.store import open_store


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


def test_bundle_and_verify_refuse_bad_folders_before_any_work(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    (tmp_path / "empty").mkdir()
    ledger = tmp_path / "none.sqlite"  # never opened: the checks come first
    with pytest.raises(UsageError, match=r"^out must be a new or empty folder, got '.*full'\.$"):
        make_bundle([tmp_path], ledger=ledger, out=tmp_path / "full")
    with pytest.raises(UsageError, match=r"^inputs must be release, audit, one-run or plan files"):
        make_bundle([tmp_path / "empty"], ledger=ledger, out=tmp_path / "new")
    with pytest.raises(UsageError, match=r"^bundle must be a folder written by `dpaudit bundle`"):
        verify_bundle(tmp_path / "empty")
    assert not ledger.exists() and not (tmp_path / "new").exists()


def test_a_release_without_its_id_is_not_bundled(tmp_path):
    rel = make_release(tmp_path / "r").to_dict()
    del rel["id"]
    write_json_atomic(tmp_path / "r" / "release.json", rel)
    with open_ledger(tmp_path / "l.sqlite", create=True):
        pass
    with pytest.raises(UsageError, match=r"^release\.json must carry its id .*, got none\.$"):
        make_bundle([tmp_path / "r"], ledger=tmp_path / "l.sqlite", out=tmp_path / "b")


def test_an_audit_of_a_release_missing_from_the_bundle_fails_its_match():
    check = _release_match("a" * 12, {"release_id": "r" * 20}, None)
    missing = "audits release rrrrrrrrrrrr, which is not in the bundle"
    assert check == Check("audit = release", "a" * 12, "FAIL", missing)


def test_foreign_roc_and_control_layouts_are_read():
    nested = {"points": [[0, 0], [0.5, 0.8], [1, 1]], "auc": 0.8}
    assert roc_of(nested) == {"fpr": [0.0, 0.5, 1.0], "tpr": [0.0, 0.8, 1.0], "auc": 0.8}
    assert roc_of({"fpr": ["x"], "tpr": ["y"]}) is None  # lists that are not numbers
    control = control_of({"no_noise": 7.5}, ("no-noise",))
    assert control == {"epsilon_lower_bound": 7.5, "auc": None, "counts": None, "ceiling": None}


SELFTEST = (
    'name = "st"\nrunner = "selftest"\nmodels = ["mean", "median"]\ndatasets = ["synthetic"]\n'
    "epsilons = [1.0]\nseeds = [1, 2]\n[settings]\nreproducible_noise = true\nn = 50\n"
)


def test_a_sweep_notes_pending_tasks_and_a_stale_or_broken_tables_json(tmp_path):
    spec = parse_spec(SELFTEST)
    run_sweep(spec, out=tmp_path, ledger_path=tmp_path / "unused.sqlite")
    folder = tmp_path / "st"
    write_tables(folder, *load_records(folder))
    extra = replace(spec.tasks()[0], seed=3)
    with open_store(folder, create=False) as store:
        store.add_tasks([extra])  # a task of the grid not run yet

    def notes_and_state():
        rep = build_report([folder])
        return rep["sections"]["sweep"][0]["tables_json"], [n["message"] for n in rep["notes"]]

    state, notes = notes_and_state()
    assert state == "matches" and "sweep st: 1 task(s) still pending" in " ".join(notes)
    saved = json.loads((folder / "tables.json").read_text())
    (folder / "tables.json").write_text(json.dumps(saved | {"tasks_with_results": 3}))
    state, notes = notes_and_state()
    assert state == "differs" and any(
        "written when 3 tasks had finished, now 4" in m for m in notes
    )
    (folder / "tables.json").write_text("{not json")
    state, notes = notes_and_state()
    assert state == "unreadable" and any("tables.json is unreadable" in m for m in notes)


def test_both_renderers_draw_every_block_kind():
    """render_block looks a kind up unguarded: each renderer must map every kind but figures."""
    kinds = {"p", "verdict", "table", "kv", "code", "notes", "h3", "more"}
    assert set(html.RENDER) == set(markdown.RENDER) == kinds

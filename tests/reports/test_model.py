"""The report model: verdict rules, claim cards, bad inputs, budget, utility."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from report_fixtures import (
    DATASET,
    make_release,
    synthetic_audit,
    truncate,
    write_audit_record,
    write_raw_audit,
)

from dpaudit.errors import DataError, UsageError
from dpaudit.reports import SECTIONS, build_report, read_report, write_report


def _verdict(rep, key):
    return next(v for v in rep["sections"]["verdict"] if v["key"] == key)


def _notes(rep, level=None):
    return [n["message"] for n in rep["notes"] if level is None or n["level"] == level]


def test_constructed_violation_shows_violation_with_exact_numbers(tmp_path):
    res, s_in, s_out = synthetic_audit(claimed_epsilon=1.0, shift=0.5)
    write_audit_record(tmp_path / "a", res, epsilon_lower_bound=3.25)
    rep = build_report([tmp_path])
    v = _verdict(rep, "rvfl")
    assert v["status"] == "violation"
    assert v["line"].startswith("dp-rvfl: VIOLATION: eps_LB 3.250 > claimed 1.000")
    assert "no evidence" not in v["line"]


def test_sound_audit_is_no_evidence_and_states_max_bound(tmp_path):
    res, s_in, s_out = synthetic_audit(claimed_epsilon=4.0, shift=0.5)
    write_audit_record(tmp_path / "a", res, s_in, s_out)
    rep = build_report([tmp_path])
    v = _verdict(rep, "rvfl")
    assert v["status"] == "no-evidence"
    assert f"max eps_LB {res.epsilon_lower_bound:.3f} <= claimed 4.000" in v["line"]
    assert "underpowered" not in v["line"]  # ceiling ~4.9 for 250 EVAL trials per world is above 4


def test_underpowered_when_ceiling_below_claim(tmp_path):
    res, *_ = synthetic_audit(claimed_epsilon=8.0, per_world=50, shift=0.3)
    write_audit_record(tmp_path / "a", res)
    v = _verdict(build_report([tmp_path]), "rvfl")
    assert v["status"] == "no-evidence"
    assert "no evidence of a violation" in v["line"]
    assert f"audit underpowered: ceiling {res.ceiling:.3f} < claimed 8.000" in v["line"]
    assert res.ceiling < 8.0


def test_real_broken_gaussian_mechanism_is_caught_and_sound_one_is_not(tmp_path):
    from dpaudit.audits.engine import run_audit
    from dpaudit.audits.gaussian import GaussianTarget

    run_audit(
        GaussianTarget.for_epsilon(epsilon=1.0, broken_noise_factor=8.0),
        runs=1000,
        out_dir=tmp_path / "broken",
        seed=3,
    )
    rep = build_report([tmp_path / "broken"])
    v = _verdict(rep, "gaussian")
    assert (
        v["status"] == "violation"
        and "VIOLATION: the claimed event is ruled out (noise_multiplier >=" in v["line"]
    )
    assert v["max_epsilon_lower_bound"] > 1.0
    run_audit(
        GaussianTarget.for_epsilon(epsilon=1.0), runs=1000, out_dir=tmp_path / "sound", seed=3
    )
    assert _verdict(build_report([tmp_path / "sound"]), "gaussian")["status"] == "no-evidence"


def test_release_without_audit_is_not_audited_with_a_note(tmp_path):
    make_release(tmp_path / "r1")
    rep = build_report([tmp_path])
    v = _verdict(rep, "rvfl")
    assert v["status"] == "not-audited" and "NOT AUDITED" in v["line"]
    assert any("has no audit" in m for m in _notes(rep, "warning"))


def test_audit_covers_only_the_release_it_records(tmp_path):
    # an audit is matched to the release it records (release id), never to a
    # release of the same mechanism at a nearby epsilon
    rel = make_release(tmp_path / "r1", noise_multiplier=1.0)
    res, *_ = synthetic_audit(claimed_epsilon=rel.epsilon, shift=0.3)
    write_audit_record(tmp_path / "a1", res)
    rep = build_report([tmp_path])
    v = _verdict(rep, "rvfl")
    assert rep["sections"]["audit"]["audits"][0]["covers_releases"] == []
    assert any("records no release among the inputs" in m for m in _notes(rep, "info"))
    assert "1 release(s) not audited" in v["line"]
    write_audit_record(tmp_path / "a1", res, release_id=rel.id)
    rep = build_report([tmp_path])
    assert _verdict(rep, "rvfl")["status"] == "no-evidence"
    assert rep["sections"]["audit"]["audits"][0]["covers_releases"] == [rel.id]


def test_audit_of_another_claim_than_its_release_covers_no_release(tmp_path):
    rel = make_release(tmp_path / "r1")
    res, *_ = synthetic_audit(claimed_epsilon=rel.epsilon * 1.01)  # audit tested a 1 % larger claim
    write_audit_record(tmp_path / "a1", res, release_id=rel.id)
    rep = build_report([tmp_path])
    (e,) = rep["sections"]["audit"]["audits"]
    assert e["covers_releases"] == [] and e["compared_claim"] == pytest.approx(rel.epsilon * 1.01)
    assert any("does not audit that claim" in m for m in _notes(rep, "warning"))


def test_audit_of_other_mechanism_in_release_dir_is_not_used(tmp_path):
    make_release(tmp_path / "r1", mechanism="dp-rvfl")
    res, *_ = synthetic_audit(claimed_epsilon=2.0, mechanism="dp-mixmin")
    write_audit_record(tmp_path / "r1", res)  # audit.json beside release.json
    rep = build_report([tmp_path])
    assert _verdict(rep, "rvfl")["status"] == "not-audited"
    assert any(
        "is of mechanism 'dp-mixmin' but belongs to release" in m for m in _notes(rep, "error")
    )
    assert _verdict(rep, "mixmin")["status"] == "no-evidence"  # judged on its own claim, separately


def test_truncated_release_is_an_error_note_and_others_still_reported(tmp_path):
    make_release(tmp_path / "good")
    make_release(tmp_path / "bad", seed=1)
    truncate(tmp_path / "bad" / "release.json")
    rep = build_report([tmp_path])
    assert len(rep["inputs"]["releases"]) == 1
    assert any("not valid JSON (truncated or corrupt)" in m for m in _notes(rep, "error"))


def test_truncated_audit_never_gives_no_evidence(tmp_path):
    make_release(tmp_path / "r1")
    res, *_ = synthetic_audit(claimed_epsilon=1.0)
    write_audit_record(tmp_path / "a1", res)
    truncate(tmp_path / "a1" / "audit.json")
    rep = build_report([tmp_path])
    assert _verdict(rep, "rvfl")["status"] == "not-audited"
    assert any("audit skipped" in m for m in _notes(rep, "error"))


def test_only_unreadable_inputs_is_one_line_error(tmp_path):
    make_release(tmp_path / "bad")
    truncate(tmp_path / "bad" / "release.json")
    with pytest.raises(DataError) as e:
        build_report([tmp_path])
    assert "\n" not in str(e.value)


def test_empty_folder_and_missing_path_are_one_line_errors(tmp_path):
    with pytest.raises(DataError, match="no release.json or audit.json found"):
        build_report([tmp_path])
    with pytest.raises(UsageError, match="must be an existing"):
        build_report([tmp_path / "nope"])


def test_audit_missing_bound_is_inconclusive(tmp_path):
    res, *_ = synthetic_audit(claimed_epsilon=1.0)
    rec = res.to_dict()
    del rec["epsilon_lower_bound"]
    write_raw_audit(tmp_path / "a", rec)
    rep = build_report([tmp_path])
    v = _verdict(rep, "rvfl")
    assert v["status"] == "inconclusive" and "INCONCLUSIVE" in v["line"]
    assert "no evidence" not in v["line"]


def test_minimal_foreign_audit_record_is_tolerated(tmp_path):
    write_raw_audit(
        tmp_path / "a", {"mechanism": "dp-elm", "claimed_epsilon": 1.0, "epsilon_lower_bound": 0.2}
    )
    rep = build_report([tmp_path])
    v = _verdict(rep, "elm")
    assert v["status"] == "no-evidence" and "ceiling unknown" in v["line"]
    assert any("lacks keys" in m for m in _notes(rep, "info"))
    write_raw_audit(
        tmp_path / "b",
        {"mechanism": "dp-elm", "claimed_epsilon": 1.0, "epsilon_lower_bound": "inf"},
    )
    assert _verdict(build_report([tmp_path / "b"]), "elm")["status"] == "violation"
    # two audits: a stored violation without counts cannot be re-judged at 1 - alpha / 2 (fail closed)
    rep = build_report([tmp_path])
    assert _verdict(rep, "elm")["status"] == "inconclusive"
    assert any("Bonferroni" in m for m in _notes(rep, "info"))


def test_stored_bound_contradicted_by_its_counts_is_inconclusive(tmp_path):
    res, *_ = synthetic_audit(
        claimed_epsilon=1.0, shift=6.0
    )  # near-perfect separation: counts certify > 1
    assert res.epsilon_lower_bound > 1.0
    write_audit_record(tmp_path / "a", res, epsilon_lower_bound=0.5)
    rep = build_report([tmp_path])
    assert _verdict(rep, "rvfl")["status"] == "inconclusive"
    entry = rep["sections"]["audit"]["audits"][0]
    assert entry["recomputed_epsilon_lower_bound"] == pytest.approx(
        res.epsilon_lower_bound, rel=1e-9
    )


def test_control_runs_alone_support_no_verdict(tmp_path):
    res, *_ = synthetic_audit(claimed_epsilon=1.0, shift=6.0)
    write_audit_record(tmp_path / "a", res, role="no-noise", noise=False)
    v = _verdict(build_report([tmp_path]), "rvfl")
    assert v["status"] == "not-audited" and "only control runs" in v["line"]


def test_under_reported_claim_is_accounting_mismatch(tmp_path):
    rel = make_release(tmp_path / "r1", epsilon=0.5, target_epsilon=0.5)  # the events give ~1.5
    rep = build_report([tmp_path])
    card = rep["sections"]["claim"][0]
    assert card["accounting_check"]["status"] == "mismatch"
    v = _verdict(rep, "rvfl")
    assert v["status"] == "accounting-mismatch" and "ACCOUNTING MISMATCH" in v["line"]
    assert rel.id in v["releases"]


def test_claim_card_recomputes_rdp_and_prv_from_the_events(tmp_path):
    from dpaudit.accounting import SubsampledGaussian, compute_epsilon

    rel = make_release(tmp_path / "r1", noise_multiplier=1.2, sample_rate=0.02, steps=300)
    card = build_report([tmp_path])["sections"]["claim"][0]
    by = {e["accountant"]: e for e in card["epsilons"]}
    ev = SubsampledGaussian(1.2, 0.02, 300)
    assert by["rdp"]["epsilon"] == pytest.approx(rel.epsilon, rel=1e-12)
    assert by["prv"]["epsilon"] == pytest.approx(
        compute_epsilon(ev, delta=1e-5, accountant="prv").epsilon, rel=1e-9
    )
    assert by["prv"]["epsilon"] < by["rdp"]["epsilon"]  # PRV is tighter for this event
    assert card["accounting_check"]["status"] == "ok"
    assert card["steps_executed"] == card["steps_accounted"] == 300
    assert card["noise_secure"] is True and card["noise_source_label"].startswith("secure")


def test_reproducible_noise_is_flagged(tmp_path):
    make_release(tmp_path / "r1")
    p = tmp_path / "r1" / "release.json"
    d = json.loads(p.read_text())
    d["noise_source"] = {"source": "reproducible", "seed": 7, "secret": False}
    p.write_text(json.dumps(d))
    rep = build_report([tmp_path])
    assert rep["sections"]["claim"][0]["noise_secure"] is False
    # noise from a published seed is not private (an error, not a warning)
    assert any(
        "noise derived from a published seed: not private" in m for m in _notes(rep, "error")
    )


def test_steps_mismatch_is_flagged(tmp_path):
    make_release(tmp_path / "r1", steps=100)
    p = tmp_path / "r1" / "release.json"
    d = json.loads(p.read_text())
    d["steps_executed"] = 99
    p.write_text(json.dumps(d))
    rep = build_report([tmp_path])
    assert any(
        "steps executed (99) differ from steps accounted (100)" in m for m in _notes(rep, "error")
    )
    assert _verdict(rep, "rvfl")["status"] == "accounting-mismatch"


def test_utility_mean_sd_over_seeds_curve_and_reference(tmp_path):
    rng = np.random.default_rng(0)
    accs = {}
    # full-batch events (sample_rate 1) keep the accountants fast; the claims are the real rdp values
    for nm, eps in ((12.0, 1.0), (6.0, 2.0), (3.5, 4.0)):
        accs[eps] = rng.uniform(0.5, 0.9, 3)
        for s, a in enumerate(accs[eps]):
            make_release(
                tmp_path / f"e{eps}-s{s}",
                noise_multiplier=nm,
                sample_rate=1.0,
                steps=5,
                target_epsilon=eps,
                seed=s,
                metrics={"accuracy": float(a)},
            )
    make_release(tmp_path / "np0", non_private=True, metrics={"accuracy": 0.95})
    make_release(tmp_path / "np1", non_private=True, seed=1, metrics={"accuracy": 0.97})
    u = build_report([tmp_path])["sections"]["utility"]
    assert len(u["curves"]) == 1
    c = u["curves"][0]
    assert [p["epsilon"] for p in c["points"]] == [1.0, 2.0, 4.0]
    for p in c["points"]:
        a = accs[p["epsilon"]]
        assert p["metrics"]["accuracy"]["mean"] == pytest.approx(a.mean(), rel=1e-12)
        assert p["metrics"]["accuracy"]["sd"] == pytest.approx(a.std(ddof=1), rel=1e-12)
        assert p["metrics"]["accuracy"]["n"] == 3
    assert c["reference"]["accuracy"]["mean"] == pytest.approx(0.96)
    assert c["reference"]["accuracy"]["sd"] == pytest.approx(np.std([0.95, 0.97], ddof=1))


def test_releases_differing_in_more_than_eps_make_no_curve(tmp_path):
    make_release(
        tmp_path / "a", noise_multiplier=12.0, sample_rate=1.0, steps=5, target_epsilon=1.0
    )
    rel = make_release(
        tmp_path / "b", noise_multiplier=6.0, sample_rate=1.0, steps=5, target_epsilon=2.0
    )
    d = json.loads((tmp_path / "b" / "release.json").read_text())
    d["config"]["hidden"] = 256
    (tmp_path / "b" / "release.json").write_text(json.dumps(d))
    assert rel.target_epsilon == 2.0
    assert build_report([tmp_path])["sections"]["utility"]["curves"] == []


def test_budget_from_real_ledger(tmp_path):
    from dpaudit.ledger.book import open_ledger

    r1 = make_release(tmp_path / "r1")
    r2 = make_release(tmp_path / "r2", seed=1)
    make_release(tmp_path / "r3", seed=2)  # never recorded
    led = tmp_path / "ledger.sqlite"
    with open_ledger(led) as L:
        L.record(r1)
        L.record(r2)
        L.cap("digits", 10.0, 1e-5)
    rep = build_report([tmp_path], ledger_path=led)
    b = rep["sections"]["budget"]
    assert b["available"] and b["ledger"] == str(led)
    whole = next(r for r in b["summary"] if r["partition"] == "*")
    assert whole["releases_subtree"] == 2
    assert whole["remaining"] == pytest.approx(10.0 - whole["epsilon"])
    assert any("is not in ledger" in m for m in _notes(rep, "warning"))
    assert {e.get("release_id") for e in b["entries"] if e.get("kind") == "release"} == {
        r1.id,
        r2.id,
    }
    assert all("hash" not in e for e in b["entries"])
    # the releases' own composition: 3 identical events composed sequentially
    comp = b["composition"][0]
    assert comp["releases"] == 3 and comp["naive_sum"] == pytest.approx(3 * r1.epsilon)
    assert comp["rdp"] < comp["naive_sum"]


def test_missing_explicit_ledger_is_usage_error(tmp_path):
    make_release(tmp_path / "r1")
    with pytest.raises(UsageError, match="ledger must be an existing"):
        build_report([tmp_path], ledger_path=tmp_path / "nope.sqlite")


def test_report_json_round_trips_and_has_seven_sections(tmp_path):
    make_release(tmp_path / "r1")
    res, s_in, s_out = synthetic_audit(claimed_epsilon=1.0, shift=0.5)
    write_audit_record(tmp_path / "a1", res, s_in, s_out)
    rep = build_report([tmp_path])
    assert list(rep["sections"]) == [k for k, _ in SECTIONS] and len(SECTIONS) == 7
    out = write_report(rep, tmp_path / "r.json", fmt="json")
    back = read_report(out)
    assert back == json.loads(json.dumps(rep))
    e = back["sections"]["audit"]["audits"][0]
    assert (
        "histogram" not in e and "threshold" not in e
    )  # raw scores and score values are local: never read
    assert not any(isinstance(x, float) and math.isnan(x) for x in e["roc"]["fpr"])


def test_provenance_lists_public_identity_and_splits(tmp_path):
    make_release(tmp_path / "r1")
    rep = build_report([tmp_path])
    prov = rep["sections"]["provenance"]
    assert (
        "sha256" not in prov[0] and prov[0]["data_versions"] == []
    )  # no ledger given: no data version to show
    assert prov[0]["source_files"] == DATASET["source_files"]
    assert prov[0]["split_sizes"] == DATASET["split_sizes"] and prov[0]["split_seeds"] == [0]
    assert not [n for n in rep["notes"] if n["section"] == "provenance"]


def test_audit_of_other_mechanism_in_separate_folders(tmp_path):
    make_release(tmp_path / "runs" / "r1", mechanism="dp-rvfl")
    res, *_ = synthetic_audit(claimed_epsilon=1.0, mechanism="dp-mixmin")
    write_audit_record(tmp_path / "audits" / "m", res)
    rep = build_report([tmp_path / "runs" / "r1", tmp_path / "audits" / "m"])
    assert _verdict(rep, "rvfl")["status"] == "not-audited"
    assert any("match no private release of dp-mixmin" in m for m in _notes(rep, "warning"))
    assert _verdict(rep, "mixmin")["releases"] == []


def test_audit_at_other_delta_is_flagged(tmp_path):
    rel = make_release(tmp_path / "r1")
    res, *_ = synthetic_audit(claimed_epsilon=rel.epsilon)
    write_audit_record(tmp_path / "a1", res, delta=1e-3, release_id=rel.id)
    rep = build_report([tmp_path])
    assert any("bounds epsilon at delta=0.001" in m for m in _notes(rep, "warning"))


def test_audit_recording_release_id_is_linked_exactly(tmp_path):
    r1 = make_release(tmp_path / "runs" / "r1", seed=0)
    r2 = make_release(
        tmp_path / "runs" / "r2", seed=1
    )  # same claim: matching by epsilon would cover both
    res, *_ = synthetic_audit(claimed_epsilon=r1.epsilon)
    rec = res.to_dict()
    rec["release_id"] = r2.id
    write_raw_audit(tmp_path / "audits" / "a", rec)
    rep = build_report([tmp_path])
    assert rep["sections"]["audit"]["audits"][0]["covers_releases"] == [r2.id]
    assert any(f"release {r1.id[:12]}" in m and "has no audit" in m for m in _notes(rep, "warning"))
    assert not any("matched to" in m for m in _notes(rep, "info"))


def test_audit_without_mechanism_supports_no_clean_verdict(tmp_path):
    write_raw_audit(tmp_path / "a", {"claimed_epsilon": 1.0, "epsilon_lower_bound": 0.1})
    rep = build_report([tmp_path])
    assert [v["status"] for v in rep["sections"]["verdict"]] == ["inconclusive"]
    assert any("names no mechanism" in m for m in _notes(rep, "error"))


def test_first_table_gives_each_release_the_verdict_of_the_audit_that_covers_it(tmp_path):
    """One row per release: a release whose own audit certifies eps_LB above its claim is a VIOLATION, a
    release no audit covers is NOT AUDITED, a claim its events do not support is an ACCOUNTING MISMATCH;
    each row names the plan (None without one) and the statistic of its audit, its eps_LB and ceiling."""
    from dpaudit.reports.verdict import summary_rows

    bad = make_release(tmp_path / "bad", noise_multiplier=1.0, sample_rate=0.05, steps=100, seed=1)
    lone = make_release(
        tmp_path / "lone", noise_multiplier=2.0, sample_rate=0.05, steps=100, seed=2
    )
    wrong = make_release(
        tmp_path / "wrong", noise_multiplier=1.0, sample_rate=0.05, steps=100, seed=3, epsilon=0.2
    )
    res, *_ = synthetic_audit(claimed_epsilon=bad.epsilon, shift=5.0)
    rec = write_audit_record(tmp_path / "bad" / "audit", res, release_id=bad.id)
    write_raw_audit(tmp_path / "bad" / "audit", {**rec, "plan_id": "plan-0123456789abcdef"})
    rows = {r["release"]: r for r in summary_rows(build_report([tmp_path])["sections"]["verdict"])}
    assert set(rows) == {bad.id, lone.id, wrong.id}
    b = rows[bad.id]
    assert (b["status"], b["plans"], b["statistics"], b["reason"]) == (
        "violation",
        ["plan-0123456789abcdef"],
        ["clopper-pearson"],
        "eps_LB above the claim",
    )
    assert (
        b["epsilon_lower_bound"] == pytest.approx(res.epsilon_lower_bound)
        and res.epsilon_lower_bound > bad.epsilon
    )
    assert b["ceiling"] == pytest.approx(res.ceiling)
    assert (b["epsilon"], b["delta"], b["adjacency"], b["accountant"]) == (
        pytest.approx(bad.epsilon),
        1e-5,
        "add-remove-record",
        "rdp",
    )
    assert (
        rows[lone.id]["status"],
        rows[lone.id]["plans"],
        rows[lone.id]["epsilon_lower_bound"],
    ) == ("not-audited", [], None)
    assert rows[wrong.id]["status"] == "accounting-mismatch"


def test_an_audit_run_under_a_plan_names_it_and_repeated_runs_are_counted(tmp_path):
    """The plan an audit ran under is read from its revealed ``plan`` (audit --plan writes it), and
    a second run under the same plan shows in the first table as "2 runs of plan X" (both audits listed)."""
    from dpaudit.reports.blocks import _first_row
    from dpaudit.reports.verdict import summary_rows

    rel = make_release(tmp_path / "r", noise_multiplier=2.0, sample_rate=0.05, steps=100, seed=1)
    res, *_ = synthetic_audit(claimed_epsilon=rel.epsilon, shift=0.0)
    plan = {"id": "a7e1dfa9d0cb4695ae24005287d14bfa", "salt": "00" * 32, "seeds": {"public": 42}}
    for run in ("run1", "run2"):
        rec = write_audit_record(tmp_path / "r" / run, res, release_id=rel.id)
        write_raw_audit(tmp_path / "r" / run, {**rec, "plan": plan})
    (row,) = summary_rows(build_report([tmp_path])["sections"]["verdict"])
    assert (
        row["plans"] == [plan["id"]]
        and row["plan_runs"] == {plan["id"]: 2}
        and len(row["audits"]) == 2
    )
    assert "2 audits: 2 runs of plan a7e1dfa9d0cb;" in _first_row(row)[2]

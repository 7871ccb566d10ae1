"""Verdicts over several audits: an audit is matched to the release it records,
never to a nearby epsilon on another dataset, and K audits of one mechanism are judged at a
family-wise error of 1 - confidence (Bonferroni), stated in the verdict line."""

from __future__ import annotations

from report_fixtures import DATASET, make_release, synthetic_audit, write_audit_record

from dpaudit.reports import build_report


def _verdict(rep: dict, key: str) -> dict:
    return next(v for v in rep["sections"]["verdict"] if v["key"] == key)


def test_a_release_on_another_dataset_at_a_nearby_epsilon_is_not_the_claim_compared(tmp_path):
    res, *_ = synthetic_audit(claimed_epsilon=1.0, shift=1.5)
    lb = res.epsilon_lower_bound
    assert lb > 0.3
    # the audit tested a claim 1 % above its bound; a release of the same mechanism on another
    # dataset, within 2 % of that claim, claims less than the bound and is linked to no audit
    write_audit_record(tmp_path / "a", res, claimed_epsilon=lb * 1.01)
    make_release(tmp_path / "r", epsilon=lb * 0.995, dataset={**DATASET, "name": "heart"})
    rep = build_report([tmp_path])
    v = _verdict(rep, "rvfl")
    assert v["status"] != "violation" and "VIOLATION" not in v["line"]
    (e,) = rep["sections"]["audit"]["audits"]
    assert e["compared_claim"] == lb * 1.01 and e["covers_releases"] == []


def test_k_audits_are_judged_at_a_bonferroni_level_and_the_line_says_so(tmp_path):
    res, *_ = synthetic_audit(claimed_epsilon=1.0, shift=1.5)
    lb = res.epsilon_lower_bound
    # one audit whose eps_LB just exceeds its claim at 95 %: a VIOLATION on its own ...
    write_audit_record(tmp_path / "edge", res, claimed_epsilon=lb * 0.999)
    alone = _verdict(build_report([tmp_path / "edge"]), "rvfl")
    assert alone["status"] == "violation"
    # ... but not at 1 - 0.05 / 3 among three audits of the mechanism
    for name in ("b", "c"):
        other, *_ = synthetic_audit(claimed_epsilon=5.0, shift=0.5, seed=3)
        write_audit_record(tmp_path / name, other)
    v = _verdict(build_report([tmp_path]), "rvfl")
    assert v["status"] == "no-evidence", v["line"]
    assert "family-wise error controlled at 5% over 3 audits (Bonferroni" in v["line"]

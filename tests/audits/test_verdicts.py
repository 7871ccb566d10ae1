"""One verdict rule, and verdicts over several audits at a controlled family-wise error."""

from __future__ import annotations

import numpy as np
import pytest

from dpaudit.accounting.events import SubsampledGaussian
from dpaudit.audits import curves, engine, stats, verdicts
from dpaudit.audits.engine import AuditResult

DELTA = 1e-5


def exact_gaussian_record(
    rng: np.random.Generator, plan, event: SubsampledGaussian, mu: float
) -> dict:
    """An audit record of an exact mu-GDP mechanism tested against its own (true) claim: the
    claimed-curve box (chosen on SELECT, bounded on EVAL) and its verdict, as curve_test makes them."""
    s = rng.normal(0.0, 1.0, plan.world.size) + mu * plan.world
    box = curves.eval_box(s, plan.world, plan.select, criterion="gdp-mu")
    curve = curves.claimed_curve(event)
    counts = {
        "fp": round(box.fpr * box.n_out),
        "n_out": box.n_out,
        "fn": round(box.fnr * box.n_in),
        "n_in": box.n_in,
    }
    return {
        "role": "main",
        "noise": True,
        "canary_inserted": True,
        "claimed_epsilon": 1.0,
        "delta": DELTA,
        "confidence": 0.95,
        "statistic": "claimed-curve",
        "counts": {
            "tp": box.n_in - counts["fn"],
            "fp": counts["fp"],
            "tn": box.n_out - counts["fp"],
            "fn": counts["fn"],
        },
        "claimed_curve": {
            "event": event.to_dict(),
            "adjacency": "add-remove-record",
            "counts": counts,
            "violated": bool(curve.violated_by(box.fpr_upper, box.fnr_upper)),
        },
    }


def test_ten_audits_of_an_exact_mechanism_keep_the_family_wise_error():
    # 100 seeds x 10 audits of an exact Gaussian mechanism (mu = 1) against its true claim: a
    # VIOLATION over the ten is false; each audit is re-judged at 1 - 0.05 / 10 from its counts
    mu = 1.0
    event = SubsampledGaussian(1.0 / mu, 1.0, 1)
    plan = engine.plan_trials(200, seed=0)
    rng = np.random.default_rng(2023)
    family_false = 0
    for _ in range(100):
        records = [exact_gaussian_record(rng, plan, event, mu) for _ in range(10)]
        fam = verdicts.family_verdict(records)
        assert fam["audits"] == 10 and "over 10 audits (Bonferroni" in fam["method"]
        assert all(d["confidence"] == pytest.approx(1 - 0.05 / 10) for d in fam["decisions"])
        family_false += fam["violated"] is True
    assert family_false / 100 <= 0.05


def test_family_verdict_recomputes_each_audit_at_the_bonferroni_level():
    # one audit whose box is just below the claimed curve at 95 % but not at 1 - 0.05 / 3
    event = SubsampledGaussian(1.0, 1.0, 1)
    curve = curves.claimed_curve(event)
    n = 1000
    rec = None
    for fp in range(
        20, 400
    ):  # the largest FN count at this FP count that is still violated at 95 %
        for fn in range(0, n):
            a, b = stats.cp_upper(fp, n, 0.95, split=2), stats.cp_upper(fn, n, 0.95, split=2)
            if not curve.violated_by(a, b):
                break
            last = fn
        else:
            continue
        if fn > 0:
            rec = {
                "role": "main",
                "noise": True,
                "canary_inserted": True,
                "claimed_epsilon": 1.0,
                "delta": DELTA,
                "confidence": 0.95,
                "statistic": "claimed-curve",
                "counts": {"tp": n - last, "fp": fp, "tn": n - fp, "fn": last},
                "claimed_curve": {
                    "event": event.to_dict(),
                    "adjacency": "add-remove-record",
                    "violated": True,
                    "counts": {"fp": fp, "n_out": n, "fn": last, "n_in": n},
                },
            }
            break
    assert rec is not None
    assert verdicts.violated(rec) and verdicts.decision_at(rec, 0.95)["violated"] is True
    assert verdicts.decision_at(rec, 1 - 0.05 / 3)["violated"] is False
    quiet = {
        **rec,
        "claimed_curve": {
            **rec["claimed_curve"],
            "violated": False,
            "counts": {"fp": 200, "n_out": n, "fn": 600, "n_in": n},
        },
    }
    assert verdicts.family_verdict([rec])["violated"] is True  # one audit: its own confidence
    fam = verdicts.family_verdict([rec, quiet, quiet])
    assert fam["violated"] is False and "over 3 audits (Bonferroni" in fam["method"]


# ------------------------------------------------------------------ one definition of "violated"


def _record_at_the_boundary() -> dict:
    """A claimed-curve audit.json whose family search stopped at s_LB = 1 exactly: the claimed event
    itself is ruled out, and its family epsilon equals the claimed epsilon."""
    rng = np.random.default_rng(0)
    res = engine.audit_scores(
        rng.normal(2.0, 1.0, 200),
        rng.normal(0.0, 1.0, 200),
        delta=DELTA,
        claim=SubsampledGaussian(1.0, 1.0, 1),
        accountant="rdp",
    )
    d = res.to_dict()
    assert d["claimed_curve"]["violated"]
    d["claimed_curve"].update(scale_lower_bound=1.0, family_epsilon=d["claimed_epsilon"])
    d["claim_family_bound"].update(scale_lower_bound=1.0, family_epsilon=d["claimed_epsilon"])
    return d


def test_violated_is_one_rule_at_the_boundary_scale_one():
    d = _record_at_the_boundary()
    # non-strict: s_LB = 1 is a violation, whatever eps_LB (a bound for any mechanism) reads
    assert verdicts.violated(d) and engine.violated(d) and AuditResult.from_dict(d).violated
    d["claimed_curve"]["violated"] = False
    assert not verdicts.violated(d) and not AuditResult.from_dict(d).violated
    # controls never violate
    d["claimed_curve"]["violated"] = True
    assert not verdicts.violated({**d, "role": "null"}) and not verdicts.violated(
        {**d, "noise": False}
    )


def test_curve_flag_is_the_scale_bound_at_most_one():
    rng = np.random.default_rng(5)
    event = SubsampledGaussian(1.0, 1.0, 1)
    plan = engine.plan_trials(400, seed=1)
    for shift in (0.5, 1.0, 1.5, 2.0, 3.0):
        s = rng.normal(0.0, 1.0, plan.world.size) + shift * plan.world
        cc = curves.curve_test(
            s, plan.world, plan.select, event=event, delta=DELTA, accountant="pld"
        )
        s_lb = cc["scale_lower_bound"]
        assert cc["violated"] is (s_lb is not None and s_lb <= 1.0)
        fpr_hi, fnr_hi = cc["point"]["fpr_upper"], cc["point"]["fnr_upper"]
        assert cc["violated"] is bool(curves.claimed_curve(event).violated_by(fpr_hi, fnr_hi))

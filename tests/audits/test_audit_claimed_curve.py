"""The claimed-curve statistic wired into audits: targets' claims as events, audit.json, the Python
API (audit_scores / audit_callable) and backward compatibility with audit.json files written
before it existed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dpaudit.accounting import compute_epsilon
from dpaudit.accounting.events import PureEpsilon, SubsampledGaussian
from dpaudit.audits.engine import (
    AUDIT_FILE,
    AuditResult,
    audit_callable,
    audit_scores,
    read_audit,
    run_audit,
    violated,
)
from dpaudit.audits.gaussian import GaussianTarget

DELTA = 1e-5
OLD_AUDITS = (
    Path(__file__).parent / "old_audits"
)  # audit.json files written by the code before the claimed-curve statistic

CURVE_KEYS = {
    "statistic",
    "method",
    "event",
    "accountant",
    "adjacency",
    "delta",
    "confidence",
    "family",
    "scale_lower_bound",
    "family_epsilon",
    "violated",
    "counts",
    "direction",
    "point",
    "points",
    "curve",
    "curve_at_lower_bound",
    "select_size",
    "eval_size",
}  # the threshold (score units) is private: audit_local.json only
COMPARISON_KEYS = {"cp_bonferroni", "tpr_at_fpr", "auroc", "gdp_estimate"}


def _check_consistent(d: dict, *, claim_event: dict) -> None:
    """One audit.json role: the claimed-curve block decides, the CP eps_LB is kept beside it."""
    assert d["statistic"] == "claimed-curve"
    cc = d["claimed_curve"]
    assert CURVE_KEYS <= set(cc)
    assert cc["event"] == claim_event and cc["statistic"] == "claimed-curve"
    # eps_LB is the bound for any mechanism; the claim-family result is its own figure
    assert (
        d["epsilon_lower_bound"] == d["general_bound"]["epsilon_lower_bound"]
        and d["method"] == cc["method"]
    )
    assert (
        d["claim_family_bound"]["family_epsilon"] == cc["family_epsilon"]
        and d["claim_family_bound"]["violated"] == cc["violated"]
    )
    assert COMPARISON_KEYS <= set(d["comparison"])
    assert [t["fpr"] for t in d["comparison"]["tpr_at_fpr"]] == [0.001, 0.01]
    assert isinstance(d["clopper_pearson_epsilon"], float) and d["clopper_pearson_epsilon"] >= 0.0
    assert d["threat_model"] == "final-model"


def test_audit_json_carries_the_claimed_curve_and_comparison(tmp_path):
    t = GaussianTarget.for_epsilon(epsilon=1.0, broken_noise_factor=3.0)
    r = run_audit(t, runs=400, seed=2, out_dir=tmp_path, reproducible_noise=True)
    d = json.loads((tmp_path / AUDIT_FILE).read_text())
    claim = SubsampledGaussian(t.noise_multiplier, 1.0, 1).to_dict()
    _check_consistent(d, claim_event=claim)
    assert d["claimed_curve"]["accountant"] == "pld"  # the exact Gaussian claim's scale
    # the controls are judged against the same claimed curve
    for role in ("no-noise", "null"):
        _check_consistent(d["controls"][role], claim_event=claim)
    # the CP eps_LB is the SELECT/EVAL one of the counts stored beside it
    from dpaudit.audits import stats

    c = d["counts"]
    assert d["clopper_pearson_epsilon"] == pytest.approx(
        stats.epsilon_lower_bound(**c, delta=DELTA, confidence=0.95).epsilon
    )
    # the verdict is the claimed-curve statistic's on the main noised run
    assert violated(d) == d["claimed_curve"]["violated"] == r.violated
    back = read_audit(tmp_path)
    assert back.to_dict() == r.to_dict()
    assert (
        back.statistic == "claimed-curve"
        and back.claimed_curve["violated"] == r.claimed_curve["violated"]
    )


def test_no_noise_control_is_far_below_the_claimed_curve():
    r = run_audit(
        GaussianTarget.for_epsilon(epsilon=1.0),
        runs=400,
        seed=1,
        controls=("no-noise",),
        reproducible_noise=True,
    )
    nn = r.controls["no-noise"]
    # no claim applies to it (never a verdict), but the curve test is evaluated and rules the claim out
    assert (
        nn.claimed_curve["violated"]
        and not nn.violated
        and nn.epsilon_lower_bound > r.claimed_epsilon
    )
    assert nn.clopper_pearson_epsilon == pytest.approx(nn.ceiling)


def test_old_audit_json_still_loads_and_means_clopper_pearson():
    path = OLD_AUDITS / "gaussian-broken.json"
    raw = json.loads(path.read_text())
    assert (
        "statistic" not in raw and "claimed_curve" not in raw
    )  # written before the claimed-curve statistic
    r = read_audit(path)
    assert r.statistic == "clopper-pearson" and r.claimed_curve is None and r.comparison == {}
    assert (
        r.clopper_pearson_epsilon == raw["epsilon_lower_bound"]
        and r.epsilon_lower_bound == raw["epsilon_lower_bound"]
    )
    assert r.threat_model == "final-model"
    assert r.violated and violated(raw)  # the old verdict is unchanged
    null = r.controls["null"]
    assert (
        null.statistic == "clopper-pearson"
        and null.clopper_pearson_epsilon == raw["controls"]["null"]["epsilon_lower_bound"]
    )
    again = AuditResult.from_dict(r.to_dict())  # and writes back in the new schema
    assert again.to_dict() == r.to_dict()


def test_audit_scores_with_a_claimed_event():
    rng = np.random.default_rng(0)
    sigma = 2.0
    claim = SubsampledGaussian(sigma, 1.0, 1)
    # scores of a Gaussian mechanism with 4x less noise than claimed (mean shift 2 / sigma)
    s_in, s_out = rng.normal(4.0 / sigma, 1.0, 1000), rng.normal(0.0, 1.0, 1000)
    r = audit_scores(s_in, s_out, delta=DELTA, claim=claim, accountant="pld")
    assert r.claimed_epsilon == pytest.approx(
        compute_epsilon(claim, delta=DELTA, accountant="pld").epsilon
    )
    assert r.statistic == "claimed-curve" and r.claimed_curve["event"] == claim.to_dict()
    assert r.claimed_curve["family"]["parameter"] == "noise_multiplier" and r.claimed_curve[
        "family"
    ]["claimed"] == pytest.approx(sigma)
    assert (
        r.violated
        and r.claimed_curve["violated"]
        and r.claim_family_bound["family_epsilon"] == r.claimed_curve["family_epsilon"]
    )
    assert COMPARISON_KEYS <= set(r.comparison)
    # without a claim the statistic is Clopper–Pearson and says so
    plain = audit_scores(s_in, s_out, delta=DELTA, claimed_epsilon=r.claimed_epsilon)
    assert plain.statistic == "clopper-pearson" and plain.claimed_curve is None
    assert (
        plain.epsilon_lower_bound == r.epsilon_lower_bound
        and plain.clopper_pearson_epsilon == r.clopper_pearson_epsilon
    )
    # the same scores from an exactly calibrated mechanism are not flagged
    ok_in = rng.normal(1.0 / sigma, 1.0, 1000)
    ok = audit_scores(ok_in, s_out, delta=DELTA, claim=claim, accountant="pld")
    assert (
        not ok.violated
        and not ok.claimed_curve["violated"]
        and ok.epsilon_lower_bound <= ok.claimed_epsilon
    )


def _laplace_mechanism(include: bool, rng: np.random.Generator) -> float:
    return float(include) + rng.laplace(0.0, 1.0 / 0.5)  # sensitivity 1, scale 2: pure eps 0.5


def _score(x: float) -> float:
    return x


def test_audit_callable_takes_the_claim_as_an_event():
    r = audit_callable(
        _laplace_mechanism,
        _score,
        200,
        claim=PureEpsilon(0.5),
        accountant="pure",
        delta=0.0,
        seed=1,
        reproducible_noise=True,
        controls=(),
    )
    assert r.claimed_epsilon == pytest.approx(0.5) and r.statistic == "claimed-curve"
    assert (
        r.claimed_curve["event"] == PureEpsilon(0.5).to_dict()
        and r.claimed_curve["family"]["parameter"] == "epsilon"
    )
    assert r.epsilon_lower_bound <= 0.5 and not r.violated
    plain = audit_callable(
        _laplace_mechanism,
        _score,
        200,
        claimed_epsilon=0.5,
        delta=0.0,
        seed=1,
        reproducible_noise=True,
        controls=(),
    )
    assert plain.statistic == "clopper-pearson" and plain.claimed_curve is None


def test_unclipped_canary_is_caught_by_the_claimed_curve_where_cp_is_not():
    """The issue's planted bug: a canary three times the sensitivity (noise / 3, claim unchanged) at a
    claim of eps = 1, 2,000 trials, through the normal run_audit path."""
    t = GaussianTarget.for_epsilon(epsilon=1.0, broken_noise_factor=3.0)
    r = run_audit(t, runs=2000, seed=1, controls=(), reproducible_noise=True)
    assert r.claimed_epsilon == pytest.approx(1.0)
    assert (
        r.clopper_pearson_epsilon <= r.claimed_epsilon
    )  # the CP statistic alone misses it (0.908 at seed 1)
    assert r.statistic == "claimed-curve" and r.claimed_curve["violated"]
    assert r.violated and r.claim_family_bound["violated"]


def test_correct_gaussian_mechanism_is_not_flagged():
    r = run_audit(
        GaussianTarget.for_epsilon(epsilon=1.0),
        runs=2000,
        seed=0,
        controls=(),
        reproducible_noise=True,
    )
    assert (
        not r.claimed_curve["violated"]
        and not r.violated
        and r.epsilon_lower_bound <= r.claimed_epsilon
    )


# ------------------------------------------------------------------------- built-in targets' claims


def test_builtin_targets_claim_their_plans_event():
    from dpaudit.auditing import build_target, generic_target
    from dpaudit.catalogue import lookup

    g = build_target("gaussian", epsilon=2.0, broken_noise_factor=3.0)
    assert (
        g.claimed_event == SubsampledGaussian(g.noise_multiplier, 1.0, 1) and g.accountant == "pld"
    )
    assert (
        g.without_noise().claimed_event == g.claimed_event
    )  # the no-noise control keeps the claim
    assert compute_epsilon(
        g.claimed_event, delta=DELTA, accountant=g.accountant
    ).epsilon == pytest.approx(g.claimed_epsilon)

    e = build_target("dp-elm", epsilon=1.5, width=3)
    assert e.claimed_event == PureEpsilon(1.5) and e.accountant == "pure"

    h = build_target("dp-rvfl", epsilon=2.0)
    cfg = h._config
    assert (
        h.claimed_event == SubsampledGaussian(cfg.noise_multiplier, cfg.sample_rate, cfg.steps)
        and h.accountant == "rdp"
    )
    assert compute_epsilon(h.claimed_event, delta=DELTA, accountant="rdp").epsilon == pytest.approx(
        h.claimed_epsilon
    )
    nn = h.without_noise()
    assert nn._config.noise_multiplier < 1e-6 and nn.claimed_event == h.claimed_event

    req = lookup("noisy-sum").request_type()(epsilon=1.0)
    n = generic_target("noisy-sum", req)
    assert (
        n.claimed_event == SubsampledGaussian(n.noise_multiplier, 1.0, 1) and n.accountant == "pld"
    )


@pytest.mark.parametrize("name", ["rvfl", "rvfl-user", "elm", "mixmin"])
def test_target_from_an_old_release_claims_the_releases_event_and_accountant(name, tmp_path):
    from dpaudit.accounting.events import event_from_dict
    from dpaudit.auditing import target_from_release
    from dpaudit.records import read_release

    old = Path(__file__).parent / "old_releases" / f"{name}.json"
    rel = read_release(old)
    kw = {}
    if name == "rvfl-user":  # made with users of 4 digits rows (its --user-ids file)
        np.save(tmp_path / "ids.npy", np.arange(1797) // 4)
        kw["user_ids"] = tmp_path / "ids.npy"
    t = target_from_release(rel, **kw)
    assert t.claimed_event == event_from_dict(rel.guarantee) and t.accountant == rel.accountant
    assert compute_epsilon(
        t.claimed_event, delta=rel.delta, accountant=t.accountant, adjacency=rel.adjacency
    ).epsilon == pytest.approx(rel.epsilon)
    # the no-noise control keeps the claim
    assert t.without_noise().claimed_event == t.claimed_event

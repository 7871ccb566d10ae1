"""Paths of the audit code no other test reaches: refusals of bad input, torn checkpoint files,
ledger reasons for unbounded trials, older plans, and the statistics' edge cases."""

import types

import numpy as np
import pytest

from dpaudit import audit_plans
from dpaudit.accounting.events import PureEpsilon, SubsampledGaussian
from dpaudit.audits import cost, curves, engine, one_run, power_runs, stats, white_box
from dpaudit.errors import DataError, UsageError


def _target(**fields):
    base = dict(noise=True, claimed_event=PureEpsilon(1.0), uncertified_sampler=None)
    return types.SimpleNamespace(**{**base, **fields})


@pytest.mark.parametrize(
    "target, reason",
    [
        (_target(claimed_event=None), "the trials' privacy event is unknown (no claimed event)"),
        (_target(uncertified_sampler="x"), "the trials use the uncertified x sampler"),
    ],
)
def test_trials_without_a_known_certified_event_are_unbounded(target, reason):
    assert cost.trial_cost({"main": (target, 4)}) == (None, reason, 4)


def test_torn_checkpoint_files_are_recomputed(tmp_path):
    role_dir = tmp_path / ".checkpoint" / "main"
    role_dir.mkdir(parents=True)
    (role_dir / "plan.json").write_text("{torn")
    (role_dir / "chunk_00000.npy").write_bytes(b"torn")
    checkpoint = engine._Checkpoint(tmp_path, "main", "abc")
    assert not (role_dir / "chunk_00000.npy").exists()  # the unreadable plan: started over
    (role_dir / "chunk_00001.npy").write_bytes(b"torn")
    assert checkpoint.done() == {} and not (role_dir / "chunk_00001.npy").exists()


def test_audit_scores_refusals():
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        engine.audit_scores([0.0, 1.0], [0.0, 1.0], delta=1e-5, canry="custom")
    with pytest.raises(UsageError, match="trials per world must be >= 2, got 1."):
        engine.audit_scores([0.0], [0.0, 1.0], delta=1e-5)
    with pytest.raises(DataError, match="audit is missing required keys"):
        engine.AuditResult.from_dict({})


@pytest.mark.parametrize(
    "scores, included, message",
    [
        ([[0.0, 1.0]], [True, False], "scores must be a 1-d array"),
        ([0.0, 1.0], [True], "included must be a 1-d array of the scores' length 2"),
        ([0.0, 1.0], [2, 0], "included must hold booleans"),
        ([0.0, np.nan], [True, False], "scores must be finite, got 1 non-finite values."),
    ],
)
def test_one_run_scores_refusals(scores, included, message):
    with pytest.raises(UsageError, match=message):
        one_run.OneRunScores(scores, included, "gradient")


def test_statistics_at_their_edges():
    assert stats.gdp_delta(1.0, 0.0) == 0.0  # no signal: no delta
    # a p-value cannot fall to a significance of 1: the doubling search stops at its guard
    assert one_run.steinke_epsilon(10, 4, 4, delta=0.0, significance=1.0) == 512.0
    profile = curves.claimed_curve(SubsampledGaussian(1.0, 0.1, 10))
    assert profile.closed_form is None and profile.fnr(np.empty(0)).shape == (0,)
    assert white_box.noise_upper(np.empty(0), 0.05) == float("inf")
    assert white_box.mean_lower(np.empty(0), 1.0, 0.05) == 0.0


def test_one_run_power_without_a_claim_has_only_its_ceiling():
    line = power_runs.one_run_power(100, delta=1e-5)
    assert line.at_claim is None and line.ceiling > 0


def test_an_older_plan_names_its_release_as_target():
    assert audit_plans.plan_target({"release_id": "r1"}) == {"release": "r1"}
    assert audit_plans.plan_target({}) is None
    assert audit_plans.target_problem({"release_id": "r1"}) is None


def test_an_unknown_mechanism_is_refused_with_the_auditable_names():
    from dpaudit.auditing import generic_target

    with pytest.raises(UsageError, match=r"^mechanism must be one of dp-rvfl, .*, got 'nope'\.$"):
        generic_target("nope", None)


def test_bound_ratio_and_a_bare_targets_description():
    from dpaudit.audits.targets import AuditTarget

    fields = ["white-box", 1.0, 2.0, 1e-5, 0.95, "rdp", 1.0, 1.0, 0.1, 10, 100, None]
    assert white_box.WhiteBoxBound(*fields).ratio == 0.5
    assert white_box.WhiteBoxBound(*fields[:2], 0.0, *fields[3:]).ratio == float("inf")

    class Bare(AuditTarget):
        scores = without_noise = None

    assert Bare().describe() == {"task": None, "dataset": None, "config": {}, "canary_info": {}}


def test_plan_checks_that_no_test_reached():
    from dpaudit.requests import AuditRequest

    assert audit_plans.signature_ok({"signer": {"public_key": "not a key"}}) is False
    result = {"plan_id": "p", "stage": "result", "audit_id": "a", "sha256": "x"}
    assert audit_plans.plan_entries([(1, None, result)])["p"]["orphan_results"] == ["a"]
    request = AuditRequest(mechanism="noisy-sum", threat_model="white-box")
    with pytest.raises(UsageError, match="threat model of a planned audit must be final-model"):
        audit_plans.make_plan(request)

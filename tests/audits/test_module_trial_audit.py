"""The trial audit of the trainable DP-SGD models (ModuleTarget): built from the release plan, its
max-clip canary shows leakage without noise and none beyond the claim with it."""

from __future__ import annotations

import pytest

from dpaudit.audits.engine import run_audit
from dpaudit.errors import UsageError
from dpaudit.mechanisms import registry
from dpaudit.requests import DPSGDRequest

REQUEST = DPSGDRequest(
    model="dp-dense",
    dataset="breast-cancer",
    epochs=2,
    batch_size=64,
    seed=3,
    reproducible_noise=True,
)


def _plan(request=REQUEST):
    mechanism = registry.mechanism(request.model)
    return mechanism, mechanism.plan_of_audit(request)


def test_no_noise_control_finds_leakage_and_the_audit_stays_within_the_claim():
    mechanism, plan = _plan()
    target = mechanism.audit_target(plan, "max-clip")
    assert target.config.to_dict() == plan.config["dp_sgd"]
    result = run_audit(
        target, runs=100, controls=("no-noise",), record=False, reproducible_noise=True, seed=0
    )
    assert result.controls["no-noise"].claimed_curve["violated"]
    assert not result.violated and result.epsilon_lower_bound <= result.claimed_epsilon


def test_user_level_and_unknown_canaries_are_refused():
    mechanism, plan = _plan()
    with pytest.raises(UsageError, match="canary must be one of max-clip, mislabeled for module"):
        mechanism.audit_target(plan, "natural")
    user = plan.__class__(**{**plan.__dict__, "privacy_unit": "user"})
    with pytest.raises(UsageError, match="release must be private and record level"):
        mechanism.audit_target(user, "max-clip")

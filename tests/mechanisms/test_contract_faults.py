"""Each property of the mechanism contract can fail: a planted fault per property, caught by the
inherited test (tests/mechanisms/contract_base.py) that the correct mechanism passes
(tests/mechanisms/test_contract_all.py)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from dpaudit.catalogue import names
from dpaudit.mechanisms import registry

from . import test_contract_all as cases
from .contract_base import Wrapped, cold_cache


def case_context(case_type, folder):
    """A contract case's mechanism, request, data, plan and release (what its fixtures hold)."""
    case = case_type()
    mechanism = registry.mechanism(case.name)
    job = mechanism.validate(case.tiny_request(folder))
    data = mechanism.load(job)
    with cold_cache(folder):
        plan = case.make_plan(mechanism, job, data)
    released = case.make_release(mechanism, job, folder)
    return SimpleNamespace(
        case=case,
        mechanism=mechanism,
        job=job,
        data=data,
        plan=plan,
        released=released,
        folder=folder,
    )


@pytest.fixture(scope="module")
def noisy_sum(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DPAUDIT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield case_context(cases.TestNoisySum, tmp_path_factory.mktemp("noisy-sum"))


@pytest.fixture(scope="module")
def rvfl(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DPAUDIT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield case_context(cases.TestDpRvfl, tmp_path_factory.mktemp("dp-rvfl"))


def with_dp_sgd(plan, **settings):
    """``plan`` with DP-SGD settings of its config replaced."""
    return dataclasses.replace(
        plan, config={**plan.config, "dp_sgd": {**plan.config["dp_sgd"], **settings}}
    )


# ------------------------------ 1. the plan is public


class PlanReadsTheCount(Wrapped):
    def plan(self, request, info):
        plan = self.inner.plan(request, info)
        return dataclasses.replace(plan, config={**plan.config, "n_train": info.n_train})


def test_a_plan_that_records_the_private_count_is_caught(noisy_sum):
    c = noisy_sum
    with pytest.raises(AssertionError, match=r"removing one record changes \{'config.n_train'"):
        c.case.test_plan_is_the_same_without_one_record(
            PlanReadsTheCount(c.mechanism), c.job, c.data, c.folder
        )


# ------------------------------ 2. the run executes plan.steps


class ReportsOneStepMore(Wrapped):
    def run(self, plan, data, noise, *, progress=None):
        output = self.inner.run(plan, data, noise, progress=progress)
        return dataclasses.replace(output, steps_executed=output.steps_executed + 1)


class RunsOneStepMoreQuietly(Wrapped):
    """Trains one step more than planned and reports the plan's steps (the noise drawn tells)."""

    def run(self, plan, data, noise, *, progress=None):
        longer = with_dp_sgd(plan, steps=plan.steps + 1)
        return dataclasses.replace(
            self.inner.run(longer, data, noise, progress=progress), steps_executed=plan.steps
        )


@pytest.mark.parametrize(
    "fault, message",
    [(ReportsOneStepMore, "run steps differ"), (RunsOneStepMoreQuietly, "Gaussian values")],
)
def test_a_run_of_one_step_more_is_caught(rvfl, fault, message):
    with pytest.raises(AssertionError, match=message):
        rvfl.case.test_run_executes_the_plan_steps(fault(rvfl.mechanism), rvfl.plan, rvfl.data)


# ------------------------------ 3. plan_of_release reproduces the plan


class ReplansWithAnotherSeed(Wrapped):
    def plan_of_release(self, request, release):
        return self.inner.plan_of_audit(dataclasses.replace(request, seed=request.seed + 1))


class SkipsTheReleaseCheck(Wrapped):
    def plan_of_release(self, request, release):
        return self.inner.plan_of_audit(request)


@pytest.mark.parametrize(
    "fault, message",
    [
        (ReplansWithAnotherSeed, "does not reproduce the plan: {'request.seed'"),
        (SkipsTheReleaseCheck, "accepted a release whose recorded steps"),
    ],
)
def test_a_plan_of_release_that_is_not_the_release_plan_is_caught(noisy_sum, fault, message):
    c = noisy_sum
    with pytest.raises(
        BaseException, match=message
    ):  # pytest.fail raises outside the Exception tree
        c.case.test_plan_of_release_reproduces_the_plan(
            fault(c.mechanism), c.plan, c.released, c.folder
        )


# ------------------------------ 4. the control refutes the claim, the audit does not


class NoisyControl(Wrapped):
    """A target whose no-noise control keeps the noise (Wrapped delegates everything else)."""

    def without_noise(self):
        return self


class NoiselessTrials(Wrapped):
    """A target that says it adds the noise and runs the noiseless trials."""

    def scores(self, canary_in, noise):
        return self.inner.without_noise().scores(canary_in, noise)


class AuditTargetFault(Wrapped):
    def __init__(self, inner, fault) -> None:
        super().__init__(inner)
        self.fault = fault

    def audit_target(self, plan, canary, **options):
        return self.fault(self.inner.audit_target(plan, canary, **options))


@pytest.mark.parametrize(
    "fault, message",
    [(NoisyControl, "control finds no leakage"), (NoiselessTrials, "exceeds the claim")],
)
def test_an_audit_that_cannot_see_or_misses_leakage_is_caught(noisy_sum, fault, message):
    c = noisy_sum
    with pytest.raises(AssertionError, match=message):
        c.case.test_audit_within_claim_and_no_noise_control_refutes_it(
            AuditTargetFault(c.mechanism, fault), c.plan
        )


# ------------------------------ 5. the audit trains with the plan


class AuditsWithAdam(Wrapped):
    def audit_target(self, plan, canary, **options):
        return self.inner.audit_target(with_dp_sgd(plan, optimizer="adam"), canary, **options)


class AuditReplansFromTheRequest(Wrapped):
    def audit_target(self, plan, canary, **options):
        return self.inner.audit_target(self.inner.plan_of_audit(plan.request), canary, **options)


@pytest.mark.parametrize(
    "context, fault", [("rvfl", AuditsWithAdam), ("noisy_sum", AuditReplansFromTheRequest)]
)
def test_an_audit_that_trains_other_settings_than_the_plan_is_caught(request, context, fault):
    c = request.getfixturevalue(context)
    with pytest.raises(AssertionError, match="ignores a training setting"):
        c.case.test_audit_trains_with_the_plan(fault(c.mechanism), c.plan, c.data, c.folder)


# ------------------------------ every catalogue mechanism has a case


def test_a_catalogue_mechanism_without_a_contract_case_is_caught(monkeypatch):
    monkeypatch.setattr(cases, "names", lambda: (*names(), "dp-lstm"))
    with pytest.raises(AssertionError, match=r"without a contract case: \['dp-lstm'\]"):
        cases.test_every_catalogue_mechanism_has_a_contract_case()

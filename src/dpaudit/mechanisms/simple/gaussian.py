"""The synthetic Gaussian mechanism on the contract: the audits' exact-epsilon calibration target.

Audit only (catalogue ``audit_only``: ``dpaudit train`` never releases it): the plan calibrates
the noise multiplier exactly for (epsilon, delta) (:func:`~dpaudit.audits.gaussian.calibrate_exact`)
and its audit target is :class:`~dpaudit.audits.gaussian.GaussianTarget` with that sigma.
"""

from __future__ import annotations

from ...accounting.events import SubsampledGaussian
from ...audits.gaussian import GaussianTarget, calibrate_exact
from ...audits.targets import prepared
from ...requests import GaussianRequest
from ...validation import open_unit, positive_finite
from ..contract import DataInfo, MechanismBase, ReleasePlan, data_plan

NAME = "gaussian"


def plan_target(plan: ReleasePlan, canary: str, **fields) -> GaussianTarget:
    """The Gaussian audit target of ``plan``'s one Gaussian release (its sigma, delta and seed),
    with the target's further ``fields``."""
    sigma = float(plan.event.noise_multiplier)
    return GaussianTarget(sigma, plan.delta, canary=canary, seed=plan.seed, **fields)


class GaussianMechanism(MechanismBase):
    name = NAME
    request_type = GaussianRequest

    def validate(self, request: GaussianRequest) -> GaussianRequest:
        positive_finite("epsilon", request.epsilon)
        open_unit("delta", request.delta)
        return request

    def load(self, request):
        return None  # synthetic: the records are public and built by the target

    def data_info(self, request, data) -> DataInfo:
        return DataInfo(
            name="synthetic-gaussian", kind="synthetic", n_train=0, n_features=0, n_classes=0
        )

    def plan(self, request: GaussianRequest, info: DataInfo) -> ReleasePlan:
        """The one Gaussian release of sigma calibrated exactly for (epsilon, delta).

        Args:
            request: the Gaussian request (epsilon, delta, seed).
            info: the synthetic dataset's description.

        Returns:
            The ReleasePlan of ``SubsampledGaussian(sigma, 1, 1)`` under the PLD accountant.
        """
        sigma = calibrate_exact(request.epsilon, request.delta)
        return data_plan(
            request,
            info,
            mechanism=NAME,
            adjacency="add-remove-record",
            accountant="pld",
            event=SubsampledGaussian(sigma, 1.0, 1),
            target_epsilon=float(request.epsilon),
            delta=float(request.delta),
            config={"noise_multiplier": sigma},
        )

    def audit_target(
        self, plan: ReleasePlan, canary: str, *, release=None, user_ids=None, no_noise: bool = False
    ):
        """The Gaussian audit target of this plan: its sigma, delta and seed.

        Args:
            plan: the plan audited (its event's sigma is the target's).
            canary: the canary kind.
            release, user_ids: unused: a synthetic claim, no data of its own.
            no_noise: the no-noise control instead.

        Returns:
            The prepared GaussianTarget (its planted ``broken_noise_factor`` kept).
        """
        broken = float(plan.request.broken_noise_factor)
        return prepared(plan_target(plan, canary, broken_noise_factor=broken), no_noise)


MECHANISM = GaussianMechanism()

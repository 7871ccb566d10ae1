"""``noisy-sum``: the Gaussian sum query, released from a real dataset (the worked example of
docs/architecture.md, "How to add a mechanism").

Mechanism: the training rows x_j of a dataset, each clipped to L2 norm <= C (so adding or
removing one record moves the sum by at most C in L2); release = sum_j clip(x_j) +
N(0, (sigma C)^2 I_d), d the number of features. The noise multiplier sigma is calibrated with
the generic accountant (``--accountant``, default ``pld``, tight for one Gaussian) for the event
``SubsampledGaussian(sigma, 1, 1)`` (one Gaussian release, no subsampling) at (epsilon, delta).

**Privacy contract.** The release is (epsilon, delta)-DP under add/remove-one-record adjacency on
the training partition, epsilon recomputed by the release skeleton from the event after the run
(:func:`dpaudit.releasing.release`); ``noise_tail_delta`` adds the Gaussian sampler's tail
(d values). Public: the dataset's identity, its declared size N0 (never the actual count; the
utility metric divides by it, and is omitted for data that declare none) and d, the clipping
norm, the seed. The test partition is read only for the published utility metric (outside the
claim, as for every release). ``non_private`` releases the exact clipped sum and claims nothing.
Its audit: :meth:`NoisySum.audit_target`.
"""

from __future__ import annotations

from ...accounting import SubsampledGaussian, calibrate_noise_multiplier
from ...audits.targets import prepared
from ...errors import DataError, UsageError
from ...lazy import lazy_import
from ...noise import GAUSSIAN_SAMPLER_DESCRIPTION
from ...requests import NOISE_SOURCES, NOISY_SUM_ACCOUNTANTS as ACCOUNTANTS, NoisySumRequest  # noqa: F401 (the request, read from here too)
from ...validation import one_of, open_unit, positive_finite
from ..contract import DataInfo, MechanismBase, ReleasePlan, RunOutput, data_plan, public_inputs
from .gaussian import plan_target

np = lazy_import("numpy")

NAME = "noisy-sum"
ADJACENCY = "add-remove-record"


def clipped_rows(x: np.ndarray, clipping_norm: float) -> np.ndarray:
    """Rows of ``x`` (float64) scaled to L2 norm at most ``clipping_norm`` (zero rows stay zero)."""
    x = np.asarray(x, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x * np.minimum(1.0, clipping_norm / np.maximum(norms, 1e-300))


class NoisySum(MechanismBase):
    """The ``noisy-sum`` mechanism (module docstring): the contract of
    :mod:`dpaudit.mechanisms.contract`."""

    name = NAME
    request_type = NoisySumRequest

    def validate(self, request: NoisySumRequest) -> NoisySumRequest:
        if not isinstance(request, NoisySumRequest):
            raise UsageError(f"request must be a NoisySumRequest, got {type(request).__name__}.")
        if not request.non_private:
            positive_finite("epsilon", request.epsilon)
        open_unit("delta", request.delta)
        positive_finite("clipping_norm", request.clipping_norm)
        one_of("accountant", request.accountant, ACCOUNTANTS)
        one_of("noise_source", request.noise_source, NOISE_SOURCES)
        return request

    def plan(self, request: NoisySumRequest, info: DataInfo) -> ReleasePlan:
        """Public quantities only: sigma from (epsilon, delta) and the accountant; d from the schema.

        Args:
            request: the noisy-sum request (epsilon, delta, C, accountant).
            info: the dataset's public description (dimension, declared size N0).

        Returns:
            The ReleasePlan of ``SubsampledGaussian(sigma, 1, 1)`` (None when non-private).
        """
        d = int(info.n_features)
        c = float(request.clipping_norm)
        if request.non_private:
            sigma, event, calibrated = 0.0, None, float("inf")
        else:
            cal = calibrate_noise_multiplier(
                target_epsilon=request.epsilon,
                delta=request.delta,
                sample_rate=1.0,
                steps=1,
                accountant=request.accountant,
                adjacency=ADJACENCY,
            )
            sigma, calibrated = cal.noise_multiplier, cal.epsilon
            event = SubsampledGaussian(sigma, 1.0, 1)
        return data_plan(
            request,
            info,
            mechanism=NAME,
            adjacency=ADJACENCY,
            accountant=request.accountant,
            event=event,
            target_epsilon=None if request.non_private else float(request.epsilon),
            delta=float(request.delta),
            steps=1,
            config={
                "model": NAME,
                "query": "sum of the training rows, each clipped to L2 norm C",
                "noise": "N(0, (sigma C)^2 I_d)",
                "clipping_norm": c,
                "dimension": d,
                "reference_size": info.reference_size,
                "noise_multiplier": sigma,
                "calibrated_epsilon": calibrated,
                **public_inputs(request, info),
            },
            release_fields={
                "noise_multiplier": sigma,
                "sample_rate": 1.0,
                "clipping_norm": c,
                "noise_sampler": "none (non-private)"
                if request.non_private
                else GAUSSIAN_SAMPLER_DESCRIPTION,
            },
            noise_values=d,
            noise_what=f"noisy-sum release ({d} noised values)",
            compare_accountants=tuple(a for a in ("rdp", "pld") if a != request.accountant),
        )

    def run(self, plan: ReleasePlan, data, noise, *, progress=None) -> RunOutput:
        """The clipped rows' sum plus N(0, (sigma C)^2 I_d) noise from ``noise``.

        Args:
            plan: the plan, executed as it is.
            data: the prepared private dataset.
            noise: the private NoiseSource.
            progress: unused (one step).

        Returns:
            The RunOutput with the noisy sum; its metric only when the data declare N0.
        """
        c = plan.config["clipping_norm"]
        total = clipped_rows(data.x_train, c).sum(axis=0)
        if plan.event is not None:
            total = total + noise.gaussian_numpy(total.shape, plan.event.noise_multiplier * c)
        # Utility on the test partition (evaluation data, outside the claim): distance of the
        # released mean (sum / the declared public N0) to the test rows' clipped mean.
        test_mean = (
            clipped_rows(data.x_test, c).mean(axis=0) if len(data.x_test) else np.zeros_like(total)
        )
        # Never the actual count (private): no mean, hence no metric, for data that declare no size.
        n0 = plan.config["reference_size"]
        metrics = {}
        if n0 is not None:
            metrics["mean_l2_distance_to_test"] = float(np.linalg.norm(total / n0 - test_mean))
        return RunOutput(
            steps_executed=1, metrics=metrics, arrays={"sum": total}, weights_name="sum.npz"
        )

    def audit_target(
        self, plan: ReleasePlan, canary: str, *, release=None, user_ids=None, no_noise: bool = False
    ):
        """The plain Gaussian audit target (:mod:`dpaudit.audits.gaussian`) of this plan: the
        release's sigma, C and d, on N0 synthetic public records (the plan's reference size). Its
        ``claimed_event`` is the plan's event; the exact (analytic Gaussian) epsilon of sigma is
        the claim the audit checks (it never exceeds the release's accountant bound).

        Args:
            plan: the plan audited.
            canary: the canary kind.
            release: unused (the claim is the plan's event).
            user_ids: unused.
            no_noise: build the no-noise control.

        Returns:
            The prepared GaussianTarget.

        Raises:
            UsageError: a non-private plan.
            DataError: the target's event differs from the plan's.
        """
        if plan.event is None:
            raise UsageError(
                "release must be private to be audited (a noisy-sum claim), got a non-private release."
            )
        target = plan_target(
            plan,
            canary,
            clipping_norm=float(plan.config["clipping_norm"]),
            dimension=int(plan.config["dimension"]),
            n_records=int(plan.config["reference_size"] or 1),
            mechanism=NAME,
        )
        if target.claimed_event != plan.event:  # the claim audited must be the plan's own event
            raise DataError(
                f"audit target event must equal the plan's {plan.event.to_dict()}, got {target.claimed_event.to_dict()}."
            )
        return prepared(target, no_noise)


MECHANISM = NoisySum()

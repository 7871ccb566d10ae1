"""White-box audits of the claimed per-step mechanism of DP-SGD from Dirac gradient canaries
(docs/white_box.md). Mechanism-free: observations in, a bound out; nothing here knows a model.

**The family.** The claim is ``SubsampledGaussian(sigma, q, T)``: at each of T independent steps
every unit is sampled with probability q, its contribution to the clipped sum has L2 norm at
most C, and N(0, (sigma C)^2) is added to every coordinate. A Dirac canary adds its clipped
gradient d C e_j (d = 1 when clipping works) to coordinate j whenever it is sampled. The
white-box auditor subtracts the other records' clipped contributions at j and divides by C,
so each canary gives, at each step t, ``y_t = b_t d + s Z_t`` with b_t ~ Bernoulli(q) its
inclusion and Z_t standard normal; a correct mechanism has (s, d, q) = (sigma, 1, q).

**Threat models.**

* ``white-box`` (:func:`step_bound`): the auditor sees every step (y_t and b_t of every canary:
  the step's batch, parameters and privatised sum). From the steps without the canary an upper
  confidence bound on s (chi-square), from the steps with it a lower bound on d (normal mean,
  with the upper s), from the inclusion count a lower bound on q (Clopper-Pearson); the
  significance is split in three (Bonferroni).
* ``crafted-final`` (:func:`final_bound`): hidden state. Only the final model is seen; with plain
  SGD on coordinates nothing else moves, each canary's final displacement is
  ``x = sum_t (b_t d + s Z_t)``. Half the canaries (private fair coins) are never inserted: their
  x bounds s (chi-square); the inserted ones bound d through their mean, with q taken as the
  claimed rate (the sum cannot separate d from q) and the normal approximation of that mean.

**What is proven.** eps_LB is the epsilon, by the claim's own accountant at the claim's delta,
of ``SubsampledGaussian(s_hi / d_lo, q_lo, T)``. Epsilon of this family decreases in the noise
multiplier and increases in q, so if the mechanism belongs to the family then with probability
>= confidence its epsilon by that accountant is at least eps_LB; with a tight accountant (pld,
prv) that is the mechanism's true epsilon. eps_LB above the claimed epsilon falsifies the claim.

**What is assumed and not tested.** The per-step mechanism is in the family (Gaussian noise,
independent steps, independent Bernoulli inclusion); a mechanism outside it (e.g. noise
correlated over steps, shuffling instead of Poisson sampling) is not ruled out by a passing
audit. ``crafted-final`` also assumes the sampling rate is the claimed one and relies on the
central limit theorem for the mean of the inserted canaries' displacements (at least
:data:`MIN_FINAL_CANARIES` inserted; the false-positive rate is simulated in the tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..accounting.accountants import compute_epsilon
from ..accounting.events import SubsampledGaussian
from ..errors import UsageError
from ..lazy import lazy_import
from ..validation import one_of, open_unit, positive_int
from .stats import bisect

np = lazy_import("numpy")
stats = lazy_import("scipy.stats")

THREAT_MODELS = ("white-box", "crafted-final")
#: Inserted (and withheld) canaries below which the crafted-final normal approximation is refused.
MIN_FINAL_CANARIES = 30
#: Noise multipliers below this (s_hi / d_lo) give eps_LB = inf (the accountants' range ends near it).
_MIN_NOISE_MULTIPLIER = 0.05


@dataclass(frozen=True)
class StepObservations:
    """What the white-box auditor saw: ``values`` (M, T), y_t of each canary at each step (in
    units of C, the other records' contributions subtracted); ``sampled`` (M, T), b_t."""

    values: np.ndarray
    sampled: np.ndarray

    def __post_init__(self) -> None:
        v, b = np.asarray(self.values, dtype=np.float64), np.asarray(self.sampled, dtype=bool)
        if v.ndim != 2 or v.shape != b.shape or v.size == 0 or not np.all(np.isfinite(v)):
            raise UsageError(
                f"observations must be finite (canaries, steps) arrays of one shape, got {v.shape} and {b.shape}."
            )
        object.__setattr__(self, "values", v)
        object.__setattr__(self, "sampled", b)

    @property
    def steps(self) -> int:
        return int(self.values.shape[1])


@dataclass(frozen=True)
class FinalObservations:
    """What the hidden-state auditor saw: ``values`` (M,), each canary coordinate's final
    displacement in units of C (sum over the steps); ``included`` (M,), its private coin;
    ``steps`` T."""

    values: np.ndarray
    included: np.ndarray
    steps: int

    def __post_init__(self) -> None:
        v, inc = np.asarray(self.values, dtype=np.float64), np.asarray(self.included, dtype=bool)
        if v.ndim != 1 or v.shape != inc.shape or not np.all(np.isfinite(v)):
            raise UsageError(
                f"final observations must be finite (canaries,) arrays of one shape, got {v.shape} and {inc.shape}."
            )
        sizes = {"inserted canaries": int(inc.sum()), "withheld canaries": int((~inc).sum())}
        for name, k in sizes.items():
            if k < MIN_FINAL_CANARIES:
                raise UsageError(
                    f"{name} must be at least {MIN_FINAL_CANARIES} (normal approximation), got {k}."
                )
        object.__setattr__(self, "values", v)
        object.__setattr__(self, "included", inc)
        object.__setattr__(self, "steps", positive_int("steps", self.steps))


@dataclass(frozen=True)
class WhiteBoxBound:
    """eps_LB and the confidence bounds it is made of (module docstring)."""

    threat_model: str
    epsilon_lb: float
    claimed_epsilon: float
    delta: float
    confidence: float
    accountant: str
    noise_upper: float
    sensitivity_lower: float
    sample_rate_lower: float
    steps: int
    observations: int
    claimed: SubsampledGaussian

    @property
    def violation(self) -> bool:
        return self.epsilon_lb > self.claimed_epsilon

    @property
    def ratio(self) -> float:
        return self.epsilon_lb / self.claimed_epsilon if self.claimed_epsilon > 0 else float("inf")

    def to_dict(self) -> dict:
        record = {_RECORD_NAMES.get(name, name): getattr(self, name) for name in _RECORD_FIELDS}
        record["epsilon_lb"] = _finite_or_none(self.epsilon_lb)
        family = ("noise_multiplier", "sample_rate", "steps")
        return {**record, "claimed_event": {k: getattr(self.claimed, k) for k in family}}


#: white_box.json's bound keys in their written order (attribute names; renamed below).
_RECORD_FIELDS = """threat_model epsilon_lb claimed_epsilon delta confidence accountant violation
noise_upper sensitivity_lower sample_rate_lower steps observations""".split()
_RECORD_NAMES = {"noise_upper": "noise_multiplier_upper"}


def _finite_or_none(x: float):
    return x if math.isfinite(x) else None


# ---------------------------------------------------------------- confidence bounds


def noise_upper(values: np.ndarray, alpha: float) -> float:
    """Upper confidence bound (level 1 - alpha) on s from n values y = s Z: sum y^2 ~ s^2 chi2(n)."""
    n = int(np.size(values))
    if n == 0:
        return float("inf")
    return math.sqrt(float(np.sum(np.square(values))) / float(stats.chi2.ppf(alpha, n)))


def rate_lower(hits: int, trials: int, alpha: float) -> float:
    """Clopper-Pearson lower confidence bound (level 1 - alpha) on q from ``hits`` of ``trials``."""
    return 0.0 if hits <= 0 else float(stats.beta.ppf(alpha, hits, trials - hits + 1))


def mean_lower(values: np.ndarray, noise_hi: float, alpha: float) -> float:
    """Lower confidence bound on d from values y = d + s Z, given s <= ``noise_hi``."""
    k = int(np.size(values))
    if k == 0:
        return 0.0
    return float(np.mean(values)) - float(stats.norm.ppf(1.0 - alpha)) * noise_hi / math.sqrt(k)


def family_epsilon(
    noise_hi: float,
    sensitivity_lo: float,
    rate_lo: float,
    steps: int,
    *,
    delta: float,
    accountant: str,
) -> float:
    """Epsilon of ``SubsampledGaussian(noise_hi / sensitivity_lo, rate_lo, steps)`` at ``delta``:
    0 when the lower bounds are 0, inf when the noise multiplier is below the accountants' range."""
    if sensitivity_lo <= 0.0 or rate_lo <= 0.0:
        return 0.0
    multiplier = noise_hi / sensitivity_lo
    if multiplier < _MIN_NOISE_MULTIPLIER:
        return float("inf")
    event = SubsampledGaussian(multiplier, min(1.0, rate_lo), steps)
    return float(compute_epsilon(event, delta=delta, accountant=accountant).epsilon)


def _claimed_epsilon(
    claimed: SubsampledGaussian, delta: float, accountant: str, claimed_epsilon
) -> float:
    if claimed_epsilon is not None:
        return float(claimed_epsilon)
    return float(compute_epsilon(claimed, delta=delta, accountant=accountant).epsilon)


def _check_claim(claimed, delta: float, confidence: float) -> None:
    if not isinstance(claimed, SubsampledGaussian):
        raise UsageError(f"claim must be a SubsampledGaussian event, got {type(claimed).__name__}.")
    open_unit("delta", delta)
    open_unit("confidence", confidence)


# ---------------------------------------------------------------- the two statistics


def step_statistics(obs: StepObservations, confidence: float) -> tuple[float, float, float]:
    """(s_hi, d_lo, q_lo), jointly valid at ``confidence`` (Bonferroni over the three)."""
    alpha = (1.0 - confidence) / 3.0
    s_hi = noise_upper(obs.values[~obs.sampled], alpha)
    d_lo = mean_lower(obs.values[obs.sampled], s_hi, alpha)
    return s_hi, d_lo, rate_lower(int(obs.sampled.sum()), obs.sampled.size, alpha)


def step_bound(obs: StepObservations, **claim) -> WhiteBoxBound:
    """eps_LB of the ``white-box`` threat model (module docstring) from every step of every canary;
    ``claim``: the keywords of :func:`threat_bound`."""
    return threat_bound("white-box", obs, **claim)


def threat_bound(
    threat_model: str,
    obs,
    *,
    claimed: SubsampledGaussian,
    delta: float,
    accountant: str = "rdp",
    confidence: float = 0.95,
    claimed_epsilon: float | None = None,
) -> WhiteBoxBound:
    """eps_LB of ``threat_model`` from its observations ``obs`` (module docstring).

    Args:
        threat_model: "white-box" (:class:`StepObservations`, :func:`step_statistics`) or
            "crafted-final" (:class:`FinalObservations`, :func:`final_statistics` at the claimed
            sampling rate).
        claimed: the claimed per-step mechanism; ``delta``, ``accountant``: its epsilon's.
        confidence: of the confidence bounds together.
        claimed_epsilon: the release's claim (default: ``claimed`` by ``accountant``).

    Returns:
        The :class:`WhiteBoxBound` record of the confidence bounds found (s_hi, d_lo, q_lo, T).

    Raises:
        UsageError: a claim that is not a SubsampledGaussian, delta or confidence outside (0, 1),
            another threat model.
    """
    _check_claim(claimed, delta, confidence)
    if one_of("threat_model", threat_model, THREAT_MODELS) == "white-box":
        found = (*step_statistics(obs, confidence), obs.steps)
    else:
        q = float(claimed.sample_rate)
        found = (*final_statistics(obs, q, confidence), q, obs.steps)
    eps = family_epsilon(*found, delta=delta, accountant=accountant)
    claim_eps = _claimed_epsilon(claimed, delta, accountant, claimed_epsilon)
    parts = (delta, confidence, accountant, *found, int(obs.values.size), claimed)
    return WhiteBoxBound(threat_model, eps, claim_eps, *parts)


def final_sensitivity_lower(
    mean_in: float, count_in: int, noise_hi: float, rate: float, steps: int, alpha: float
) -> float:
    """The smallest d >= 0 whose inserted-canary mean could reach ``mean_in``: the root of
    d q T + z sqrt(T (s_hi^2 + d^2 q (1 - q)) / k) = mean (increasing in d), 0 when none is positive."""
    z = float(stats.norm.ppf(1.0 - alpha))

    def excess(d: float) -> float:
        return (
            d * rate * steps
            + z * math.sqrt(steps * (noise_hi**2 + d * d * rate * (1.0 - rate)) / count_in)
            - mean_in
        )

    if excess(0.0) >= 0.0:
        return 0.0
    hi = 1.0
    while excess(hi) < 0.0:
        hi *= 2.0
    # bisection to float precision; the reported d is one the mean rules in
    return bisect(lambda d: excess(d) < 0.0, 0.0, hi, steps=60)[0]


def final_statistics(obs: FinalObservations, rate: float, confidence: float) -> tuple[float, float]:
    """(s_hi, d_lo) at sampling rate ``rate``, jointly valid at ``confidence`` (Bonferroni over the two)."""
    alpha = (1.0 - confidence) / 2.0
    s_hi = noise_upper(obs.values[~obs.included] / math.sqrt(obs.steps), alpha)
    inserted = obs.values[obs.included]
    return s_hi, final_sensitivity_lower(
        float(np.mean(inserted)), int(inserted.size), s_hi, rate, obs.steps, alpha
    )


def final_bound(obs: FinalObservations, **claim) -> WhiteBoxBound:
    """eps_LB of the ``crafted-final`` threat model (module docstring): s from the withheld
    canaries, d from the inserted ones' mean at the claimed rate q; significance halved;
    ``claim``: the keywords of :func:`threat_bound`."""
    return threat_bound("crafted-final", obs, **claim)


# ---------------------------------------------------------------- simulation, limits, power


def simulate_steps(
    rng: np.random.Generator,
    *,
    noise: float,
    rate: float,
    steps: int,
    canaries: int,
    sensitivity: float = 1.0,
) -> StepObservations:
    """Observations of an exactly known family member (s, d, q): the tests' and benchmarks' mechanism."""
    b = rng.random((canaries, steps)) < rate
    return StepObservations(b * sensitivity + noise * rng.standard_normal((canaries, steps)), b)


def simulate_final(
    rng: np.random.Generator,
    *,
    noise: float,
    rate: float,
    steps: int,
    canaries: int,
    sensitivity: float = 1.0,
) -> FinalObservations:
    """Final displacements of ``canaries`` Dirac canaries, each inserted on a fair coin (exact family member)."""
    included = rng.random(canaries) < 0.5
    counts = rng.binomial(steps, rate, size=canaries) * included
    return FinalObservations(
        counts * sensitivity + noise * math.sqrt(steps) * rng.standard_normal(canaries),
        included,
        steps,
    )


def expected_step_bound(
    claimed: SubsampledGaussian,
    canaries: int,
    *,
    delta: float,
    accountant: str = "rdp",
    confidence: float = 0.95,
) -> float:
    """The physical limit of :func:`step_bound` for ``canaries`` canaries over the claim's T steps:
    eps_LB when every statistic sits at its expectation under the claim (with infinitely many
    observations it tends to the claimed epsilon)."""
    alpha = (1.0 - confidence) / 3.0
    s, q, t = claimed.noise_multiplier, claimed.sample_rate, claimed.steps
    n = canaries * t
    hits = q * n
    n_out = n - hits
    s_hi = s * math.sqrt(n_out / float(stats.chi2.ppf(alpha, n_out)))
    d_lo = 1.0 - float(stats.norm.ppf(1.0 - alpha)) * s_hi / math.sqrt(hits)
    q_lo = float(stats.beta.ppf(alpha, hits, n - hits + 1))
    return family_epsilon(s_hi, d_lo, q_lo, t, delta=delta, accountant=accountant)


def expected_final_bound(
    claimed: SubsampledGaussian,
    canaries: int,
    *,
    delta: float,
    accountant: str = "rdp",
    confidence: float = 0.95,
) -> float:
    """The physical limit of :func:`final_bound` (``canaries``, half inserted) at the expectations."""
    alpha = (1.0 - confidence) / 2.0
    s, q, t = claimed.noise_multiplier, claimed.sample_rate, claimed.steps
    k = canaries / 2.0
    s_hi = s * math.sqrt(k / float(stats.chi2.ppf(alpha, k)))
    d_lo = final_sensitivity_lower(q * t, int(k), s_hi, q, t, alpha)
    return family_epsilon(s_hi, d_lo, q, t, delta=delta, accountant=accountant)


def gdp_mu_ratio(claimed: SubsampledGaussian) -> dict:
    """Gaussian-DP mu of the trajectory (CLT of Poisson-subsampled Gaussian composition,
    q sqrt(T (exp(1/sigma^2) - 1))) and of the final-sum test (mean shift q T over the withheld
    spread sigma sqrt(T)), and their ratio 1 / (sigma sqrt(exp(1/sigma^2) - 1)) < 1: what the sum
    discards of the per-step inclusion pattern."""
    s, q, t = claimed.noise_multiplier, claimed.sample_rate, claimed.steps
    traj = q * math.sqrt(t * math.expm1(1.0 / (s * s)))
    final = q * t / (s * math.sqrt(t))
    return {"mu_trajectory": traj, "mu_final": final, "ratio": final / traj}

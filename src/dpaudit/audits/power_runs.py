"""The power line of one-run and white-box audits: the record of trial audits
(:class:`dpaudit.audits.power.AuditPower`), computed at the expected statistics of the claimed
mechanism. Predictions, never bounds.

**One-run** (:mod:`dpaudit.audits.one_run`). m canaries, each included with probability 1/2. A
mechanism at the trade-off curve f puts, above the threshold of false-positive rate a, about
(m/2)(1 - f(a)) included and (m/2) a excluded canaries; the k highest scores of the public grid
are those above the a with (m/2)(1 - f(a) + a) = k, (m/2)(1 - f(a)) of them right, and the k
lowest alike (the claimed curve holds in both orders). These counts, rounded, go through the
record's deciding analysis (f-DP with a claimed event, else Steinke et al.), Bonferroni over the
grid as the audit does. ``ceiling``: every guess right; ``at_claim``: f = the claim's curve;
``smallest_factor``: the largest k whose family member (noise times k) the analysis flags at its
expected counts; ``trials_for_90``: the canaries at which ``at_claim`` reaches 90 % of the claim.

**White-box / crafted-final** (:mod:`dpaudit.audits.white_box`): ``at_claim`` is
``expected_step_bound`` / ``expected_final_bound`` (every statistic at its expectation), the
same of the mechanism with sigma times k for the factor, and of m canaries for the size; the
ceiling is unbounded (noise-free observations give infinity), so a violation is always detectable.

A PLD-profile claim (a subsampled Gaussian, compositions) costs a privacy loss distribution per
scale: the claim's own curve is the audit's (expected counts, the test at the claim); the searches
run to 1 % on coarse curves (:data:`dpaudit.audits.power.COARSE_SIGMA`, pessimistic: lower) with
:func:`dpaudit.audits.power.curve_search`. A test curve that is lower rules out less, so the
at-claim statistic is a scale the audit's own curves rule out too (measured: 0.1-1.6 % below the
exact computation); the factor's members are lower too (caught more easily), so its answer is
lowered until caught on the member's own curve. The one-run ceiling of such a claim is not searched
(as the record's).
"""

from __future__ import annotations

import functools
import math

from ..accounting.events import SubsampledGaussian, event_from_dict
from ..errors import DataError
from ..lazy import lazy_import
from ..validation import open_unit, positive_int
from . import one_run, white_box
from .curves import SCALE_RANGE_PROFILE, ClaimedCurve, claimed_curve, member_epsilon, scale_event
from .power import COARSE_SIGMA, MAX_CANARIES, MIN_FACTOR, NO_EVENT_NOTE, TARGET_SHARE, AuditPower
from .power import _point_curve, as_gdp, curve_search, factor_name, gdp_mu, largest_holding
from .power import smallest_factor, smallest_size

np = lazy_import("numpy")

#: Scales the f-DP searches of closed-form claims look at (a pure epsilon over 1e3 overflows).
_SCALE_RANGE = (1e-3, 1e3)
_STEINKE_TOLERANCE = 1e-4


def expected_counts(values, m: int) -> list[tuple[int, int]]:
    """(guesses, correct) at each point of :func:`one_run.guess_grid` for m canaries of a mechanism
    whose trade-off curve takes ``values`` on :func:`one_run._fdp_grid` (module docstring), correct
    rounded to the nearest integer."""
    a = one_run._fdp_grid()
    rise = np.maximum.accumulate(1.0 - values + a)  # the share of canaries above a's threshold
    out = []
    for k, _ in one_run.guess_grid(m):
        f_at = float(np.interp(2.0 * k / m, rise, values))
        out.append((2 * k, int(min(2 * k, round(m * (1.0 - f_at))))))
    return out


def curve_values(fnr):
    """``fnr`` on :func:`one_run._fdp_grid` (non-increasing, in [0, 1])."""
    return one_run._curve_values(fnr)[0]


class _OneRun:
    """The one-run record's deciding analysis at given counts (:func:`one_run.one_run_bounds`)."""

    def __init__(self, m: int, claim, delta: float, confidence: float, accountant, adjacency):
        self.m, self.claim, self.delta, self.alpha = m, claim, delta, 1.0 - confidence
        self.accountant, self.adjacency = accountant, adjacency
        self.curve = None if claim is None else claimed_curve(claim, adjacency)
        self._values: dict = {}
        self.epsilons: dict = {}
        self.fdp = False  # the record's rule: f-DP when the claim's curve is convex on the grid
        if self.curve is not None:
            self._values[1.0], self.fdp = one_run._curve_values(self.curve.fnr)
        self.closed = self.curve is not None and self.curve.closed_form is not None

    @property
    def name(self) -> str:
        return "f-DP (claimed curve)" if self.fdp else "steinke (eps, delta)"

    def each(self, m: int) -> float:
        return self.alpha / len(one_run.guess_grid(m))

    def steinke(self, m: int, counts) -> float:
        each, tol = self.each(m), _STEINKE_TOLERANCE
        steinke = one_run.steinke_epsilon
        return max(
            steinke(m, r, v, delta=self.delta, significance=each, tol=tol) for r, v in counts
        )

    def steinke_above(self, m: int, counts, epsilon: float) -> bool:
        """Some grid point's p-value at ``epsilon`` is within its share of the significance."""
        return any(
            one_run.steinke_p_value(m, r, v, epsilon, self.delta) <= self.each(m) for r, v in counts
        )

    def values(self, key, fnr):
        """The curve ``fnr`` on the f-DP grid, cached under ``key`` (None: not cached)."""
        if key is None:
            return curve_values(fnr)
        if key not in self._values:
            self._values[key] = curve_values(fnr)
        return self._values[key]

    def rejects(self, key, fnr, m: int, counts) -> bool:
        """The f-DP test rules out the curve ``fnr`` (cached under ``key``) from these counts
        (never a curve that cannot be evaluated: a PLD of very little noise overflows)."""
        try:
            vals = self.values(key, fnr)
        except DataError:
            return False
        return any(one_run.fdp_rejects(vals, m, r, v, self.each(m)) for r, v in counts)

    def rejects_gdp(self, mu: float, u: float, m: int, counts) -> bool:
        """The test rules out the claim read as mu-GDP moved to scale 1 / u (.power.proxy_mu)."""
        return self.rejects(("gdp", u), as_gdp(self.curve, mu, 1.0 / u), m, counts)

    def rejects_member(self, s: float, m: int, counts) -> bool:
        """The test rules out the family member at scale s: a profile family's on its coarse curve
        (lower, so a member it rules out, the audit's own curve rules out too); scale 1 reads the
        claim's own curve, cached under 1.0 at construction."""
        return self.rejects(s, self.coarse(s), m, counts)

    def coarse(self, s: float):
        """The member at scale s; a profile family's on its coarse PLD (.power.COARSE_SIGMA)."""
        return ClaimedCurve(
            scale_event(self.claim, s), self.adjacency, 0.5 if self.closed else COARSE_SIGMA
        ).fnr

    def epsilon(self, s: float) -> float:
        if s not in self.epsilons:
            stated = dict(delta=self.delta, accountant=self.accountant, adjacency=self.adjacency)
            self.epsilons[s] = member_epsilon(self.claim, s, **stated)
        return self.epsilons[s]

    def fdp_epsilon(self, m: int, counts) -> float:
        """eps_LB of the f-DP family search at these counts (u = 1 / s; a scale that was evaluated,
        searched from the claim read as mu-GDP moved along the family by .power.proxy_mu)."""
        low, high = _SCALE_RANGE if self.closed else SCALE_RANGE_PROFILE
        span = {"low": 1.0 / high, "high": 1.0 / low}
        mu, proxy = gdp_mu(self.curve), None
        if mu is not None:
            proxy = largest_holding(lambda u: self.rejects_gdp(mu, u, m, counts), 1.0, **span)
        if self.closed:
            member = lambda u: self.rejects_member(1.0 / u, m, counts)  # noqa: E731
            u = largest_holding(member, proxy or 1.0, **span)
        else:
            holds = lambda fnr: self.rejects(None, fnr, m, counts)  # noqa: E731
            u = curve_search(holds, lambda u: self.coarse(1.0 / u), proxy or 1.0, **span)
        return 0.0 if u is None else self.epsilon(1.0 / u)

    def statistic(self, m: int, counts) -> float:
        return self.fdp_epsilon(m, counts) if self.fdp else self.steinke(m, counts)

    @property
    def perfect(self) -> list[tuple[int, int]]:
        """(guesses, correct) with every guess of the grid right."""
        return [(2 * k, 2 * k) for k, _ in one_run.guess_grid(self.m)]

    def ceiling(self) -> float | None:
        """Every guess right; None for an f-DP PLD claim (not searched, as the record's)."""
        if not self.fdp:
            return self.steinke(self.m, self.perfect)
        return self.fdp_epsilon(self.m, self.perfect) if self.closed else None

    def detectable(self, claim_fnr, claimed_epsilon: float) -> bool:
        """Every guess right rules the claim out."""
        perfect = self.perfect
        if self.fdp:
            return self.rejects(1.0, claim_fnr, self.m, perfect)
        return self.steinke_above(self.m, perfect, claimed_epsilon)


def one_run_power(
    canaries: int,
    *,
    delta: float,
    confidence: float = 0.95,
    claim=None,
    accountant: str = "rdp",
    adjacency: str = "add-remove-record",
    claimed_epsilon: float | None = None,
) -> AuditPower:
    """The power line of a one-run audit of ``canaries`` canaries (module docstring), with the
    keywords of :func:`dpaudit.audits.one_run.one_run_bounds`.

    Args:
        canaries: m, at least 2.
        delta, confidence, claim, accountant, adjacency, claimed_epsilon: as the audit's.

    Returns:
        The :class:`~dpaudit.audits.power.AuditPower` record (``unit`` "canaries").

    Raises:
        UsageError: canaries below 2, delta or confidence outside (0, 1).
    """
    m = positive_int("canaries", canaries, 2)
    delta, confidence = open_unit("delta", delta), open_unit("confidence", confidence)
    run = _OneRun(m, claim, delta, confidence, accountant, adjacency)
    if claimed_epsilon is None and claim is not None:
        claimed_epsilon = run.epsilon(1.0)
    base = dict(
        trials=m,
        estimator=run.name,
        claimed_epsilon=claimed_epsilon,
        ceiling=run.ceiling(),
        unit="canaries",
        kind="one-run",
        factor_name=factor_name(run.curve),
        factor_note=None if claim is not None else NO_EVENT_NOTE,
    )
    if claim is None and claimed_epsilon is None:
        return AuditPower(**base)
    claim_fnr = run.curve.fnr if claim is not None else _point_curve(claimed_epsilon, delta)
    claim_values = run.values(1.0, claim_fnr)
    detectable = run.detectable(claim_fnr, claimed_epsilon)
    factor = _one_run_factor(run, claimed_epsilon) if detectable and claim is not None else None
    at_claim = run.statistic(m, expected_counts(claim_values, m))  # before: its epsilon is reused
    return AuditPower(
        **base,
        at_claim=at_claim,
        detectable=detectable,
        smallest_factor=factor,
        trials_for_90=_canaries_for(run, claim_values, claimed_epsilon),
    )


def _one_run_factor(run: _OneRun, claimed_epsilon: float) -> float | None:
    """Largest k whose family member (noise x k) the deciding analysis flags at its expected
    counts."""

    def caught(fnr) -> bool:
        try:
            counts = expected_counts(curve_values(fnr), run.m)
        except DataError:  # a PLD of very little noise overflows: not evaluated, so never reported
            return False
        if run.fdp:
            return run.rejects(1.0, run.curve.fnr, run.m, counts)
        return run.steinke_above(run.m, counts, claimed_epsilon)

    return smallest_factor(run.curve, caught)


def _canaries_for(run: _OneRun, claim_values, claimed_epsilon: float) -> int | None:
    """Smallest m (to 1 %) whose at-claim statistic reaches TARGET_SHARE of the claim. f-DP: the
    test at the expected counts rules out the family member whose epsilon is that share (its scale
    evaluated, at most the true one: then eps_LB >= the share)."""
    goal = TARGET_SHARE * claimed_epsilon
    s_goal = _goal_scale(run, claimed_epsilon, goal) if run.fdp else None
    if run.fdp and s_goal is None:
        return None

    def reached(m: int) -> bool:
        counts = expected_counts(claim_values, m)
        return (
            run.rejects_member(s_goal, m, counts) if run.fdp else run.steinke_above(m, counts, goal)
        )

    return smallest_size(reached, 2, MAX_CANARIES, first=64)


def _goal_scale(run: _OneRun, claimed_epsilon: float, goal: float) -> float | None:
    """A scale whose member's epsilon reaches ``goal`` (at most the largest such: testing it asks
    no less of the audit), read off the line through log epsilon at scale 1 and at a scale above 1
    whose epsilon is known (the at-claim statistic's; else 1 / TARGET_SHARE) against log scale,
    one tolerance lower, and searched only when that misses (an accountant call: 0.02-0.3 s)."""
    known = [s for s, e in run.epsilons.items() if s > 1.0 and 0.0 < e < claimed_epsilon]
    far, tolerance = min(known, default=1.0 / TARGET_SHARE), 1e-3 if run.closed else 1e-2
    slope = math.log(run.epsilon(far) / claimed_epsilon) / math.log(far)
    guess = (math.exp(math.log(TARGET_SHARE) / slope) if slope < 0.0 else far) / (1.0 + tolerance)
    if run.epsilon(guess) >= goal:
        return guess
    return largest_holding(
        lambda s: run.epsilon(s) >= goal, guess, low=MIN_FACTOR, high=guess, tolerance=tolerance
    )


def one_run_power_of(bounds: dict) -> dict:
    """one_run.json "power" of a one-run record's bounds (:func:`.one_run.one_run_bounds`):
    :func:`one_run_power` at its canaries, claim, delta and confidence."""
    fdp = bounds.get("fdp") or {}
    claim = event_from_dict(fdp["event"]) if isinstance(fdp.get("event"), dict) else None
    return _cached_one_run_power(
        int(bounds["canaries"]),
        delta=float(bounds["delta"]),
        confidence=float(bounds["confidence"]),
        claim=claim,
        accountant=fdp.get("accountant") or "rdp",
        adjacency=fdp.get("adjacency") or "add-remove-record",
        claimed_epsilon=bounds.get("claimed_epsilon"),
    ).to_dict()


#: Cached: the line depends on the public configuration only (a PLD claim's costs seconds).
_cached_one_run_power = functools.lru_cache(maxsize=64)(one_run_power)


# ---------------------------------------------------------------- white-box and crafted-final

_EXPECTED = {
    "white-box": white_box.expected_step_bound,
    "crafted-final": white_box.expected_final_bound,
}


def white_box_power(
    claimed: SubsampledGaussian,
    canaries: int,
    *,
    threat_model: str = "white-box",
    delta: float,
    accountant: str = "rdp",
    confidence: float = 0.95,
    claimed_epsilon: float | None = None,
) -> AuditPower:
    """The power line of a ``white-box`` or ``crafted-final`` audit of ``canaries`` Dirac canaries
    over the claim's T steps (module docstring).

    Args:
        claimed: the claimed per-step mechanism (sigma, q, T).
        canaries: M, at least 2.
        threat_model: "white-box" or "crafted-final".
        delta, accountant, confidence, claimed_epsilon: as the audit's (claimed_epsilon: default the
            claim's epsilon by ``accountant``).

    Returns:
        The :class:`~dpaudit.audits.power.AuditPower` record (``unit`` "canaries").

    Raises:
        UsageError: a claim that is not a SubsampledGaussian, canaries below 2, delta or confidence
            outside (0, 1).
    """
    white_box._check_claim(claimed, delta, confidence)
    m = positive_int("canaries", canaries, 2)
    bound = _EXPECTED[threat_model]
    claim_eps = white_box._claimed_epsilon(claimed, delta, accountant, claimed_epsilon)

    def at(k: float, size: int) -> float:
        event = SubsampledGaussian(claimed.noise_multiplier * k, claimed.sample_rate, claimed.steps)
        return bound(event, size, delta=delta, accountant=accountant, confidence=confidence)

    least = 2 * white_box.MIN_FINAL_CANARIES if threat_model == "crafted-final" else 2
    factor = largest_holding(lambda k: at(k, m) > claim_eps, 0.9, low=MIN_FACTOR, high=1.0)
    needed = smallest_size(lambda n: at(1.0, n) >= TARGET_SHARE * claim_eps, least, MAX_CANARIES)
    return AuditPower(
        trials=m,
        estimator=f"{threat_model} (chi-square noise, sensitivity, rate)",
        claimed_epsilon=claim_eps,
        ceiling=None,
        at_claim=white_box._finite_or_none(at(1.0, m)),
        smallest_factor=factor,
        trials_for_90=needed,
        unit="canaries",
        kind=threat_model,
    )

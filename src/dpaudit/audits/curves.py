"""Claimed-curve audits: test the whole trade-off curve a DP claim makes, not one (eps, delta) point.

**The claim as a curve.** A release records a DP event (Gaussian, subsampled Gaussian, pure
epsilon, compositions, parallel parts) and an adjacency. Every such event makes a claim much
stronger than one (eps, delta) pair: for every neighbouring pair (D, D') and every test of
"D or D'?", the test's (FPR, FNR) lies on or above the event's trade-off function
T(alpha) (Dong, Roth & Su 2019). :func:`claimed_curve` returns a *valid lower bound* f <= T,
symmetric (it holds for both orderings of the pair):

- Gaussian (sample rate 1, T steps, and compositions of such leaves): f(a) = Phi(Phi^-1(1 - a)
  - mu), mu = sqrt(sum_i T_i / sigma_i^2) in units of the clipping norm, with the sensitivity of a
  sum doubled under replace-one (the accountants' convention: N(C) vs N(-C)), i.e. exactly mu-GDP.
- Pure epsilon, applied once: f(a) = max(0, 1 - e^eps a, e^-eps (1 - a)) (Wasserman & Zhou 2010;
  Kairouz, Oh & Viswanath 2015) -- exact.
- Anything else (a subsampled Gaussian, several different leaves, a pure epsilon applied more than
  once): from the pessimistic privacy profile delta(eps) of dp-accounting's privacy loss
  distribution (Koskela et al.; Doroshenko et al. 2022, "connect the dots"), the same PLD
  conventions as :mod:`dpaudit.accounting.accountants`. Its add/remove PLD keeps both the remove
  and the add pair and its delta is the larger, and its replace-one pair is symmetric, so delta(eps)
  bounds the hockey-stick divergence of both orderings, and (eps, delta(eps))-DP of both orderings
  gives, for every test, FNR >= 1 - delta(eps) - e^eps FPR and FNR >= e^-eps (1 - delta(eps) - FPR).
  Each such line is a valid lower bound, so is their maximum over any finite eps grid:
  f(a) = max_eps max(0, 1 - delta(eps) - e^eps a, e^-eps (1 - delta(eps) - a)). The PLD is
  pessimistic (its delta is an upper bound at every eps, truncated mass counted as infinite
  loss), so the discretisation only lowers f. The delta grid carries a slack of
  :data:`PROFILE_DELTA_SLACK` for float rounding in its suffix sums.
- Parallel parts (disjoint records): the differing record lies in one part, so the claim is the
  minimum of the branches' curves.

**The test** (:func:`curve_test`). Threshold and direction are chosen on the SELECT trials only;
on the disjoint EVAL trials the chosen rule's false-positive and false-negative rates get
one-sided Clopper–Pearson upper bounds, each at significance (1 - confidence) / 2. The box
[0, FPR_hi] x [0, FNR_hi] is *below* a curve f iff FNR_hi < f(FPR_hi) (f is non-increasing, so
the whole box is then below it).

Soundness argument. Given the SELECT trials, the rule is fixed and the EVAL trials are fresh
independent draws, so by the union bound the true (FPR, FNR) of that rule lies in the box with
probability >= confidence. If the claim is correct, the true point is on or above the claimed
trade-off function, which is on or above our lower bound f; then the box cannot be strictly
below f. So "violated" (the box is below the curve of the claimed event) is reported for a
correct claim with probability <= 1 - confidence. The family search over the scale s (below)
asks the same question of every member of the family about the *same single box*: the one event
"the true point lies in the box" (probability >= confidence) makes every answer correct at once,
so the search needs no further correction. Reported values are always members the box was
verified to be below (the search never reports an unverified s), so rounding in the search only
makes the result weaker.

**The family and the statistic.** :func:`scale_event` multiplies every noise multiplier by s
and divides every pure epsilon by s: a larger s is more noise and a higher (more private)
curve. The evidence rules out every s >= s_LB, where ``scale_lower_bound`` = s_LB is (up to a
relative 1e-3, rounded towards "not ruled out") the smallest s whose curve the box is below;
``family_epsilon`` = epsilon of scale_event(event, s_LB) at ``delta`` under the release's own
accountant -- the claim in its own units: the strongest member of the claim's family the audit
rules out. It is NOT a lower bound on the epsilon of a mechanism of another shape (randomized
response with eps 1 against a Gaussian claim it satisfies reads ~5): the published eps_LB is
:func:`dpaudit.audits.stats.general_epsilon`. 0.0 when the box is not even below FNR = 1 - FPR (the
s -> infinity limit, "no privacy loss"): then no member is ruled out. ``violated`` = the claimed
event itself (s = 1) is ruled out, which is the same as s_LB <= 1 (non-strict; the verdict's one
rule, :mod:`dpaudit.audits.verdicts`).

**SELECT criterion.** For closed-form families the SELECT rule maximises the statistic itself:
for Gaussian claims the statistic is an increasing function of the Gaussian-DP mu of the box
corner, Phi^-1(1 - FPR_hi) - Phi^-1(FNR_hi); for a single pure epsilon it is the pure epsilon of
the corner, max(ln((1 - FNR_hi)/FPR_hi), ln((1 - FPR_hi)/FNR_hi)). For profile-based families
(no closed form) the Gaussian-DP mu of the corner is used as a cheap monotone proxy. The bounds on
SELECT are Clopper–Pearson upper bounds at the same confidence, which penalises rules that rest
on few trials.
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from dataclasses import dataclass

from ..accounting.accountants import branches, compute_epsilon, get_accountant, merge_leaves
from ..accounting.adjacency import Adjacency
from ..accounting.events import Composed, Event, Parallel, PureEpsilon, SubsampledGaussian
from ..errors import UnsupportedEventError, UsageError
from ..lazy import lazy_import
from ..validation import open_unit, positive_finite
from . import stats

np = lazy_import("numpy")
optimize = lazy_import("scipy.optimize")
special = lazy_import("scipy.special")

#: pld discretisation of the privacy loss (the accountants' default). For noise multipliers below
#: 0.5 (the family search goes down to s = 1/16) the Gaussian losses grow like 1/sigma^2, so the
#: interval grows the same way (capped at :data:`PLD_MAX_DISCRETIZATION`) to keep the PLD's size
#: and time flat; a coarser pessimistic PLD is still valid, only less tight (measured: sigma 0.44,
#: q 0.005, T 2000: eps 15.841 at 1e-3 vs 15.845 at 4e-3, at 1/3 of the time).
PLD_DISCRETIZATION = 1e-3
PLD_MAX_DISCRETIZATION = 0.25
#: Added to every delta of a privacy profile: the suffix sums behind delta(eps) round at ~1e-16
#: per term (at most ~1e6 terms), and a curve a hair too high could flag a correct claim.
PROFILE_DELTA_SLACK = 1e-9
#: A box is below a curve only when FNR_hi < f(FPR_hi) - CURVE_MARGIN (float rounding of f).
CURVE_MARGIN = 1e-12
#: The eps grid of a privacy profile: spacing (the tangent lines it misses cost O(spacing^2) in
#: f; measured < 1e-5 against the Gaussian closed form) and the most points.
PROFILE_EPS_STEP = 0.005
PROFILE_MAX_POINTS = 6000
#: The family search: relative tolerance in s, and the range of s it looks in. Profile families
#: stop at 1/16 (below that the PLD's losses explode; an s_LB that small is reported as 1/16,
#: which the box was verified to be below, so it is still a valid, weaker, result).
SCALE_TOLERANCE = 1e-3
SCALE_RANGE_CLOSED = (1e-6, 1e6)
SCALE_RANGE_PROFILE = (1.0 / 16.0, 64.0)
MAX_POINTS = 256
#: The claimed-curve block's EVAL counts of the box, in their written order.
BOX_COUNTS = ("fp", "n_out", "fn", "n_in")


@functools.cache
def curve_grid() -> np.ndarray:
    """The FPR grid of the reported curves (a function: numpy runs when a curve is reported, not at import)."""
    return np.logspace(-6, 0, 200)


# --------------------------------------------------------------------------- the claimed curve


def scale_event(event: Event, s: float) -> Event:
    """The claim's family: every noise multiplier times ``s``, every pure epsilon divided by ``s``.

    s = 1 is the event itself; a larger s is more noise (a more private claim, a higher curve).
    """
    s = positive_finite("s", s)
    if isinstance(event, SubsampledGaussian):
        return SubsampledGaussian(event.noise_multiplier * s, event.sample_rate, event.steps)
    if isinstance(event, PureEpsilon):
        return PureEpsilon(event.epsilon / s, event.count)
    if isinstance(event, Composed):
        return Composed(tuple(scale_event(e, s) for e in event.events))
    if isinstance(event, Parallel):
        return Parallel(tuple(scale_event(e, s) for e in event.events))
    raise UnsupportedEventError(
        f"event must be a subsampled-gaussian, pure-epsilon, composed or parallel event, got {event!r}."
    )


def gaussian_fnr(fpr, mu: float) -> np.ndarray:
    """Trade-off function of mu-GDP: Phi(Phi^-1(1 - a) - mu), written -ndtri(a) so tiny a keep precision."""
    a = np.asarray(fpr, dtype=float)
    with np.errstate(over="ignore", invalid="ignore"):
        return special.ndtr(-special.ndtri(a) - mu)


def pure_fnr(fpr, epsilon: float) -> np.ndarray:
    """Trade-off function of one eps-DP mechanism: max(0, 1 - e^eps a, e^-eps (1 - a))."""
    a = np.asarray(fpr, dtype=float)
    return np.maximum(0.0, np.maximum(1.0 - math.exp(epsilon) * a, math.exp(-epsilon) * (1.0 - a)))


def _active(leaves) -> list:
    return [
        leaf
        for leaf in merge_leaves(list(leaves))
        if (leaf.steps if isinstance(leaf, SubsampledGaussian) else leaf.count) > 0
    ]


def _branch_form(leaves: tuple, adjacency: Adjacency) -> tuple[str, float | None]:
    """("gaussian", mu), ("pure", eps) or ("profile", None) for one sequential branch."""
    act = _active(leaves)
    if all(isinstance(leaf, SubsampledGaussian) and leaf.sample_rate >= 1.0 for leaf in act):
        # Gaussians compose exactly: mu^2 adds. Replace-one moves the sum by 2C (sensitivity 2).
        factor = 2.0 if adjacency is Adjacency.REPLACE_RECORD else 1.0
        mu_squared = sum(leaf.steps / leaf.noise_multiplier**2 for leaf in act)
        return "gaussian", factor * math.sqrt(mu_squared)
    if len(act) == 1 and isinstance(act[0], PureEpsilon) and act[0].count == 1:
        return "pure", float(act[0].epsilon)
    return "profile", None


def _pld_discretization(leaves: tuple, coarse_sigma: float = 0.5) -> float:
    """PLD_DISCRETIZATION, coarsened like 1/sigma^2 below a noise multiplier of ``coarse_sigma``
    (the audit's 0.5), where the Gaussian privacy losses (range ~ 1/sigma^2) would make the PLD
    large and slow (see :data:`PLD_DISCRETIZATION`). Pure-epsilon losses are bounded by the
    epsilons: never coarsened."""
    gaussians = [leaf for leaf in leaves if isinstance(leaf, SubsampledGaussian)]
    worst = max([1.0] + [coarse_sigma / leaf.noise_multiplier for leaf in gaussians])
    return min(PLD_MAX_DISCRETIZATION, PLD_DISCRETIZATION * worst * worst)


def _leaf_pld(leaf, adjacency: Adjacency, discretization: float):
    """Pessimistic PLD of one merged, active leaf (the conventions of pld._pld_leaf)."""
    from dp_accounting.pld import common
    from dp_accounting.pld import privacy_loss_distribution as pld_lib
    from dp_accounting.privacy_accountant import NeighboringRelation

    replace = adjacency is Adjacency.REPLACE_RECORD
    relation = NeighboringRelation.REPLACE_ONE if replace else NeighboringRelation.ADD_OR_REMOVE_ONE
    if isinstance(leaf, SubsampledGaussian):
        full = leaf.sample_rate >= 1.0  # T Gaussian steps = one Gaussian with noise sigma / sqrt(T)
        sigma = float(leaf.noise_multiplier)
        pld = pld_lib.from_gaussian_mechanism(
            standard_deviation=sigma / math.sqrt(leaf.steps) if full else sigma,
            sensitivity=1.0,
            sampling_prob=1.0 if full else float(leaf.sample_rate),
            value_discretization_interval=discretization,
            neighboring_relation=relation,
        )
        return pld if full else pld.self_compose(int(leaf.steps))
    return pld_lib.from_privacy_parameters(
        common.DifferentialPrivacyParameters(float(leaf.epsilon), 0.0),
        value_discretization_interval=discretization,
    ).self_compose(int(leaf.count))


def _pmf_arrays(pmf) -> tuple[np.ndarray, np.ndarray, float]:
    """(losses, probabilities, infinity mass) of a dp-accounting PLD pmf (dense form)."""
    dense = pmf.to_dense_pmf()
    probs = np.asarray(dense._probs, dtype=float)  # noqa: SLF001 - dp-accounting 0.6 has no public accessor
    losses = (np.arange(probs.size) + dense._lower_loss) * dense._discretization  # noqa: SLF001
    return losses, probs, float(dense._infinity_mass)  # noqa: SLF001


def hockey_stick(
    losses: np.ndarray, probs: np.ndarray, infinity_mass: float, eps: np.ndarray
) -> np.ndarray:
    """delta(eps) = inf_mass + sum_{l_i > eps} p_i (1 - e^(eps - l_i)) at every eps (vectorised).

    The same sum dp-accounting's ``get_delta_for_epsilon`` computes in a Python loop, here with
    suffix sums: sum_{l_i > eps} p_i - e^eps sum_{l_i > eps} p_i e^-l_i (only losses > 0 matter
    for eps >= 0, so e^-l never overflows).
    """
    eps = np.asarray(eps, dtype=float)
    keep = losses > 0.0
    l, p = losses[keep], probs[keep]
    upper = np.concatenate([np.cumsum(p[::-1])[::-1], [0.0]])
    lower = np.concatenate([np.cumsum((p * np.exp(-l))[::-1])[::-1], [0.0]])
    k = np.searchsorted(l, eps, side="right")  # first loss > eps
    return infinity_mass + np.maximum(upper[k] - np.exp(eps) * lower[k], 0.0)


@functools.lru_cache(maxsize=512)
def _branch_profile(
    leaves: tuple, adjacency: Adjacency, coarse_sigma: float = 0.5
) -> tuple[np.ndarray, np.ndarray]:
    """(eps grid, delta grid) of one sequential branch from its pessimistic PLD; cached, read-only.

    delta is the larger of the two orderings' (add and remove PLD; replace-one is symmetric)
    plus :data:`PROFILE_DELTA_SLACK`, capped at 1.
    """
    # never empty: a branch without active leaves has the closed "gaussian" form (_branch_form)
    arrays = _branch_arrays(_active(leaves), adjacency, coarse_sigma)
    top = max((float(l[p > 0].max()) if np.any(p > 0) else 0.0) for l, p, _ in arrays)
    top = max(top, 0.0)
    step = max(PROFILE_EPS_STEP, top / PROFILE_MAX_POINTS)
    eps = np.append(np.arange(0.0, top, step), top)
    delta = np.max([hockey_stick(l, p, m, eps) for l, p, m in arrays], axis=0)
    delta = np.minimum(delta + PROFILE_DELTA_SLACK, 1.0)
    eps.setflags(write=False)
    delta.setflags(write=False)
    return eps, delta


def _branch_arrays(act: list, adjacency: Adjacency, coarse_sigma: float) -> list:
    """The PMF arrays of a branch's pessimistic PLD (removal, and addition unless symmetric);
    dp-accounting's failure is a one-line UnsupportedEventError."""
    disc = _pld_discretization(tuple(act), coarse_sigma)
    try:
        with (
            np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"),
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("ignore", RuntimeWarning)
            parts = [_leaf_pld(leaf, adjacency, disc) for leaf in act]
            pld = functools.reduce(lambda left, right: left.compose(right), parts)
            pmfs = [pld._pmf_remove] if pld._symmetric else [pld._pmf_remove, pld._pmf_add]  # noqa: SLF001
            return [_pmf_arrays(pmf) for pmf in pmfs]
    except (RuntimeError, ValueError, FloatingPointError, OverflowError, MemoryError) as e:
        raise UnsupportedEventError(
            f"dp-accounting's PLD could not bound these events "
            f"({str(e).splitlines()[0] if str(e) else type(e).__name__})."
        ) from None


def profile_fnr(fpr, eps: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """max over the grid of max(0, 1 - delta - e^eps a, e^-eps (1 - delta - a)) (vectorised in a).

    Exactly the maximum over every line, found without testing every line at every a: within each
    family (slopes -e^eps, slopes -e^-eps) the line that wins at a moves monotonically with a (a
    line winning at a1 < a2 and one winning at a2 have slopes in that order, and every a between
    them is won by a line whose slope lies between theirs), so the winner is found among all lines
    at every :data:`ENVELOPE_BLOCK`-th sorted a only, and the points between two of those among
    the lines between their winners (widened by a few lines against float ties).
    """
    a = np.asarray(fpr, dtype=float)
    flat = a.reshape(-1)
    order = np.argsort(flat, kind="stable")
    e, one = np.exp(eps), 1.0 - delta
    with np.errstate(over="ignore", invalid="ignore"):
        best = np.maximum(
            _envelope(flat[order], lambda x, j: one[j] - e[j] * x[:, None]),
            _envelope(flat[order], lambda x, j: (one[j] - x[:, None]) / e[j]),
        )
    out = np.empty(flat.shape)
    out[order] = np.maximum(best, 0.0)
    return out.reshape(a.shape)


#: Sorted points between two exhaustive searches of :func:`profile_fnr`, and the lines added on
#: either side of each block's range.
ENVELOPE_BLOCK, ENVELOPE_PAD = 32, 2


def _envelope(x: np.ndarray, line) -> np.ndarray:
    """max over j of ``line(x, j)`` at sorted ``x`` (a family whose winner moves monotonically)."""
    if x.size == 0:
        return np.empty(0)
    n = line(x[:1], slice(None)).shape[1]
    anchors = np.unique(np.append(np.arange(0, x.size, ENVELOPE_BLOCK), x.size - 1))
    values = line(x[anchors], slice(None))
    won = values.argmax(axis=1)
    out = np.empty(x.size)
    out[anchors] = values.max(axis=1)
    for i0, i1, j0, j1 in zip(anchors[:-1], anchors[1:], won[:-1], won[1:]):
        if i1 > i0 + 1:
            lo, hi = max(min(j0, j1) - ENVELOPE_PAD, 0), min(max(j0, j1) + ENVELOPE_PAD + 1, n)
            out[i0 + 1 : i1] = line(x[i0 + 1 : i1], slice(lo, hi)).max(axis=1)
    return out


def _branch_fnr(leaves: tuple, adjacency: Adjacency, fpr, coarse_sigma: float) -> np.ndarray:
    form, value = _branch_form(leaves, adjacency)
    if form != "profile":
        return {"gaussian": gaussian_fnr, "pure": pure_fnr}[form](fpr, value)
    eps, delta = _branch_profile(leaves, adjacency, coarse_sigma)
    return profile_fnr(fpr, eps, delta)


@dataclass(frozen=True)
class ClaimedCurve:
    """A symmetric lower bound f on the trade-off function of ``event`` under ``adjacency``.

    Privacy contract: for every pair of datasets neighbouring under ``adjacency``, either order,
    and every test, the test's (FPR, FNR) satisfies FNR >= f(FPR) if the event's claim holds. So a
    point known (at some confidence) to lie strictly below f falsifies the claim (at that
    confidence). Closed forms for Gaussian and single pure-epsilon branches, else the pessimistic
    PLD profile (see the module docstring); parallel parts: the minimum over branches.
    ``coarse_sigma``: the noise multiplier below which the PLD's interval grows like 1/sigma^2;
    a larger one is coarser, still pessimistic: a lower curve (the power line's searches).
    """

    event: Event
    adjacency: str = Adjacency.ADD_REMOVE_RECORD.value
    coarse_sigma: float = 0.5

    def __post_init__(self) -> None:
        object.__setattr__(self, "adjacency", Adjacency.parse(self.adjacency).value)
        self._branches()  # an unsupported event is refused at construction, not at first use

    def _branches(self) -> list[tuple]:
        return [tuple(b) for b in branches(self.event)]

    @property
    def forms(self) -> tuple[str, ...]:
        """The form of each branch: "gaussian", "pure" or "profile"."""
        adj = Adjacency.parse(self.adjacency)
        return tuple(_branch_form(b, adj)[0] for b in self._branches())

    @property
    def closed_form(self) -> str | None:
        """ "gaussian" / "pure" when every branch has that closed form, else None (profile-based)."""
        forms = set(self.forms)
        return forms.pop() if len(forms) == 1 and forms <= {"gaussian", "pure"} else None

    def fnr(self, fpr) -> np.ndarray:
        """f(FPR): vectorised, non-increasing, in [0, 1]. FPR must lie in [0, 1]."""
        a = _rates("fpr", fpr)
        adj = Adjacency.parse(self.adjacency)
        out = np.min([_branch_fnr(b, adj, a, self.coarse_sigma) for b in self._branches()], axis=0)
        return np.clip(out, 0.0, 1.0)

    def violated_by(self, fpr_upper, fnr_upper) -> np.ndarray:
        """True where the box [0, fpr_upper] x [0, fnr_upper] lies strictly below the curve
        (fnr_upper < f(fpr_upper) by more than float rounding, :data:`CURVE_MARGIN`)."""
        b = _rates("fnr_upper", fnr_upper)
        return np.asarray(b < self.fnr(np.asarray(fpr_upper, dtype=float)) - CURVE_MARGIN)


def _rates(name: str, values) -> np.ndarray:
    """``values`` as a float array, refused unless every one is in [0, 1]."""
    x = np.asarray(values, dtype=float)
    if x.size and not (np.all(np.isfinite(x)) and x.min() >= 0.0 and x.max() <= 1.0):
        raise UsageError(
            f"{name} must be in [0, 1], got values from {float(np.nanmin(x))!r} to {float(np.nanmax(x))!r}."
        )
    return x


def claimed_curve(
    event: Event, adjacency: "str | Adjacency" = Adjacency.ADD_REMOVE_RECORD
) -> ClaimedCurve:
    """The claimed trade-off curve of ``event`` under ``adjacency`` (see :class:`ClaimedCurve`)."""
    return ClaimedCurve(event, Adjacency.parse(adjacency).value)


# ------------------------------------------------------------------------------ the test


@dataclass(frozen=True)
class Box:
    """The chosen rule and its EVAL confidence box."""

    threshold: float
    direction: str
    fpr: float
    fnr: float
    fpr_upper: float
    fnr_upper: float
    n_in: int
    n_out: int


def _gdp_mu(fpr_hi, fnr_hi) -> np.ndarray:
    """Gaussian-DP mu of a box corner, Phi^-1(1 - FPR_hi) - Phi^-1(FNR_hi) (may be negative)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return -special.ndtri(np.asarray(fpr_hi, float)) - special.ndtri(np.asarray(fnr_hi, float))


def _pure_eps(fpr_hi, fnr_hi) -> np.ndarray:
    """Pure epsilon of a box corner, max(ln((1 - FNR_hi)/FPR_hi), ln((1 - FPR_hi)/FNR_hi))."""
    a, b = np.asarray(fpr_hi, float), np.asarray(fnr_hi, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.fmax(np.log1p(-b) - np.log(a), np.log1p(-a) - np.log(b))


def _check_inputs(scores, world, select) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=float).ravel()
    w = np.asarray(world).ravel()
    sel = np.asarray(select).ravel()
    if w.dtype != bool or sel.dtype != bool:
        raise UsageError(f"world and select must be boolean arrays, got {w.dtype} and {sel.dtype}.")
    if not (s.size == w.size == sel.size):
        raise UsageError(
            f"scores, world and select must have the same length, got {s.size}, {w.size} and {sel.size}."
        )
    stats.finite_scores(s)
    for name, part in (("SELECT ", sel), ("EVAL ", ~sel)):
        stats._require_worlds(int(np.sum(w & part)), int(np.sum(~w & part)), name)
    return s, w, sel


def select_rule(scores, labels, *, criterion: str, confidence: float = 0.95) -> tuple[float, str]:
    """(threshold, direction) maximising ``criterion`` ("gdp-mu" or "pure-epsilon") of the
    Clopper–Pearson box corner on these (SELECT) trials (:func:`dpaudit.audits.stats.best_rule`)."""
    score_of = _gdp_mu if criterion == "gdp-mu" else _pure_eps
    return stats.best_rule(
        np.asarray(scores, float), np.asarray(labels, bool), score_of, confidence
    )[:2]


def criterion_for(curve: ClaimedCurve) -> str:
    """How SELECT chooses the rule for ``curve`` (fixed-N and sequential tests alike): the pure
    epsilon of the box corner for one pure-epsilon claim, else its Gaussian-DP mu."""
    return "pure-epsilon" if curve.closed_form == "pure" else "gdp-mu"


def eval_box(scores, world, select, *, criterion: str, confidence: float = 0.95) -> Box:
    """Choose the rule on SELECT (:func:`select_rule`), bound its FPR and FNR on EVAL (one-sided
    Clopper–Pearson, significance split in two: jointly at ``confidence``)."""
    s, w, sel = _check_inputs(scores, world, select)
    threshold, direction = select_rule(s[sel], w[sel], criterion=criterion, confidence=confidence)
    ev = ~sel
    tp, fp, tn, fn = stats.confusion(s[ev], w[ev], threshold, direction)
    n_in, n_out = tp + fn, tn + fp
    fpr_hi = float(stats.cp_upper(fp, n_out, confidence, split=2))
    fnr_hi = float(stats.cp_upper(fn, n_in, confidence, split=2))
    return Box(threshold, direction, fp / n_out, fn / n_in, fpr_hi, fnr_hi, n_in, n_out)


class _Family:
    """The family scale_event(event, s) against the box. Called at x = log s: the gap
    f_s(FPR_hi) - FNR_hi - margin (> 0 iff the box is below the curve of s), memoised, and the
    bracket the gaps leave: ``lo`` (the largest x not ruled out), ``hi`` (the smallest ruled out)."""

    def __init__(self, event: Event, adjacency: str, box: Box):
        self.event, self.adjacency, self.box = event, adjacency, box
        self.base = claimed_curve(event, adjacency)
        self.profile = self.base.closed_form is None
        self.lo, self.hi = -math.inf, math.inf
        self.memo: dict[float, float] = {}

    def __call__(self, x: float) -> float:
        if x not in self.memo:
            s = math.exp(x)
            curve = (
                self.base if s == 1.0 else claimed_curve(scale_event(self.event, s), self.adjacency)
            )
            self.memo[x] = float(curve.fnr(self.box.fpr_upper)) - self.box.fnr_upper - CURVE_MARGIN
            if self.memo[x] > 0:
                self.hi = min(self.hi, x)
            else:
                self.lo = max(self.lo, x)
        return self.memo[x]


def _search(family: _Family) -> float | None:
    """The smallest s (relative tolerance :data:`SCALE_TOLERANCE`) whose curve the box is below,
    rounded up to one the box was verified to be below; None when none in the search range is.

    Starts at s = 1, then at the Gaussian-DP guess s = mu_1 / mu_box (exact for Gaussian claims)
    to bracket, then Brent's method; every evaluated x moves the bracket [lo (not ruled out),
    hi (ruled out)], and bisection finishes if Brent stops early.
    """
    box = family.box
    if not box.fnr_upper < 1.0 - box.fpr_upper - CURVE_MARGIN:
        return None  # not below the s -> infinity limit: no member can be ruled out
    s_min, s_max = SCALE_RANGE_PROFILE if family.profile else SCALE_RANGE_CLOSED
    x_min, x_max = math.log(s_min), math.log(s_max)
    tol = math.log1p(SCALE_TOLERANCE)
    family(0.0)
    guess = _gdp_guess(family, x_min, x_max)
    if guess is not None and abs(guess) > tol:
        family(guess)
    if not _bracket(family, x_min, x_max):
        # ruled out even at the bottom of the range: report that (verified) s; or none is
        return math.exp(family.hi) if math.isfinite(family.hi) else None
    if family.hi - family.lo > tol and family.memo[family.lo] < 0:
        # not converged in maxiter: the bracket is kept by the family's gaps, bisection finishes
        with contextlib.suppress(RuntimeError):
            optimize.brentq(family, family.lo, family.hi, xtol=tol / 4.0, maxiter=60)
    while family.hi - family.lo > tol:
        family((family.lo + family.hi) / 2.0)
    return math.exp(family.hi)


def _gdp_guess(family: _Family, x_min: float, x_max: float) -> float | None:
    """The Gaussian-DP guess of x = log s: f_1(a) read as mu-GDP, the box as mu_box, mu scaling
    like 1/s (clipped to the range; None when either is not a positive mu)."""
    box = family.box
    mu_box = float(_gdp_mu(box.fpr_upper, box.fnr_upper))
    f1 = float(family.base.fnr(box.fpr_upper))
    mu_1 = float(_gdp_mu(box.fpr_upper, f1)) if 0.0 < f1 < 1.0 else float("nan")
    if mu_box > 0 and math.isfinite(mu_1) and mu_1 > 0:
        return min(max(math.log(mu_1 / mu_box), x_min), x_max)
    return None


def _bracket(probe: _Family, x_min: float, x_max: float) -> bool:
    """Walk away from the ruled-out / not-ruled-out side with a doubling step until both are
    found (True), or the range ends first (False)."""
    step = 0.05
    while not (math.isfinite(probe.lo) and math.isfinite(probe.hi)):
        if math.isfinite(probe.hi):  # everything tried is ruled out: go down
            if probe.hi <= x_min:
                return False
            probe(max(probe.hi - step, x_min))
        else:  # nothing tried is ruled out: go up
            if probe.lo >= x_max:
                return False
            probe(min(probe.lo + step, x_max))
        step *= 2.0
    return True


def family_ruled_out(
    event: Event, adjacency: "str | Adjacency", fpr_upper: float, fnr_upper: float
) -> dict:
    """What a box with these upper corners rules out, by the search of :func:`curve_test`:
    {parameter, claimed, lower_bound (None: nothing), scale_lower_bound, violated (s_LB <= 1)}."""
    box = Box(math.nan, "greater", math.nan, math.nan, float(fpr_upper), float(fnr_upper), 0, 0)
    s = _search(_Family(event, Adjacency.parse(adjacency).value, box))
    found = {"scale_lower_bound": s, "violated": s is not None and s <= 1.0}
    return {**_family_parameter(event, s), **found}


def _num(x):
    """A float for JSON: infinities as the strings "inf" / "-inf"."""
    if x is None:
        return None
    x = float(x)
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def _curve_dict(curve: ClaimedCurve) -> dict:
    grid = curve_grid()
    return {"fpr": [float(v) for v in grid], "fnr": [float(v) for v in curve.fnr(grid)]}


def _eval_points(s: np.ndarray, w: np.ndarray, direction: str) -> dict:
    """Empirical (FPR, FNR) of every threshold rule in ``direction`` on these trials, thinned."""
    o = s if direction == "greater" else -s
    t = np.concatenate([[-np.inf], np.unique(o), [np.inf]])
    pos, neg = np.sort(o[w]), np.sort(o[~w])
    fpr = (neg.size - np.searchsorted(neg, t, side="left")) / neg.size  # predicted in iff o >= t
    fnr = np.searchsorted(pos, t, side="left") / pos.size
    fpr, fnr = stats.thinned(MAX_POINTS, fpr, fnr)
    return {"fpr": [float(v) for v in fpr], "fnr": [float(v) for v in fnr]}


def _family_parameter(event: Event, s: float | None) -> dict:
    """The family member at scale ``s`` in the claim's own units (None: no member ruled out)."""
    if isinstance(event, SubsampledGaussian):
        name, claimed, at = "noise_multiplier", event.noise_multiplier, lambda: claimed * s
    elif isinstance(event, PureEpsilon):
        name, claimed, at = "epsilon", event.epsilon, lambda: claimed / s
    else:
        name, claimed, at = "noise_scale", 1.0, lambda: s
    return {
        "parameter": name,
        "claimed": float(claimed),
        "lower_bound": None if s is None else float(at()),
    }


def member_epsilon(event: Event, s: float | None, *, delta: float, accountant, adjacency) -> float:
    """Epsilon at ``delta`` of the family member ``scale_event(event, s)`` by ``accountant``;
    0.0 when no member is ruled out (``s`` None)."""
    if s is None:
        return 0.0
    member = event if s == 1.0 else scale_event(event, s)
    return float(
        compute_epsilon(member, delta=delta, accountant=accountant, adjacency=adjacency).epsilon
    )


def ruled_out(event: Event, found: tuple, counts: tuple, rule: tuple, rates: tuple) -> dict:
    """The claimed-curve block's findings: ``found`` (s_LB, the family member's epsilon, violated),
    the chosen ``rule`` (threshold, direction), its EVAL ``counts`` (fp, n_out, fn, n_in) and box
    ``rates`` (fpr, fnr, fpr_upper, fnr_upper)."""
    s_lb, eps_lb, violated = found
    return {
        "family": _family_parameter(event, s_lb),
        "scale_lower_bound": None if s_lb is None else float(s_lb),
        "family_epsilon": _num(eps_lb),
        "violated": bool(violated),
        "counts": dict(zip(BOX_COUNTS, counts)),
        "threshold": _num(rule[0]),
        "direction": rule[1],
        "point": dict(zip(("fpr", "fnr", "fpr_upper", "fnr_upper"), map(float, rates))),
    }


def curve_at(event: Event, adjacency, s: float | None) -> dict | None:
    """The reported curve of the family member at scale ``s`` (None: no member ruled out)."""
    return None if s is None else _curve_dict(claimed_curve(scale_event(event, s), adjacency))


def family_statement(family: dict) -> str:
    """ "noise_multiplier >= 0.8123 ruled out (claimed 1.2)": the family result in the claim's units.

    More noise (a larger noise multiplier or scale) or a smaller pure epsilon is a stronger claim;
    the evidence rules out that member and every stronger one."""
    param = family.get("parameter", "noise_scale")
    claimed, lb = family.get("claimed"), family.get("lower_bound")
    if lb is None:
        return f"no {param} ruled out (claimed {float(claimed):.4g})"
    return f"{param} {'<=' if param == 'epsilon' else '>='} {float(lb):.4g} ruled out (claimed {float(claimed):.4g})"


def curve_test(
    scores,
    world,
    select,
    *,
    event: Event,
    delta: float,
    confidence: float = 0.95,
    accountant="rdp",
    adjacency: "str | Adjacency" = Adjacency.ADD_REMOVE_RECORD,
) -> dict:
    """The claimed-curve audit of per-trial ``scores`` (``world``: canary-in trial; ``select``:
    SELECT trial, the rest is EVAL) against ``event`` under ``adjacency``: the audit.json
    "claimed_curve" block (see the module docstring for the statistic and its soundness).

    Privacy contract: if ``event`` is a correct claim for the mechanism that produced the scores,
    ``violated`` is True with probability at most 1 - ``confidence`` (over the trials).
    ``family_epsilon`` (the epsilon of the strongest family member ruled out) is a statement
    about the claim's family only: for a mechanism of another shape it is no bound on epsilon.
    """
    confidence = open_unit("confidence", confidence)
    delta = stats._check_delta(delta)
    adj = Adjacency.parse(adjacency)
    acc = get_accountant(accountant)
    if getattr(acc, "uses_delta", True):
        open_unit("delta", delta)  # checked now, not after the search
    reason = acc.support_error(event, adj)
    if reason is not None:
        raise UnsupportedEventError(reason)
    curve = claimed_curve(event, adj)
    s, w, sel = _check_inputs(scores, world, select)
    box = eval_box(s, w, sel, criterion=criterion_for(curve), confidence=confidence)
    family = _Family(event, adj.value, box)
    s_lb = _search(family)
    eps_lb = member_epsilon(event, s_lb, delta=delta, accountant=acc, adjacency=adj)
    # the one rule (non-strict): s_LB = 1 means the claimed event itself was verified ruled out
    violated = s_lb is not None and s_lb <= 1.0
    if family.profile:
        selection = (
            "threshold and direction chosen on SELECT trials by the Gaussian-DP mu of the Clopper-Pearson box corner "
            "(a monotone proxy; the curve is the pessimistic PLD privacy profile)"
        )
    else:
        selection = "threshold and direction chosen on SELECT trials to maximise the statistic itself (closed-form curve)"
    method = (
        f"{selection}; one-sided Clopper-Pearson upper bounds on EVAL FPR and FNR, significance split in two; "
        "the box is tested against the claimed trade-off curve and its family (noise multipliers x s, pure epsilons / s); "
        "family_epsilon is the epsilon of the smallest s ruled out (a statement about the claim's family, not a bound "
        "for other mechanisms); violated: s = 1 is ruled out."
    )
    ev = ~sel
    counts = (int(round(box.fpr * box.n_out)), box.n_out, int(round(box.fnr * box.n_in)), box.n_in)
    rates = (box.fpr, box.fnr, box.fpr_upper, box.fnr_upper)
    return {
        "statistic": "claimed-curve",
        "method": method,
        "event": event.to_dict(),
        "accountant": acc.name,
        "adjacency": adj.value,
        "delta": float(delta),
        "confidence": float(confidence),
        **ruled_out(event, (s_lb, eps_lb, violated), counts, (box.threshold, box.direction), rates),
        "points": _eval_points(s[ev], w[ev], box.direction),
        "curve": _curve_dict(curve),
        "curve_at_lower_bound": curve_at(event, adj, s_lb),
        "select_size": int(sel.sum()),
        "eval_size": int(ev.sum()),
    }

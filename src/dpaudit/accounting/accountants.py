"""Accountants: turn a stored event into (epsilon, delta).

- ``rdp``: Rényi DP of the Poisson-subsampled Gaussian via Opacus's analysis
  (Mironov, Talwar & Zhang 2019), converted with Balle et al. 2020 (Opacus's conversion),
  over the fixed order set :data:`RDP_ORDERS`.
- ``prv``: numerical composition of privacy random variables (Gopi, Lee & Wutschitz 2021)
  via ``prv-accountant``; reports lower / estimate / upper, and the claim uses the upper bound.
- ``pure``: pure epsilon-DP, delta = 0, composition by summation.

Sequential composition is exact inside each accountant (RDP curves add; PRVs convolve).
Parallel composition (events on disjoint records) takes the worst case over which part
holds the differing record: every "branch" of the event tree is composed sequentially and
the largest epsilon is reported.
"""

from __future__ import annotations

import functools
import itertools
import math
import warnings
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import UnsupportedEventError, UsageError
from ..validation import open_unit
from .adjacency import Adjacency
from .events import Composed, Event, Parallel, PureEpsilon, SubsampledGaussian

ACCOUNTANTS = ("rdp", "prv", "pure")

#: The RDP orders: {1.1, ..., 10.9} U {12, ..., 255} U {256, 512, ..., 16384}.
RDP_ORDERS: tuple[float, ...] = tuple(
    [round(1 + x / 10.0, 1) for x in range(1, 100)]
    + [float(a) for a in range(12, 256)]
    + [float(2**k) for k in range(8, 15)]
)

#: prv-accountant discretisation error in epsilon (the reported upper bound absorbs it).
PRV_EPS_ERROR = 0.01
#: prv-accountant error in delta, relative to the target delta.
PRV_DELTA_ERROR_FRACTION = 1e-3
#: Above this many compositions in one branch the PRV discretisation (mesh ~ 1/sqrt(N)) grows to
#: minutes and gigabytes; the prv accountant then declines with an error (the ledger falls back on
#: the RDP bound, which is always valid) rather than hanging.
PRV_MAX_COMPOSITIONS = 100_000
_MAX_BRANCHES = 4096


@dataclass(frozen=True)
class AccountantResult:
    """What an accountant says about an event, under a declared adjacency."""

    accountant: str
    epsilon: float  # the claim: for prv this is the upper bound
    delta: float
    adjacency: str
    epsilon_lower: float | None = None
    epsilon_estimate: float | None = None
    optimal_order: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def branches(event: Event) -> list[list[SubsampledGaussian | PureEpsilon]]:
    """Sequential leaf lists, one per choice of child in every Parallel node."""
    if isinstance(event, (SubsampledGaussian, PureEpsilon)):
        return [[event]]
    if isinstance(event, Composed):
        parts = [branches(e) for e in event.events]
        total = math.prod(len(p) for p in parts) if parts else 1
        if total > _MAX_BRANCHES:
            raise UnsupportedEventError(f"event tree has {total} parallel branches; at most {_MAX_BRANCHES} are supported.")
        return [sum(combo, []) for combo in itertools.product(*parts)] if parts else [[]]
    if isinstance(event, Parallel):
        out: list = []
        for e in event.events:
            out.extend(branches(e))
        return out or [[]]
    raise UnsupportedEventError(f"accountants understand subsampled-gaussian, pure-epsilon, composed and parallel events, got {event!r}.")


def merge_leaves(leaves: list) -> list:
    """Merge identical mechanisms of one sequential branch: T1 then T2 steps of the same
    subsampled Gaussian are exactly T1 + T2 steps of it (likewise counts of one pure epsilon).

    Exact for every accountant, and it keeps a ledger of hundreds of releases that share a few
    (noise multiplier, sample rate) pairs as cheap to account as a handful of events.
    """
    steps: dict = {}
    counts: dict = {}
    for leaf in leaves:
        if isinstance(leaf, SubsampledGaussian):
            key = (leaf.noise_multiplier, leaf.sample_rate)
            steps[key] = steps.get(key, 0) + leaf.steps
        elif isinstance(leaf, PureEpsilon):
            counts[leaf.epsilon] = counts.get(leaf.epsilon, 0) + leaf.count
        else:
            raise UnsupportedEventError(f"accountants understand subsampled-gaussian and pure-epsilon leaves, got {leaf!r}.")
    return [SubsampledGaussian(s, q, t) for (s, q), t in steps.items()] + [PureEpsilon(e, c) for e, c in counts.items()]


# ---------------------------------------------------------------- RDP


@functools.lru_cache(maxsize=4096)
def _one_step_rdp(sample_rate: float, noise_multiplier: float, orders: tuple[float, ...]) -> np.ndarray:
    """RDP curve of ONE step of the subsampled Gaussian (Opacus's analysis), read-only."""
    from opacus.accountants.analysis.rdp import compute_rdp

    curve = np.asarray(compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=1, orders=list(orders)), dtype=float)
    curve.setflags(write=False)
    return curve


def rdp_curve(leaves: list, orders: tuple[float, ...] = RDP_ORDERS) -> np.ndarray:
    """Sum of the RDP curves of sequentially composed leaves at ``orders``.

    T steps of one subsampled Gaussian have T times its one-step RDP (RDP composes additively;
    Opacus's ``compute_rdp`` itself returns the one-step curve times ``steps``), so the one-step
    curve is computed once per (sample_rate, noise_multiplier) and scaled: the same arithmetic,
    and a ledger of hundreds of releases sharing a few mechanisms costs a few curve evaluations.
    """
    orders = tuple(float(o) for o in orders)
    orders_arr = np.asarray(orders, dtype=float)
    total = np.zeros_like(orders_arr)
    for leaf in leaves:
        if isinstance(leaf, SubsampledGaussian):
            if leaf.steps == 0:
                continue
            total = total + _one_step_rdp(float(leaf.sample_rate), float(leaf.noise_multiplier), orders) * leaf.steps
        elif isinstance(leaf, PureEpsilon):
            # eps-DP implies (alpha, eps)-RDP (Mironov 2017, Prop. 3) and (alpha, alpha eps^2 / 2)-RDP
            # (Bun & Steinke 2016, Prop. 3.3); both hold, so take the smaller.
            e = leaf.epsilon
            total = total + leaf.count * np.minimum(e, orders_arr * e * e / 2.0)
        else:
            raise UnsupportedEventError(f"the rdp accountant cannot account for {leaf!r}.")
    return total


def rdp_to_epsilon(curve: np.ndarray, delta: float, orders: tuple[float, ...] = RDP_ORDERS) -> tuple[float, float]:
    """(epsilon, optimal order) via Opacus's conversion (Balle et al. 2020, Thm. 21)."""
    from opacus.accountants.analysis.rdp import get_privacy_spent

    if not np.any(curve):
        return 0.0, float(orders[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the optimum at an extreme order is not an error here
        eps, order = get_privacy_spent(orders=list(orders), rdp=list(curve), delta=delta)
    return max(0.0, float(eps)), float(order)


def _rdp(event: Event, delta: float, adjacency: str) -> AccountantResult:
    best_eps, best_order = 0.0, None
    for leaves in branches(event):
        eps, order = rdp_to_epsilon(rdp_curve(merge_leaves(leaves)), delta)
        if best_order is None or eps > best_eps:
            best_eps, best_order = eps, order
    return AccountantResult("rdp", best_eps, delta, adjacency, optimal_order=best_order)


# ---------------------------------------------------------------- PRV


def _prv_leaf(leaf):
    import prv_accountant as pa

    if isinstance(leaf, SubsampledGaussian):
        if leaf.sample_rate >= 1.0:
            return pa.GaussianMechanism(noise_multiplier=leaf.noise_multiplier), leaf.steps
        return pa.PoissonSubsampledGaussianMechanism(sampling_probability=leaf.sample_rate, noise_multiplier=leaf.noise_multiplier), leaf.steps
    if isinstance(leaf, PureEpsilon):
        return pa.PureDPMechanism(eps=leaf.epsilon), leaf.count
    raise UnsupportedEventError(f"the prv accountant cannot account for {leaf!r}.")


def prv_epsilon_bounds(leaves: list, delta: float) -> tuple[float, float, float]:
    """(lower, estimate, upper) epsilon of sequentially composed leaves."""
    import prv_accountant as pa

    prvs, counts = [], []
    for leaf in leaves:
        prv, count = _prv_leaf(leaf)
        if count > 0:
            prvs.append(prv)
            counts.append(int(count))
    if not prvs:
        return 0.0, 0.0, 0.0
    if sum(counts) > PRV_MAX_COMPOSITIONS:
        raise UnsupportedEventError(
            f"the prv accountant supports at most {PRV_MAX_COMPOSITIONS} compositions per branch, got {sum(counts)}; use rdp."
        )
    with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            acc = pa.PRVAccountant(
                prvs=prvs,
                max_self_compositions=counts,
                eps_error=PRV_EPS_ERROR,
                delta_error=delta * PRV_DELTA_ERROR_FRACTION,
            )
            lo, est, hi = acc.compute_epsilon(delta=delta, num_self_compositions=counts)
        except (RuntimeError, ValueError, FloatingPointError) as e:
            # e.g. "Discrete mean differs from continuous mean significantly" far out in the
            # tails (composed eps ~ 80): prv gives no bound here; callers fall back on rdp.
            raise UnsupportedEventError(f"prv-accountant could not bound these events ({str(e).splitlines()[0] if str(e) else type(e).__name__}); use rdp.") from None
    if not all(map(math.isfinite, (lo, est, hi))):
        raise UnsupportedEventError("prv-accountant returned a non-finite epsilon for these events; use the rdp accountant.")
    return float(max(lo, 0.0)), float(max(est, 0.0)), float(max(hi, 0.0))


def _prv(event: Event, delta: float, adjacency: str) -> AccountantResult:
    best = None
    for leaves in branches(event):
        b = prv_epsilon_bounds(merge_leaves(leaves), delta)
        if best is None or b[2] > best[2]:
            best = b
    lo, est, hi = best  # type: ignore[misc]
    return AccountantResult("prv", hi, delta, adjacency, epsilon_lower=lo, epsilon_estimate=est)


# ---------------------------------------------------------------- pure


def _pure(event: Event, adjacency: str) -> AccountantResult:
    worst = 0.0
    for leaves in branches(event):
        total = 0.0
        for leaf in leaves:
            if isinstance(leaf, PureEpsilon):
                total += leaf.epsilon * leaf.count
            elif isinstance(leaf, SubsampledGaussian) and leaf.steps == 0:
                continue
            else:
                raise UnsupportedEventError(
                    f"the pure accountant only accounts for pure-epsilon events, got {leaf.to_dict()['type']}; use rdp or prv."
                )
        worst = max(worst, total)
    return AccountantResult("pure", worst, 0.0, adjacency)


def compute_epsilon(
    event: Event,
    *,
    delta: float,
    accountant: str = "rdp",
    adjacency: "str | Adjacency" = Adjacency.ADD_REMOVE_RECORD,
) -> AccountantResult:
    """Epsilon of ``event`` at ``delta`` with the named accountant (``delta`` ignored for pure)."""
    adj = Adjacency.parse(adjacency).value
    if accountant == "pure":
        return _pure(event, adj)
    if accountant not in ("rdp", "prv"):
        raise UsageError(f"accountant must be one of {', '.join(ACCOUNTANTS)}, got {accountant!r}.")
    open_unit("delta", delta)
    if accountant == "rdp":
        return _rdp(event, delta, adj)
    return _prv(event, delta, adj)

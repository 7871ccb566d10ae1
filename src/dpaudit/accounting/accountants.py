"""Accountants: turn a stored event into (epsilon, delta) under a declared adjacency.

- ``rdp``: Rényi DP of the Poisson-subsampled Gaussian via Opacus's analysis
  (Mironov, Talwar & Zhang 2019), converted with Balle et al. 2020 (Opacus's conversion),
  over the fixed order set :data:`RDP_ORDERS`.
- ``prv``: numerical composition of privacy random variables (Gopi, Lee & Wutschitz 2021)
  via ``prv-accountant``; reports lower / estimate / upper, and the claim uses the upper bound.
- ``pld``: privacy loss distributions (Koskela et al. 2020; Doroshenko et al. 2022,
  "connect the dots") via Google's ``dp-accounting``, pessimistic discretisation, for both
  add/remove (``ADD_OR_REMOVE_ONE``) and replace-one (``REPLACE_ONE``) neighbours.
- ``pure``: pure epsilon-DP, delta = 0, composition by summation.

**Accountants behind one protocol** (:class:`Accountant`, in the spirit of dp_accounting's
``PrivacyAccountant``, states its contract): the built-ins and any user accountant live in one
registry (:func:`register_accountant`, :func:`get_accountant`), which :func:`compute_epsilon`
wraps. **Adjacency is an input, never a label**: a pair an accountant does not support
(:func:`support_error`) is refused with a one-line :class:`~dpaudit.errors.UnsupportedEventError`,
and so is an answer labelled with another adjacency or accountant. The conventions
every accountant uses for a ``SubsampledGaussian`` event (DP-SGD): each record's (or, at user
level, each user's) clipped contribution to the noisy *sum* has L2 norm at most C, the noise std
is ``noise_multiplier * C``, and each record (user) is in a step's batch independently with
probability ``sample_rate``. Then, per step and conditioned on the rest of the batch, the output
pair of a neighbouring dataset pair is dominated by (units of C):

- add/remove (record or user): ``(1-q) N(0, s^2) + q N(1, s^2)`` vs ``N(0, s^2)``, both
  orders (the removed unit's contribution is present or absent);
- replace-one: ``(1-q) N(0, s^2) + q N(1, s^2)`` vs ``(1-q) N(0, s^2) + q N(-1, s^2)`` (the old
  unit's contribution is replaced by the new one's, pointing the opposite way: the sum moves
  by up to 2C). At q = 1 this is ``N(1)`` vs ``N(-1)``: the Gaussian mechanism with
  sensitivity 2C, i.e. add/remove with noise multiplier ``s / 2``.

Sequential composition is exact inside each accountant (RDP curves add; PRVs and PLDs
convolve). Parallel composition (events on disjoint records) takes the worst case over which
part holds the differing record: every "branch" of the event tree is composed sequentially and
the largest epsilon is reported.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import functools
import itertools
import json
import math
import os
import pickle
import signal
import threading
import warnings
from dataclasses import asdict, dataclass
from typing import Callable, Iterator, Protocol, runtime_checkable

from ..errors import UnsupportedEventError, UsageError
from ..lazy import lazy_import
from ..validation import non_negative_finite, open_unit
from .adjacency import Adjacency
from .events import Composed, Event, Parallel, PureEpsilon, SubsampledGaussian
from .rdp_sgm import compute_rdp, get_privacy_spent  # Opacus's analysis with numpy alone (no scipy import)
np = lazy_import("numpy")

#: Every accountant :func:`compute_epsilon` knows, in the order tools list them.
ACCOUNTANTS = ("rdp", "prv", "pld", "pure")

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
#: prv-accountant discretises the privacy loss on [-L, L] (L from an RDP bound, about epsilon + 3)
#: with mesh ``eps_error / sqrt(N/2 ln(12/delta_error))``; memory grows with the number of grid
#: points (measured: 3.6e6 points took 1.3 GB and 36 s; sigma 0.3, q 0.5, T 3000 asks for ~1e8
#: points and was killed for memory). Above this many points prv declines before allocating.
PRV_MAX_GRID_POINTS = 5_000_000
#: integer RDP orders for the quick estimate of prv-accountant's grid size.
_PRV_GRID_ORDERS: tuple[float, ...] = (2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0, 96.0, 128.0, 256.0, 512.0, 1024.0)
#: pld discretisation of the privacy loss. The PLD is pessimistic (rounded up, truncated mass
#: counted as infinite loss), so the reported epsilon is an upper bound at any interval; 1e-3
#: costs < 0.005 in epsilon against 1e-4 at 1/10 of the time (measured: sigma 1, q 0.005,
#: T 2000, replace-one: 1.9284 vs 1.9269).
PLD_VALUE_DISCRETIZATION = 1e-3
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


# ---------------------------------------------------------------- which (event, adjacency) pairs


def _replace_gaussian_noise(leaf: SubsampledGaussian, adjacency: Adjacency) -> float:
    """Noise multiplier of the add/remove Gaussian that is *exactly* this leaf's mechanism under
    ``adjacency``: halved for replace-one without subsampling (module docstring); callers reject
    replace-one with q < 1 before (:func:`_leaf_error`)."""
    if adjacency is Adjacency.REPLACE_RECORD:
        return leaf.noise_multiplier / 2.0
    return leaf.noise_multiplier


def _leaf_error(accountant: str, leaf, adjacency: Adjacency) -> str | None:
    """Why ``accountant`` cannot account for one leaf under ``adjacency`` (None: it can).

    - add-remove-user: a user-level event is the same mechanism with the user as the unit
      (user-level clipping bounds a whole user's contribution by C and users are Poisson
      sampled), so it is supported exactly where add-remove-record is.
    - PureEpsilon: the stored epsilon is a claim *under the release's own adjacency*; the ledger
      only composes releases that share one adjacency, and eps-DP of a neighbouring pair
      implies the RDP / PRV / PLD bounds of that same pair, so every accountant supports it
      under the adjacency it was made under (which is the one it is asked about).
    - SubsampledGaussian, replace-record: rdp (Opacus's analysis of Mironov, Talwar & Zhang
      2019) and prv (prv-accountant's PoissonSubsampledGaussianMechanism) are analyses of the
      add/remove pair; they support replace-one only without subsampling (q = 1), where the
      exact conversion to noise multiplier / 2 applies (:func:`_replace_gaussian_noise`).
      Relabelling the add/remove epsilon would under-report (sigma 1, q 0.005, T 2000:
      1.21 add/remove vs 1.93 replace-one) and the generic group-privacy conversion is loose,
      so they refuse and point to pld, which analyses the replace-one pair directly.
    - pure accepts only pure-epsilon leaves (and no-op Gaussian leaves with 0 steps).
    """
    if isinstance(leaf, PureEpsilon):
        return None
    if not isinstance(leaf, SubsampledGaussian):
        return f"the {accountant} accountant does not support {event_kind(leaf)} events under {adjacency.value} adjacency."
    if leaf.steps == 0:
        return None  # nothing happened: epsilon 0 under every adjacency
    if accountant == "pure":
        return (f"the pure accountant does not support subsampled-gaussian events under {adjacency.value} adjacency "
                f"(it only accounts for pure-epsilon events); use rdp, prv or pld.")
    if accountant in ("rdp", "prv") and adjacency is Adjacency.REPLACE_RECORD and leaf.sample_rate < 1.0:
        analysis = "Opacus's subsampled-Gaussian RDP analysis" if accountant == "rdp" else "prv-accountant's subsampled-Gaussian PRV"
        return (f"the {accountant} accountant does not support subsampled-gaussian events with sample_rate < 1 "
                f"under {adjacency.value} adjacency ({analysis} is for add/remove neighbours); use the pld accountant.")
    return None


def event_kind(event) -> str:
    """The type name an event serialises under (``subsampled-gaussian``, ...), for messages."""
    try:
        kind = event.to_dict().get("type")
    except Exception:  # noqa: BLE001 - no or a failing to_dict: only a message is at stake
        kind = None
    return kind if isinstance(kind, str) else type(event).__name__


def _builtin_support_error(accountant: str, event: Event, adj: Adjacency) -> str | None:
    """:meth:`Accountant.support_error` of the built-ins: every leaf of every parallel branch
    (merged as the computation merges them) must be supported under ``adj``."""
    try:
        trees = branches(event)
    except UnsupportedEventError as e:
        # an event type no accountant understands, or too many branches: a refusal, not a crash
        detail = str(e).splitlines()[0].rstrip(".") if str(e) else type(e).__name__
        return f"the {accountant} accountant does not support {event_kind(event)} events under {adj.value} adjacency ({detail})."
    for leaves in trees:
        try:
            merged = merge_leaves(leaves)
        except UnsupportedEventError:
            merged = leaves  # _leaf_error names the leaf it cannot handle
        for leaf in merged:
            reason = _leaf_error(accountant, leaf, adj)
            if reason is not None:
                return reason
        if accountant == "prv":
            n = sum(leaf.steps if isinstance(leaf, SubsampledGaussian) else leaf.count for leaf in merged)
            if n > PRV_MAX_COMPOSITIONS:
                return (f"the prv accountant supports at most {PRV_MAX_COMPOSITIONS} compositions per branch, "
                        f"got {n} ({event_kind(event)} events under {adj.value} adjacency); use rdp or pld.")
    return None


def support_error(accountant: "str | Accountant", event: Event, adjacency: "str | Adjacency" = Adjacency.ADD_REMOVE_RECORD) -> str | None:
    """Why ``accountant`` (a registered name or an :class:`Accountant`) declines ``event`` under
    ``adjacency`` (a one-line reason), or None.

    Structural only: an accountant may still decline a supported pair at compute time for a
    numerical reason (prv far in the tails), always with :class:`UnsupportedEventError`.
    """
    acc = get_accountant(accountant)
    return acc.support_error(event, Adjacency.parse(adjacency))


def supports(accountant: "str | Accountant", event: Event, adjacency: "str | Adjacency" = Adjacency.ADD_REMOVE_RECORD) -> bool:
    """True when ``accountant`` can account for ``event`` under ``adjacency`` (see :func:`support_error`)."""
    return support_error(accountant, event, adjacency) is None


def accountants_supporting(event: Event, adjacency: "str | Adjacency") -> tuple[str, ...]:
    """Names of the registered accountants that support ``(event, adjacency)``, in registration
    order (the built-ins first, in :data:`ACCOUNTANTS` order)."""
    adj = Adjacency.parse(adjacency)
    return tuple(name for name, acc in _REGISTRY.items() if acc.support_error(event, adj) is None)


# ---------------------------------------------------------------- RDP


@functools.lru_cache(maxsize=4096)
def _one_step_rdp(sample_rate: float, noise_multiplier: float, orders: tuple[float, ...]) -> np.ndarray:
    """RDP curve of ONE step of the subsampled Gaussian (Opacus's analysis, :mod:`.rdp_sgm`), read-only."""
    curve = np.asarray(compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=1, orders=list(orders)), dtype=float)
    curve.setflags(write=False)
    return curve


def rdp_curve(leaves: list, orders: tuple[float, ...] = RDP_ORDERS, adjacency: "str | Adjacency" = Adjacency.ADD_REMOVE_RECORD) -> np.ndarray:
    """Sum of the RDP curves of sequentially composed leaves at ``orders``. T steps of one
    subsampled Gaussian have T times its one-step RDP (as Opacus's ``compute_rdp`` computes it),
    so the one-step curve is computed once per (sample_rate, noise_multiplier) and scaled."""
    adj = Adjacency.parse(adjacency)
    orders = tuple(float(o) for o in orders)
    orders_arr = np.asarray(orders, dtype=float)
    total = np.zeros_like(orders_arr)
    for leaf in leaves:
        reason = _leaf_error("rdp", leaf, adj)
        if reason is not None:
            raise UnsupportedEventError(reason)
        if isinstance(leaf, SubsampledGaussian):
            if leaf.steps == 0:
                continue
            sigma = _replace_gaussian_noise(leaf, adj)
            total = total + _one_step_rdp(float(leaf.sample_rate), float(sigma), orders) * leaf.steps
        else:  # PureEpsilon
            # eps-DP implies (alpha, eps)-RDP (Mironov 2017, Prop. 3) and (alpha, alpha eps^2 / 2)-RDP
            # (Bun & Steinke 2016, Prop. 3.3); both hold, so take the smaller.
            e = leaf.epsilon
            total = total + leaf.count * np.minimum(e, orders_arr * e * e / 2.0)
    return total


def rdp_to_epsilon(curve: np.ndarray, delta: float, orders: tuple[float, ...] = RDP_ORDERS) -> tuple[float, float]:
    """(epsilon, optimal order) via Opacus's conversion (Balle et al. 2020, Thm. 21)."""
    if not np.any(curve):
        return 0.0, float(orders[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the optimum at an extreme order is not an error here
        eps, order = get_privacy_spent(orders=list(orders), rdp=list(curve), delta=delta)
    return max(0.0, float(eps)), float(order)


# ---------------------------------------------------------------- PRV


def _prv_leaf(leaf, adjacency: Adjacency = Adjacency.ADD_REMOVE_RECORD):
    import prv_accountant as pa

    reason = _leaf_error("prv", leaf, adjacency)
    if reason is not None:
        raise UnsupportedEventError(reason)
    if isinstance(leaf, SubsampledGaussian):
        sigma = _replace_gaussian_noise(leaf, adjacency)
        if leaf.sample_rate >= 1.0:
            return pa.GaussianMechanism(noise_multiplier=sigma), leaf.steps
        return pa.PoissonSubsampledGaussianMechanism(sampling_probability=leaf.sample_rate, noise_multiplier=sigma), leaf.steps
    return pa.PureDPMechanism(eps=leaf.epsilon), leaf.count


def prv_epsilon_bounds(leaves: list, delta: float, adjacency: "str | Adjacency" = Adjacency.ADD_REMOVE_RECORD) -> tuple[float, float, float]:
    """(lower, estimate, upper) epsilon of sequentially composed leaves."""
    import prv_accountant as pa

    adj = Adjacency.parse(adjacency)
    prvs, counts = [], []
    for leaf in leaves:
        prv, count = _prv_leaf(leaf, adj)
        if count > 0:
            prvs.append(prv)
            counts.append(int(count))
    if not prvs:
        return 0.0, 0.0, 0.0
    if sum(counts) > PRV_MAX_COMPOSITIONS:
        raise UnsupportedEventError(
            f"the prv accountant supports at most {PRV_MAX_COMPOSITIONS} compositions per branch, got {sum(counts)}; use rdp or pld."
        )
    delta_error = delta * PRV_DELTA_ERROR_FRACTION
    with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            # The grid PRVAccountant is about to allocate: half-width L = (RDP epsilon at
            # delta_error / 4) + 3 and its mesh (Gopi et al. 2021, Thm. 5.5 / Remark 5.6). L is
            # estimated from RDP at a few integer orders (fast; any order gives a valid RDP bound,
            # so the estimate is >= the library's L and the check never lets a larger grid
            # through); prv-accountant's own RDP pass costs seconds. Decline before allocating.
            half_width = rdp_to_epsilon(rdp_curve(leaves, orders=_PRV_GRID_ORDERS, adjacency=adj), delta_error / 4.0, orders=_PRV_GRID_ORDERS)[0] + 3.0
            mesh = PRV_EPS_ERROR / math.sqrt(sum(counts) / 2.0 * math.log(12.0 / delta_error))
            points = 2.0 * half_width / mesh
            if not math.isfinite(points) or points > PRV_MAX_GRID_POINTS:
                raise UnsupportedEventError(
                    f"the prv accountant declines: its discretisation would need {points:.3g} grid points "
                    f"(privacy loss up to {half_width:.4g}; at most {PRV_MAX_GRID_POINTS:.3g}); use rdp or pld."
                )
            acc = pa.PRVAccountant(
                prvs=prvs,
                max_self_compositions=counts,
                eps_error=PRV_EPS_ERROR,
                delta_error=delta_error,
            )
            lo, est, hi = acc.compute_epsilon(delta=delta, num_self_compositions=counts)
        except (RuntimeError, ValueError, FloatingPointError, OverflowError, MemoryError) as e:
            # e.g. "Discrete mean differs from continuous mean significantly" far out in the
            # tails (composed eps ~ 80): prv gives no bound here; callers fall back on rdp.
            raise UnsupportedEventError(f"prv-accountant could not bound these events ({str(e).splitlines()[0] if str(e) else type(e).__name__}); use rdp.") from None
    if not all(map(math.isfinite, (lo, est, hi))):
        raise UnsupportedEventError("prv-accountant returned a non-finite epsilon for these events; use the rdp accountant.")
    return float(max(lo, 0.0)), float(max(est, 0.0)), float(max(hi, 0.0))


def _prv(event: Event, delta: float, adjacency: Adjacency) -> AccountantResult:
    best = None
    for leaves in branches(event):
        b = prv_epsilon_bounds(merge_leaves(leaves), delta, adjacency)
        if best is None or b[2] > best[2]:
            best = b
    lo, est, hi = best  # type: ignore[misc]
    return AccountantResult("prv", hi, delta, adjacency.value, epsilon_lower=lo, epsilon_estimate=est)


# ---------------------------------------------------------------- PLD (dp-accounting)


def _pld_leaf(leaf, adjacency: Adjacency):
    """Pessimistic PLD of one merged leaf, or None when it spends nothing.

    SubsampledGaussian: ``from_gaussian_mechanism(std = noise_multiplier, sensitivity = 1,
    sampling_prob = q)`` in units of the clipping norm C. dp-accounting's REPLACE_ONE pair is
    ``q N(-1) + (1-q) N(0)`` vs ``q N(1) + (1-q) N(0)`` (its privacy_loss_mechanism
    AdditiveNoisePrivacyLoss docstring), i.e. our replace-one convention with ``sensitivity`` =
    the bound C on one record's contribution, not on the change of the sum (2C); its
    ADD_OR_REMOVE_ONE PLD keeps both the add and the remove pair and reports the worse.
    Without subsampling T Gaussian steps are exactly one Gaussian with noise multiplier
    s / sqrt(T) (as dp-accounting's own PLDAccountant composes GaussianDpEvent).
    PureEpsilon: ``from_privacy_parameters(eps, 0)``, the pessimistic PLD dominating every
    eps-DP pair (dp-accounting's docstring; Kairouz et al. 2015), valid under any adjacency.
    """
    from dp_accounting.pld import common
    from dp_accounting.pld import privacy_loss_distribution as pld_lib
    from dp_accounting.privacy_accountant import NeighboringRelation

    reason = _leaf_error("pld", leaf, adjacency)
    if reason is not None:
        raise UnsupportedEventError(reason)
    if isinstance(leaf, SubsampledGaussian):
        if leaf.steps == 0:
            return None
        # add-remove-user is add/remove with the user as the unit (see _leaf_error).
        relation = NeighboringRelation.REPLACE_ONE if adjacency is Adjacency.REPLACE_RECORD else NeighboringRelation.ADD_OR_REMOVE_ONE
        if leaf.sample_rate >= 1.0:
            return pld_lib.from_gaussian_mechanism(
                standard_deviation=float(leaf.noise_multiplier) / math.sqrt(leaf.steps), sensitivity=1.0,
                value_discretization_interval=PLD_VALUE_DISCRETIZATION, neighboring_relation=relation,
            )
        return pld_lib.from_gaussian_mechanism(
            standard_deviation=float(leaf.noise_multiplier), sensitivity=1.0, sampling_prob=float(leaf.sample_rate),
            value_discretization_interval=PLD_VALUE_DISCRETIZATION, neighboring_relation=relation,
        ).self_compose(int(leaf.steps))
    if leaf.count == 0:
        return None
    return pld_lib.from_privacy_parameters(
        common.DifferentialPrivacyParameters(float(leaf.epsilon), 0.0), value_discretization_interval=PLD_VALUE_DISCRETIZATION,
    ).self_compose(int(leaf.count))


def _pld_query(leaves: list, adjacency: "str | Adjacency", query: Callable, what: str) -> float:
    """``query(composed PLD)`` of sequentially composed leaves, 0.0 when nothing is spent; a
    library failure is an :class:`UnsupportedEventError`, never a number."""
    adj = Adjacency.parse(adjacency)
    total = None
    try:
        with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for leaf in leaves:
                pld = _pld_leaf(leaf, adj)
                if pld is not None:
                    total = pld if total is None else total.compose(pld)
            if total is None:
                return 0.0
            value = float(query(total))
    except (RuntimeError, ValueError, FloatingPointError, OverflowError, MemoryError) as e:
        raise UnsupportedEventError(f"dp-accounting's PLD could not bound these events ({str(e).splitlines()[0] if str(e) else type(e).__name__}).") from None
    if math.isnan(value):
        raise UnsupportedEventError(f"dp-accounting's PLD returned NaN {what} for these events.")
    return value


def pld_epsilon(leaves: list, delta: float, adjacency: "str | Adjacency" = Adjacency.ADD_REMOVE_RECORD) -> float:
    """Epsilon (an upper bound: pessimistic PLD) of sequentially composed leaves at ``delta``."""
    eps = _pld_query(leaves, adjacency, lambda pld: pld.get_epsilon_for_delta(delta), "epsilon")
    return max(0.0, eps)  # +inf is a valid (if useless) upper bound: delta below the infinite-loss mass


def pld_delta(leaves: list, epsilon: float, adjacency: "str | Adjacency" = Adjacency.ADD_REMOVE_RECORD) -> float:
    """Delta (an upper bound: pessimistic PLD) of sequentially composed leaves at ``epsilon``."""
    return min(1.0, max(0.0, _pld_query(leaves, adjacency, lambda pld: pld.get_delta_for_epsilon(epsilon), "delta")))


# ---------------------------------------------------------------- the protocol and the registry

#: What an accountant's ``epsilon`` returns (dp_accounting's name for the same idea).
EpsilonResult = AccountantResult


@dataclass(frozen=True)
class DeltaResult:
    """What an accountant says about delta at a given epsilon, under a declared adjacency."""

    accountant: str
    delta: float  # an upper bound on delta at ``epsilon``
    epsilon: float
    adjacency: str
    optimal_order: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@runtime_checkable
class Accountant(Protocol):
    """An accountant: turns an event into (epsilon, delta) under a declared adjacency.

    Privacy contract of every implementation (built-in or registered by a user):

    - ``epsilon(event, delta, adjacency)`` returns an :data:`EpsilonResult` whose ``epsilon`` is
      an *upper bound* on the privacy loss of ``event`` at ``delta`` for every pair of datasets
      that neighbour under ``adjacency``: computed for that relation and labelled with it
      (``result.adjacency == adjacency.value``), never a bound for another relation relabelled.
    - ``support_error(event, adjacency)`` is None exactly for the pairs it can bound, else a
      one-line reason naming the accountant, the event and the adjacency; ``epsilon`` refuses
      the other pairs with :class:`~dpaudit.errors.UnsupportedEventError` (never 0, never a guess).
      ``supports`` is ``support_error(...) is None``.
    - ``uses_delta``: False when the bound holds at delta 0 (pure DP); the delta argument is then
      not validated and is ignored.
    - optionally ``delta(event, epsilon, adjacency) -> DeltaResult``: an upper bound on delta at
      ``epsilon`` (the built-ins rdp, pld and pure have it; see :func:`compute_delta`).
    """

    name: str
    uses_delta: bool

    def support_error(self, event: Event, adjacency: Adjacency) -> str | None: ...

    def supports(self, event: Event, adjacency: Adjacency) -> bool: ...

    def epsilon(self, event: Event, delta: float, adjacency: Adjacency) -> AccountantResult: ...


class _BuiltinAccountant:
    """Shared behaviour of the built-ins: the support table of :func:`_leaf_error` and a refusal of
    every pair outside it, also when ``epsilon`` / ``delta`` are called directly."""

    name: str = ""
    uses_delta: bool = True

    def support_error(self, event: Event, adjacency: "str | Adjacency" = Adjacency.ADD_REMOVE_RECORD) -> str | None:
        return _builtin_support_error(self.name, event, Adjacency.parse(adjacency))

    def supports(self, event: Event, adjacency: "str | Adjacency" = Adjacency.ADD_REMOVE_RECORD) -> bool:
        return self.support_error(event, adjacency) is None

    def _checked(self, event: Event, adjacency: "str | Adjacency") -> Adjacency:
        adj = Adjacency.parse(adjacency)
        reason = self.support_error(event, adj)
        if reason is not None:
            raise UnsupportedEventError(reason)
        return adj

    def epsilon(self, event: Event, delta: float, adjacency: "str | Adjacency" = Adjacency.ADD_REMOVE_RECORD) -> AccountantResult:
        if self.uses_delta:
            open_unit("delta", delta)
        return self._epsilon(event, delta, self._checked(event, adjacency))

    def _epsilon(self, event: Event, delta: float, adj: Adjacency) -> AccountantResult:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{self.name} accountant>"


def rdp_to_delta(curve: np.ndarray, epsilon: float, orders: tuple[float, ...] = RDP_ORDERS) -> tuple[float, float]:
    """(delta, optimal order) at ``epsilon``: the conversion of :func:`rdp_to_epsilon` (Balle et
    al. 2020, Thm. 21: eps = rdp + log((a-1)/a) - (log delta + log a)/(a-1)) solved for delta at
    each order, minimised over the orders and capped at 1. At the epsilon rdp_to_epsilon returns
    for a delta, this gives that delta back (the optimal order is the same)."""
    if not np.any(curve):
        return 0.0, float(orders[0])
    a = np.asarray(orders, dtype=float)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        log_delta = (a - 1.0) * (np.asarray(curve, dtype=float) - epsilon + np.log((a - 1.0) / a)) - np.log(a)
    if np.isnan(log_delta).all():
        return 1.0, float("nan")
    i = int(np.nanargmin(log_delta))
    return float(math.exp(min(0.0, float(log_delta[i])))), float(a[i])


class RdpAccountant(_BuiltinAccountant):
    """Rényi DP (Opacus's subsampled-Gaussian analysis) over :data:`RDP_ORDERS`."""

    name = "rdp"

    def _epsilon(self, event: Event, delta: float, adj: Adjacency) -> AccountantResult:
        best_eps, best_order = 0.0, None
        for leaves in branches(event):  # parallel: the worst branch
            eps, order = rdp_to_epsilon(rdp_curve(merge_leaves(leaves), adjacency=adj), delta)
            if best_order is None or eps > best_eps:
                best_eps, best_order = eps, order
        return AccountantResult("rdp", best_eps, delta, adj.value, optimal_order=best_order)

    def delta(self, event: Event, epsilon: float, adjacency: "str | Adjacency" = Adjacency.ADD_REMOVE_RECORD) -> DeltaResult:
        eps = non_negative_finite("epsilon", epsilon)
        adj = self._checked(event, adjacency)
        worst, order = 0.0, None
        for leaves in branches(event):  # parallel: the worst branch
            d, o = rdp_to_delta(rdp_curve(merge_leaves(leaves), adjacency=adj), eps)
            if order is None or d > worst:
                worst, order = d, o
        return DeltaResult(self.name, worst, eps, adj.value, optimal_order=order)


class PrvAccountant(_BuiltinAccountant):
    """Privacy random variables (prv-accountant); the claim is the upper bound. No ``delta``:
    prv-accountant's error control is set relative to a target delta."""

    name = "prv"

    def _epsilon(self, event: Event, delta: float, adj: Adjacency) -> AccountantResult:
        return _prv(event, delta, adj)


class PldAccountant(_BuiltinAccountant):
    """Pessimistic privacy loss distributions (dp-accounting), add/remove and replace-one."""

    name = "pld"

    def _epsilon(self, event: Event, delta: float, adj: Adjacency) -> AccountantResult:
        worst = max(pld_epsilon(merge_leaves(leaves), delta, adj) for leaves in branches(event))
        return AccountantResult("pld", max(0.0, worst), delta, adj.value)

    def delta(self, event: Event, epsilon: float, adjacency: "str | Adjacency" = Adjacency.ADD_REMOVE_RECORD) -> DeltaResult:
        eps = non_negative_finite("epsilon", epsilon)
        adj = self._checked(event, adjacency)
        worst = max(pld_delta(merge_leaves(leaves), eps, adj) for leaves in branches(event))
        return DeltaResult(self.name, worst, eps, adj.value)


class PureAccountant(_BuiltinAccountant):
    """Pure epsilon-DP: delta 0, composition by summation."""

    name = "pure"
    uses_delta = False

    def _epsilon(self, event: Event, delta: float, adj: Adjacency) -> AccountantResult:
        worst = max(sum(leaf.epsilon * leaf.count for leaf in leaves if isinstance(leaf, PureEpsilon)) for leaves in branches(event))
        return AccountantResult("pure", max(0.0, worst), 0.0, adj.value)

    def delta(self, event: Event, epsilon: float, adjacency: "str | Adjacency" = Adjacency.ADD_REMOVE_RECORD) -> DeltaResult:
        """0 at epsilon >= the composed pure epsilon; below it summation gives no delta (refused)."""
        eps = non_negative_finite("epsilon", epsilon)
        adj = self._checked(event, adjacency)
        total = self._epsilon(event, 0.0, adj).epsilon
        if eps < total:
            raise UnsupportedEventError(f"the pure accountant bounds delta only at epsilon >= {total:g} (where it is 0), "
                                        f"got {eps:g}; use the pld accountant.")
        return DeltaResult(self.name, 0.0, eps, adj.value)


_REGISTRY: dict[str, Accountant] = {}
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_")
#: Names the CLI gives another meaning (``--accountant all``).
_RESERVED_NAMES = frozenset({"all"})


def register_accountant(accountant: Accountant, *, replace: bool = False) -> Accountant:
    """Add ``accountant`` to the registry (then :func:`get_accountant`, :func:`compute_epsilon`,
    :func:`accountants_supporting` and ``dpaudit account --accountant all`` see it).

    The built-ins cannot be replaced: ledgers and releases record an accountant by name, and
    "rdp" must always mean the same computation. Another user accountant of the same name is
    replaced only with ``replace=True``.
    """
    if not isinstance(accountant, Accountant):
        raise UsageError("accountant must implement the Accountant protocol (name, uses_delta, supports, support_error, "
                         f"epsilon), got {accountant!r}.")
    name = accountant.name
    if not (isinstance(name, str) and name and set(name) <= _NAME_CHARS) or name in _RESERVED_NAMES:
        raise UsageError(f"accountant name must be a non-empty string of a-z, 0-9, '-', '_' other than 'all', got {name!r}.")
    if name in ACCOUNTANTS and name in _REGISTRY:
        raise UsageError(f"accountant name must not be a built-in ({', '.join(ACCOUNTANTS)}), got {name!r}.")
    if name in _REGISTRY and not replace:
        raise UsageError(f"accountant name must be new (or pass replace=True), got {name!r}, which is already registered.")
    _REGISTRY[name] = accountant
    return accountant


def unregister_accountant(name: str) -> None:
    """Remove a user accountant from the registry (the built-ins stay)."""
    if name in ACCOUNTANTS:
        raise UsageError(f"accountant must be a user-registered one, got the built-in {name!r}.")
    if name not in _REGISTRY:
        raise UsageError(f"accountant must be one of the registered {', '.join(_REGISTRY)}, got {name!r}.")
    del _REGISTRY[name]


def accountant_names() -> tuple[str, ...]:
    """Names of the registered accountants, built-ins first."""
    return tuple(_REGISTRY)


def get_accountant(accountant: "str | Accountant") -> Accountant:
    """The registered accountant called ``accountant``; an :class:`Accountant` object is returned
    as it is (so unregistered accountants can be used directly)."""
    if isinstance(accountant, str):
        acc = _REGISTRY.get(accountant)
        if acc is None:
            raise UsageError(f"accountant must be one of {', '.join(_REGISTRY)}, got {accountant!r}.")
        return acc
    if isinstance(accountant, Accountant):
        return accountant
    raise UsageError(f"accountant must be one of {', '.join(_REGISTRY)} or an Accountant, got {accountant!r}.")


for _builtin in (RdpAccountant(), PrvAccountant(), PldAccountant(), PureAccountant()):
    register_accountant(_builtin)
del _builtin
assert tuple(_REGISTRY) == ACCOUNTANTS


def _refusal(acc: Accountant, event: Event, adj: Adjacency, reason: str) -> str:
    """One line naming the accountant, the event and the adjacency: the accountant's own reason
    when it already names the accountant and the adjacency (the built-ins' do), else with them."""
    line = (str(reason).splitlines()[0].strip() if str(reason).strip() else "") or "no reason given"
    if acc.name in line and adj.value in line:
        return line
    return f"the {acc.name} accountant does not support {event_kind(event)} events under {adj.value} adjacency: {line}"


def _checked_result(acc: Accountant, result, adj: Adjacency, field: str, asked: float):
    """An accountant's answer as it may be reported: the result type callers read, labelled with
    the accountant and with the adjacency it was asked about (a bound for another relation is
    refused, never relabelled), a number >= 0 (not NaN), and at the other parameter it was asked
    at or a stronger one (``asked``: the delta of an epsilon question, the epsilon of a delta one)."""
    kind = AccountantResult if field == "epsilon" else DeltaResult
    if not isinstance(result, kind):
        raise UnsupportedEventError(f"the {acc.name} accountant returned {type(result).__name__}, not a {kind.__name__}; "
                                    "its result is refused.")
    if result.accountant != acc.name:
        raise UnsupportedEventError(f"the {acc.name} accountant labelled its result {result.accountant!r}; its result is refused.")
    label = getattr(result, "adjacency", None)
    if label != adj.value:
        raise UnsupportedEventError(f"the {acc.name} accountant answered for {label!r} adjacency when asked about "
                                    f"{adj.value}; its result is refused.")
    value = getattr(result, field, None)
    if not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
        raise UnsupportedEventError(f"the {acc.name} accountant returned {field} {value!r}; a bound must be a number >= 0.")
    other = "delta" if field == "epsilon" else "epsilon"
    if (field == "delta" or getattr(acc, "uses_delta", True)) and not getattr(result, other) <= asked:
        raise UnsupportedEventError(f"the {acc.name} accountant answered at {other} {getattr(result, other)!r} when asked at "
                                    f"{asked!r}; its result is refused.")
    return result


def compute_epsilon(
    event: Event,
    *,
    delta: float,
    accountant: "str | Accountant" = "rdp",
    adjacency: "str | Adjacency" = Adjacency.ADD_REMOVE_RECORD,
) -> AccountantResult:
    """Epsilon of ``event`` at ``delta`` under ``adjacency`` with ``accountant`` (a registered
    name or an :class:`Accountant`; ``delta`` ignored for accountants that do not use it).

    A thin wrapper over the registry. Raises :class:`UnsupportedEventError` (one line naming the
    accountant, the event and the adjacency; for the built-ins also an accountant that supports
    the pair) when the accountant does not support ``(event, adjacency)``: the result is always
    computed under the adjacency it is labelled with, never relabelled.
    """
    adj = Adjacency.parse(adjacency)
    acc = get_accountant(accountant)
    if getattr(acc, "uses_delta", True):
        open_unit("delta", delta)
    reason = acc.support_error(event, adj)
    if reason is not None:
        raise UnsupportedEventError(_refusal(acc, event, adj, reason))
    return _checked_result(acc, acc.epsilon(event, delta, adj), adj, "epsilon", delta)


def compute_delta(
    event: Event,
    *,
    epsilon: float,
    accountant: "str | Accountant" = "rdp",
    adjacency: "str | Adjacency" = Adjacency.ADD_REMOVE_RECORD,
) -> DeltaResult:
    """An upper bound on the delta of ``event`` at ``epsilon`` under ``adjacency``, for
    accountants with a ``delta`` method (rdp, pld, pure; prv has none)."""
    adj = Adjacency.parse(adjacency)
    acc = get_accountant(accountant)
    eps = non_negative_finite("epsilon", epsilon)
    if not callable(getattr(acc, "delta", None)):
        able = [n for n, a in _REGISTRY.items() if callable(getattr(a, "delta", None))]
        raise UnsupportedEventError(f"the {acc.name} accountant cannot compute delta at a given epsilon; use {' or '.join(able)}.")
    reason = acc.support_error(event, adj)
    if reason is not None:
        raise UnsupportedEventError(_refusal(acc, event, adj, reason))
    return _checked_result(acc, acc.delta(event, eps, adj), adj, "delta", eps)


def compared_accountants(adjacency: Adjacency) -> list[str]:
    """The accountants compared side by side (``dpaudit account --accountant all``): rdp and prv;
    under replace-record also pld, the one of them that analyses the replace-one pair of a
    subsampled Gaussian (rdp / prv decline it); then every accountant registered with
    :func:`register_accountant`."""
    builtin = ["rdp", "prv", "pld"] if adjacency is Adjacency.REPLACE_RECORD else ["rdp", "prv"]
    return builtin + [name for name in accountant_names() if name not in ACCOUNTANTS]


def compare(event: Event, *, delta: float, adjacency: Adjacency, names) -> tuple[list[dict], dict]:
    """Each accountant's result for ``event`` (``AccountantResult.to_dict``) and ``{name: reason}``
    of those that decline it. With several names, one that declines this (event, adjacency) is a
    row without epsilon, never a number computed under another adjacency; a single accountant's
    refusal, or everyone's, raises :class:`UnsupportedEventError`."""
    results, skipped = [], {}
    for n in names:
        try:
            results.append(compute_epsilon(event, delta=delta, accountant=n, adjacency=adjacency).to_dict())
        except UnsupportedEventError as e:
            if len(names) == 1:
                raise
            skipped[n] = str(e).splitlines()[0] if str(e) else type(e).__name__
            results.append({"accountant": n, "epsilon": None, "delta": delta, "adjacency": adjacency.value, "epsilon_lower": None,
                            "epsilon_estimate": None, "optimal_order": None, "skipped": skipped[n]})
    if all(r["epsilon"] is None for r in results):
        raise UnsupportedEventError("no accountant could bound this run: " + "; ".join(f"{k}: {v.rstrip('.')}" for k, v in skipped.items()) + ".")
    return results, skipped


# ---------------------------------------------------------------- comparison values, computed ahead


def comparison_epsilons(event: Event, delta: float, adjacency: "str | Adjacency", accountants) -> dict:
    """``{accountant: epsilon, or "unavailable: ErrorType"}``: values recorded beside a claim, never
    the claim; the child's answer inside :func:`comparisons_ahead` of exactly these arguments."""
    ahead = _AHEAD.get()
    answer = ahead.answer(_ahead_key(event, delta, adjacency, accountants)) if ahead is not None else None
    return answer if answer is not None else _comparisons(event, delta, adjacency, accountants, ahead.memory if ahead is not None else None)


def _comparisons(event, delta, adjacency, accountants, memory=None, *, remembered_only: bool = False) -> dict | None:
    """``{accountant: epsilon or "unavailable: ErrorType"}``. ``memory``: remembered answers of
    these exact computations (``kept`` / ``lookup`` / ``store`` of :mod:`dpaudit.ledger.result_cache`),
    read first and written with each new answer; None computes every value. ``remembered_only``:
    None as soon as an accountant the memory keeps has no answer there (the others, e.g. rdp, take
    milliseconds and are computed)."""
    out = {}
    adj = Adjacency.parse(adjacency).value
    for name in accountants:
        res = memory.lookup(event, delta, name, adj) if memory is not None else None
        if res is None and remembered_only and memory.kept(name):
            return None
        if res is None:
            try:
                res = compute_epsilon(event, delta=delta, accountant=name, adjacency=adjacency)
            except Exception as e:  # noqa: BLE001 -- a comparison value only
                res = e
            if memory is not None:
                memory.store(event, delta, name, adj, res)
        out[name] = f"unavailable: {type(res).__name__}" if isinstance(res, Exception) else res.epsilon
    return out


def _remembered(memory, jobs: dict) -> dict | None:
    """Every job's comparison values when ``memory`` holds the answer of every accountant it keeps
    (then no child is needed), else None; each answer is looked up once."""
    if memory is None or not any(memory.kept(name) for *_, names in jobs.values() for name in names):
        return None
    answers = {}
    for key, args in jobs.items():
        answers[key] = _comparisons(*args, memory, remembered_only=True)
        if answers[key] is None:
            return None
    return answers


def _ahead_key(event, delta, adjacency, accountants) -> str:
    return json.dumps([event.to_dict(), repr(float(delta)), str(adjacency), list(accountants)], sort_keys=True)


class _Ahead:
    """A child process, forked at construction, writing :func:`_comparisons` of ``jobs`` (``{key:
    args}``) to a pipe; none (``pid`` None) without fork or while another thread runs (a fork
    would copy that thread's locks held), or when ``memory`` answers every job (read here)."""

    def __init__(self, jobs: dict, memory=None):
        self.answers, self.pid, self.memory = _remembered(memory, jobs), None, memory
        if self.answers is None and hasattr(os, "fork") and threading.active_count() == 1:
            r, w = os.pipe()
            self.pipe, parent, self.pid = os.fdopen(r, "rb"), os.getpid(), os.fork()
            if self.pid == 0:
                _child(self.pipe, w, parent, jobs, memory)
            os.close(w)

    def answer(self, key: str):
        if self.answers is None:
            data = self.pipe.read() if self.pid else b""
            self.close()
            try:
                self.answers = pickle.loads(data)  # from our own child, over a private pipe
            except Exception:  # noqa: BLE001 -- no answer (the child died): computed in-process
                self.answers = {}
        return self.answers.get(key)

    def close(self) -> None:
        """Stop (after an error, or when never asked) and reap the child; close the pipe."""
        if self.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.pid = None
            self.pipe.close()


def _child(pipe, w: int, parent: int, jobs: dict, memory) -> None:
    """The forked child's life: answers, then ``os._exit`` (no parent cleanup, no output flushed twice)."""
    code = 1
    try:
        pipe.close()  # so that its write fails once the parent is gone
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # Linux PR_SET_PDEATHSIG: killed when its parent dies
        with contextlib.suppress(OSError, AttributeError):
            os.nice(10)  # beside the parent's multi-threaded work (features), the parent goes first
        if os.getppid() == parent:  # else the parent died before prctl took effect
            with os.fdopen(w, "wb") as f:
                f.write(pickle.dumps({key: _comparisons(*args, memory) for key, args in jobs.items()}))
            code = 0
    finally:
        os._exit(code)


_AHEAD: contextvars.ContextVar[_Ahead | None] = contextvars.ContextVar("dpaudit_comparisons_ahead", default=None)


@contextlib.contextmanager
def comparisons_ahead(jobs, memory=None) -> Iterator[None]:
    """Within this block, :func:`comparison_epsilons` of each ``(event, delta, adjacency,
    accountants)`` of ``jobs`` (public parameters only) is computed by a child forked now, beside
    the caller's work (prv's import and composition take ~1.5 s): the same code in a copy of this
    process, so the same numbers. The child is killed and reaped when the block ends, on an error
    too; without fork, while another thread runs, or without an answer, they are computed here.

    ``memory`` (``lookup`` / ``store``, e.g. :mod:`dpaudit.ledger.result_cache`): answers of these
    exact computations remembered by earlier runs; when it holds them all, nothing is forked.
    Comparison values only: a claim is always computed afresh."""
    jobs = {_ahead_key(*job): job for job in jobs if job[3]}
    ahead = _Ahead(jobs, memory) if jobs else None
    token = _AHEAD.set(ahead)
    try:
        yield
    finally:
        _AHEAD.reset(token)
        if ahead is not None:
            ahead.close()

"""The ``prv`` accountant: numerical composition of privacy random variables (Gopi, Lee &
Wutschitz 2021) via ``prv-accountant``; it reports lower / estimate / upper, and the claim is the
upper bound. It analyses the add/remove pair: a subsampled Gaussian under replace-one is refused
(use pld), except without subsampling. No ``delta``: prv-accountant's error control is set
relative to a target delta."""

from __future__ import annotations

import math

from ..errors import UnsupportedEventError
from .adjacency import Adjacency, AdjacencyLike
from .base import ADD_REMOVE, AccountantResult, BuiltinAccountant, Event, SubsampledGaussian
from .base import add_remove_only, event_kind, first_line, quiet_numerics, replace_gaussian_noise
from .rdp import rdp_curve, rdp_to_epsilon

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
_PRV_GRID_ORDERS = tuple(map(float, "2 3 4 6 8 12 16 24 32 48 64 96 128 256 512 1024".split()))
#: prv-accountant's failures far in the tails, e.g. "Discrete mean differs from continuous mean
#: significantly" (composed eps ~ 80): it gives no bound there, and callers fall back on rdp.
_LIBRARY_FAILURES = (RuntimeError, ValueError, FloatingPointError, OverflowError, MemoryError)


def _prv_leaf(leaf, adj: Adjacency) -> tuple:
    """``(privacy random variable, self-compositions)`` of one supported leaf."""
    import prv_accountant as pa

    if not isinstance(leaf, SubsampledGaussian):
        return pa.PureDPMechanism(eps=leaf.epsilon), leaf.count
    sigma = replace_gaussian_noise(leaf, adj)
    if leaf.sample_rate >= 1.0:
        return pa.GaussianMechanism(noise_multiplier=sigma), leaf.steps
    subsampled = pa.PoissonSubsampledGaussianMechanism(
        sampling_probability=leaf.sample_rate, noise_multiplier=sigma
    )
    return subsampled, leaf.steps


def _grid_points(leaves: list, compositions: int, delta_error: float, adj: Adjacency) -> tuple:
    """``(points, L)``: the grid PRVAccountant is about to allocate, half-width L = (RDP epsilon at
    delta_error / 4) + 3 and its mesh (Gopi et al. 2021, Thm. 5.5 / Remark 5.6). L is estimated
    from RDP at a few integer orders (fast; any order gives a valid RDP bound, so the estimate is
    >= the library's L and the check never lets a larger grid through); prv-accountant's own RDP
    pass costs seconds."""
    curve = rdp_curve(leaves, orders=_PRV_GRID_ORDERS, adjacency=adj)
    half_width = rdp_to_epsilon(curve, delta_error / 4.0, orders=_PRV_GRID_ORDERS)[0] + 3.0
    mesh = PRV_EPS_ERROR / math.sqrt(compositions / 2.0 * math.log(12.0 / delta_error))
    return 2.0 * half_width / mesh, half_width


def prv_epsilon_bounds(leaves: list, delta: float, adjacency: AdjacencyLike = ADD_REMOVE) -> tuple:
    """(lower, estimate, upper) epsilon of sequentially composed leaves (refused unless the prv
    accountant supports them, its composition cap included).

    Args:
        leaves: subsampled-Gaussian and pure-epsilon leaves of one sequential branch.
        delta: in (0, 1).
        adjacency: the neighbouring relation.

    Returns:
        ``(lower, estimate, upper)`` epsilon; the upper one is the bound reported.

    Raises:
        UnsupportedEventError: leaves the prv accountant does not support, or prv-accountant fails
            on them.
    """
    import prv_accountant as pa

    adj = PRV.checked_leaves(leaves, adjacency)
    prvs, counts = [], []
    for prv, count in (_prv_leaf(leaf, adj) for leaf in leaves):
        if count > 0:
            prvs.append(prv)
            counts.append(int(count))
    if not prvs:
        return 0.0, 0.0, 0.0
    delta_error = delta * PRV_DELTA_ERROR_FRACTION
    with quiet_numerics():
        try:
            points, half_width = _grid_points(leaves, sum(counts), delta_error, adj)
            if not math.isfinite(points) or points > PRV_MAX_GRID_POINTS:  # before allocating
                raise UnsupportedEventError(
                    f"the prv accountant declines: its discretisation would need {points:.3g} grid "
                    f"points (privacy loss up to {half_width:.4g}; at most "
                    f"{PRV_MAX_GRID_POINTS:.3g}); use rdp or pld."
                )
            acc = pa.PRVAccountant(
                prvs=prvs,
                max_self_compositions=counts,
                eps_error=PRV_EPS_ERROR,
                delta_error=delta_error,
            )
            lo, est, hi = acc.compute_epsilon(delta=delta, num_self_compositions=counts)
        except _LIBRARY_FAILURES as e:
            raise UnsupportedEventError(
                f"prv-accountant could not bound these events ({first_line(e)}); use rdp."
            ) from None
    if not all(map(math.isfinite, (lo, est, hi))):
        raise UnsupportedEventError(
            "prv-accountant returned a non-finite epsilon for these events; use the rdp accountant."
        )
    return float(max(lo, 0.0)), float(max(est, 0.0)), float(max(hi, 0.0))


class PrvAccountant(BuiltinAccountant):
    """Privacy random variables (prv-accountant); the claim is the upper bound."""

    name = "prv"

    def gaussian_error(self, leaf: SubsampledGaussian, adj: Adjacency) -> str | None:
        return add_remove_only(self.name, "prv-accountant's subsampled-Gaussian PRV", leaf, adj)

    def branch_error(self, leaves: list, event: Event, adj: Adjacency) -> str | None:
        n = sum(
            leaf.steps if isinstance(leaf, SubsampledGaussian) else leaf.count for leaf in leaves
        )
        if n <= PRV_MAX_COMPOSITIONS:
            return None
        return (
            f"the prv accountant supports at most {PRV_MAX_COMPOSITIONS} compositions per "
            f"branch, got {n} ({event_kind(event)} events under {adj} adjacency); use rdp or "
            "pld."
        )

    def event_epsilon(self, event: Event, delta: float, adj: Adjacency) -> AccountantResult:
        lo, est, hi = self.worst(
            event,
            lambda leaves: prv_epsilon_bounds(leaves, delta, adj),
            key=lambda bounds: bounds[2],
        )
        return AccountantResult(
            self.name, hi, delta, adj.value, epsilon_lower=lo, epsilon_estimate=est
        )


#: The accountant whose support rules :func:`prv_epsilon_bounds` applies to its leaves.
PRV = PrvAccountant()

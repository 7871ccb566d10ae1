"""The ``rdp`` accountant: Rényi DP of the Poisson-subsampled Gaussian via Opacus's analysis
(Mironov, Talwar & Zhang 2019; :mod:`.rdp_sgm`), converted with Balle et al. 2020 (Opacus's
conversion), over the fixed order set :data:`RDP_ORDERS`. It analyses the add/remove pair: a
subsampled Gaussian under replace-one is refused (use pld), except without subsampling."""

from __future__ import annotations

import functools
import math
import warnings

from ..lazy import lazy_import
from .adjacency import Adjacency, AdjacencyLike
from .base import ADD_REMOVE, AccountantResult, BuiltinAccountant, DeltaResult, Event
from .base import SubsampledGaussian, add_remove_only, replace_gaussian_noise
from .rdp_sgm import compute_rdp, get_privacy_spent  # Opacus's analysis in numpy alone (no scipy)

np = lazy_import("numpy")

#: The RDP orders: {1.1, ..., 10.9} U {12, ..., 255} U {256, 512, ..., 16384}.
RDP_ORDERS: tuple[float, ...] = tuple(
    [round(1 + x / 10.0, 1) for x in range(1, 100)]
    + [float(a) for a in range(12, 256)]
    + [float(2**k) for k in range(8, 15)]
)


@functools.lru_cache(maxsize=4096)
def _one_step_rdp(sample_rate: float, noise_multiplier: float, orders: tuple) -> np.ndarray:
    """RDP curve of ONE step of the subsampled Gaussian (Opacus's analysis, :mod:`.rdp_sgm`),
    read-only."""
    curve = np.asarray(
        compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=1, orders=list(orders)),
        dtype=float,
    )
    curve.setflags(write=False)
    return curve


def rdp_curve(leaves: list, orders=RDP_ORDERS, adjacency: AdjacencyLike = ADD_REMOVE) -> np.ndarray:
    """Sum of the RDP curves of sequentially composed leaves at ``orders``. T steps of one
    subsampled Gaussian have T times its one-step RDP (as Opacus's ``compute_rdp`` computes it),
    so the one-step curve is computed once per (sample_rate, noise_multiplier) and scaled.

    Args:
        leaves: subsampled-Gaussian and pure-epsilon leaves of one sequential branch.
        orders: the RDP orders.
        adjacency: the neighbouring relation.

    Returns:
        The composed RDP at each order.

    Raises:
        UnsupportedEventError: a leaf the rdp accountant does not support under ``adjacency``.
    """
    adj = RDP.checked_leaves(leaves, adjacency)
    orders = tuple(float(o) for o in orders)
    orders_arr = np.asarray(orders, dtype=float)
    total = np.zeros_like(orders_arr)
    for leaf in leaves:
        if isinstance(leaf, SubsampledGaussian) and leaf.steps > 0:
            sigma = replace_gaussian_noise(leaf, adj)
            one_step = _one_step_rdp(float(leaf.sample_rate), float(sigma), orders)
            total = total + one_step * leaf.steps
        elif not isinstance(leaf, SubsampledGaussian):  # PureEpsilon
            # eps-DP implies (alpha, eps)-RDP (Mironov 2017, Prop. 3) and (alpha, alpha eps^2 /
            # 2)-RDP (Bun & Steinke 2016, Prop. 3.3); both hold, so take the smaller.
            e = leaf.epsilon
            total = total + leaf.count * np.minimum(e, orders_arr * e * e / 2.0)
    return total


def rdp_to_epsilon(curve: np.ndarray, delta: float, orders=RDP_ORDERS) -> tuple[float, float]:
    """(epsilon, optimal order) via Opacus's conversion (Balle et al. 2020, Thm. 21).

    Args:
        curve: RDP values at ``orders``.
        delta: in (0, 1).
        orders: the orders of ``curve``.

    Returns:
        ``(epsilon >= 0, the order that attains it)``.
    """
    if not np.any(curve):
        return 0.0, float(orders[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the optimum at an extreme order is not an error here
        eps, order = get_privacy_spent(orders=list(orders), rdp=list(curve), delta=delta)
    return max(0.0, float(eps)), float(order)


def rdp_to_delta(curve: np.ndarray, epsilon: float, orders=RDP_ORDERS) -> tuple[float, float]:
    """(delta, optimal order) at ``epsilon``: the conversion of :func:`rdp_to_epsilon` (Balle et
    al. 2020, Thm. 21: eps = rdp + log((a-1)/a) - (log delta + log a)/(a-1)) solved for delta at
    each order, minimised over the orders and capped at 1. At the epsilon rdp_to_epsilon returns
    for a delta, this gives that delta back (the optimal order is the same).

    Args:
        curve: RDP values at ``orders``.
        epsilon: the epsilon of the bound.
        orders: the orders of ``curve``.

    Returns:
        ``(delta in [0, 1], the order that attains it)`` (order NaN when no order gives one).
    """
    if not np.any(curve):
        return 0.0, float(orders[0])
    a = np.asarray(orders, dtype=float)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        curve = np.asarray(curve, dtype=float)
        log_delta = (a - 1.0) * (curve - epsilon + np.log((a - 1.0) / a)) - np.log(a)
    if np.isnan(log_delta).all():
        return 1.0, float("nan")
    i = int(np.nanargmin(log_delta))
    return float(math.exp(min(0.0, float(log_delta[i])))), float(a[i])


class RdpAccountant(BuiltinAccountant):
    """Rényi DP (Opacus's subsampled-Gaussian analysis) over :data:`RDP_ORDERS`."""

    name = "rdp"

    def gaussian_error(self, leaf: SubsampledGaussian, adj: Adjacency) -> str | None:
        return add_remove_only(self.name, "Opacus's subsampled-Gaussian RDP analysis", leaf, adj)

    def event_epsilon(self, event: Event, delta: float, adj: Adjacency) -> AccountantResult:
        def branch(leaves):
            return rdp_to_epsilon(rdp_curve(leaves, adjacency=adj), delta)

        eps, order = self.worst(event, branch, key=lambda answer: answer[0])
        return AccountantResult(self.name, eps, delta, adj.value, optimal_order=order)

    def delta(self, event: Event, epsilon: float, adjacency: AdjacencyLike = ADD_REMOVE):
        eps, adj = self.delta_question(event, epsilon, adjacency)

        def branch(leaves):
            return rdp_to_delta(rdp_curve(leaves, adjacency=adj), eps)

        delta, order = self.worst(event, branch, key=lambda answer: answer[0])
        return DeltaResult(self.name, delta, eps, adj.value, optimal_order=order)


#: The accountant whose support rules :func:`rdp_curve` applies to its leaves.
RDP = RdpAccountant()

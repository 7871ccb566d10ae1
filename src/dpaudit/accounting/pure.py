"""The ``pure`` accountant: pure epsilon-DP, delta = 0, composition by summation. It accounts
only for pure-epsilon events (and subsampled Gaussians of 0 steps, which spend nothing)."""

from __future__ import annotations

from ..errors import UnsupportedEventError
from .adjacency import Adjacency, AdjacencyLike
from .base import ADD_REMOVE, AccountantResult, BuiltinAccountant, DeltaResult, Event, PureEpsilon
from .base import SubsampledGaussian, branches, unsupported


class PureAccountant(BuiltinAccountant):
    """Pure epsilon-DP: delta 0, composition by summation."""

    name = "pure"
    uses_delta = False

    def gaussian_error(self, leaf: SubsampledGaussian, adj: Adjacency) -> str | None:
        return (
            f"{unsupported(self.name, leaf, adj)} (it only accounts for pure-epsilon events); "
            "use rdp, prv or pld."
        )

    def event_epsilon(self, event: Event, delta: float, adj: Adjacency) -> AccountantResult:
        # summed as the leaves come (merging would sum epsilon * (c1 + c2) instead)
        worst = max(
            sum(leaf.epsilon * leaf.count for leaf in leaves if isinstance(leaf, PureEpsilon))
            for leaves in branches(event)
        )
        return AccountantResult(self.name, max(0.0, worst), 0.0, adj.value)

    def delta(self, event: Event, epsilon: float, adjacency: AdjacencyLike = ADD_REMOVE):
        """0 at epsilon >= the composed pure epsilon; below, summation gives no delta (refused)."""
        eps, adj = self.delta_question(event, epsilon, adjacency)
        total = self.event_epsilon(event, 0.0, adj).epsilon
        if eps < total:
            raise UnsupportedEventError(
                f"the pure accountant bounds delta only at epsilon >= "
                f"{total:g} (where it is 0), got {eps:g}; use the pld "
                "accountant."
            )
        return DeltaResult(self.name, 0.0, eps, adj.value)

"""Guarantees as data: immutable privacy events that any accountant can recompute later.

In the spirit of Google's dp_accounting ``DpEvent``: a release stores *what was done*
(mechanism parameters), not only an epsilon, so later composition in the ledger is exact.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UnsupportedEventError
from ..validation import half_open_unit, non_negative_int, positive_finite


@dataclass(frozen=True)
class SubsampledGaussian:
    """``steps`` (T) applications of the Gaussian mechanism, with noise std ``noise_multiplier``
    times the L2 sensitivity (clipping norm), on a Poisson subsample of rate ``sample_rate`` (q;
    1.0: none)."""

    noise_multiplier: float
    sample_rate: float
    steps: int

    def __post_init__(self) -> None:
        positive_finite("noise_multiplier", self.noise_multiplier)
        half_open_unit("sample_rate", self.sample_rate)
        non_negative_int("steps", self.steps)

    def to_dict(self) -> dict:
        return {
            "type": "subsampled-gaussian",
            "noise_multiplier": float(self.noise_multiplier),
            "sample_rate": float(self.sample_rate),
            "steps": int(self.steps),
        }


@dataclass(frozen=True)
class PureEpsilon:
    """A pure epsilon-DP mechanism (e.g. Laplace), applied ``count`` times."""

    epsilon: float
    count: int = 1

    def __post_init__(self) -> None:
        positive_finite("epsilon", self.epsilon)
        non_negative_int("count", self.count)

    def to_dict(self) -> dict:
        return {"type": "pure-epsilon", "epsilon": float(self.epsilon), "count": int(self.count)}


@dataclass(frozen=True)
class Composed:
    """Sequential composition: all events touch the same records."""

    events: tuple

    def to_dict(self) -> dict:
        return {"type": "composed", "events": [e.to_dict() for e in self.events]}


@dataclass(frozen=True)
class Parallel:
    """Parallel composition: each event touches a disjoint part of the data (guarantee = max)."""

    events: tuple

    def to_dict(self) -> dict:
        return {"type": "parallel", "events": [e.to_dict() for e in self.events]}


Event = SubsampledGaussian | PureEpsilon | Composed | Parallel
_NODES = {"composed": Composed, "parallel": Parallel}


def event_from_dict(data: dict) -> Event:
    """Inverse of ``to_dict``; an unknown event type is an error, never epsilon 0."""
    kind = data.get("type") if isinstance(data, dict) else None
    if kind == "subsampled-gaussian":
        noise, rate = float(data["noise_multiplier"]), float(data["sample_rate"])
        return SubsampledGaussian(noise, rate, int(data["steps"]))
    if kind == "pure-epsilon":
        return PureEpsilon(epsilon=float(data["epsilon"]), count=int(data.get("count", 1)))
    if kind in ("composed", "parallel"):  # compared, not hashed: a type may be any JSON value
        return _NODES[kind](tuple(event_from_dict(e) for e in data["events"]))
    raise UnsupportedEventError(
        "event type must be one of subsampled-gaussian, pure-epsilon, "
        f"composed, parallel, got {kind!r}."
    )

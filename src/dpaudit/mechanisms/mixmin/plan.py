"""A-priori guideline for the mixture-learning fraction rho (DP-MixMin paper, appendix A.2).

With T = rho * N private examples for mixture learning and k public sources, the DP-SCO trade-off of Lemma 4.1 reads alpha =
O(1/sqrt(T) + sqrt(k ln(1/delta)) / (epsilon T)) (eq. 4). Asking each term to contribute at most alpha / 2 gives (eqs. 5-7):
  statistics-limited size   T_stat = 4 / alpha^2
  privacy-limited size      T_priv = 2 sqrt(k ln(1/delta)) / (epsilon alpha)
  T >= max(T_stat, T_priv),  rho = T / N,
and the two regimes cross at epsilon* = (alpha / 2) sqrt(k ln(1/delta)). Constants inside O(.) are dropped, exactly as in the
paper: this is a guideline for sizing rho, not a guarantee."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ...validation import half_open_unit, open_unit, positive_finite, positive_int


@dataclass(frozen=True)
class RhoPlan:
    n: int
    k: int
    epsilon: float
    delta: float
    alpha: float
    statistics_limited_size: float  # 4 / alpha^2
    privacy_limited_size: float  # 2 sqrt(k ln(1/delta)) / (epsilon alpha)
    required_size: float  # the max of the two
    regime: str  # "statistics-limited" or "privacy-limited"
    epsilon_crossover: float  # (alpha / 2) sqrt(k ln(1/delta))
    rho: float  # required_size / n (may exceed 1: not enough data for this alpha)
    feasible: bool  # rho <= 1
    rho_given: float | None = None
    alpha_at_rho_given: float | None = None  # the excess error the guideline predicts for rho_given

    def to_dict(self) -> dict:
        return asdict(self)


def alpha_for_size(size: float, *, k: int, epsilon: float, delta: float) -> float:
    """Smallest alpha whose two terms are each <= alpha/2 at ``size`` mixing examples (eq. 5-6)."""
    size = positive_finite("size", size)
    return max(2.0 / math.sqrt(size), 2.0 * math.sqrt(k * math.log(1.0 / delta)) / (epsilon * size))


def plan_rho(
    *, n: int, k: int, epsilon: float, delta: float, alpha: float, rho: float | None = None
) -> RhoPlan:
    """Sizes and the fraction rho of N private records needed for excess error ``alpha`` (A.2)."""
    n = positive_int("n", n)
    k = positive_int("k", k)
    epsilon = positive_finite("epsilon", epsilon)
    delta = open_unit("delta", delta)
    alpha = positive_finite("alpha", alpha)
    if rho is not None:
        rho = half_open_unit("rho", rho)
    root = math.sqrt(k * math.log(1.0 / delta))
    t_stat = 4.0 / alpha**2
    t_priv = 2.0 * root / (epsilon * alpha)
    t_req = max(t_stat, t_priv)
    return RhoPlan(
        n=n,
        k=k,
        epsilon=epsilon,
        delta=delta,
        alpha=alpha,
        statistics_limited_size=t_stat,
        privacy_limited_size=t_priv,
        required_size=t_req,
        regime="statistics-limited" if t_stat >= t_priv else "privacy-limited",
        epsilon_crossover=alpha / 2.0 * root,
        rho=t_req / n,
        feasible=t_req <= n,
        rho_given=rho,
        alpha_at_rho_given=None
        if rho is None
        else alpha_for_size(rho * n, k=k, epsilon=epsilon, delta=delta),
    )

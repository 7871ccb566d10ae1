"""Small, independent statistics the report uses to cross-check audit records.

Nothing here replaces the audit module: the report re-derives the Clopper–Pearson bound (its
formula: docs/architecture.md, "Audit statistics") and the *ceiling* (that bound at perfect
separation with the same trial counts: no audit with these many EVAL trials can certify more)
from the counts an audit stored, so a reviewer sees them even when a record omits them, and a
stored number that disagrees with its counts is flagged.
"""

from __future__ import annotations

import math
from typing import Sequence

from ..lazy import lazy_import

np = lazy_import("numpy")
special = lazy_import("scipy.special")


def cp_upper(k: int, n: int, alpha: float) -> float:
    """One-sided (1 - alpha) Clopper–Pearson upper bound on a rate with ``k`` events in ``n`` trials:
    the (1 - alpha) quantile of Beta(k + 1, n - k); 1 when k = n or n = 0 (no information). It is
    ``scipy.special.betaincinv``, the same numbers as ``scipy.stats.beta.ppf`` without importing
    scipy.stats (about a second of a report)."""
    if n <= 0 or k >= n:
        return 1.0
    return float(special.betaincinv(float(k + 1), float(n - k), 1.0 - alpha))


def _log_ratio(num: float, den: float) -> float:
    return 0.0 if num <= 0.0 else math.inf if den <= 0.0 else math.log(num) - math.log(den)


def epsilon_lower_bound(
    *, tp: int, fp: int, tn: int, fn: int, delta: float, confidence: float
) -> float:
    """Clopper–Pearson epsilon lower bound from EVAL counts (significance split over 2 bounds)."""
    alpha = (1.0 - confidence) / 2.0
    fpr_hi = cp_upper(fp, fp + tn, alpha)
    fnr_hi = cp_upper(fn, fn + tp, alpha)
    return max(
        0.0, _log_ratio(1.0 - delta - fnr_hi, fpr_hi), _log_ratio(1.0 - delta - fpr_hi, fnr_hi)
    )


def ceiling(*, n_in: int, n_out: int, delta: float, confidence: float) -> float:
    """Largest eps_LB these trial counts can certify (perfect separation, 0 errors)."""
    return epsilon_lower_bound(tp=n_in, fp=0, tn=n_out, fn=0, delta=delta, confidence=confidence)


def mean_sd(values: Sequence[float]) -> tuple[float, float | None, int]:
    """Mean, sample standard deviation (ddof = 1; None for a single value) and count."""
    arr = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if arr.size == 0:
        return math.nan, None, 0
    sd = float(arr.std(ddof=1)) if arr.size > 1 else None
    return float(arr.mean()), sd, int(arr.size)

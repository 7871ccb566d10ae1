"""Small, independent statistics the report uses to cross-check audit records.

Nothing here replaces the audit module: the report re-derives a few numbers from the raw
counts and scores an audit stored (Clopper–Pearson bounds, the ceiling, ROC points, histograms)
so that a reviewer sees them even when an audit record omits them, and so that a stored
number that disagrees with its own counts is flagged rather than trusted silently.

Audit bound (docs/architecture.md, "Audit statistics"; Jagielski et al. 2020; Nasr et al. 2021): with
one-sided Clopper–Pearson upper bounds FPR_hi, FNR_hi at total confidence ``1 - a`` (``a``
split evenly across the two bounds),

    eps_LB = max(0, ln((1 - delta - FNR_hi) / FPR_hi), ln((1 - delta - FPR_hi) / FNR_hi)).

The *ceiling* is that bound at perfect separation (0 errors) with the same trial counts: no
audit with these many EVAL trials can certify a larger epsilon.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def cp_upper(k: int, n: int, alpha: float) -> float:
    """One-sided (1 - alpha) Clopper–Pearson upper bound on a rate with ``k`` events in ``n`` trials.

    The (1 - alpha) quantile of Beta(k + 1, n - k); 1 when k = n; 1 when n = 0 (no information).
    """
    from scipy.stats import beta

    if n <= 0 or k >= n:
        return 1.0
    return float(beta.ppf(1.0 - alpha, float(k + 1), float(n - k)))


def _log_ratio(num: float, den: float) -> float:
    if num <= 0.0:
        return 0.0
    if den <= 0.0:
        return math.inf
    return math.log(num) - math.log(den)


def epsilon_lower_bound(*, tp: int, fp: int, tn: int, fn: int, delta: float, confidence: float) -> float:
    """Clopper–Pearson epsilon lower bound from EVAL counts (significance split over 2 bounds)."""
    alpha = (1.0 - confidence) / 2.0
    fpr_hi = cp_upper(fp, fp + tn, alpha)
    fnr_hi = cp_upper(fn, fn + tp, alpha)
    return max(0.0, _log_ratio(1.0 - delta - fnr_hi, fpr_hi), _log_ratio(1.0 - delta - fpr_hi, fnr_hi))


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


def roc_points(scores: np.ndarray, worlds: np.ndarray, max_points: int = 400) -> dict:
    """ROC of the rule "say IN when score >= t" over all thresholds t.

    ``worlds`` holds 1 (canary in) / 0 (canary out). Returns fpr, tpr (both ascending, starting
    at (0, 0) and ending at (1, 1)), the AUC (trapezoids; ties count half) and the counts. At
    most ``max_points`` points are kept, thinned on a log grid of FPR so the low-FPR region
    that matters on log-log axes keeps its detail.
    """
    scores = np.asarray(scores, dtype=float).ravel()
    worlds = np.asarray(worlds).astype(bool).ravel()
    n_in, n_out = int(worlds.sum()), int((~worlds).sum())
    if n_in == 0 or n_out == 0:
        return {"fpr": [], "tpr": [], "auc": None, "n_in": n_in, "n_out": n_out}
    order = np.argsort(-scores, kind="mergesort")
    s, w = scores[order], worlds[order]
    # one point per distinct threshold (the last index of each run of equal scores)
    last = np.r_[np.nonzero(np.diff(s))[0], s.size - 1]
    tp = np.cumsum(w)[last]
    fp = np.cumsum(~w)[last]
    tpr = np.r_[0.0, tp / n_in]
    fpr = np.r_[0.0, fp / n_out]
    auc = float(np.trapezoid(tpr, fpr)) if hasattr(np, "trapezoid") else float(np.trapz(tpr, fpr))
    if fpr.size > max_points:
        keep = {0, fpr.size - 1}
        grid = np.unique(np.r_[np.geomspace(1.0 / n_out, 1.0, max_points - 2)])
        idx = np.searchsorted(fpr, grid, side="left")
        keep.update(int(i) for i in np.clip(idx, 0, fpr.size - 1))
        keep.update(int(i) for i in np.clip(idx - 1, 0, fpr.size - 1))
        sel = np.array(sorted(keep))
        fpr, tpr = fpr[sel], tpr[sel]
    return {"fpr": fpr.tolist(), "tpr": tpr.tolist(), "auc": auc, "n_in": n_in, "n_out": n_out}


def histograms(scores: np.ndarray, worlds: np.ndarray, bins: int = 40) -> dict:
    """Counts of scores per world on common bin edges (for the in/out histogram)."""
    scores = np.asarray(scores, dtype=float).ravel()
    worlds = np.asarray(worlds).astype(bool).ravel()
    finite = np.isfinite(scores)
    s, w = scores[finite], worlds[finite]
    if s.size == 0:
        return {"edges": [], "in": [], "out": [], "n_in": 0, "n_out": 0, "dropped_non_finite": int((~finite).sum())}
    lo, hi = float(s.min()), float(s.max())
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    edges = np.linspace(lo, hi, bins + 1)
    c_in, _ = np.histogram(s[w], bins=edges)
    c_out, _ = np.histogram(s[~w], bins=edges)
    return {
        "edges": edges.tolist(), "in": c_in.tolist(), "out": c_out.tolist(),
        "n_in": int(w.sum()), "n_out": int((~w).sum()), "dropped_non_finite": int((~finite).sum()),
    }

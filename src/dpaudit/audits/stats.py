"""Audit statistics: Clopper–Pearson bounds, the empirical epsilon lower bound, ROC, GDP estimate.

The method is Jagielski, Ullman & Oprea (2020), "Auditing differentially private machine
learning: how private is private SGD?", as used in appendix A.8 of the DP-MixMin paper
(Tables 16-17): a distinguishing test "was the canary in?" is run on R trials; its false
positive and false negative rates, bounded from above with one-sided Clopper–Pearson intervals,
lower-bound epsilon through the (epsilon, delta)-DP hypothesis-testing inequalities

    1 - FNR <= e^eps * FPR + delta   and   1 - FPR <= e^eps * FNR + delta,

so  eps_LB = max(0, ln((1 - delta - FNR_hi) / FPR_hi), ln((1 - delta - FPR_hi) / FNR_hi)).

Soundness rests on three choices made here, each a known pitfall elsewhere:
  - the delta term is kept (dropping it inflates eps_LB);
  - the threshold and direction are chosen on SELECT trials and the bound is computed on the
    disjoint EVAL trials (choosing on the evaluated trials biases eps_LB upwards);
  - the significance 1 - confidence is split between the two bounds (union bound), so
    (FPR_hi, FNR_hi) hold *jointly* with probability >= confidence.

The Gaussian-DP estimate (Dong, Roth & Su 2019) is a point estimate, not a bound: it assumes
the scores behave like a Gaussian shift. mu is estimated from ranks (AUC = Phi(mu / sqrt 2) for
a unit-variance Gaussian shift), so it is invariant to monotone transforms of the score and is
~0 on null scores (AUC ~ 1/2) instead of reporting large epsilon from a noisy variance ratio.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from ..errors import DataError, UsageError
from ..lazy import lazy_import
from ..noise import public_rng
from ..validation import non_negative_finite, one_of, open_unit, positive_finite, positive_int

np = lazy_import("numpy")
optimize = lazy_import("scipy.optimize")
special = lazy_import("scipy.special")

DIRECTIONS = ("greater", "less")  # "greater": predict "canary in" when score >= threshold
#: delta at which the GDP estimate is stated for pure-DP (delta = 0) claims
GDP_FALLBACK_DELTA = 1e-5


def _check_delta(delta: float) -> float:
    d = non_negative_finite("delta", delta)
    if d >= 1:
        raise UsageError(f"delta must be in [0, 1), got {delta!r}.")
    return d


def cp_upper(errors, trials, confidence: float = 0.95, *, split: int = 2):
    """One-sided Clopper–Pearson upper bound(s) on an error rate.

    Each bound holds with probability >= 1 - (1 - confidence) / split, so ``split`` bounds hold
    jointly with probability >= confidence (union bound). For k errors in n trials the bound is the
    (1 - a) quantile of Beta(k + 1, n - k), and 1 when k = n; computed as
    ``scipy.special.betainccinv(k + 1, n - k, a)``, the very call behind statsmodels'
    ``proportion_confint(method="beta")`` (tests compare the two). Vectorised over arrays of
    ``errors`` / ``trials``.
    """
    confidence = open_unit("confidence", confidence)
    a = (1.0 - confidence) / split  # one-sided significance of each bound
    k = np.asarray(errors, dtype=float)
    n = np.asarray(trials, dtype=float)
    if np.any(n < 1) or np.any(k < 0) or np.any(k > n):
        raise UsageError(
            f"errors must be in [0, trials] with trials >= 1, got errors={errors!r}, trials={trials!r}."
        )
    upper = np.where(k >= n, 1.0, _cp_quantile(k, n, a))
    return float(upper) if np.ndim(upper) == 0 else np.asarray(upper, dtype=float)


def _cp_quantile(k, n, a):
    """The (1 - a) quantile of Beta(k + 1, n - k) (n - k floored at 1; the caller sets k = n to 1)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return special.betainccinv(k + 1.0, np.maximum(n - k, 1.0), a)


def epsilon_from_rates(fpr_hi, fnr_hi, delta: float):
    """eps_LB from upper bounds on FPR and FNR (vectorised); 0 when no test beats chance."""
    fpr = np.asarray(fpr_hi, dtype=float)
    fnr = np.asarray(fnr_hi, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.log(np.maximum(1.0 - delta - fnr, 0.0)) - np.log(fpr)
        b = np.log(np.maximum(1.0 - delta - fpr, 0.0)) - np.log(fnr)
    finite = functools.partial(np.nan_to_num, nan=0.0, neginf=0.0)
    eps = np.maximum(0.0, np.fmax(finite(a), finite(b)))
    return float(eps) if np.ndim(eps) == 0 else eps


@dataclass(frozen=True)
class Bound:
    """eps_LB of one threshold test evaluated on a set of trials."""

    epsilon: float
    fpr_upper: float
    fnr_upper: float
    tp: int
    fp: int
    tn: int
    fn: int

    @property
    def counts(self) -> dict:
        return {"tp": self.tp, "fp": self.fp, "tn": self.tn, "fn": self.fn}


def epsilon_lower_bound(
    *, tp: int, fp: int, tn: int, fn: int, delta: float, confidence: float = 0.95
) -> Bound:
    """eps_LB at ``confidence`` from a test's confusion counts (positives = canary-in trials)."""
    delta = _check_delta(delta)
    n_pos, n_neg = _require_worlds(tp + fn, tn + fp)
    fpr_hi = cp_upper(fp, n_neg, confidence)
    fnr_hi = cp_upper(fn, n_pos, confidence)
    counts = (int(tp), int(fp), int(tn), int(fn))
    return Bound(epsilon_from_rates(fpr_hi, fnr_hi, delta), fpr_hi, fnr_hi, *counts)


def ceiling(n_in: int, n_out: int, *, delta: float, confidence: float = 0.95) -> float:
    """The largest eps_LB ``n_in`` + ``n_out`` EVAL trials can certify (a perfect test).

    At 95 % with delta = 1e-5 it is ~3.3 for 100 trials per world, ~4.9 for 500, ~5.6 for 1,000:
    an audit whose ceiling is below the claim cannot detect a violation at all.
    """
    return epsilon_lower_bound(
        tp=n_in, fp=0, tn=n_out, fn=0, delta=delta, confidence=confidence
    ).epsilon


def bisect(holds, lo: float, hi: float, *, tol: float = 0.0, steps: int = 64) -> tuple:
    """The last bracket (lo, hi) of halving [lo, hi] ``steps`` times, or until it is no wider than
    ``tol``, keeping ``holds`` true at lo and false at hi (the one bisection of the audits)."""
    for _ in range(steps):
        if hi - lo <= tol:
            break
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if holds(mid) else (lo, mid)
    return lo, hi


def _check_scores(scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=float).ravel()
    y = np.asarray(labels, dtype=bool).ravel()
    if s.shape != y.shape:
        raise UsageError(f"scores and labels must have the same length, got {s.size} and {y.size}.")
    return finite_scores(s), y


def finite_scores(s: np.ndarray) -> np.ndarray:
    """``s``, refused (DataError) when any score is not finite."""
    bad = int(np.sum(~np.isfinite(s)))
    if bad:
        raise DataError(
            f"scores must be finite, got {bad} non-finite of {s.size} (the mechanism diverged or the score is broken)."
        )
    return s


def _worlds(y: np.ndarray, what: str = "") -> tuple[int, int]:
    """(canary-in, canary-out) trial counts of the labels ``y``; UsageError unless both are >= 1."""
    return _require_worlds(int(y.sum()), int((~y).sum()), what)


def _require_worlds(n_pos: int, n_neg: int, what: str = "") -> tuple[int, int]:
    """(n_pos, n_neg), refused unless both worlds have at least one trial."""
    if n_pos < 1 or n_neg < 1:
        raise UsageError(
            f"{what}trials per world must be >= 1, got {n_pos} with and {n_neg} without the canary."
        )
    return n_pos, n_neg


def confusion(scores, labels, threshold: float, direction: str) -> tuple[int, int, int, int]:
    """(tp, fp, tn, fn) of the rule "canary in iff score >= threshold" (or <= for ``less``)."""
    s, y = _check_scores(scores, labels)
    one_of("direction", direction, DIRECTIONS)
    pred = s >= threshold if direction == "greater" else s <= threshold
    tp = int(np.sum(pred & y))
    fp = int(np.sum(pred & ~y))
    return tp, fp, int(np.sum(~y)) - fp, int(np.sum(y)) - tp


def rule_counts(s: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Candidate thresholds (midpoints of distinct scores and +-inf) and, for the rule
    "in iff score >= t", the true-positive and false-positive counts at each, from cumulative counts."""
    u = np.unique(s)
    cands = np.concatenate([[-np.inf], (u[:-1] + u[1:]) / 2.0, [np.inf]])
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    tp_ge = n_pos - np.searchsorted(np.sort(s[y]), cands, side="left")
    fp_ge = n_neg - np.searchsorted(np.sort(s[~y]), cands, side="left")
    return cands, tp_ge, fp_ge, u.size


@dataclass(frozen=True)
class Threshold:
    threshold: float
    direction: str
    # eps_LB of this rule on the SELECT trials (biased upwards; for information)
    select_epsilon: float


def best_rule(
    s: np.ndarray, y: np.ndarray, criterion, confidence: float
) -> tuple[float, str, float]:
    """(threshold, direction, criterion) of the rule on these (SELECT) trials maximising ``criterion(fpr_hi, fnr_hi)`` of
    its one-sided Clopper–Pearson upper bounds (significance split in two). Candidates are midpoints between consecutive
    distinct scores plus +-inf, in both directions, all evaluated at once from cumulative counts. Ties (e.g. all eps_LB = 0
    on null scores) are broken by the largest |TPR - FPR| (Youden), then by the rule closest to the median score."""
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    cands, pos_ge, neg_ge, _ = rule_counts(s, y)
    closeness = -np.abs(np.where(np.isfinite(cands), cands, np.sign(cands) * 1e300) - np.median(s))
    # the bounds for every possible error count, once per world, then looked up (the same numbers, a fraction of the time)
    fpr_table = np.atleast_1d(cp_upper(np.arange(n_neg + 1), np.full(n_neg + 1, n_neg), confidence))
    fnr_table = np.atleast_1d(cp_upper(np.arange(n_pos + 1), np.full(n_pos + 1, n_pos), confidence))
    best: tuple | None = None
    for direction in DIRECTIONS:
        # "less": predicted in iff s <= t; with midpoint thresholds no score equals t except +-inf
        tp, fp = (pos_ge, neg_ge) if direction == "greater" else (n_pos - pos_ge, n_neg - neg_ge)
        crit = np.nan_to_num(
            criterion(fpr_table[fp], fnr_table[n_pos - tp]), nan=-np.inf, posinf=np.inf
        )
        youden = np.abs(tp / n_pos - fp / n_neg)
        i = int(np.lexsort((closeness, youden, crit))[-1])  # last key is primary
        key = (float(crit[i]), float(youden[i]), float(closeness[i]))
        if best is None or key > best[0]:
            best = (key, float(cands[i]), direction)
    assert best is not None
    return best[1], best[2], best[0][0]


def select_threshold(scores, labels, *, delta: float, confidence: float = 0.95) -> Threshold:
    """Choose threshold and direction on SELECT trials: the rule with the largest eps_LB there (:func:`best_rule`)."""
    s, y = _check_scores(scores, labels)
    _worlds(y, "SELECT ")
    return Threshold(
        *best_rule(s, y, lambda fpr, fnr: epsilon_from_rates(fpr, fnr, delta), confidence)
    )


def roc(scores, labels, direction: str = "greater", *, max_points: int = 512) -> dict:
    """ROC points (fpr, tpr) and AUC of the oriented score (higher = more likely "in").

    AUC is the Mann–Whitney statistic with ties counted 1/2. Points are the distinct-score
    vertices, thinned to at most ``max_points`` (the two ends always kept).
    """
    s, y = _check_scores(scores, labels)
    o = s if direction == "greater" else -s
    if y.all() or (~y).all():
        raise UsageError("ROC needs trials from both worlds.")
    fpr, tpr = thinned(max_points, *roc_vertices(o, y))
    auc = mann_whitney_u(o[y], o[~y]) / (int(y.sum()) * int((~y).sum()))
    return {"fpr": fpr.tolist(), "tpr": tpr.tolist(), "auc": auc}


def thinned(max_points: int, *rates: np.ndarray) -> tuple[np.ndarray, ...]:
    """Equal-length ``rates`` at no more than ``max_points`` evenly spaced indices (both ends kept)."""
    if rates[0].size <= max_points:
        return rates
    idx = np.unique(np.linspace(0, rates[0].size - 1, max_points).round().astype(int))
    return tuple(r[idx] for r in rates)


def roc_vertices(scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(fpr, tpr) of the rules "score >= t" over the distinct scores t, highest first, starting at
    (0, 0); points in the middle of a straight segment are left out (the corners and both ends
    remain), which is what scikit-learn's ``roc_curve(drop_intermediate=True)`` returns."""
    order = np.argsort(-scores, kind="mergesort")
    s, y = scores[order], labels[order]
    # last index of each run of equal scores
    last = np.r_[np.flatnonzero(s[1:] != s[:-1]), s.size - 1]
    tps = np.cumsum(y)[last].astype(float)
    fps = (last + 1) - tps
    if tps.size > 2:
        corner = np.r_[True, (np.diff(fps, 2) != 0) | (np.diff(tps, 2) != 0), True]
        tps, fps = tps[corner], fps[corner]
    tps, fps = np.r_[0.0, tps], np.r_[0.0, fps]
    return fps / fps[-1], tps / tps[-1]


# ---------------------------------------------------------------- Gaussian differential privacy


def gdp_delta(epsilon: float, mu: float) -> float:
    """delta(eps) of mu-GDP, = the analytic Gaussian mechanism with sensitivity/sigma = mu.

    delta = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu)  (Balle & Wang 2018, Thm 8;
    Dong, Roth & Su 2019, Cor. 2.13), evaluated in log space so tiny deltas do not cancel.
    """
    epsilon = float(epsilon)
    if mu <= 0:
        return 0.0
    la = special.log_ndtr(mu / 2.0 - epsilon / mu)
    lb = special.log_ndtr(-mu / 2.0 - epsilon / mu)
    diff = epsilon + lb - la  # <= 0 always
    return float(math.exp(la) * -math.expm1(min(diff, 0.0)))


def gdp_epsilon(mu: float, delta: float) -> float:
    """Smallest eps with gdp_delta(eps, mu) <= delta (0 when mu = 0). Exact up to 1e-12 relative."""
    mu = non_negative_finite("mu", mu)
    delta = open_unit("delta", delta)
    if mu == 0.0 or gdp_delta(0.0, mu) <= delta:
        return 0.0
    hi = max(1.0, mu * mu)
    while gdp_delta(hi, mu) > delta:
        hi *= 2.0
    root = optimize.brentq(
        lambda e: gdp_delta(e, mu) - delta, 0.0, hi, xtol=1e-14, rtol=1e-12, maxiter=500
    )
    return float(root)


def gdp_mu_for_epsilon(epsilon: float, delta: float) -> float:
    """The mu (= sensitivity / sigma) whose exact (eps, delta) curve passes through (epsilon, delta)."""
    epsilon = positive_finite("epsilon", epsilon)
    delta = open_unit("delta", delta)
    lo, hi = 1e-8, 1.0
    while gdp_delta(epsilon, hi) < delta:
        hi *= 2.0
    root = optimize.brentq(
        lambda m: gdp_delta(epsilon, m) - delta, lo, hi, xtol=1e-14, rtol=1e-13, maxiter=500
    )
    return float(root)


def mann_whitney_u(x, y) -> float:
    """Mann–Whitney U of ``x`` against ``y``: pairs with x > y, ties counting one half (the
    statistic of ``scipy.stats.mannwhitneyu``, from mid-ranks; numpy only, no scipy.stats import)."""
    x, y = np.asarray(x, dtype=float).ravel(), np.asarray(y, dtype=float).ravel()
    v = np.concatenate([x, y])
    order = np.argsort(v, kind="mergesort")
    sv = v[order]
    # first position of each run of equal values
    starts = np.flatnonzero(np.r_[True, sv[1:] != sv[:-1]])
    ends = np.r_[starts[1:], sv.size]
    mid = (starts + ends + 1) / 2.0  # mean of the 1-based ranks starts+1 .. ends
    ranks = np.empty(v.size)
    ranks[order] = np.repeat(mid, ends - starts)
    return float(ranks[: x.size].sum() - x.size * (x.size + 1) / 2.0)


def auc_variance(auc: float, n_pos: int, n_neg: int) -> float:
    """Hanley & McNeil (1982) variance of the Mann–Whitney AUC."""
    q1 = auc / (2.0 - auc)
    q2 = 2.0 * auc * auc / (1.0 + auc)
    return max(
        (auc * (1 - auc) + (n_pos - 1) * (q1 - auc * auc) + (n_neg - 1) * (q2 - auc * auc))
        / (n_pos * n_neg),
        0.0,
    )


def gdp_estimate(scores, labels, direction: str, *, delta: float, confidence: float = 0.95) -> dict:
    """Gaussian-DP ESTIMATE of epsilon (not a bound): mu = sqrt(2) Phi^-1(AUC), eps = eps_mu(delta).

    The AUC is computed with the orientation chosen on SELECT; AUC <= 1/2 gives mu = 0. The
    interval propagates the Hanley–McNeil AUC standard error (normal approximation); it is a
    sampling interval for the estimate under the Gaussian-shift model, not a privacy guarantee.
    """
    s, y = _check_scores(scores, labels)
    o = s if direction == "greater" else -s
    n_pos, n_neg = _worlds(y)
    # A pure-DP claim (delta = 0) has no finite GDP epsilon; report it at a stated delta instead.
    delta_used = delta if delta > 0 else GDP_FALLBACK_DELTA
    auc = mann_whitney_u(o[y], o[~y]) / (n_pos * n_neg)
    z = float(special.ndtri(0.5 + confidence / 2.0))
    se = math.sqrt(auc_variance(auc, n_pos, n_neg))
    clip = 1.0 - 0.5 / max(n_pos * n_neg, 1)  # an AUC of exactly 1 would give mu = inf

    def mu_of(a: float) -> float:
        return max(0.0, math.sqrt(2.0) * float(special.ndtri(min(max(a, 0.5), clip))))

    mu, mu_lo, mu_hi = mu_of(auc), mu_of(auc - z * se), mu_of(auc + z * se)
    return {
        "kind": "estimate (not a bound)",
        "method": "gaussian-dp from AUC: mu = sqrt(2) * Phi^-1(AUC), epsilon at delta (Dong, Roth & Su 2019)",
        "auc": auc,
        "mu": mu,
        "mu_interval": [mu_lo, mu_hi],
        "delta": delta_used,
        "epsilon": gdp_epsilon(mu, delta_used),
        "epsilon_interval": [gdp_epsilon(mu_lo, delta_used), gdp_epsilon(mu_hi, delta_used)],
        "interval_confidence": confidence,
        "significant": mu_lo > 0.0,  # False: indistinguishable from no leakage at this confidence
        # perfect separation: mu (and eps) only bounded by the trial count
        "saturated": auc >= clip,
        "trials": n_pos + n_neg,
    }


# ------------------------------------------------------------------------ comparison statistics
#
# The statistics reviewers compare across auditing tools, computed from the same per-trial scores
# as the deciding statistic. Only cp_bonferroni is a bound (it holds at ``confidence`` without a
# SELECT/EVAL split); TPR at fixed FPR, AUROC and the GDP estimate are descriptive.

TAG_AUROC_BOOTSTRAP = 0xA0C0B7  # public_rng tag of the AUROC bootstrap resamples
TPR_AT_FPR_TARGETS = (0.001, 0.01)
AUROC_BOOTSTRAP = 1000


def cp_bonferroni(scores, labels, *, delta: float, confidence: float = 0.95) -> dict:
    """Clopper–Pearson eps_LB over ALL threshold rules on ALL trials, Bonferroni-corrected.

    Privacy contract: with probability >= ``confidence`` the returned ``epsilon_lower_bound`` does
    not exceed the epsilon of any (epsilon, ``delta``)-DP mechanism that produced the scores, with
    no SELECT/EVAL split. Every rule "in iff score >= t" / "<= t" (t = midpoints of distinct scores
    and +-inf, both directions: 2 (U + 1) rules for U distinct scores) gets one-sided CP upper
    bounds on FPR and FNR, each at significance (1 - confidence) / (2 m).

    Why this is simultaneously valid although the thresholds depend on the data: for one direction
    the FP count takes n_neg + 1 values; for each value k the largest true FPR of any threshold with
    k false positives exceeds CP_upper(k) with probability <= a (it is "at most k of n_neg draws
    fall at or above a fixed quantile"), for any score law, ties included. The union therefore runs
    over 2 (n_neg + 1) + 2 (n_pos + 1) = 2 (n + 2) events, so m = max(2 (U + 1), n + 2): equal to
    the number of rules when the scores are distinct, larger (more conservative) under heavy ties.
    """
    confidence = open_unit("confidence", confidence)
    delta = _check_delta(delta)
    s, y = _check_scores(scores, labels)
    n_pos, n_neg = _worlds(y)
    cands, tp_ge, fp_ge, n_unique = rule_counts(s, y)
    rules = 2 * cands.size
    m = max(rules, s.size + 2)
    split = 2 * m  # two one-sided bounds per rule
    best: tuple | None = None
    for direction in DIRECTIONS:
        tp, fp = (tp_ge, fp_ge) if direction == "greater" else (n_pos - tp_ge, n_neg - fp_ge)
        fn = n_pos - tp
        fpr_hi = cp_upper(fp, np.full(fp.shape, n_neg), confidence, split=split)
        fnr_hi = cp_upper(fn, np.full(fn.shape, n_pos), confidence, split=split)
        eps = np.asarray(epsilon_from_rates(fpr_hi, fnr_hi, delta), dtype=float)
        youden = np.abs(tp / n_pos - fp / n_neg)
        i = int(np.lexsort((youden, eps))[-1])  # largest eps, ties (e.g. all 0) by Youden
        key = (float(eps[i]), float(youden[i]))
        if best is None or key > best[0]:
            best = (key, direction, i, fpr_hi, fnr_hi, tp, fp, fn)
    assert best is not None
    (eps_best, _), direction, i, fpr_hi, fnr_hi, tp, fp, fn = best
    return {
        "epsilon_lower_bound": eps_best,
        "thresholds_tested": int(rules),
        "bonferroni_m": int(m),
        "per_bound_significance": (1.0 - confidence) / split,
        "threshold": float(cands[i]),
        "direction": direction,
        "fpr_upper": float(fpr_hi[i]),
        "fnr_upper": float(fnr_hi[i]),
        "counts": {"tp": int(tp[i]), "fp": int(fp[i]), "tn": n_neg - int(fp[i]), "fn": int(fn[i])},
        "trials": int(s.size),
        "delta": delta,
        "confidence": confidence,
        "method": (
            "Clopper-Pearson upper bounds on FPR and FNR of every threshold rule (both directions) on all "
            "trials, no SELECT/EVAL split; Bonferroni: each of the 2m one-sided bounds at significance "
            "(1 - confidence)/(2m), m = max(rules tested, trials + 2); eps_LB = max over rules of "
            "max(ln((1 - delta - FNR_hi)/FPR_hi), ln((1 - delta - FPR_hi)/FNR_hi), 0)"
        ),
    }


def _two_sided_cp(k: int, n: int, confidence: float) -> list[float]:
    """Two-sided Clopper–Pearson interval at ``confidence`` (statsmodels' ``method="beta"``)."""
    a = (1.0 - confidence) / 2.0
    lo = 0.0 if k == 0 else float(special.betaincinv(k, n - k + 1.0, a))
    hi = 1.0 if k == n else float(special.betainccinv(k + 1.0, n - k, a))
    return [lo, hi]


def tpr_at_fpr(
    scores, labels, direction: str, targets=TPR_AT_FPR_TARGETS, *, confidence: float = 0.95
) -> list[dict]:
    """Largest TPR among rules "in iff oriented score >= t" whose empirical FPR is <= each target.

    Descriptive, not a bound: the rule is chosen on the same trials, so the two-sided
    Clopper–Pearson interval on the TPR (at ``confidence``) is optimistic. The trivial rule
    (nothing predicted in) always qualifies, so TPR is 0 when no other rule does.
    """
    confidence = open_unit("confidence", confidence)
    o, y, n_pos, n_neg = _oriented(scores, labels, direction)
    _, tp, fp, _ = rule_counts(o, y)
    out = []
    for target in targets:
        target = open_unit("fpr target", target)
        ok = fp / n_neg <= target  # the +inf rule (fp = 0) always qualifies
        k = int(tp[ok].max())
        j = int(np.flatnonzero(ok & (tp == k))[0])
        row = {
            "fpr": float(target),
            "tpr": k / n_pos,
            "tpr_interval": _two_sided_cp(k, n_pos, confidence),
            "fpr_achieved": float(fp[j]) / n_neg,
            "positives": n_pos,
            "negatives": n_neg,
        }
        out.append(row)
    return out


def _oriented(scores, labels, direction: str) -> tuple:
    """(score oriented so that higher means "in", labels, n_pos, n_neg), all checked."""
    s, y = _check_scores(scores, labels)
    one_of("direction", direction, DIRECTIONS)
    n_pos, n_neg = _worlds(y)
    return (s if direction == "greater" else -s), y, n_pos, n_neg


def _auc_from_codes(pos_w: np.ndarray, neg_w: np.ndarray) -> np.ndarray:
    """Mann–Whitney AUC (ties 1/2) from weights per distinct score (last axis, ascending order)."""
    below = np.cumsum(neg_w, axis=-1) - neg_w  # negative weight strictly below each distinct score
    twice = np.sum(pos_w * (2 * below + neg_w), axis=-1)  # integer weights stay exact in int64
    return twice / (2.0 * pos_w.sum(axis=-1) * neg_w.sum(axis=-1))


def auroc_bootstrap(
    scores,
    labels,
    direction: str,
    *,
    confidence: float = 0.95,
    resamples: int = AUROC_BOOTSTRAP,
    seed: int = 0,
) -> dict:
    """Mann–Whitney AUC of the oriented score with a percentile bootstrap interval (descriptive).

    Resamples are stratified by world (n_pos draws from the canary-in trials, n_neg from the others,
    with replacement) from the public stream ``public_rng(seed, TAG_AUROC_BOOTSTRAP)``. Vectorised:
    each resample is a weight vector over the distinct scores, and the AUC is a cumulative sum.
    """
    confidence = open_unit("confidence", confidence)
    b = positive_int("resamples", resamples)
    o, y, n_pos, n_neg = _oriented(scores, labels, direction)
    u, codes = np.unique(o, return_inverse=True)
    codes = codes.ravel()
    n_u = u.size
    pos_codes, neg_codes = codes[y], codes[~y]
    counts = [np.bincount(world, minlength=n_u) for world in (pos_codes, neg_codes)]
    auc = float(_auc_from_codes(*counts))
    rng = public_rng(seed, TAG_AUROC_BOOTSTRAP)
    offs = (np.arange(b) * n_u)[:, None]

    def weights(c: np.ndarray, n: int) -> np.ndarray:
        draw = c[rng.integers(0, n, size=(b, n))] + offs
        return np.bincount(draw.ravel(), minlength=b * n_u).reshape(b, n_u)

    boot = _auc_from_codes(weights(pos_codes, n_pos), weights(neg_codes, n_neg))
    lo, hi = np.quantile(boot, [(1.0 - confidence) / 2.0, (1.0 + confidence) / 2.0])
    return {
        "auc": auc,
        "interval": [float(lo), float(hi)],
        "bootstrap": b,
        "confidence": confidence,
        "method": "Mann-Whitney AUC (ties 1/2) on EVAL; percentile bootstrap stratified by world (descriptive)",
    }


def comparison_statistics(
    scores, world, select, direction: str, *, delta: float, confidence: float = 0.95, seed: int = 0
) -> dict:
    """The statistics reviewers compare across tools, from one audit's scores (audit.json "comparison").

    - cp_bonferroni: a BOUND at ``confidence`` on ALL trials (see :func:`cp_bonferroni`);
    - tpr_at_fpr (0.1 %, 1 %) and auroc on the EVAL trials (``select`` False), oriented by
      ``direction`` (chosen on SELECT): descriptive, not privacy guarantees;
    - gdp_estimate: :func:`gdp_estimate` on all trials, an ESTIMATE under a Gaussian-shift model.
    """
    confidence = open_unit("confidence", confidence)
    delta = _check_delta(delta)
    one_of("direction", direction, DIRECTIONS)
    s, w = _check_scores(scores, world)
    sel = np.asarray(select, dtype=bool).ravel()
    if sel.shape != s.shape:
        raise UsageError(
            f"select must have one entry per trial, got {sel.size} for {s.size} trials."
        )
    ev = ~sel
    _worlds(w[ev], "EVAL ")
    return {
        "cp_bonferroni": cp_bonferroni(s, w, delta=delta, confidence=confidence),
        "tpr_at_fpr": tpr_at_fpr(s[ev], w[ev], direction, confidence=confidence),
        "auroc": auroc_bootstrap(s[ev], w[ev], direction, confidence=confidence, seed=seed),
        "gdp_estimate": gdp_estimate(s, w, direction, delta=delta, confidence=confidence),
    }


# ---------------------------------------------------------------------- the published eps_LB
#
# One bound for every threshold rule on every trial, valid for ANY mechanism (no claimed shape):
# simultaneous one-sided Clopper-Pearson bands, calibrated exactly.
#
# For one world of n trials and one direction, the rules' error regions are nested. Give each
# trial V = the true error rate of the smallest region that holds it: V is uniform for a continuous
# score law (atoms only shrink the event below, as an independent tie-break shows), and a rule with
# k errors has a true rate below V_(k+1). So "some rule's true rate exceeds u_k(a)" (u_k(a): the CP
# upper bound for k errors) is the event "V_(k+1) > u_k(a) for some k < n" on n uniform order
# statistics, whose probability P_n(a) depends on n and a only and is computed exactly
# (:func:`crossing_probability`). The four (world, direction) families share the significance; each
# gets the largest level a*(n) with P_n(a*) <= its share (:func:`band_level`). a* >= share / n (the
# Bonferroni level over the n counts) and is several times larger in practice, which is what makes
# the band at least the Bonferroni-over-every-threshold bound (tests/audits/test_general_bound.py).

#: (world, direction) families sharing the band's significance.
BAND_FAMILIES = 4
BAND_CALIBRATION = "exact order-statistics crossing probability per (world, direction) family"
#: Bounds of :func:`crossing_probability` taken together for the counts that none of them can reach.
BLOCK = 32
#: Poisson probabilities below this end a step's kernel (the dropped tail is below 1e-30).
KERNEL_FLOOR = 1e-32
#: Most crossing-probability calls :func:`band_level` makes (it needs 3-5).
LEVEL_STEPS = 60


@functools.lru_cache(maxsize=8)
def _cp_table(n: int, a: float) -> np.ndarray:
    """u_k(a) for k = 0..n (1 at k = n), read-only: kept for the next band with this level (a
    report recomputes every audit's band at one or two levels)."""
    u = _cp_quantile(np.arange(n + 1, dtype=float), float(n), a)
    u[-1] = 1.0
    u = np.maximum.accumulate(u)  # non-decreasing in k (guards rounding at the far end)
    u.flags.writeable = False
    return u


def _poisson_pmf(j: np.ndarray, mu: float) -> np.ndarray:
    """Poisson(mu) probabilities at the counts ``j`` (mu = 0: all mass at 0)."""
    if mu <= 0:
        return (j == 0).astype(float)
    return np.exp(j * math.log(mu) - mu - special.gammaln(j + 1.0))


def _tail_end(mu: float) -> int:
    """Counts 0..end-1 of Poisson(mu) hold all but < 1e-30 of its mass (Chernoff, 14 sd + 50)."""
    return int(mu + 14.0 * math.sqrt(mu) + 50.0)


def _poisson_kernel(mu: float, cap: int) -> np.ndarray:
    """Poisson(mu) probabilities of 0..L-1, L past the mass that matters (the dropped tail < 1e-30
    only lowers the staying probability: the crossing probability errs upwards, a* downwards)."""
    return _poisson_pmf(np.arange(min(cap, _tail_end(mu)), dtype=float), mu)


def _step_kernels(mus: np.ndarray) -> list[np.ndarray]:
    """Poisson(mu) kernels of one block's steps, at once; each ends at its last probability of at
    least :data:`KERNEL_FLOOR` (the dropped tail < 1e-30, on the conservative side as above)."""
    j = np.arange(_tail_end(float(mus.max())), dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        rows = np.exp(j * np.log(mus)[:, None] - mus[:, None] - special.gammaln(j + 1.0))
    rows[mus <= 0] = j == 0
    ends = j.size - np.argmax(rows[:, ::-1] >= KERNEL_FLOOR, axis=1)
    return [row[:end] for row, end in zip(rows, ends)]


def _mass_window(p: np.ndarray, lo: int, hi: int) -> tuple[int, int]:
    """The part of p[lo:hi] at or above 1e-30 of its largest entry; the rest is set to 0. Dropping
    that mass only lowers the staying probability (the crossing probability errs upwards, a*
    downwards), as the kernel's dropped tail does."""
    window = p[lo:hi]
    top = float(window.max()) if window.size else 0.0
    if top <= 0.0:
        return lo, max(lo, min(hi, lo + 1))
    kept = np.flatnonzero(window >= top * 1e-30)
    new_lo, new_hi = lo + int(kept[0]), lo + int(kept[-1]) + 1
    p[lo:new_lo] = 0.0
    p[new_hi:hi] = 0.0
    return new_lo, new_hi


def _step_low(low: np.ndarray, low_lo: int, means: np.ndarray, steps: range) -> tuple:
    """The counts below a block's end (``low``, from count ``low_lo``) through its bounds one at a
    time, each dropping the counts <= k (those that crossed). ``means[k + 1]``: n b_k."""
    cap, start, stop = means.size, steps.start, steps.stop
    moved = means[start + 1 : stop + 1] - means[start]
    # these counts started below stop: past stop + the tail of their Poisson move is < 1e-30
    tails = (moved + 14.0 * np.sqrt(moved) + 50.0).astype(int).tolist()  # _tail_end, at once
    kernels = _step_kernels(np.diff(means[start : stop + 1])) if low.size else []
    for k, kernel, tail in zip(steps, kernels, tails):
        low = np.convolve(low, kernel)[: min(cap - low_lo, stop - low_lo + tail)]
        if k >= low_lo:
            low, low_lo = low[k + 1 - low_lo :], k + 1
        if not low.size:  # every count crossed
            break
    return low_lo, low


def _block(p: np.ndarray, window: tuple, means: np.ndarray, steps: range) -> tuple[int, int]:
    """Bounds ``steps`` of :func:`crossing_probability` on p (zero outside ``window``): counts at or
    above the block's end meet every one of its bounds already (N(b_k) >= k + 1 needs at most
    steps.stop, and counts only grow), so they move in one convolution; the counts below are stepped
    bound by bound (:func:`_step_low`). Returns the new window."""
    (lo, hi), cap = window, p.size
    split = max(lo, min(hi, steps.stop))
    low = p[lo:split].copy()
    high = p[split:hi]
    if high.size:
        move = _poisson_kernel(float(means[steps.stop] - means[steps.start]), cap)
        high = np.convolve(high, move)[: cap - split]
    p[lo:hi] = 0.0
    p[split : split + high.size] = high
    low_lo, low = _step_low(low, lo, means, steps)
    p[low_lo : low_lo + low.size] += low
    end = max(split + high.size, low_lo + low.size, steps.stop + 1)
    return _mass_window(p, max(lo, steps.stop), end)


def crossing_probability(n: int, a: float) -> float:
    """P(V_(k+1) > u_k(a) for some k = 0..n-1) for the order statistics of n independent uniforms.

    Exact up to float rounding and dropped mass below 1e-30 (which only raises the result: the
    conservative side): a Poisson process of rate n, conditioned on n points in [0, 1], has the
    uniform order statistics as its points; stepping through the bounds b_k = u_k(a) the state is
    the count so far, which must reach k + 1 by b_k (N(b_k) >= k + 1 is V_(k+1) <= b_k). The bounds
    go :data:`BLOCK` at a time (:func:`_block`), so most counts move once a block, not once a bound.
    """
    b = _cp_table(n, a)[:n]
    means = n * np.r_[0.0, b]  # the Poisson process's mean count at each bound
    p = np.zeros(n + 1)
    p[0] = 1.0
    window = (0, 1)  # p is zero outside [lo, hi)
    for start in range(0, n, BLOCK):
        window = _block(p, window, means, range(start, min(n, start + BLOCK)))
    # the remaining n - j points in (b_{n-1}, 1], over P(N(1) = n)
    last = _poisson_pmf(n - np.arange(n + 1, dtype=float), n * (1.0 - float(b[-1])))
    stay = float(p @ last) / float(_poisson_pmf(np.array([float(n)]), float(n))[0])
    return min(1.0, max(0.0, 1.0 - stay))


def band_level(n: int, share: float, claimed: float | None = None) -> float:
    """a*(n, share): the largest level (to relative 1e-4, from below) whose
    :func:`crossing_probability` is at most ``share``; the returned level always qualifies.

    ``claimed``: a level stored by an earlier computation (audit.json's ``per_bound_significance``).
    It is returned only when one crossing-probability call shows that it qualifies, and ignored
    otherwise: any qualifying level gives a valid band (a smaller one, a looser band).
    """
    if claimed is not None and 0.0 < claimed <= share and _claimed_crossing(n, claimed) <= share:
        return claimed
    return _solved_level(n, share)


@functools.lru_cache(maxsize=256)
def _claimed_crossing(n: int, level: float) -> float:
    """One check per stored level, whatever share it is checked against."""
    return crossing_probability(n, level)


@functools.lru_cache(maxsize=256)
def _solved_level(n: int, share: float) -> float:
    """:func:`band_level` from scratch: secant steps on log P against log a (nearly linear, slope
    about 1) inside the bracket [share / n, share]. share / n (the Bonferroni level over the n
    counts) always qualifies; the search stops at a level whose log P is 1e-6 to 3e-6 below the
    share's (a margin float rounding, ~1e-9, cannot cross; the earlier regula falsi stopped within
    1e-6), or within 1e-4 of a failing level in log a."""
    if n == 1:
        return float(share)
    target = math.log(share)
    lo, hi = math.log(share / n), target
    x, last = min(max(target - 2.0 * math.log1p(math.log(n)), lo), hi), None
    for _ in range(LEVEL_STEPS):
        gap = math.log(max(crossing_probability(n, math.exp(x)), 1e-300)) - target
        lo, hi = (x, hi) if gap <= 0.0 else (lo, x)
        if -3e-6 < gap <= -1e-6 or hi - lo <= 1e-4:
            break
        x, last = _secant_step(x, gap, last, (lo, hi)), (x, gap)
    return math.exp(lo)


def _secant_step(x: float, gap: float, last: tuple | None, bracket: tuple[float, float]) -> float:
    """The next log level: the secant through the last two points (slope 1 before there are two),
    aimed 2e-6 below the root so that it lands qualifying; bisection when it leaves the bracket."""
    slope = 1.0 if last is None or last[1] == gap else (gap - last[1]) / (x - last[0])
    step = x - (gap + 2e-6) / slope if slope > 0.0 else math.nan
    return step if bracket[0] < step < bracket[1] else (bracket[0] + bracket[1]) / 2.0


def _staircase(fp: np.ndarray, fn: np.ndarray) -> list[list[int]]:
    """The (fp, fn) pairs no other pair beats in both (the rules that can attain the maximum)."""
    pairs = sorted(set(zip(fp.tolist(), fn.tolist())))
    out: list[list[int]] = []
    for fp_k, fn_k in pairs:  # ascending fp: keep a pair only if its fn is below every kept one
        if not out or fn_k < out[-1][1]:
            out.append([int(fp_k), int(fn_k)])
    return out


def band_bound(scores, labels, *, delta: float, confidence: float = 0.95) -> dict:
    """eps_LB from every threshold rule on all trials (both directions), valid for any mechanism.

    Privacy contract: with probability >= ``confidence`` over the trials, ``epsilon_lower_bound``
    does not exceed the epsilon of any (epsilon, ``delta``)-DP mechanism that produced the scores
    (see the block comment above). ``cells`` holds, per direction, the (FP, FN) count pairs of the
    rules that can attain the maximum: with ``trials_per_world`` it recomputes the bound at any other
    confidence (:func:`band_epsilon`), e.g. a Bonferroni share over audits.
    """
    confidence = open_unit("confidence", confidence)
    delta = _check_delta(delta)
    s, y = _check_scores(scores, labels)
    n_pos, n_neg = _worlds(y)
    _, tp_ge, fp_ge, _ = rule_counts(s, y)
    cells = {}
    for direction in DIRECTIONS:
        tp, fp = (tp_ge, fp_ge) if direction == "greater" else (n_pos - tp_ge, n_neg - fp_ge)
        cells[direction] = _staircase(fp, n_pos - tp)
    record = {
        "cells": cells,
        "events": BAND_FAMILIES,
        "trials_per_world": {"in": n_pos, "out": n_neg},
        "calibration": BAND_CALIBRATION,
    }
    eps, direction, cell = band_epsilon(record, delta=delta, confidence=confidence, best=True)
    share = _band_share(confidence)
    return {
        "epsilon_lower_bound": eps,
        "direction": direction,
        "fp_at_most": cell[0],
        "fn_at_most": cell[1],
        **record,
        "per_bound_significance": {"in": band_level(n_pos, share), "out": band_level(n_neg, share)},
        "delta": delta,
        "confidence": confidence,
        "method": (
            "every threshold rule (both directions) on all trials; one-sided Clopper-Pearson upper bounds on FPR and FNR "
            "as simultaneous bands, each (world, direction) family at the level whose exact order-statistics crossing "
            "probability is its quarter of the significance; eps_LB = max over rules of max(0, ln((1 - delta - FNR_hi)/FPR_hi), "
            "ln((1 - delta - FPR_hi)/FNR_hi)); valid for any mechanism"
        ),
    }


def band_epsilon(record: dict, *, delta: float, confidence: float, best: bool = False):
    """:func:`band_bound`'s eps_LB from its stored ``cells`` and ``trials_per_world``, at
    ``confidence`` (its own, or a stricter one). ``best``: also the direction and the (FP, FN) cell
    that attain it. Records of the earlier grid band (its first version) hold counts rounded
    up to a grid: the same computation bounds them conservatively (u_k grows with k). The levels
    the record stored are used where they qualify (:func:`band_level`, :func:`stored_levels`)."""
    n_pos, n_neg = int(record["trials_per_world"]["in"]), int(record["trials_per_world"]["out"])
    share = _band_share(open_unit("confidence", confidence))
    claimed = stored_levels(record)
    u_pos = _cp_table(n_pos, band_level(n_pos, share, claimed[0]))
    u_neg = _cp_table(n_neg, band_level(n_neg, share, claimed[1]))
    top = (0.0, DIRECTIONS[0], (n_neg, n_pos))
    for direction in DIRECTIONS:
        pairs = np.asarray(record["cells"][direction], dtype=int).reshape(-1, 2)
        if not pairs.size:
            continue
        eps = np.atleast_1d(epsilon_from_rates(u_neg[pairs[:, 0]], u_pos[pairs[:, 1]], delta))
        i = int(np.argmax(eps))
        if eps[i] > top[0]:
            top = (float(eps[i]), direction, (int(pairs[i, 0]), int(pairs[i, 1])))
    return top if best else top[0]


#: The band's share of the significance, the first that makes it at least the Bonferroni bound over
#: every threshold (see :func:`general_split`); the EVAL box gets the rest.
BAND_SHARES = (0.5, 0.75, 0.9, 0.97)


def _band_share(band_confidence: float) -> float:
    """The significance each (world, direction) family of a band at ``band_confidence`` spends."""
    return (1.0 - band_confidence) / BAND_FAMILIES


def stored_levels(band: dict) -> tuple[float | None, float | None]:
    """The (in, out) levels a band record stored (``per_bound_significance``), as claims for
    :func:`band_level` to check; None for a world without a positive finite number."""
    levels = band.get("per_bound_significance")
    levels = levels if isinstance(levels, dict) else {}
    return tuple(_positive_or_none(levels.get(world)) for world in ("in", "out"))


def _positive_or_none(value) -> float | None:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if number and math.isfinite(value) and value > 0 else None


@functools.lru_cache(maxsize=256)
def general_split(
    n_pos: int, n_neg: int, confidence: float, claimed: tuple = (None, None)
) -> tuple[float, float]:
    """(box confidence, band confidence) of the published eps_LB for these trial counts.

    A function of the public trial counts only, fixed before any score is seen. The band takes the
    first share of the significance in :data:`BAND_SHARES` at which both worlds' band levels are at
    least the per-bound level (1 - confidence) / (2 (n_pos + n_neg + 1)) of the one-sided
    Bonferroni-over-every-threshold bound (jax_privacy's ``CanaryScoreAuditor`` correction made
    valid): then every rule is bounded at least as tightly as there, so eps_LB is at least that
    bound on every score set. Half for about 30 or more trials per world; more below.
    ``claimed``: (in, out) levels a record stored, checked by :func:`band_level` before use.
    """
    alpha = 1.0 - open_unit("confidence", confidence)
    reference = alpha / (2.0 * (n_pos + n_neg + 1))
    share = BAND_SHARES[-1]
    for f in BAND_SHARES:
        fam = _band_share(1.0 - f * alpha)  # the very share band_epsilon spends at this confidence
        if min(band_level(n_pos, fam, claimed[0]), band_level(n_neg, fam, claimed[1])) >= reference:
            share = f
            break
    return 1.0 - (1.0 - share) * alpha, 1.0 - share * alpha


def general_epsilon(counts: dict, band: dict, *, delta: float, confidence: float) -> float:
    """The published eps_LB: the larger of two bounds that hold jointly at ``confidence`` (their
    significances add up to its): the EVAL counts of the rule chosen on SELECT (``counts``: tp, fp,
    tn, fn) and the all-threshold band on all trials (``band``: :func:`band_bound`'s record), split
    by :func:`general_split`. Valid for any mechanism, and at least the one-sided Clopper-Pearson
    bound with Bonferroni over every threshold at ``confidence``."""
    tpw = band["trials_per_world"]
    confidence = open_unit("confidence", confidence)
    n_in, n_out = int(tpw["in"]), int(tpw["out"])
    box_conf, band_conf = general_split(n_in, n_out, confidence, stored_levels(band))
    box = epsilon_lower_bound(
        **{k: int(counts[k]) for k in ("tp", "fp", "tn", "fn")}, delta=delta, confidence=box_conf
    ).epsilon
    return max(box, band_epsilon(band, delta=delta, confidence=band_conf))

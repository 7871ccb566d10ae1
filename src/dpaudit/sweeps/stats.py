"""Seed-level statistics of a sweep, as specified in section 4.2 of the DP-RVFL paper (001; docs/sweeps.md, "Tables"): per
cell mean, sample SD and Student-t interval over seeds; paired contrasts by seed with the exact two-sided sign-flip test (five
seeds cannot reach p < 0.05) and Holm adjustment over the reported family; descriptive win/tie/loss counts."""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Iterable, Sequence

from ..errors import UsageError
from ..lazy import lazy_import

np = lazy_import("numpy")

#: The four primary metrics of the paper's contrast family (section 4.2: accuracy, F1, AUROC, AUPRC).
PRIMARY_METRICS = ("accuracy", "f1_macro", "auroc", "auprc")
#: Largest n for which the exact sign-flip test enumerates all 2^n assignments.
MAX_EXACT_N = 24


@dataclass(frozen=True)
class CellSummary:
    n: int
    mean: float
    sd: float  # sample SD (ddof = 1); nan when n < 2
    ci_low: float  # Student-t interval; nan when n < 2
    ci_high: float
    confidence: float = 0.95


def summarize(values: Sequence[float], *, confidence: float = 0.95) -> CellSummary:
    """Mean, sample SD and the two-sided Student-t interval at ``confidence`` over seeds."""
    from scipy import stats

    x = np.asarray(list(values), dtype=float)
    if x.size == 0:
        raise UsageError("values must be non-empty, got [].")
    if not (0.0 < confidence < 1.0):
        raise UsageError(f"confidence must be in (0, 1), got {confidence!r}.")
    mean = float(x.mean())
    if x.size < 2:
        return CellSummary(1, mean, math.nan, math.nan, math.nan, confidence)
    sd = float(x.std(ddof=1))
    half = float(stats.t.ppf(0.5 + confidence / 2.0, df=x.size - 1)) * sd / math.sqrt(x.size)
    return CellSummary(int(x.size), mean, sd, mean - half, mean + half, confidence)


def sign_flip_pvalue(differences: Sequence[float]) -> float:
    """Exact two-sided sign-flip (randomisation) test of paired differences. Enumerates all 2^n sign vectors s and returns the
    fraction with |sum s_i d_i| >= |sum d_i| (the observed assignment included, so p >= 2 / 2^n unless every difference is zero, p
    = 1). Comparisons allow a relative tolerance of 1e-12 so that floating-point rounding of equal sums never makes p smaller than
    it is."""
    d = np.asarray(list(differences), dtype=float)
    n = d.size
    if n == 0:
        raise UsageError("differences must be non-empty, got [].")
    if not np.all(np.isfinite(d)):
        raise UsageError(f"differences must be finite, got {d.tolist()!r}.")
    if n > MAX_EXACT_N:
        raise UsageError(
            f"number of paired differences must be at most {MAX_EXACT_N} for the exact test, got {n}."
        )
    observed = abs(float(d.sum()))
    tol = 1e-12 * max(float(np.abs(d).sum()), 1e-300)
    # Row r of the sign matrix: bit j of r set -> sign -1 for difference j.
    count = 0
    total = 1 << n
    block = 1 << min(n, 16)
    bits = (np.arange(block)[:, None] >> np.arange(min(n, 16))[None, :]) & 1
    low_signs = 1.0 - 2.0 * bits  # (block, min(n,16))
    low_sums = low_signs @ d[: min(n, 16)]
    rest = d[16:]
    for hi in range(total // block):
        hi_sign = 1.0 - 2.0 * ((hi >> np.arange(rest.size)) & 1) if rest.size else np.zeros(0)
        sums = low_sums + float(hi_sign @ rest) if rest.size else low_sums
        count += int(np.count_nonzero(np.abs(sums) >= observed - tol))
    return count / total


def holm_adjust(pvalues: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values across one family (statsmodels ``multipletests``)."""
    from statsmodels.stats.multitest import multipletests

    p = np.asarray(list(pvalues), dtype=float)
    if p.size == 0:
        return []
    if np.any((p < 0) | (p > 1)) or not np.all(np.isfinite(p)):
        raise UsageError(f"p-values must lie in [0, 1], got {p.tolist()!r}.")
    return [float(v) for v in multipletests(p, method="holm")[1]]


def min_attainable_pvalue(n: int) -> float:
    """Smallest two-sided p-value of the exact sign-flip test with n non-zero differences."""
    return 2.0 / (1 << n) if n >= 1 else 1.0


# ---- Records: one dict per finished task {model, dataset, epsilon, seed, metrics}


def records_from_rows(rows: Iterable) -> list[dict]:
    """Flatten finished store rows (:class:`~dpaudit.sweeps.store.TaskRow`) into records."""
    out = []
    for r in rows:
        if r.status != "done" or not r.result:
            continue
        c = r.config
        rec = {
            "model": c["model"],
            "dataset": c["dataset"],
            "epsilon": c["epsilon"],
            "seed": int(c["seed"]),
            "metrics": dict(r.result.get("metrics", {})),
            "seconds": r.seconds,
            "epsilon_achieved": r.result.get("epsilon"),
        }
        profile = (c.get("settings") or {}).get("profile")
        if profile is not None:  # a non-default profile (the sweep tables keep it apart)
            rec["profile"] = profile
        out.append(rec)
    return out


def _metric(rec: dict, metric: str) -> float | None:
    v = rec.get("metrics", {}).get(metric)
    if v is None:
        return None
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def eps_key(e) -> tuple:
    """Sort key of budgets: non-private (None) first, then by epsilon."""
    return (e is not None, e if e is not None else 0.0)


@dataclass(frozen=True)
class Cell:
    dataset: str
    epsilon: float | None
    model: str
    metric: str
    seeds: tuple[int, ...]
    values: tuple[float, ...]
    summary: CellSummary

    def to_dict(self) -> dict:
        return asdict(self)  # the summary too (asdict recurses)


def cells(
    records: Iterable[dict], metric: str = "accuracy", *, confidence: float = 0.95
) -> list[Cell]:
    """Per (dataset, epsilon, model) summaries of ``metric`` over seeds, sorted."""
    groups = {
        (ds, eps, model): by_seed
        for (ds, eps, _), models in _by_condition(list(records), [metric]).items()
        for model, by_seed in models.items()
    }
    out = []
    for (ds, eps, model), by_seed in sorted(
        groups.items(), key=lambda kv: (kv[0][0], eps_key(kv[0][1]), kv[0][2])
    ):
        seeds = tuple(sorted(by_seed))
        vals = tuple(by_seed[s] for s in seeds)
        out.append(
            Cell(ds, eps, model, metric, seeds, vals, summarize(vals, confidence=confidence))
        )
    return out


@dataclass(frozen=True)
class Contrast:
    """Reference minus comparator on one metric in one dataset-budget condition, paired by seed."""

    dataset: str
    epsilon: float | None
    metric: str
    reference: str
    comparator: str
    seeds: tuple[int, ...]
    differences: tuple[float, ...]
    mean_difference: float
    sd_difference: float
    p_value: float  # exact two-sided sign-flip
    p_holm: float = math.nan  # Holm-adjusted across the reported family
    wins: int = 0  # seeds where reference > comparator
    ties: int = 0
    losses: int = 0

    @property
    def n(self) -> int:
        return len(self.seeds)

    def to_dict(self) -> dict:
        return {**asdict(self), "n": self.n}


def paired_contrasts(
    records: Iterable[dict],
    *,
    reference: str = "dp-rvfl",
    comparators: Sequence[str] | None = None,
    metrics: Sequence[str] = PRIMARY_METRICS,
    tie_tolerance: float = 0.0,
    min_pairs: int = 2,
) -> list[Contrast]:
    """All reference-vs-comparator contrasts the records support, Holm-adjusted as one family. A contrast exists for every
    (dataset, epsilon, metric, comparator) where the reference and the comparator share at least ``min_pairs`` seeds; the family
    for Holm's adjustment is exactly the returned list (report all of it: adjusting a subset would understate multiplicity).
    Seed-level ties are |difference| <= ``tie_tolerance``."""
    by_cond = _by_condition(list(records), metrics)
    metric_order = {m: i for i, m in enumerate(metrics)}
    out = [
        _contrast(
            cond,
            reference,
            comp,
            seeds,
            [models[reference][s] - models[comp][s] for s in seeds],
            tie_tolerance,
        )
        for cond in sorted(by_cond, key=lambda k: (k[0], eps_key(k[1]), metric_order[k[2]]))
        for models in (by_cond[cond],)
        for comp, seeds in _pairs(models, reference, comparators, min_pairs)
    ]
    adjusted = holm_adjust([c.p_value for c in out])
    return [dataclasses.replace(c, p_holm=a) for c, a in zip(out, adjusted)]


def _pairs(models: dict[str, dict[int, float]], reference: str, comparators, min_pairs: int):
    """(comparator, shared seeds) of one condition's ``models`` ({model: {seed: value}}) with at least ``min_pairs`` seeds in
    common with the reference (none without the reference)."""
    if reference not in models:
        return
    for comp in comparators if comparators is not None else sorted(models):
        seeds = tuple(sorted(set(models[reference]) & set(models.get(comp, {}))))
        if comp != reference and comp in models and len(seeds) >= min_pairs:
            yield comp, seeds


def _by_condition(
    records: list[dict], metrics: Sequence[str]
) -> dict[tuple, dict[str, dict[int, float]]]:
    """{(dataset, epsilon, metric): {model: {seed: value}}} of the finite metric values."""
    by_cond: dict[tuple, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for metric in metrics:
        for r in records:
            v = _metric(r, metric)
            if v is not None:
                by_cond[(r["dataset"], r["epsilon"], metric)][r["model"]][int(r["seed"])] = v
    return by_cond


def _contrast(
    cond: tuple,
    reference: str,
    comparator: str,
    seeds: tuple,
    diffs: list[float],
    tie_tolerance: float,
) -> Contrast:
    """One contrast of ``cond`` = (dataset, epsilon, metric) from its per-seed differences (not yet Holm-adjusted)."""
    dd = np.asarray(diffs)
    return Contrast(
        dataset=cond[0],
        epsilon=cond[1],
        metric=cond[2],
        reference=reference,
        comparator=comparator,
        seeds=seeds,
        differences=tuple(diffs),
        mean_difference=float(dd.mean()),
        sd_difference=float(dd.std(ddof=1)) if dd.size > 1 else math.nan,
        p_value=sign_flip_pvalue(diffs),
        wins=int(np.sum(dd > tie_tolerance)),
        ties=int(np.sum(np.abs(dd) <= tie_tolerance)),
        losses=int(np.sum(dd < -tie_tolerance)),
    )


@dataclass(frozen=True)
class WinTieLoss:
    """Condition-level counts for one comparator and metric: reference mean above/equal/below."""

    reference: str
    comparator: str
    metric: str
    wins: int
    ties: int
    losses: int
    conditions: int = field(default=0)

    def to_dict(self) -> dict:
        return asdict(self)


def win_tie_loss(contrasts: Iterable[Contrast], *, tie_tolerance: float = 0.0) -> list[WinTieLoss]:
    """Across conditions, how often the reference's mean beats, ties or trails each comparator. This is the paper's "higher mean
    accuracy in 20 of the 24 conditions" count (section 4.3); it is descriptive only."""
    agg: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0])
    ref_name = {}
    for c in contrasts:
        k = (c.comparator, c.metric)
        ref_name[k] = c.reference
        agg[k][
            0
            if c.mean_difference > tie_tolerance
            else 2
            if c.mean_difference < -tie_tolerance
            else 1
        ] += 1
    return [
        WinTieLoss(ref_name[k], k[0], k[1], w, t, l, w + t + l)
        for k, (w, t, l) in sorted(agg.items())
    ]

"""What an audit of N trials can detect, before (or beside) running it: its power line.

Computed from expected counts, not by simulating trials. For a mechanism whose trade-off curve is
g, a threshold rule with false-positive rate a has, on n_out canary-out and n_in canary-in EVAL
trials, about a n_out false positives and g(a) n_in false negatives; the counts are rounded to the
nearest integer (about the median of the binomial count), bounded from above as the audit bounds
them (one-sided Clopper-Pearson with the significance split in two; a sequential audit: its
anytime-valid sequences with the base prior, a conservative stand-in for the SELECT-centred one),
and the best rule over a grid of a is kept (as if SELECT chose perfectly). Then:

- ``ceiling``: the statistic of perfectly separated scores (no error at all): nothing this audit can
  report is larger; ``detectable`` is False when even that is not a violation of the claim (the
  audit cannot detect a violation at all, whatever the mechanism does);
- ``at_claim``: the statistic at the expected counts of a mechanism exactly at the claim: what a
  correct claim typically reads, the practical limit of this N;
- ``smallest_factor``: the largest k < 1 such that a mechanism with noise sigma k (the claim's
  sigma understated by 1/k) reads as a violation at its expected counts (about probability 1/2);
- ``trials_for_90``: the trials N at which ``at_claim`` reaches 90 % of the claim.

The statistic: for a claim whose curve is a Gaussian (mu-GDP) one, the claimed-curve test's, in
epsilon units of the Gaussian-DP family (exact conversion, :func:`stats.gdp_epsilon`; the k-search
stays in the family, sigma k). Otherwise the eps_LB of the box corner, max(ln((1 - delta -
FNR_hi)/FPR_hi), ln((1 - delta - FPR_hi)/FNR_hi)), against the claimed epsilon, with the claim's
curve (or, without an event, the (eps, delta) point's curve) for the expected counts; the k-search
needs a noise family and is left out there (None). These are predictions, not bounds.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..lazy import lazy_import
from ..validation import open_unit, positive_int
from . import sequential, stats
np = lazy_import("numpy")
special = lazy_import("scipy.special")

#: Most false-positive counts tried per evaluation (geometric grid beyond it).
GRID_POINTS = 800
#: The largest N the trials-for-90 % search looks at, and the smallest noise factor k it tries.
MAX_TRIALS = 10**8
MIN_FACTOR = 1.0 / 64.0
#: Share of the claim ``trials_for_90`` asks for.
TARGET_SHARE = 0.9
SELECT_FRACTION = 0.3  # the engine's default (dpaudit.audits.engine.SELECT_FRACTION)


@dataclass(frozen=True)
class AuditPower:
    """The power line of one audit (see the module docstring): predictions, never bounds."""

    trials: int
    eval_in: int
    eval_out: int
    estimator: str
    claimed_epsilon: float | None
    ceiling: float
    at_claim: float | None
    detectable: bool
    smallest_factor: float | None
    trials_for_90: int | None
    sequential: bool = False

    def to_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        """One plain line for the CLI and the reports."""
        return power_line(self.to_dict())


def power_line(p: dict) -> str:
    """The power line of a stored ``power`` block (audit.json)."""
    claim = p.get("claimed_epsilon")
    lead = f"power ({p['trials']} trials, {p['estimator']}): limit {_f(p.get('ceiling'))} (perfectly separated scores), at the claim {_f(p.get('at_claim'))}"
    if claim is not None and not p.get("detectable"):
        return (f"{lead}; UNDERPOWERED: even perfectly separated scores give {_f(p.get('ceiling'))}, not above the claim "
                f"{_f(claim)}: this audit cannot detect a violation at all (more trials needed)")
    k = p.get("smallest_factor")
    if not str(p.get("estimator", "")).startswith("claimed-curve"):
        smallest = "not computed (needs a Gaussian claim)"
    else:
        smallest = "none down to sigma x 1/64" if k is None else f"sigma x {k:.2f} (the claimed noise {1.0 / k:.2f}x the real)"
    n90 = p.get("trials_for_90")
    return (f"{lead}; smallest noise understatement detected: {smallest}; trials for 90 % of the claim: "
            f"{'over ' + format(MAX_TRIALS, ',') if n90 is None else format(n90, ',')}")


def _f(x) -> str:
    return "—" if x is None else f"{float(x):.3f}"


def eval_sizes(trials: int, *, select_fraction: float = SELECT_FRACTION, sequential_mode: bool = False) -> tuple[int, int]:
    """(EVAL canary-in, EVAL canary-out) trials of an audit of ``trials`` (engine.plan_trials'
    split; a sequential audit: all but its SELECT trials, half each)."""
    if sequential_mode:
        rest = trials - sequential.SELECT_TRIALS
        return rest // 2, rest - rest // 2
    n_in, n_out = trials // 2, trials - trials // 2

    def rest(n: int) -> int:
        return n - min(max(int(round(select_fraction * n)), 1), n - 1)

    return rest(n_in), rest(n_out)


class _Uppers:
    """Upper bounds on a rate from (errors, trials) as the audit computes them."""

    def __init__(self, confidence: float, sequential_mode: bool):
        self.confidence, self.sequential = confidence, sequential_mode

    def __call__(self, k, n):
        if self.sequential:
            return sequential.anytime_upper(k, np.full(np.shape(k), n), (1.0 - self.confidence) / 2.0)
        return stats.cp_upper(k, np.full(np.shape(k), n), self.confidence, split=2)


def _fp_grid(n_out: int) -> np.ndarray:
    if n_out + 1 <= GRID_POINTS:
        return np.arange(n_out + 1, dtype=float)
    return np.unique(np.concatenate([[0.0], np.round(np.geomspace(1, n_out, GRID_POINTS - 1))]))


class _Statistic:
    """The audit's statistic of a box corner, and the claim's value of it."""

    def __init__(self, curve, claimed_epsilon: float | None, delta: float):
        self.curve, self.claimed, self.delta = curve, claimed_epsilon, delta
        self.mu = None
        if getattr(curve, "closed_form", None) == "gaussian":
            self.mu = float(-special.ndtri(float(curve.fnr(0.5))))  # f(1/2) = Phi(-mu)

    @property
    def name(self) -> str:
        return "claimed-curve (Gaussian-DP)" if self.mu is not None else "eps_LB of the box (clopper-pearson)"

    def of(self, fpr_hi, fnr_hi) -> np.ndarray:
        if self.mu is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                return np.nan_to_num(-special.ndtri(fpr_hi) - special.ndtri(fnr_hi), nan=-np.inf)
        return np.asarray(stats.epsilon_from_rates(fpr_hi, fnr_hi, self.delta))

    def epsilon(self, value: float) -> float:
        """The statistic in epsilon units."""
        if self.mu is not None:
            return stats.gdp_epsilon(max(value, 0.0), self.delta)
        return float(value)

    def claim_value(self) -> float | None:
        return self.mu if self.mu is not None else self.claimed


def _expected_best(stat: _Statistic, fnr_of, n_in: int, n_out: int, uppers: _Uppers) -> float:
    """The best statistic over rules at the expected counts of a mechanism with curve ``fnr_of``."""
    k = _fp_grid(n_out)
    fn = np.round(n_in * np.clip(fnr_of(k / n_out), 0.0, 1.0))
    return float(np.max(stat.of(uppers(k, n_out), uppers(fn, n_in))))


def _gaussian_fnr(mu: float):
    return lambda a: special.ndtr(-special.ndtri(a) - mu)


def _tabulated(fnr):
    """``fnr`` read off a fixed log grid (linear in between): a profile curve costs one evaluation, not one per N."""
    grid = np.concatenate([[0.0], np.logspace(-9, 0, 1500)])
    values = np.asarray(fnr(grid), float)
    return lambda a: np.interp(a, grid, values)


def _point_curve(epsilon: float, delta: float):
    """The trade-off curve of one (epsilon, delta) point (claims without an event)."""
    e = math.exp(epsilon)
    return lambda a: np.maximum(0.0, np.maximum(1.0 - delta - e * a, (1.0 - delta - a) / e))


def audit_power(*, trials: int, delta: float, claimed_epsilon: float | None = None, curve=None, confidence: float = 0.95,
                select_fraction: float = SELECT_FRACTION, sequential_mode: bool = False) -> AuditPower:
    """The power line of an audit of ``trials`` trials of the claim ``curve`` (a
    :class:`dpaudit.audits.curves.ClaimedCurve`; None: the (``claimed_epsilon``, ``delta``) point)."""
    trials = positive_int("trials", trials, sequential.SELECT_TRIALS + 2 if sequential_mode else 4)
    confidence = open_unit("confidence", confidence)
    uppers = _Uppers(confidence, sequential_mode)
    n_in, n_out = eval_sizes(trials, select_fraction=select_fraction, sequential_mode=sequential_mode)
    stat = _Statistic(curve, claimed_epsilon, delta)
    perfect = float(stat.of(uppers(np.zeros(1), n_out), uppers(np.zeros(1), n_in))[0])
    base = dict(trials=trials, eval_in=n_in, eval_out=n_out, estimator=stat.name, claimed_epsilon=claimed_epsilon,
                ceiling=stat.epsilon(perfect), sequential=sequential_mode)
    claim_fnr = _tabulated(curve.fnr) if curve is not None else (None if claimed_epsilon is None else _point_curve(claimed_epsilon, delta))
    target = stat.claim_value()
    if claim_fnr is None or target is None:
        return AuditPower(**base, at_claim=None, detectable=True, smallest_factor=None, trials_for_90=None)
    at_claim = _expected_best(stat, claim_fnr, n_in, n_out, uppers)
    detectable = perfect > target
    return AuditPower(**base, at_claim=stat.epsilon(at_claim), detectable=detectable,
                      smallest_factor=_smallest_factor(stat, n_in, n_out, uppers) if detectable else None,
                      trials_for_90=_trials_for(stat, claim_fnr, uppers, select_fraction, sequential_mode))


def _smallest_factor(stat: _Statistic, n_in: int, n_out: int, uppers: _Uppers) -> float | None:
    """Largest k in [MIN_FACTOR, 1) whose mechanism (sigma k) reads as a violation (Gaussian claims)."""
    if stat.mu is None:
        return None

    def caught(k: float) -> bool:
        return _expected_best(stat, _gaussian_fnr(stat.mu / k), n_in, n_out, uppers) > stat.mu

    if not caught(MIN_FACTOR):
        return None
    lo, hi = MIN_FACTOR, 1.0  # caught at lo, not at hi (a correct mechanism is never read as one)
    while hi - lo > 1e-3:
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if caught(mid) else (lo, mid)
    return lo


def _trials_for(stat: _Statistic, claim_fnr, uppers: _Uppers, select_fraction: float, sequential_mode: bool) -> int | None:
    """Smallest N (to 1 %) whose at-claim statistic reaches TARGET_SHARE of the claim, in epsilon units."""
    goal = TARGET_SHARE * stat.epsilon(stat.claim_value())

    def reached(n: int) -> bool:
        n_in, n_out = eval_sizes(n, select_fraction=select_fraction, sequential_mode=sequential_mode)
        return stat.epsilon(_expected_best(stat, claim_fnr, n_in, n_out, uppers)) >= goal

    lo, hi = (sequential.SELECT_TRIALS + 2 if sequential_mode else 4), 256
    while not reached(hi):
        if hi >= MAX_TRIALS:
            return None
        lo, hi = hi, min(hi * 2, MAX_TRIALS)
    while hi - lo > max(2, hi // 100):
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if reached(mid) else (mid, hi)
    return int(hi)


def power_cell(p: dict) -> str:
    """The power line shortened for a report's table cell."""
    if p.get("claimed_epsilon") is not None and not p.get("detectable"):
        return f"UNDERPOWERED: cannot detect a violation at all (limit {_f(p.get('ceiling'))} not above the claim)"
    k, n90 = p.get("smallest_factor"), p.get("trials_for_90")
    return (f"limit {_f(p.get('ceiling'))}; at claim {_f(p.get('at_claim'))}; detects sigma x {'—' if k is None else f'{k:.2f}'}; "
            f"90 % of claim: {'—' if n90 is None else format(n90, ',')} trials")

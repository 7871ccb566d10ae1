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
- ``smallest_factor``: the largest k < 1 such that a mechanism with k times the claimed noise (the
  claim's noise understated by 1/k) reads as a violation at its expected counts (about probability
  1/2);
- ``trials_for_90``: the trials N at which ``at_claim`` reaches 90 % of the claim.

The statistic: for a claim whose curve is a Gaussian (mu-GDP) one, the claimed-curve test's, in
epsilon units of the Gaussian-DP family (exact conversion, :func:`stats.gdp_epsilon`; the k-search
stays in the family, sigma k). Otherwise the eps_LB of the box corner, max(ln((1 - delta -
FNR_hi)/FPR_hi), ln((1 - delta - FPR_hi)/FNR_hi)), against the claimed epsilon, with the claim's
curve (or, without an event, the (eps, delta) point's curve) for the expected counts; there the
k-search runs in the claim's family (:func:`.curves.scale_event`: every noise multiplier times k,
a pure epsilon over k, so a Laplace scale times k), and a claim without an event has none (its
``factor_note`` says why). A PLD-profile claim costs a privacy loss distribution per k: its search
starts at the answer of the claim read as mu-GDP moved along the family by the central limit theorem
(:func:`proxy_mu`), runs on coarser PLDs (:data:`COARSE_SIGMA`; pessimistic, so lower curves: a
member is caught on its coarse curve wherever it is on its own), narrows the bracket on curves
interpolated between two evaluated ones (:func:`curve_search`), and reports a k caught on its own
curve, to 1 % (:data:`PROFILE_TOLERANCE`). These are predictions, not bounds; :mod:`.power_runs`
gives the same record for one-run and white-box audits.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass

from ..accounting.events import SubsampledGaussian
from ..lazy import lazy_import
from ..errors import DataError, UnsupportedEventError
from ..validation import open_unit, positive_int
from . import sequential, stats
from .curves import ClaimedCurve, _gdp_mu, gaussian_fnr, scale_event

np = lazy_import("numpy")
special = lazy_import("scipy.special")

#: Most false-positive counts tried per evaluation (geometric grid beyond it).
GRID_POINTS = 800
#: The largest N the trials-for-90 % search looks at, and the smallest noise factor k it tries.
MAX_TRIALS = 10**8
MIN_FACTOR = 1.0 / 64.0
#: The largest canary count the one-run and white-box size searches look at.
MAX_CANARIES = 10**5
#: Share of the claim ``trials_for_90`` asks for.
TARGET_SHARE = 0.9
SELECT_FRACTION = 0.3  # the engine's default (dpaudit.audits.engine.SELECT_FRACTION)


@dataclass(frozen=True)
class AuditPower:
    """The power line of one audit (see the module docstring): predictions, never bounds. The same
    record for every audit kind: ``trials`` is the audit's size in ``unit`` (trials; one-run and
    white-box audits: canaries) and ``trials_for_90`` the size, in that unit, at which ``at_claim``
    reaches 90 % of the claim; ``factor_note`` says why ``smallest_factor`` is not computed."""

    trials: int
    estimator: str
    claimed_epsilon: float | None
    ceiling: float | None
    at_claim: float | None = None
    detectable: bool = True
    smallest_factor: float | None = None
    trials_for_90: int | None = None
    eval_in: int | None = None
    eval_out: int | None = None
    sequential: bool = False
    unit: str = "trials"
    kind: str = "trials"
    factor_name: str = "sigma"
    factor_note: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        """One plain line for the CLI and the reports."""
        return power_line(self.to_dict())


#: What a record without a power block reads as (audits written before it existed).
NOT_RECORDED = "power: not recorded"


def power_line(p: dict | None) -> str:
    """The power line of a stored ``power`` block (audit.json, one_run.json, white_box.json)."""
    if not p:
        return NOT_RECORDED
    claim, unit = p.get("claimed_epsilon"), p.get("unit", "trials")
    ceiling = f"{_f(p.get('ceiling'))} ({_CEILING.get(p.get('kind'), _CEILING['trials'])})"
    lead = (
        f"power ({p['trials']} {unit}, {p['estimator']}): limit {ceiling}, "
        f"at the claim {_f(p.get('at_claim'))}"
    )
    if claim is not None and not p.get("detectable"):
        return (
            f"{lead}; UNDERPOWERED: that limit is not above the claim {_f(claim)}: this audit "
            f"cannot detect a violation at all (more {unit} needed)"
        )
    n90 = p.get("trials_for_90")
    needed = "over " + format(_MOST.get(unit, MAX_TRIALS), ",") if n90 is None else format(n90, ",")
    return (
        f"{lead}; smallest noise understatement detected: {_factor_text(p)}; "
        f"{unit} for 90 % of the claim: {needed}"
    )


#: What each kind's ceiling is, and the largest size each unit's search looks at.
_CEILING = {
    "trials": "perfectly separated scores",
    "one-run": "every guess correct",
    "white-box": "noise-free observations",
    "crafted-final": "noise-free observations",
}
_MOST = {"trials": MAX_TRIALS, "canaries": MAX_CANARIES}


def _factor_text(p: dict) -> str:
    """The smallest-factor part of a power line (older records: Gaussian claims only)."""
    k, name = p.get("smallest_factor"), p.get("factor_name", "sigma")
    if p.get("factor_note"):
        return str(p["factor_note"])
    gaussian = str(p.get("estimator", "")).startswith("claimed-curve")
    if k is None and "factor_name" not in p and not gaussian:
        return "not computed (needs a Gaussian claim)"
    if k is None:
        return f"none down to {name} x 1/64 (1/16 for a PLD claim)"
    return f"{name} x {k:.2f} (the claimed noise {1.0 / k:.2f}x the real)"


def _f(x) -> str:
    return "—" if x is None else f"{float(x):.3f}"


def eval_sizes(
    trials: int, *, select_fraction: float = SELECT_FRACTION, sequential_mode: bool = False
) -> tuple[int, int]:
    """(EVAL canary-in, EVAL canary-out) trials of an audit of ``trials`` (engine.plan_trials'
    split; a sequential audit: all but its SELECT trials, half each)."""
    if sequential_mode:
        rest = trials - sequential.SELECT_TRIALS
        return rest // 2, rest - rest // 2
    n_in, n_out = trials // 2, trials - trials // 2
    return n_in - select_count(n_in, select_fraction), n_out - select_count(n_out, select_fraction)


def select_count(trials: int, select_fraction: float) -> int:
    """SELECT trials of one world of ``trials``: a share ``select_fraction``, at least one, never all."""
    return min(max(int(round(select_fraction * trials)), 1), trials - 1)


def _uppers(confidence: float, sequential_mode: bool):
    """Upper bounds on a rate from (errors, trials) as the audit computes them."""
    if sequential_mode:
        alpha = (1.0 - confidence) / 2.0
        return lambda k, n: sequential.anytime_upper(k, np.full(np.shape(k), n), alpha)
    return lambda k, n: stats.cp_upper(k, np.full(np.shape(k), n), confidence, split=2)


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
        gaussian = self.mu is not None
        return "claimed-curve (Gaussian-DP)" if gaussian else "eps_LB of the box (clopper-pearson)"

    def of(self, fpr_hi, fnr_hi) -> np.ndarray:
        if self.mu is not None:
            return np.nan_to_num(_gdp_mu(fpr_hi, fnr_hi), nan=-np.inf)
        return np.asarray(stats.epsilon_from_rates(fpr_hi, fnr_hi, self.delta))

    def epsilon(self, value: float) -> float:
        """The statistic in epsilon units."""
        if self.mu is not None:
            return stats.gdp_epsilon(max(value, 0.0), self.delta)
        return float(value)

    def claim_value(self) -> float | None:
        return self.mu if self.mu is not None else self.claimed


def _expected_best(stat: _Statistic, fnr_of, n_in: int, n_out: int, uppers) -> float:
    """The best statistic over rules at the expected counts of a mechanism with curve ``fnr_of``."""
    k = _fp_grid(n_out)
    fn = np.round(n_in * np.clip(fnr_of(k / n_out), 0.0, 1.0))
    return float(np.max(stat.of(uppers(k, n_out), uppers(fn, n_in))))


def _grid() -> np.ndarray:
    return np.concatenate([[0.0], np.logspace(-9, 0, 1500)])


def _read_off(values: np.ndarray):
    grid = _grid()
    return lambda a: np.interp(a, grid, values)


def _point_curve(epsilon: float, delta: float):
    """The trade-off curve of one (epsilon, delta) point (claims without an event)."""
    e = math.exp(epsilon)
    return lambda a: np.maximum(0.0, np.maximum(1.0 - delta - e * a, (1.0 - delta - a) / e))


#: Why a claim without a DP event has no smallest factor.
NO_EVENT_NOTE = "n/a: an (epsilon, delta) claim without a DP event names no noise to scale"
#: The searches on a PLD-profile claim: relative tolerance (closed forms: 1e-3), and the noise
#: multiplier below which their coarse curves' PLD interval grows like 1/sigma^2 (the audit's
#: curves: 0.5): coarser, still pessimistic, so lower curves (measured: at most 0.01 lower in FNR
#: at sigma 0.6), 3-10x faster each.
PROFILE_TOLERANCE = 0.01
COARSE_SIGMA = 1.5


def audit_power(
    *,
    trials: int,
    delta: float,
    claimed_epsilon: float | None = None,
    curve=None,
    confidence: float = 0.95,
    select_fraction: float = SELECT_FRACTION,
    sequential_mode: bool = False,
) -> AuditPower:
    """The power line of an audit of ``trials`` trials of the claim ``curve`` (a
    :class:`dpaudit.audits.curves.ClaimedCurve`; None: the (``claimed_epsilon``, ``delta``) point)."""
    least = sequential.SELECT_TRIALS + 2 if sequential_mode else 4
    trials = positive_int("trials", trials, least)
    confidence = open_unit("confidence", confidence)
    uppers = _uppers(confidence, sequential_mode)
    sizes = functools.partial(
        eval_sizes, select_fraction=select_fraction, sequential_mode=sequential_mode
    )
    n_in, n_out = sizes(trials)
    stat = _Statistic(curve, claimed_epsilon, delta)
    perfect = float(stat.of(uppers(np.zeros(1), n_out), uppers(np.zeros(1), n_in))[0])
    base = dict(
        trials=trials,
        eval_in=n_in,
        eval_out=n_out,
        estimator=stat.name,
        claimed_epsilon=claimed_epsilon,
        ceiling=stat.epsilon(perfect),
        sequential=sequential_mode,
        factor_name=factor_name(curve),
        factor_note=None if curve is not None else NO_EVENT_NOTE,
    )
    claim_fnr = None if claimed_epsilon is None else _point_curve(claimed_epsilon, delta)
    if curve is not None:
        # read off a fixed log grid: a profile curve costs one evaluation, not one per N
        claim_fnr = _read_off(np.asarray(curve.fnr(_grid()), float))
    target = stat.claim_value()
    if claim_fnr is None or target is None:
        return AuditPower(**base)
    at_claim = _expected_best(stat, claim_fnr, n_in, n_out, uppers)
    detectable = perfect > target

    def caught(fnr) -> bool:
        return _expected_best(stat, fnr, n_in, n_out, uppers) > target

    factor = smallest_factor(curve, caught) if detectable and curve is not None else None
    needed = _trials_for(stat, claim_fnr, uppers, sizes, least)
    return AuditPower(
        **base,
        at_claim=stat.epsilon(at_claim),
        detectable=detectable,
        smallest_factor=factor,
        trials_for_90=needed,
    )


def factor_name(curve) -> str:
    """What the factor scales: the noise multiplier of a Gaussian-family claim, else the noise
    scale (a pure epsilon claim's Laplace scale 1/eps; :func:`.curves.scale_event`)."""
    event = getattr(curve, "event", None)
    leaves = [] if event is None else _leaves(event)
    gaussian = leaves and all(isinstance(leaf, SubsampledGaussian) for leaf in leaves)
    return "sigma" if gaussian else "noise"


def _leaves(event) -> list:
    inner = getattr(event, "events", None)
    return [event] if inner is None else [leaf for e in inner for leaf in _leaves(e)]


def smallest_factor(curve, caught) -> float | None:
    """Largest k in [MIN_FACTOR, 1) such that ``caught(fnr)`` holds for the trade-off curve ``fnr``
    of the claim's family member with k times its noise (:func:`dpaudit.audits.curves.scale_event`;
    a Gaussian claim: mu / k); None when not even 1/64 is. ``caught`` must hold for a lower curve
    wherever it holds for a higher one. Every k reported was evaluated on the member's own curve."""
    mu, as_gaussian = gdp_mu(curve), None
    if mu is not None:
        as_gaussian = largest_holding(
            lambda k: caught(as_gdp(curve, mu, k)), 0.5, low=MIN_FACTOR, high=1.0, step=0.25
        )
    if curve.closed_form == "gaussian" and mu is not None:
        return as_gaussian

    def member(k: float, coarse_sigma: float = 0.5):
        return ClaimedCurve(scale_event(curve.event, k), curve.adjacency, coarse_sigma).fnr

    guess = as_gaussian or 0.5  # the claim read as mu-GDP answers first, for free
    if curve.closed_form is not None:
        return largest_holding(lambda k: caught(member(k)), guess, low=MIN_FACTOR, high=1.0)
    # a coarse member is lower, so caught wherever its own curve is (and not caught above the
    # coarse answer): that answer, one tolerance lower, is lowered on the member's own curve until
    # caught there (a PLD below 1/16 of the noise explodes)
    k = curve_search(caught, lambda k: member(k, COARSE_SIGMA), guess, low=1.0 / 16.0, high=1.0)
    if k is None:
        return None
    tol = PROFILE_TOLERANCE
    return largest_holding(
        lambda x: caught(member(x)), k / (1.0 + tol), low=1.0 / 16.0, high=k, tolerance=tol
    )


def curve_search(holds, curve_at, guess: float, *, low: float, high: float) -> float | None:
    """:func:`largest_holding` of ``holds(curve_at(x))`` (to :data:`PROFILE_TOLERANCE`) in fewer
    calls of ``curve_at`` (a PLD each): steps from ``guess`` until two evaluated x bracket the
    edge, then tries the edge of the curves read off those two (pointwise, linear in log x: a
    guess only, cheap), with its neighbour x (1 +/- tolerance) once the bracket is within 4 of
    them, narrowing the bracket each time.
    Every x returned held on its own curve; a curve that cannot be computed does not hold."""
    seen: dict = {}

    def check(x: float) -> bool:
        try:
            seen[x] = np.asarray(curve_at(x)(_grid()), float)
        except (DataError, UnsupportedEventError):
            return False
        return holds(_read_off(seen[x]))

    yes, no = _bracket(check, guess, low, high)
    while yes is not None and no / yes > 1.0 + PROFILE_TOLERANCE:
        share = _read_off_share(holds, seen, yes, no) if yes in seen and no in seen else 0.5
        x = yes * (no / yes) ** share
        if check(x):
            yes, x = x, x * (1.0 + PROFILE_TOLERANCE)
        else:
            no, x = x, x / (1.0 + PROFILE_TOLERANCE)
        if yes < x < no and no / yes < (1.0 + PROFILE_TOLERANCE) ** 4:  # a read-off near the edge
            yes, no = (x, no) if check(x) else (yes, x)
    return yes


def _bracket(check, guess: float, low: float, high: float) -> tuple[float | None, float]:
    """(largest x found holding or None, smallest found failing; ``high`` unevaluated), stepping
    from ``guess`` by factors 1.1, 1.1^2, 1.1^4, ... until both are found."""
    yes, no, factor = None, high, 1.1
    x = min(max(guess, low), high / factor)
    while True:
        if check(x):
            yes = x
            if no < high or x * factor >= high:
                return yes, no
            x *= factor
        else:
            no = x
            if yes is not None or x <= low:
                return yes, no
            x = max(low, x / factor)
        factor *= factor


def _read_off_share(holds, seen: dict, yes: float, no: float, steps: int = 6) -> float:
    """Where the edge lies between ``yes`` and ``no`` (0 to 1 in log x) on the curves interpolated
    between theirs."""
    lo, hi = 0.0, 1.0
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        values = (1.0 - mid) * seen[yes] + mid * seen[no]
        lo, hi = (mid, hi) if holds(_read_off(values)) else (lo, mid)
    return min(max(0.5 * (lo + hi), 0.05), 0.95)  # keep the next x inside the bracket


def as_gdp(curve, mu: float, scale: float):
    """The trade-off curve of the claim read as ``mu``-GDP, moved to ``scale`` times its noise."""
    return functools.partial(gaussian_fnr, mu=proxy_mu(curve, mu, scale))


def proxy_mu(curve, mu: float, scale: float) -> float:
    """mu-GDP of the claim's family member with ``scale`` times its noise: a search's first guess,
    never a result. mu / scale, exact for a Gaussian claim; a profile claim of subsampled Gaussians:
    the central limit theorem's mu, sqrt(sum q^2 T (e^(1/sigma^2) - 1)), moved from the claim to
    the member and calibrated to the claim's own reading ``mu``."""
    leaves = [] if curve.closed_form is not None else _leaves(curve.event)
    leaves = [leaf for leaf in leaves if getattr(leaf, "steps", 0) > 0]
    if not leaves or not all(isinstance(leaf, SubsampledGaussian) for leaf in leaves):
        return mu / scale
    return mu * math.exp(min(_log_clt_mu(leaves, scale) - _log_clt_mu(leaves, 1.0), 700.0))


def _log_clt_mu(leaves: list, scale: float) -> float:
    """log of the central limit theorem's mu of these subsampled Gaussians at noise x ``scale``."""
    terms = []
    for leaf in leaves:
        x = 1.0 / (leaf.noise_multiplier * scale) ** 2  # log(e^x - 1) = x + log(1 - e^-x)
        terms.append(
            2.0 * math.log(leaf.sample_rate) + math.log(leaf.steps) + x + math.log(-math.expm1(-x))
        )
    top = max(terms)
    return 0.5 * (top + math.log(sum(math.exp(t - top) for t in terms)))


def gdp_mu(curve) -> float | None:
    """The claim read as mu-GDP (f(1/2) = Phi(-mu)); None when f(1/2) is 0 or 1 (no finite mu)."""
    mu = -float(special.ndtri(float(curve.fnr(0.5))))
    return mu if math.isfinite(mu) and mu > 0.0 else None


def largest_holding(
    holds,
    guess: float,
    *,
    low: float,
    high: float,
    tolerance: float = 1e-3,
    tries: int = 64,
    step: float | None = None,
) -> float | None:
    """The largest x in [low, high) evaluated to satisfy ``holds`` (true below an edge, false above;
    ``high`` is taken as false unevaluated), searched from ``guess`` by growing steps (down while
    none holds, up while none fails), then by geometric bisection to a relative ``tolerance``, in
    at most ``tries`` evaluations; the first step is ``step`` (default ``tolerance``). None when
    none evaluated holds. Never a value that was not evaluated."""
    yes, no, bracketed = None, high, False
    x, step = min(max(guess, low), high / (1.0 + tolerance)), step or tolerance
    for _ in range(tries):
        if holds(x):
            yes = x
        else:
            no, bracketed = x, True
        if yes is None:
            if x <= low:
                break
            x = max(low, x / (1.0 + step))
        elif no / yes <= 1.0 + tolerance:
            break
        elif not bracketed and x * (1.0 + step) < high:  # up by growing steps until one fails
            x = x * (1.0 + step)
        else:
            x = math.sqrt(yes * no)
        step *= 2.0
    return yes


def _trials_for(stat: _Statistic, claim_fnr, uppers, sizes, least: int) -> int | None:
    """Smallest N (from ``least``, to 1 %) whose at-claim statistic reaches TARGET_SHARE of the
    claim, in epsilon units; ``sizes(N)``: the EVAL (canary-in, canary-out) trials of N."""
    goal = TARGET_SHARE * stat.epsilon(stat.claim_value())

    def reached(n: int) -> bool:
        return stat.epsilon(_expected_best(stat, claim_fnr, *sizes(n), uppers)) >= goal

    return smallest_size(reached, least, MAX_TRIALS)


def smallest_size(reached, least: int, most: int, first: int = 256) -> int | None:
    """Smallest n in (least, most] (to 1 %) with ``reached(n)``, assumed monotone: doubling from
    ``first``, then bisection; the n returned was evaluated. None when ``most`` is not reached
    (asked first: the doubling would end there anyway)."""
    if not reached(most):
        return None
    lo, hi = least, max(first, least + 1)
    while hi < most and not reached(hi):
        lo, hi = hi, min(hi * 2, most)
    while hi - lo > max(2, hi // 100):
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if reached(mid) else (mid, hi)
    return int(hi)


def power_cell(p: dict | None) -> str:
    """The power line shortened for a report's table cell (no block: "power: not recorded")."""
    if not p:
        return NOT_RECORDED
    if p.get("claimed_epsilon") is not None and not p.get("detectable"):
        return f"UNDERPOWERED: cannot detect a violation at all (limit {_f(p.get('ceiling'))} not above the claim)"
    k, n90, unit = p.get("smallest_factor"), p.get("trials_for_90"), p.get("unit", "trials")
    factor = "n/a" if p.get("factor_note") else "—" if k is None else f"{k:.2f}"
    return (
        f"limit {_f(p.get('ceiling'))}; at claim {_f(p.get('at_claim'))}; "
        f"detects {p.get('factor_name', 'sigma')} x {factor}; "
        f"90 % of claim: {'—' if n90 is None else format(n90, ',')} {unit}"
    )

"""One-run audits: lower bounds on epsilon from ONE training run with m independent canaries.

A trainer inserts m canaries, each included independently with probability 1/2 (a private coin),
trains once and hands the analysis one score per canary (:class:`OneRunScores`). The auditor
guesses "in" for the ``k_pos`` highest scores, "out" for the ``k_neg`` lowest and abstains on the
rest; the number of correct guesses is then compared with what any mechanism satisfying the
claim could achieve. Two analyses, each at the stated confidence:

* **(eps, delta)** -- Steinke, Nasr & Jagielski (2023), "Privacy auditing with one (1) training
  run", main theorem: for an (eps, delta)-DP mechanism and r guesses over m canaries,
  ``P[W >= v] <= P[B >= v] + 2 m delta max_{1<=i<=v} P[v - i <= B < v] / i`` with
  ``B ~ Binomial(r, e^eps / (1 + e^eps))``. eps_LB is an eps at which that p-value is at most
  the significance (:func:`steinke_p_value`, :func:`steinke_epsilon`).
* **f-DP** -- Mahloujifar, Melis & Chaudhuri (2024), "Auditing f-differential privacy in one
  run": against the claimed trade-off curve f of the release's event (and its family
  ``scale_event(claim, s)``) the number of correct guesses obeys a recursion over the tail
  probabilities (:func:`fdp_rejects`; the derivation is in its docstring). The family search
  mirrors :func:`dpaudit.audits.curves.curve_test`: ``scale_lower_bound`` = the smallest scale s
  whose claim the guesses rule out, reported as epsilon of ``scale_event(claim, s)``.

Choosing (k_pos, k_neg) after looking at the guesses is multiple testing, so a fixed public grid
(:func:`guess_grid`) is tried with a Bonferroni split of the significance over it.

**Privacy contract.** The guesses depend on the scores and on public canary indices only (ties
broken by index), never on ``included``; each canary must be one add/remove unit of the claimed
event with its own independent fair inclusion coin. Under these conditions the bounds are valid:
an eps_LB above the claim falsifies it at the stated confidence.
"""

from __future__ import annotations

import functools
import math
import os
import uuid
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable

from ..audit_outputs import ONE_RUN_LOCAL_FILE, local_document, split_one_run
from ..errors import DataError, UsageError
from ..lazy import lazy_import
from ..noise import public_rng
from ..records import _json_safe, write_json_atomic
from ..validation import one_of, open_unit
from . import curves
from .curves import claimed_curve, member_epsilon, scale_event
from .stats import bisect

np = lazy_import("numpy")
special = lazy_import("scipy.special")
stats = lazy_import("scipy.stats")

SCHEMA = "dpaudit.one-run/1"
ONE_RUN_FILE = "one_run.json"
KINDS = ("gradient", "input-mislabeled", "input-ood", "user")
#: k_pos = k_neg = round(m * fraction) (>= 1, at most m // 2) for each fraction: the public guess grid.
GRID_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.25, 0.5)
#: Family search over the scale s: relative tolerance and default range (profile curves use
#: curves.SCALE_RANGE_PROFILE, where dp-accounting's PLD stays well behaved, and the coarser
#: _PROFILE_TOLERANCE: each scale costs a PLD, seconds; the reported s is a rejected one either way).
_SCALE_TOLERANCE = 1e-3
_PROFILE_TOLERANCE = 1e-2
_SCALE_RANGE = (1e-6, 1e6)
_TAG_PLAN_COINS = 0xC011


@functools.cache
def _fdp_grid() -> np.ndarray:
    """FPR grid on which the claimed curve is evaluated for the f-DP recursion: 0 and log-spaced points from 1e-12 to 1 (the
    inverse used there is rounded DOWN to a grid point: conservative)."""
    return np.concatenate([[0.0], np.logspace(-12.0, 0.0, 3001)])


# ------------------------------------------------------------------------------------ scores


@dataclass(frozen=True)
class OneRunScores:
    """What a trainer hands to the analysis.

    scores: (m,) float, higher = "more likely included" (finite).
    included: (m,) bool, each canary included independently with probability 1/2 (private draw).
    kind: "gradient" | "input-mislabeled" | "input-ood" | "user".
    info: public description (coordinates, model, steps...), stored in one_run.json.
    """

    scores: np.ndarray
    included: np.ndarray
    kind: str
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if np.ndim(self.scores) > 1:
            raise UsageError(f"scores must be a 1-d array, got shape {np.shape(self.scores)}.")
        s = np.asarray(self.scores, dtype=np.float64).reshape(-1)
        inc = np.asarray(self.included)
        if inc.ndim != 1 or inc.size != s.size:
            raise UsageError(
                f"included must be a 1-d array of the scores' length {s.size}, got shape {inc.shape}."
            )
        if inc.dtype != bool and not np.all(np.isin(inc, (0, 1))):
            raise UsageError(
                f"included must hold booleans (or 0/1), got values {sorted(set(np.unique(inc).tolist()))[:5]}."
            )
        inc = inc.astype(bool)
        if s.size < 2:
            raise UsageError(f"canaries must be at least 2, got {s.size}.")
        if not np.all(np.isfinite(s)):
            raise UsageError(
                f"scores must be finite, got {int(np.sum(~np.isfinite(s)))} non-finite values."
            )
        one_of("kind", self.kind, KINDS)
        if not isinstance(self.info, dict):
            raise UsageError(f"info must be a dict, got {type(self.info).__name__}.")
        object.__setattr__(self, "scores", s)
        object.__setattr__(self, "included", inc)

    @property
    def m(self) -> int:
        return int(self.scores.size)


def plan_coins(seed: int, m: int) -> np.ndarray:
    """The m fair inclusion coins of a pre-registered one-run audit, from the seed its plan commits
    to (:mod:`dpaudit.audit_plans`): secret until the run reveals the seed, then checkable by anyone.
    Independent of the DP noise, which never derives from it."""
    return public_rng(seed, _TAG_PLAN_COINS).random(int(m)) < 0.5


def guess_grid(m: int) -> list[tuple[int, int]]:
    """The public (k_pos, k_neg) grid for m canaries: k_pos = k_neg = round(m * f) for f in
    :data:`GRID_FRACTIONS`, at least 1 and at most m // 2, duplicates removed (order kept)."""
    out: list[tuple[int, int]] = []
    for f in GRID_FRACTIONS:
        k = min(max(1, int(round(m * f))), m // 2)
        if k >= 1 and (k, k) not in out:
            out.append((k, k))
    return out


def count_correct(scores, included, k_pos: int, k_neg: int) -> tuple[int, int]:
    """(guesses, correct) of the rule "in" for the k_pos highest scores, "out" for the k_neg
    lowest. Ties are broken by canary index (public), never by inclusion."""
    s = np.asarray(scores, dtype=np.float64)
    inc = np.asarray(included, dtype=bool)
    if k_pos < 0 or k_neg < 0 or k_pos + k_neg > s.size:
        raise UsageError(f"k_pos + k_neg must be in [0, {s.size}], got {k_pos} + {k_neg}.")
    order = np.argsort(-s, kind="stable")  # descending score; equal scores keep index order
    top = order[:k_pos]
    bottom = order[s.size - k_neg :] if k_neg else order[:0]
    return k_pos + k_neg, int(inc[top].sum() + (~inc[bottom]).sum())


# ------------------------------------------------------------------- (eps, delta): Steinke et al.


def steinke_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """Upper bound on P[at least v of r guesses correct] for any (epsilon, delta)-DP mechanism
    with m canaries (Steinke, Nasr & Jagielski 2023, main theorem): ``P[B >= v] + 2 m delta
    max_{1<=i<=v} P[v - i <= B < v] / i`` with ``B ~ Binomial(r, e^eps / (1 + e^eps))``."""
    if not (0 <= v <= r <= m):
        raise UsageError(
            f"counts must satisfy 0 <= correct <= guesses <= canaries, got {v}, {r}, {m}."
        )
    q = float(special.expit(epsilon))
    beta = float(stats.binom.sf(v - 1, r, q))
    if delta == 0 or v == 0:
        return min(beta, 1.0)
    # P[B = v - i] for i = 1..v; the running sums are P[v - i <= B < v].
    tail = np.cumsum(stats.binom.pmf(np.arange(v - 1, -1, -1), r, q))
    alpha = float(np.max(tail / np.arange(1, v + 1)))
    return min(beta + 2.0 * m * float(delta) * alpha, 1.0)


def steinke_epsilon(
    m: int, r: int, v: int, *, delta: float, significance: float, tol: float = 1e-6
) -> float:
    """eps_LB of one (r, v) at ``significance``: an epsilon whose p-value is <= significance (the
    left end of a bisection bracket, so the returned value always passes), 0 if eps = 0 already
    fails. Sound whatever the p-value's shape: (e, delta)-DP implies (E, delta)-DP for E >= e, so
    a reported E with p(E) <= significance rules out every e <= E at that level."""
    if v == 0 or steinke_p_value(m, r, v, 0.0, delta) > significance:
        return 0.0
    lo, hi = 0.0, 1.0
    while steinke_p_value(m, r, v, hi, delta) <= significance:
        lo, hi = hi, 2.0 * hi
        if hi > 1e3:  # cannot happen for r >= 1 (the binomial tail tends to 1); guard anyway
            return lo
    return bisect(lambda e: steinke_p_value(m, r, v, e, delta) <= significance, lo, hi, tol=tol)[0]


# --------------------------------------------------------------------- f-DP: Mahloujifar et al.


def _curve_values(fnr: Callable[[np.ndarray], np.ndarray]) -> tuple[np.ndarray, bool]:
    """The curve on :func:`_fdp_grid`, made non-increasing (a running minimum only lowers it:
    conservative), and whether it is convex on the grid (the recursion needs a convex curve: a
    trade-off function is one; a non-convex "lower bound" is refused, never patched up)."""
    x = _fdp_grid()
    f = np.clip(np.asarray(fnr(x), dtype=np.float64), 0.0, 1.0)
    if f.shape != x.shape or not np.all(np.isfinite(f)):
        raise DataError(
            f"claimed curve must give finite values on the FPR grid, got shape {f.shape}."
        )
    f = np.minimum.accumulate(f)
    convex = _convex_on_grid(x, f)
    return f, convex


def _convex_on_grid(x: np.ndarray, f: np.ndarray, tol: float = 1e-9) -> bool:
    """Every grid point lies on or below the chord of its two neighbours (up to ``tol``)."""
    xa, xb, xc = x[:-2], x[1:-1], x[2:]
    chord = f[:-2] + (f[2:] - f[:-2]) * (xb - xa) / (xc - xa)
    return bool(np.all(f[1:-1] <= chord + tol))


def fdp_rejects(
    curve_values: np.ndarray, m: int, guesses: int, correct: int, significance: float
) -> bool:
    """True when ``correct`` of ``guesses`` correct guesses over m canaries rule out, at
    ``significance``, every mechanism that is f-DP for the curve f given by ``curve_values`` on
    :func:`_fdp_grid` (non-increasing, convex, a lower bound on the trade-off function of every
    canary's neighbouring pair in both orders).

    Derivation (after Mahloujifar, Melis & Chaudhuri 2024). Let c' = guesses (fixed), N = correct
    guesses, p_j = P[N = j], and for a uniformly random canary J:
    ``r_i = P[J guessed right, N >= i] = sum_{j>=i} p_j j / m`` and
    ``h_i = P[J guessed wrong, N >= i] = sum_{j>=i} p_j (c' - j) / m``.
    {J right, N >= i} and {J wrong, N >= i - 1} are the same test of J's coin (guess on J and
    N_{-J} >= i - 1, functions of the output and the other coins) scored against opposite
    values of the coin, so f-DP and Jensen (1 - f concave) give ``r_i <= 1 - f(h_{i-1})``,
    i.e. ``h_{i-1} >= G(r_i)`` with ``G(y) = inf{x : f(x) <= 1 - y}``; and
    ``r_{i-1} - r_i = a_{i-1} (h_{i-1} - h_i)`` with ``a_i = i / (c' - i)``. If P[N >= c] >= s
    (s = significance), the greedy recursion started from (s c / m, s (c' - c) / m) and taking
    the smallest allowed h at each level ends with ``r_0 + h_0 <= c' / m`` (the true value):
    the difference between the true and the greedy state stays in the cone spanned by (1, -1)
    and (i, c' - i) at level i (checked step by step: the greedy step maps the cone at level
    i + 1 into the one at level i because a_i < a_{i+1}, G is non-decreasing and any larger h
    adds a multiple of (a_i, 1)), and that cone at level 0 has r + h >= 0. So a final
    ``r_0 + h_0 > c' / m`` means P[N >= c] < s: the claim is rejected. G is evaluated rounded
    DOWN to the grid (a smaller G only weakens the test).
    """
    c1, v = int(guesses), int(correct)
    if not (0 <= v <= c1 <= m):
        raise UsageError(
            f"counts must satisfy 0 <= correct <= guesses <= canaries, got {v}, {c1}, {m}."
        )
    if c1 == 0 or v == 0:
        return False
    neg_f = -curve_values  # non-decreasing: searchsorted finds how many grid points have f > 1 - y
    x = _fdp_grid()
    total = c1 / m
    r = significance * v / m
    h = significance * (c1 - v) / m
    for i in range(v - 1, -1, -1):
        k = int(np.searchsorted(neg_f, r - 1.0, side="left"))  # f(x_j) > 1 - r for j < k
        g = x[k - 1] if k > 0 else 0.0
        if g <= h:
            break  # nothing changes at this or any lower level
        r += i / (c1 - i) * (g - h)
        h = g
        if r + h > total * (1.0 + 1e-9):
            return True
    return r + h > total * (1.0 + 1e-9)


def fdp_family_search(
    counts: list[tuple[int, int]],
    m: int,
    *,
    curve_at: Callable[[float], Callable],
    significance: float,
    tolerance: float = _SCALE_TOLERANCE,
    scale_range: tuple[float, float] = _SCALE_RANGE,
) -> dict:
    """Smallest scale s (within ``scale_range``) whose curve ``curve_at(s)`` (a ``fnr`` callable;
    larger s = higher curve) the guesses rule out, Bonferroni over ``counts`` (each (guesses,
    correct) tested at significance / len(counts)). The returned ``scale_lower_bound`` is always a
    scale that was tested and rejected (bisection's right end): sound, conservative by at most the
    bisection width. ``None`` when even the largest scale is not rejected."""
    each = significance / max(1, len(counts))

    class _NotConvex(Exception):
        pass

    @functools.cache  # each scale is tested once (a refused curve raises again: never cached)
    def rejects(s: float) -> bool:
        vals, convex = _curve_values(curve_at(s))
        if not convex:
            raise _NotConvex(s)
        return any(fdp_rejects(vals, m, c1, v, each) for c1, v in counts)

    try:
        return _search(rejects, tolerance, scale_range)
    except _NotConvex as e:
        return {
            "scale_lower_bound": None,
            "violated": False,
            "unavailable": f"the claimed curve at scale {e.args[0]:.4g} is not convex on the FPR grid",
        }


def _search(
    rejects: Callable[[float], bool], tolerance: float, scale_range: tuple[float, float]
) -> dict:
    """inf{s : rejects(s)} for an up-closed rejection set, reported at a rejected s (the right
    end of the final bracket, relative width ``tolerance``); None when the top of the range
    is not rejected, the bottom of the range when everything tried is."""
    lo_lim, hi_lim = scale_range
    violated = rejects(1.0)
    lo, hi = (None, 1.0) if violated else (1.0, None)
    step = 2.0
    while hi is None:
        s = min(lo * step, hi_lim)
        if rejects(s):
            hi = s
        elif s >= hi_lim:
            return {"scale_lower_bound": None, "violated": False}
        else:
            lo, step = s, step * step
    while lo is None:
        s = max(hi / step, lo_lim)
        if not rejects(s):
            lo = s
        elif s <= lo_lim:
            return {"scale_lower_bound": s, "violated": True}
        else:
            hi, step = s, step * step
    while hi / lo > 1.0 + tolerance:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if rejects(mid) else (mid, hi)
    return {"scale_lower_bound": hi, "violated": violated}


# --------------------------------------------------------------------------------- the record


def one_run_bounds(
    s: OneRunScores,
    *,
    delta: float,
    confidence: float = 0.95,
    claim=None,
    accountant: str = "rdp",
    adjacency: str = "add-remove-record",
    claimed_epsilon: float | None = None,
) -> dict:
    """Both one-run analyses of ``s`` (the dict stored as one_run.json; module docstring).

    ``claim``: the claimed event (dpaudit.accounting.events); with it the f-DP analysis runs
    against its claimed curve and family, and ``claimed_epsilon`` defaults to the event's epsilon
    at ``delta`` under ``accountant``. Without it ``"fdp"`` is null.
    """
    if not isinstance(s, OneRunScores):
        raise UsageError(f"scores must be a OneRunScores, got {type(s).__name__}.")
    delta = open_unit("delta", delta)
    alpha = 1.0 - open_unit("confidence", confidence)
    m = s.m
    grid = guess_grid(m)
    counts = [count_correct(s.scores, s.included, kp, kn) for kp, kn in grid]
    steinke = _steinke_block(m, grid, counts, delta, alpha)
    fdp = None
    if claim is not None:
        fdp = _fdp_block(counts, m, claim, delta, alpha, accountant, adjacency)
        if claimed_epsilon is None:
            claimed_epsilon = _epsilon_of(claim, 1.0, delta, accountant, adjacency)
    return {
        "schema": SCHEMA,
        "canaries": m,
        "kind": s.kind,
        "included": int(s.included.sum()),
        "grid": [{"k_pos": kp, "k_neg": kn} for kp, kn in grid],
        "steinke": steinke,
        "fdp": fdp,
        "claimed_epsilon": None if claimed_epsilon is None else float(claimed_epsilon),
        "delta": delta,
        "confidence": float(confidence),
        "info": dict(s.info),
    }


def _steinke_block(m: int, grid: list, counts: list, delta: float, alpha: float) -> dict:
    """one_run.json "steinke": the Steinke et al. eps_LB of the grid's (guesses, correct)
    ``counts``, Bonferroni over the grid at significance ``alpha``, and its ceiling."""
    each = alpha / len(grid)
    eps = [steinke_epsilon(m, r, v, delta=delta, significance=each) for r, v in counts]
    best = int(np.argmax(eps))
    ceiling = max(steinke_epsilon(m, r, r, delta=delta, significance=each) for r, _ in counts)
    method = (
        f"Steinke, Nasr & Jagielski (2023): guess 'in' for the k+ highest scores and 'out' for the k- lowest, abstain on the "
        f"rest; eps_LB = the largest eps whose (eps, delta) p-value P[Bin(r, e^eps/(1+e^eps)) >= v] + 2 m delta "
        f"max_i P[v-i <= Bin < v]/i is <= {alpha:g}/{len(grid)} (Bonferroni over the {len(grid)} (k+, k-) grid points); "
        f"ceiling: all guesses correct."
    )
    return {
        "epsilon_lower_bound": float(eps[best]),
        "k_pos": grid[best][0],
        "k_neg": grid[best][1],
        "guesses": counts[best][0],
        "correct": counts[best][1],
        "ceiling": float(ceiling),
        "method": method,
        "per_grid": [
            {"k_pos": kp, "k_neg": kn, "guesses": r, "correct": v, "epsilon_lower_bound": float(e)}
            for (kp, kn), (r, v), e in zip(grid, counts, eps)
        ],
    }


def _epsilon_of(claim, s, delta: float, accountant: str, adjacency: str) -> float:
    """Epsilon of the claim's family member at scale ``s`` (0.0 for None: none ruled out)."""
    return member_epsilon(claim, s, delta=delta, accountant=accountant, adjacency=adjacency)


def _fdp_block(
    counts, m: int, claim, delta: float, alpha: float, accountant: str, adjacency: str
) -> dict:
    """The f-DP analysis of the grid's (guesses, correct) ``counts`` against ``claim``'s family."""
    closed = claimed_curve(claim, adjacency=adjacency).closed_form is not None
    scale_range = curves.SCALE_RANGE_CLOSED if closed else curves.SCALE_RANGE_PROFILE

    def curve_at(scale: float):
        return claimed_curve(scale_event(claim, scale), adjacency=adjacency).fnr

    tol = _SCALE_TOLERANCE if closed else _PROFILE_TOLERANCE
    search = functools.partial(
        fdp_family_search, m=m, curve_at=curve_at, significance=alpha, scale_range=scale_range
    )
    found = search(counts, tolerance=tol)
    if "unavailable" in found:
        why = found["unavailable"]
        return {
            "method": f"not computed: {why} (the f-DP recursion needs a convex trade-off curve).",
            "event": claim.to_dict(),
            "epsilon_lower_bound": None,
            "violated": False,
            "unavailable": why,
        }
    s_lb = found["scale_lower_bound"]
    eps_lb = _epsilon_of(claim, s_lb, delta, accountant, adjacency)
    ceiling = None
    if closed:  # a profile (PLD) curve costs seconds per scale: its ceiling is not searched
        top = search([(r, r) for r, _ in counts])
        ceiling = _epsilon_of(claim, top.get("scale_lower_bound"), delta, accountant, adjacency)
    method = (
        f"Mahloujifar, Melis & Chaudhuri (2024): the same guesses tested against the claimed trade-off curve of "
        f"scale_event(claim, s) with the recursive bound on the number of correct guesses of an f-DP mechanism, "
        f"Bonferroni over the {len(counts)} (k+, k-) grid points at significance {alpha:g}; scale_lower_bound = the smallest "
        f"s ruled out (log-bisection to {tol:g} relative, reported at a rejected s); eps_LB = epsilon of "
        f"scale_event(claim, s_LB) at delta with the {accountant} accountant."
    )
    return {
        "method": method,
        "event": claim.to_dict(),
        "accountant": accountant,
        "adjacency": str(adjacency),
        "family": curves._family_parameter(claim, s_lb),
        "scale_lower_bound": s_lb,
        "epsilon_lower_bound": float(eps_lb),
        "violated": bool(found["violated"]),
        "ceiling": ceiling,
    }


def recompute_bounds(
    rec: dict, *, claim=None, accountant: str = "rdp", adjacency: str = "add-remove-record"
) -> dict:
    """The eps_LB of both analyses recomputed from a one_run.json's stored counts (the guesses and
    correct guesses at each point of the public grid) alone: {"steinke": eps, "fdp": eps or None
    (no ``claim`` event)}. A grid other than :func:`guess_grid`'s is a DataError."""
    m, delta = int(rec["canaries"]), float(rec["delta"])
    alpha = 1.0 - open_unit("confidence", float(rec["confidence"]))
    rows = rec["steinke"]["per_grid"]
    grid = [(int(g["k_pos"]), int(g["k_neg"])) for g in rows]
    counts = [(int(g["guesses"]), int(g["correct"])) for g in rows]
    if grid != guess_grid(m):
        raise DataError(f"one-run grid must be the public grid of {m} canaries, got {grid}.")
    steinke = _steinke_block(m, grid, counts, delta, alpha)["epsilon_lower_bound"]
    if claim is None:
        return {"steinke": float(steinke), "fdp": None}
    fdp = _fdp_block(counts, m, claim, delta, alpha, accountant, adjacency)
    return {"steinke": float(steinke), "fdp": fdp["epsilon_lower_bound"]}


def audit_one_run(
    scores, included, *, kind: str = "gradient", info: dict | None = None, **bounds
) -> dict:
    """Bring your own: the one-run bounds (:func:`one_run_bounds`, whose keywords ``bounds`` are:
    ``delta``, ``confidence``, ``claim``, ``accountant``, ``adjacency``, ``claimed_epsilon``) of
    scores made elsewhere. ``included`` must be each canary's private fair coin, drawn
    independently of everything the scores' guesses could be tuned on."""
    scored = OneRunScores(np.asarray(scores), np.asarray(included), kind, dict(info or {}))
    return one_run_bounds(scored, **bounds)


@dataclass(frozen=True)
class OneRunResult:
    """one_run.json as a record: the bounds dict plus where and how it was made."""

    bounds: dict
    mechanism: str | None = None
    noise: bool = True
    command: str | None = None
    release_id: str | None = None
    release_path: str | None = None
    timings: dict = field(default_factory=dict)
    # the ledger's audit entry (and plan run) of this run
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # a pre-registered run: plan id, revealed salt and seeds (dpaudit.audit_plans)
    plan: dict | None = None
    power: dict | None = None  # what this m can detect (dpaudit.audits.power_runs.one_run_power_of)

    @property
    def statistic(self) -> str:
        """The deciding analysis, fixed before looking: "f-dp" when a claimed event was tested
        (and its curve was usable), else "steinke". Only one decides, so the verdict keeps the
        stated confidence (taking the larger of the two would not)."""
        fdp = self.bounds.get("fdp") or {}
        return "f-dp" if fdp.get("epsilon_lower_bound") is not None else "steinke"

    @property
    def epsilon_lower_bound(self) -> float:
        """The deciding statistic's eps_LB."""
        key = "fdp" if self.statistic == "f-dp" else "steinke"
        return float(self.bounds[key]["epsilon_lower_bound"])

    @property
    def violated(self) -> bool:
        """The deciding statistic rules out the claim on the real (noised) mechanism."""
        claim = self.bounds.get("claimed_epsilon")
        if not self.noise or claim is None:
            return False
        if self.statistic == "f-dp":
            return bool(self.bounds["fdp"]["violated"])
        return float(self.bounds["steinke"]["epsilon_lower_bound"]) > float(claim)

    def to_dict(self) -> dict:
        d = dict(self.bounds)
        d.update((f.name, getattr(self, f.name)) for f in fields(self)[1:])  # all but the bounds
        d.update(
            statistic=self.statistic,
            epsilon_lower_bound=self.epsilon_lower_bound,
            violated=self.violated,
        )
        return _json_safe(d)


def write_one_run(result: OneRunResult, out_dir: str | os.PathLike) -> Path:
    """Write ``one_run.json`` (shareable) and ``one_run_local.json`` (not for publication: the
    data-derived canary coordinates, labels, exact timings; :mod:`dpaudit.audit_outputs`) under ``out_dir``."""
    public, local = split_one_run(result.to_dict())
    write_json_atomic(
        Path(out_dir) / ONE_RUN_LOCAL_FILE,
        local_document(result.release_id, local, key="release_id"),
    )
    return write_json_atomic(Path(out_dir) / ONE_RUN_FILE, public)

"""Noise calibration: the smallest noise parameter whose epsilon does not exceed a target.

:func:`calibrate` is generic, in the spirit of dp_accounting's ``calibrate_dp_mechanism``: given
``make_event(p)`` (the event of the mechanism run with noise parameter p: a noise multiplier, a
Laplace scale, ...), an accountant and an adjacency, it finds the smallest p in ``[lo, hi]`` with
``epsilon(make_event(p)) <= target``, assuming epsilon does not increase with p (more noise,
less privacy loss). :func:`calibrate_noise_multiplier` is that search for a Poisson-subsampled
Gaussian run (DP-SGD), with an on-disk cache.

The search (:func:`calibrate`) never overshoots: the returned epsilon is the accountant's own
value at the returned parameter, <= target. Results of :func:`calibrate_noise_multiplier` are
cached on disk per public configuration and re-verified with the accountant before use, so a
stale or edited cache can never under-report epsilon.

Calibration is made under a declared adjacency with an accountant that supports it
(:func:`~dpaudit.accounting.accountants.support_error`): e.g. replace-record with sample_rate < 1
needs ``pld``; rdp / prv refuse it with a one-line error rather than calibrating the add/remove
epsilon. An accountant that declines some noise levels for a numerical reason (prv far in the
tails) counts them as infinite epsilon during the search (conservative); if that leaves the
result further than the tolerance from the target, calibration refuses with the accountant's
reason instead of returning a silently loose noise level.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import CalibrationError, UnsupportedEventError, UsageError
from ..paths import cache_dir, write_atomically
from ..validation import half_open_unit, open_unit, positive_finite, positive_int
from .accountants import ACCOUNTANTS, Accountant, accountants_supporting, compute_epsilon
from .accountants import get_accountant, refuse_unsupported
from .adjacency import Adjacency, AdjacencyLike
from .base import ADD_REMOVE, Record, first_line
from .events import Event, SubsampledGaussian
from .pld import PLD_VALUE_DISCRETIZATION
from .rdp import RDP_ORDERS

EPSILON_TOLERANCE = 1e-4
MAX_NOISE_MULTIPLIER = 1e6
MIN_NOISE_MULTIPLIER = 1e-3
_CACHE_VERSION = 1


@dataclass(frozen=True)
class Calibration(Record):
    noise_multiplier: float
    epsilon: float  # achieved, <= target_epsilon
    target_epsilon: float
    delta: float
    sample_rate: float
    steps: int
    accountant: str
    cached: bool = False


def _cache_key(
    accountant: str,
    target: float,
    delta: float,
    q: float,
    steps: int,
    adjacency: Adjacency = ADD_REMOVE,
) -> str:
    fields = [_CACHE_VERSION, accountant, repr(target), repr(delta), repr(q), steps]
    fields += [EPSILON_TOLERANCE, list(RDP_ORDERS) if accountant == "rdp" else None]
    if accountant == "pld":
        fields.append(PLD_VALUE_DISCRETIZATION)
    if adjacency is Adjacency.REPLACE_RECORD:
        # add-remove-record and add-remove-user are the same mechanism (the unit differs), so they
        # share the old key; replace-one is a different computation and gets its own.
        fields.append(adjacency.value)
    return hashlib.sha256(json.dumps(fields).encode()).hexdigest()


def _cache_path() -> Path:
    return cache_dir() / "calibration.json"


def _load_cache() -> dict:
    try:
        data = json.loads(_cache_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _store_cache(key: str, value: float) -> None:
    with contextlib.suppress(OSError):  # a cache that cannot be written only costs time
        write_atomically(_cache_path(), json.dumps({**_load_cache(), key: value}))


@dataclass(frozen=True)
class CalibrationResult(Record):
    """What :func:`calibrate` found: the smallest noise ``parameter`` it certified and the
    accountant's epsilon there (<= ``target_epsilon``), under ``adjacency``."""

    parameter: float
    epsilon: float  # the accountant's value at ``parameter``, <= target_epsilon
    target_epsilon: float
    delta: float
    accountant: str
    adjacency: str
    evaluations: int  # accountant calls made (distinct parameters)


@dataclass
class _Search:
    """Epsilon evaluations of one calibration (memoised), remembering the accountant's declines."""

    make_event: Callable[[float], Event]
    accountant: Accountant
    delta: float
    adjacency: Adjacency
    parameter_name: str
    declined: dict[float, str] = field(default_factory=dict)  # parameter -> the accountant's reason
    values: dict[float, float] = field(default_factory=dict)

    def epsilon(self, p: float) -> float:
        if p in self.values:
            return self.values[p]
        event = self.make_event(p)  # outside the try: a broken make_event is the caller's error
        try:
            eps = compute_epsilon(
                event, delta=self.delta, accountant=self.accountant, adjacency=self.adjacency
            ).epsilon
        except UnsupportedEventError as e:
            # The accountant gives no bound at this noise level (prv far in the tails): infinite
            # epsilon is the conservative reading; remembered so a result next to a decline is
            # refused rather than returned loose (see calibrate).
            self.declined[p] = first_line(e)
            eps = float("inf")
        except (MemoryError, OverflowError, FloatingPointError, ValueError):
            # an accountant library failing on the huge privacy loss of a tiny noise multiplier;
            # treating it as infinite epsilon is the conservative reading during the search.
            eps = float("inf")
        self.values[p] = eps
        return eps

    def solve(self, target: float, lo: float, hi: float, start: float, tol: float) -> tuple:
        """``(parameter, epsilon)``: bracket from ``start``, then bisect (see :func:`calibrate`)."""
        down, up = self._bracket(target, lo, hi, start)
        if down is None:
            return up, self.epsilon(up)  # lo itself meets the target: the smallest allowed
        for _ in range(200):  # bisection: eps(down) > target >= eps(up)
            mid = 0.5 * (down + up)
            # stop within the tolerance; at floating-point resolution (up is the conservative
            # answer); or where the gap is the accountant's, not the bisection's (checked below)
            gap_declined = down in self.declined and (up - down) <= 1e-4 * up
            if target - self.epsilon(up) <= tol or not down < mid < up or gap_declined:
                break
            if self.epsilon(mid) > target:
                down = mid
            else:
                up = mid
        if target - self.epsilon(up) > tol and down in self.declined:
            # epsilon(up) is certified but far below the target, and the accountant gives no bound
            # just below up: returning up would silently over-noise; say why instead.
            certified = self.epsilon(up)
            raise self.refusal(
                down,
                f"the certified epsilon {certified:.6g} stays below the target {target:g} because",
            )
        return up, self.epsilon(up)

    def _bracket(self, target: float, lo: float, hi: float, start: float) -> tuple:
        """``(down, up)`` with eps(down) > target >= eps(up); down None when lo meets the target."""
        up, down = start, None  # down: the largest parameter known to miss the target
        while self.epsilon(up) > target:  # doubling up from start until the target is met
            if up >= hi:
                raise self.no_bracket(target, hi)
            down, up = up, min(2.0 * up, hi)
        while down is None and up > lo:  # start met it: halving down while the target is met
            below = max(up / 2.0, lo)
            if self.epsilon(below) > target:
                down = below
            else:
                up = below
        return down, up

    def no_bracket(self, target: float, hi: float) -> Exception:
        """Why even ``hi`` misses the target: the accountant's declines, else too little noise."""
        if self.declined:
            return self.refusal(
                max(self.declined), f"up to the largest {self.parameter_name} tried,"
            )
        return CalibrationError(
            f"epsilon target {target:g} at delta {self.delta:g} under {self.adjacency} adjacency "
            f"({self.accountant.name} accountant) needs a {self.parameter_name} above {hi:g}; "
            f"choose a larger epsilon or less privacy loss per {self.parameter_name}."
        )

    def refusal(self, p: float, what: str) -> UnsupportedEventError:
        name = self.accountant.name
        supporting = accountants_supporting(self.make_event(p), self.adjacency)
        alternatives = [a for a in supporting if a != name]
        hint = f"; calibrate with {' or '.join(alternatives)}" if alternatives else ""
        return UnsupportedEventError(
            f"the {name} accountant cannot calibrate this run: {what} it "
            f"declines {self.parameter_name} {p:.6g} "
            f"({self.declined[p].rstrip('.')}){hint}."
        )


@dataclass(frozen=True)
class SearchRange:
    """Where :func:`calibrate` searches the noise parameter: ``[lo, hi]`` from ``start`` (None: 1.0
    when it lies in the range, else the geometric mean), until epsilon is within
    ``epsilon_tolerance`` below the target."""

    lo: float = MIN_NOISE_MULTIPLIER
    hi: float = MAX_NOISE_MULTIPLIER
    start: float | None = None
    epsilon_tolerance: float = EPSILON_TOLERANCE

    def checked(self) -> tuple[float, float, float, float]:
        """``(lo, hi, start, tolerance)``, validated (UsageError)."""
        lo, hi = positive_finite("lo", self.lo), positive_finite("hi", self.hi)
        if not lo < hi:
            raise UsageError(f"lo must be < hi, got lo={lo!r} and hi={hi!r}.")
        tol = positive_finite("epsilon_tolerance", self.epsilon_tolerance)
        start = self.start
        if start is None:
            start = 1.0 if lo <= 1.0 <= hi else (lo * hi) ** 0.5
        start = positive_finite("start", start)
        if not lo <= start <= hi:
            raise UsageError(f"start must be in [lo, hi] = [{lo:g}, {hi:g}], got {start!r}.")
        return lo, hi, start, tol


def calibrate(
    make_event: Callable[[float], Event],
    accountant: "str | Accountant" = "rdp",
    *,
    target_epsilon: float,
    delta: float,
    adjacency: AdjacencyLike = ADD_REMOVE,
    search: SearchRange = SearchRange(),
    parameter_name: str = "noise parameter",
) -> CalibrationResult:
    """The smallest noise parameter p in ``[search.lo, search.hi]`` with ``epsilon(make_event(p))
    <= target``.

    Privacy contract: the returned ``epsilon`` is the accountant's own value for
    ``make_event(parameter)`` at ``delta`` under ``adjacency`` and never exceeds
    ``target_epsilon``, whatever ``make_event`` does. The search doubles (or halves) the parameter
    from ``search.start`` until it brackets the target, then bisects; optimality (epsilon within
    ``search.epsilon_tolerance`` below the target, or ``parameter == lo``, unless the bisection runs
    out of floating-point resolution: the larger noise is then returned) assumes epsilon does not
    increase with p. Raises :class:`UnsupportedEventError` when the accountant (a name or an
    :class:`~dpaudit.accounting.accountants.Accountant`) does not support the event under
    ``adjacency``, or declines the parameters it would need to certify a result within the
    tolerance; :class:`CalibrationError` when even ``hi`` misses the target.

    Args:
        make_event: the event of the mechanism run with noise parameter p (epsilon must not
            increase with p).
        accountant: a registered accountant name or an Accountant.
        target_epsilon: the epsilon not to exceed (> 0, finite).
        delta: the delta of the bound, in (0, 1) (unchecked for accountants without delta).
        adjacency: the neighbouring relation the claim is made under.
        search: the range, start and tolerance of the search.
        parameter_name: how messages name the parameter.

    Returns:
        The smallest certified parameter, the accountant's epsilon there (<= target_epsilon) and the
        number of accountant calls.

    Raises:
        UsageError: an invalid target, delta, search range or make_event.
        UnsupportedEventError: the accountant does not support the event, or declines the
            parameters it would need to certify a result within the tolerance.
        CalibrationError: even ``search.hi`` misses the target.
    """
    target = positive_finite("target_epsilon", target_epsilon)
    acc = get_accountant(accountant)
    if getattr(acc, "uses_delta", True):
        delta = open_unit("delta", delta)
    adj = Adjacency.parse(adjacency)
    lo, hi, start, tol = search.checked()
    if not callable(make_event):
        raise UsageError(
            "make_event must be a callable from the noise parameter to an event, got "
            f"{make_event!r}."
        )
    # Structural support does not depend on the noise level for the built-ins: refused first.
    refuse_unsupported(acc, make_event(start), adj)
    run = _Search(make_event, acc, delta, adj, parameter_name)
    p, eps = run.solve(target, lo, hi, start, tol)
    if not eps <= target:  # the contract; an explicit check, not an assert (python -O)
        raise CalibrationError(
            f"internal error: calibrated epsilon {eps!r} exceeds the target {target!r}."
        )
    return CalibrationResult(
        float(p), float(eps), target, float(delta), acc.name, adj.value, len(run.values)
    )


def calibrate_noise_multiplier(
    *,
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    accountant: "str | Accountant" = "rdp",
    adjacency: AdjacencyLike = ADD_REMOVE,
    use_cache: bool = True,
) -> Calibration:
    """Noise multiplier for a Poisson-subsampled Gaussian run meeting (target_epsilon, delta)
    under ``adjacency`` (add/remove of a record or, at user level, of a user; or replace-one):
    :func:`calibrate` of ``lambda s: SubsampledGaussian(s, sample_rate, steps)`` on
    ``[MIN_NOISE_MULTIPLIER, MAX_NOISE_MULTIPLIER]`` from 1.0, plus an on-disk cache (built-in
    accountants only: a user accountant's name is not a stable cache key; a cached value is
    re-verified, and an unsupported pair is refused by :func:`calibrate` as ever).

    Args:
        target_epsilon: the epsilon not to exceed (> 0, finite).
        delta: in (0, 1).
        sample_rate: the Poisson sampling rate q, in (0, 1].
        steps: the number of steps T (>= 1).
        accountant: a registered accountant name or an Accountant.
        adjacency: the neighbouring relation the claim is made under.
        use_cache: read and write the on-disk cache (cached values are re-verified).

    Returns:
        The noise multiplier and its epsilon (<= target_epsilon); ``cached``: read from the cache.

    Raises:
        UsageError: an invalid argument.
        UnsupportedEventError: the accountant does not support the run under ``adjacency``.
        CalibrationError: no noise multiplier up to MAX_NOISE_MULTIPLIER meets the target.
    """
    target = positive_finite("epsilon", target_epsilon)
    delta = open_unit("delta", delta)
    q = half_open_unit("sample_rate", sample_rate)
    steps = positive_int("steps", steps)
    adj = Adjacency.parse(adjacency)
    acc = get_accountant(accountant)
    make_event = functools.partial(SubsampledGaussian, sample_rate=q, steps=steps)
    cacheable = use_cache and isinstance(accountant, str) and accountant in ACCOUNTANTS
    key = _cache_key(acc.name, target, delta, q, steps, adj) if cacheable else None
    cached = _load_cache().get(key) if key is not None else None
    if isinstance(cached, (int, float)) and 0 < cached < math.inf:
        # re-verified: unverifiable (declined, a library failure) is infinite epsilon: recalibrated
        eps = _Search(make_event, acc, delta, adj, "noise multiplier").epsilon(float(cached))
        if eps <= target:
            return Calibration(float(cached), eps, target, delta, q, steps, acc.name, cached=True)
    try:
        r = calibrate(
            make_event,
            acc,
            target_epsilon=target,
            delta=delta,
            adjacency=adj,
            search=SearchRange(start=1.0),
            parameter_name="noise multiplier",
        )
    except CalibrationError:
        raise CalibrationError(
            f"epsilon target {target} at delta {delta} with sample_rate {q} and {steps} steps "
            f"needs a noise multiplier above {MAX_NOISE_MULTIPLIER:g}; choose a larger epsilon or "
            "fewer steps."
        ) from None
    if key is not None:
        _store_cache(key, r.parameter)
    return Calibration(r.parameter, r.epsilon, target, delta, q, steps, acc.name)

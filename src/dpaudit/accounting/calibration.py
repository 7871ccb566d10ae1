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

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from ..errors import CalibrationError, UnsupportedEventError, UsageError
from ..paths import cache_dir, write_atomically
from ..validation import half_open_unit, open_unit, positive_finite, positive_int
from .accountants import (
    ACCOUNTANTS,
    PLD_VALUE_DISCRETIZATION,
    RDP_ORDERS,
    Accountant,
    _refusal,
    accountants_supporting,
    compute_epsilon,
    get_accountant,
)
from .adjacency import Adjacency
from .events import Event, SubsampledGaussian

EPSILON_TOLERANCE = 1e-4
MAX_NOISE_MULTIPLIER = 1e6
MIN_NOISE_MULTIPLIER = 1e-3
_CACHE_VERSION = 1


@dataclass(frozen=True)
class Calibration:
    noise_multiplier: float
    epsilon: float  # achieved, <= target_epsilon
    target_epsilon: float
    delta: float
    sample_rate: float
    steps: int
    accountant: str
    cached: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


def _cache_key(accountant: str, target: float, delta: float, q: float, steps: int, adjacency: Adjacency = Adjacency.ADD_REMOVE_RECORD) -> str:
    fields = [_CACHE_VERSION, accountant, repr(target), repr(delta), repr(q), steps, EPSILON_TOLERANCE, list(RDP_ORDERS) if accountant == "rdp" else None]
    if accountant == "pld":
        fields.append(PLD_VALUE_DISCRETIZATION)
    if adjacency is Adjacency.REPLACE_RECORD:
        # add-remove-record and add-remove-user are the same mechanism (the unit differs), so they
        # share the old key; replace-one is a different computation and gets its own.
        fields.append(adjacency.value)
    payload = json.dumps(fields)
    return hashlib.sha256(payload.encode()).hexdigest()


def _cache_path() -> Path:
    return cache_dir() / "calibration.json"


def _load_cache() -> dict:
    try:
        with open(_cache_path()) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _store_cache(key: str, value: float) -> None:
    data = _load_cache()
    data[key] = value
    try:
        write_atomically(_cache_path(), json.dumps(data))
    except OSError:
        pass  # a cache that cannot be written only costs time


@dataclass(frozen=True)
class CalibrationResult:
    """What :func:`calibrate` found: the smallest noise ``parameter`` it certified and the
    accountant's epsilon there (<= ``target_epsilon``), under ``adjacency``."""

    parameter: float
    epsilon: float  # the accountant's value at ``parameter``, <= target_epsilon
    target_epsilon: float
    delta: float
    accountant: str
    adjacency: str
    evaluations: int  # accountant calls made (distinct parameters)

    def to_dict(self) -> dict:
        return asdict(self)


class _Search:
    """Epsilon evaluations of one calibration (memoised), remembering the accountant's declines."""

    def __init__(self, make_event: Callable[[float], Event], accountant: Accountant, delta: float, adjacency: Adjacency,
                 parameter_name: str) -> None:
        self.make_event, self.accountant, self.delta, self.adjacency = make_event, accountant, delta, adjacency
        self.parameter_name = parameter_name
        self.declined: dict[float, str] = {}  # parameter -> the accountant's reason
        self.values: dict[float, float] = {}

    def epsilon(self, p: float) -> float:
        if p in self.values:
            return self.values[p]
        event = self.make_event(p)  # outside the try: a broken make_event is the caller's error, not "infinite epsilon"
        try:
            eps = compute_epsilon(event, delta=self.delta, accountant=self.accountant, adjacency=self.adjacency).epsilon
        except UnsupportedEventError as e:
            # The accountant gives no bound at this noise level (prv far in the tails): infinite
            # epsilon is the conservative reading; remembered so a result next to a decline is
            # refused rather than returned loose (see calibrate).
            self.declined[p] = str(e).splitlines()[0] if str(e) else type(e).__name__
            eps = float("inf")
        except (MemoryError, OverflowError, FloatingPointError, ValueError):
            # an accountant library failing on the huge privacy loss of a tiny noise multiplier;
            # treating it as infinite epsilon is the conservative reading during the search.
            eps = float("inf")
        self.values[p] = eps
        return eps

    def solve(self, target: float, lo: float, hi: float, start: float, tol: float) -> tuple[float, float]:
        """``(parameter, epsilon)``: bracket from ``start``, then bisect (see :func:`calibrate`)."""
        down, up, eps_up = self._bracket_up(target, hi, start)
        if down is None:
            down, up, eps_up = self._bracket_down(target, lo, up, eps_up)
            if down is None:
                return up, eps_up  # lo itself meets the target: the smallest allowed
        for _ in range(200):
            if target - eps_up <= tol:
                break
            mid = 0.5 * (down + up)
            if mid <= down or mid >= up:
                break  # floating-point resolution reached; up is the conservative answer
            if down in self.declined and (up - down) <= 1e-4 * up:
                break  # the gap is the accountant's, not the bisection's (checked below)
            eps_mid = self.epsilon(mid)
            if eps_mid <= target:
                up, eps_up = mid, eps_mid
            else:
                down = mid
        if target - eps_up > tol and down in self.declined:
            # epsilon(up) is certified but far below the target, and the accountant gives no bound just
            # below up: returning up would silently over-noise; say why instead.
            raise self.refusal(down, f"the certified epsilon {eps_up:.6g} stays below the target {target:g} because")
        return up, eps_up

    def _bracket_up(self, target: float, hi: float, start: float) -> tuple[float | None, float, float]:
        """Up from start until the target is met: ``(down, up, eps(up))``, ``down`` the largest
        parameter known to miss it (None: start met it)."""
        up, eps_up, down = start, self.epsilon(start), None
        while eps_up > target:
            if up >= hi:
                if self.declined:
                    raise self.refusal(max(self.declined), f"up to the largest {self.parameter_name} tried,")
                raise CalibrationError(
                    f"epsilon target {target:g} at delta {self.delta:g} under {self.adjacency.value} adjacency ({self.accountant.name} "
                    f"accountant) needs a {self.parameter_name} above {hi:g}; choose a larger epsilon or less privacy loss per "
                    f"{self.parameter_name}.")
            down, up = up, min(2.0 * up, hi)
            eps_up = self.epsilon(up)
        return down, up, eps_up

    def _bracket_down(self, target: float, lo: float, up: float, eps_up: float) -> tuple[float | None, float, float]:
        """Down from ``up`` while the target is still met; then eps(down) > target >= eps(up)
        (``down`` None: ``lo`` itself meets it, returned as ``up``)."""
        down = max(up / 2.0, lo)
        while self.epsilon(down) <= target:
            up, eps_up = down, self.epsilon(down)
            if up <= lo:
                return None, up, eps_up
            down = max(up / 2.0, lo)
        return down, up, eps_up

    def refusal(self, p: float, what: str) -> UnsupportedEventError:
        reason = self.declined[p]
        name = self.accountant.name
        alternatives = [a for a in accountants_supporting(self.make_event(p), self.adjacency) if a != name]
        hint = f"; calibrate with {' or '.join(alternatives)}" if alternatives else ""
        return UnsupportedEventError(f"the {name} accountant cannot calibrate this run: {what} it declines {self.parameter_name} "
                                     f"{p:.6g} ({reason.rstrip('.')}){hint}.")


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
        start = positive_finite("start", (1.0 if lo <= 1.0 <= hi else (lo * hi) ** 0.5) if self.start is None else self.start)
        if not lo <= start <= hi:
            raise UsageError(f"start must be in [lo, hi] = [{lo:g}, {hi:g}], got {start!r}.")
        return lo, hi, start, tol


def calibrate(make_event: Callable[[float], Event], accountant: "str | Accountant" = "rdp", *, target_epsilon: float, delta: float,
              adjacency: "str | Adjacency" = Adjacency.ADD_REMOVE_RECORD, search: SearchRange = SearchRange(),
              parameter_name: str = "noise parameter") -> CalibrationResult:
    """The smallest noise parameter p in ``[search.lo, search.hi]`` with ``epsilon(make_event(p)) <= target``.

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
    """
    target = positive_finite("target_epsilon", target_epsilon)
    acc = get_accountant(accountant)
    if getattr(acc, "uses_delta", True):
        delta = open_unit("delta", delta)
    adj = Adjacency.parse(adjacency)
    lo, hi, start, tol = search.checked()
    if not callable(make_event):
        raise UsageError(f"make_event must be a callable from the noise parameter to an event, got {make_event!r}.")
    # Structural support does not depend on the noise level for the built-ins: refuse before searching.
    reason = acc.support_error(make_event(start), adj)
    if reason is not None:
        raise UnsupportedEventError(_refusal(acc, make_event(start), adj, reason))
    run = _Search(make_event, acc, delta, adj, parameter_name)
    p, eps = run.solve(target, lo, hi, start, tol)
    if not eps <= target:  # the contract; an explicit check, not an assert (python -O)
        raise CalibrationError(f"internal error: calibrated epsilon {eps!r} exceeds the target {target!r}.")
    return CalibrationResult(float(p), float(eps), target, float(delta), acc.name, adj.value, len(run.values))


def calibrate_noise_multiplier(
    *,
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    accountant: "str | Accountant" = "rdp",
    adjacency: "str | Adjacency" = Adjacency.ADD_REMOVE_RECORD,
    use_cache: bool = True,
) -> Calibration:
    """Noise multiplier for a Poisson-subsampled Gaussian run meeting (target_epsilon, delta)
    under ``adjacency`` (add/remove of a record or, at user level, of a user; or replace-one):
    :func:`calibrate` of ``lambda s: SubsampledGaussian(s, sample_rate, steps)`` on
    ``[MIN_NOISE_MULTIPLIER, MAX_NOISE_MULTIPLIER]`` from 1.0, plus an on-disk cache (built-in
    accountants only: a user accountant's name is not a stable cache key; a cached value is
    re-verified, and an unsupported pair is refused by :func:`calibrate` as ever)."""
    target = positive_finite("epsilon", target_epsilon)
    delta = open_unit("delta", delta)
    q = half_open_unit("sample_rate", sample_rate)
    steps = positive_int("steps", steps)
    adj = Adjacency.parse(adjacency)
    acc = get_accountant(accountant)

    def make_event(sigma: float) -> SubsampledGaussian:
        return SubsampledGaussian(sigma, q, steps)

    cacheable = use_cache and isinstance(accountant, str) and accountant in ACCOUNTANTS
    key = _cache_key(acc.name, target, delta, q, steps, adj) if cacheable else None
    if key is not None:
        cached = _load_cache().get(key)
        if isinstance(cached, (int, float)) and cached > 0:
            try:
                eps = compute_epsilon(make_event(float(cached)), delta=delta, accountant=acc, adjacency=adj).epsilon
            except (UnsupportedEventError, MemoryError, OverflowError, FloatingPointError, ValueError):
                eps = float("inf")  # unverifiable: recalibrate
            if eps <= target:
                return Calibration(float(cached), eps, target, delta, q, steps, acc.name, cached=True)
    try:
        r = calibrate(make_event, acc, target_epsilon=target, delta=delta, adjacency=adj, search=SearchRange(start=1.0),
                      parameter_name="noise multiplier")
    except CalibrationError:
        raise CalibrationError(
            f"epsilon target {target} at delta {delta} with sample_rate {q} and {steps} steps "
            f"needs a noise multiplier above {MAX_NOISE_MULTIPLIER:g}; choose a larger epsilon or fewer steps."
        ) from None
    if key is not None:
        _store_cache(key, r.parameter)
    return Calibration(r.parameter, r.epsilon, target, delta, q, steps, acc.name)

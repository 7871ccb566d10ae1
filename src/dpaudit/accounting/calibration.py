"""Noise calibration: the smallest noise multiplier whose epsilon does not exceed a target.

Bisection on the noise multiplier with an epsilon tolerance of 1e-4: the returned multiplier
always has epsilon <= target (never overshoots) and epsilon >= target - 1e-4 unless the
bisection ran out of resolution, in which case the conservative (larger) noise is returned.
Results are cached on disk per public configuration; a cached value is re-verified with the
accountant before it is returned, so a stale or edited cache can never under-report epsilon.

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
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import CalibrationError, UnsupportedEventError, UsageError
from ..validation import half_open_unit, open_unit, positive_finite, positive_int
from .accountants import PLD_VALUE_DISCRETIZATION, RDP_ORDERS, compute_epsilon, support_error
from .adjacency import Adjacency
from .events import SubsampledGaussian

EPSILON_TOLERANCE = 1e-4
MAX_NOISE_MULTIPLIER = 1e6
MIN_NOISE_MULTIPLIER = 1e-3
CACHE_ENV = "DPAUDIT_CACHE_DIR"
_CACHE_VERSION = 1
#: Accountants that can calibrate a Poisson-subsampled Gaussian (pure cannot: it has no delta).
CALIBRATION_ACCOUNTANTS = ("rdp", "prv", "pld")


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


def cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "dpaudit"


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
    path = _cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = _load_cache()
        data[key] = value
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".calibration.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)  # atomic: readers see the old or the new file, never half of one
    except OSError:
        pass  # a cache that cannot be written only costs time


class _Search:
    """Epsilon evaluations of one calibration, remembering the accountant's declines."""

    def __init__(self, q: float, steps: int, delta: float, accountant: str, adjacency: Adjacency) -> None:
        self.q, self.steps, self.delta, self.accountant, self.adjacency = q, steps, delta, accountant, adjacency
        self.declined: dict[float, str] = {}  # noise multiplier -> the accountant's reason

    def epsilon(self, sigma: float) -> float:
        try:
            return compute_epsilon(SubsampledGaussian(sigma, self.q, self.steps), delta=self.delta,
                                   accountant=self.accountant, adjacency=self.adjacency).epsilon
        except UnsupportedEventError as e:
            # The accountant gives no bound at this noise level (prv far in the tails): infinite
            # epsilon is the conservative reading; remembered so a result next to a decline is
            # refused rather than returned loose (see calibrate_noise_multiplier).
            self.declined[sigma] = str(e).splitlines()[0] if str(e) else type(e).__name__
            return float("inf")
        except (MemoryError, OverflowError, FloatingPointError, ValueError):
            # an accountant library failing on the huge privacy loss of a tiny noise multiplier;
            # treating it as infinite epsilon is the conservative reading during the search.
            return float("inf")

    def refusal(self, sigma: float, what: str) -> UnsupportedEventError:
        reason = self.declined[sigma]
        alternatives = [a for a in CALIBRATION_ACCOUNTANTS if a != self.accountant
                        and support_error(a, SubsampledGaussian(1.0, self.q, self.steps), self.adjacency) is None]
        hint = f"; calibrate with {' or '.join(alternatives)}" if alternatives else ""
        return UnsupportedEventError(f"the {self.accountant} accountant cannot calibrate this run: {what} it declines noise multiplier "
                                     f"{sigma:.6g} ({reason.rstrip('.')}){hint}.")


def calibrate_noise_multiplier(
    *,
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    accountant: str = "rdp",
    adjacency: "str | Adjacency" = Adjacency.ADD_REMOVE_RECORD,
    use_cache: bool = True,
) -> Calibration:
    """Noise multiplier for a Poisson-subsampled Gaussian run meeting (target_epsilon, delta)
    under ``adjacency`` (add/remove of a record or, at user level, of a user; or replace-one).

    Raises :class:`UnsupportedEventError` (one line, naming an accountant that supports the
    pair) when ``accountant`` does not support the run under ``adjacency``, and when it declines
    the noise levels it would need to certify a result within the tolerance of the target.
    """
    target = positive_finite("epsilon", target_epsilon)
    delta = open_unit("delta", delta)
    q = half_open_unit("sample_rate", sample_rate)
    steps = positive_int("steps", steps)
    adj = Adjacency.parse(adjacency)
    if accountant not in CALIBRATION_ACCOUNTANTS:
        raise UsageError(f"accountant must be one of {', '.join(CALIBRATION_ACCOUNTANTS)}, got {accountant!r}.")
    # Structural support does not depend on the noise multiplier: refuse before searching.
    reason = support_error(accountant, SubsampledGaussian(1.0, q, steps), adj)
    if reason is not None:
        raise UnsupportedEventError(reason)
    search = _Search(q, steps, delta, accountant, adj)
    eps_of = search.epsilon

    key = _cache_key(accountant, target, delta, q, steps, adj)
    if use_cache:
        cached = _load_cache().get(key)
        if isinstance(cached, (int, float)) and cached > 0:
            eps = eps_of(float(cached))
            if eps <= target:
                return Calibration(float(cached), eps, target, delta, q, steps, accountant, cached=True)

    hi = 1.0
    eps_hi = eps_of(hi)
    while eps_hi > target:
        hi *= 2.0
        if hi > MAX_NOISE_MULTIPLIER:
            if search.declined:
                raise search.refusal(max(search.declined), "up to the largest noise multiplier tried,")
            raise CalibrationError(
                f"epsilon target {target} at delta {delta} with sample_rate {q} and {steps} steps "
                f"needs a noise multiplier above {MAX_NOISE_MULTIPLIER:g}; choose a larger epsilon or fewer steps."
            )
        eps_hi = eps_of(hi)
    lo = hi / 2.0
    # Invariant: epsilon(lo) > target, epsilon(hi) <= target. When 1.0 already meets the
    # target, walk down until the lower end exceeds it.
    while eps_of(lo) <= target:
        hi = lo
        eps_hi = eps_of(hi)
        lo = hi / 2.0
        if lo < MIN_NOISE_MULTIPLIER:
            break
    for _ in range(200):
        if target - eps_hi <= EPSILON_TOLERANCE:
            break
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break  # floating-point resolution reached; hi is the conservative answer
        if lo in search.declined and (hi - lo) <= 1e-4 * hi:
            break  # the gap is the accountant's, not the bisection's (checked below)
        eps_mid = eps_of(mid)
        if eps_mid <= target:
            hi, eps_hi = mid, eps_mid
        else:
            lo = mid
    assert eps_hi <= target  # the contract of this function
    if target - eps_hi > EPSILON_TOLERANCE and lo in search.declined:
        # epsilon(hi) is certified but far below the target, and the accountant gives no bound just
        # below hi: returning hi would silently over-noise; say why instead.
        raise search.refusal(lo, f"the certified epsilon {eps_hi:.6g} stays below the target {target:g} because")
    if use_cache:
        _store_cache(key, hi)
    return Calibration(hi, eps_hi, target, delta, q, steps, accountant)

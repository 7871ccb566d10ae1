"""Noise calibration: the smallest noise multiplier whose epsilon does not exceed a target.

Bisection on the noise multiplier with an epsilon tolerance of 1e-4: the returned multiplier
always has epsilon <= target (never overshoots) and epsilon >= target - 1e-4 unless the
bisection ran out of resolution, in which case the conservative (larger) noise is returned.
Results are cached on disk per public configuration; a cached value is re-verified with the
accountant before it is returned, so a stale or edited cache can never under-report epsilon.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import CalibrationError, UsageError
from ..validation import half_open_unit, open_unit, positive_finite, positive_int
from .accountants import RDP_ORDERS, compute_epsilon
from .events import SubsampledGaussian

EPSILON_TOLERANCE = 1e-4
MAX_NOISE_MULTIPLIER = 1e6
MIN_NOISE_MULTIPLIER = 1e-3
CACHE_ENV = "DPAUDIT_CACHE_DIR"
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


def cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "dpaudit"


def _cache_key(accountant: str, target: float, delta: float, q: float, steps: int) -> str:
    payload = json.dumps([_CACHE_VERSION, accountant, repr(target), repr(delta), repr(q), steps, EPSILON_TOLERANCE, list(RDP_ORDERS) if accountant == "rdp" else None])
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


def _epsilon(sigma: float, q: float, steps: int, delta: float, accountant: str) -> float:
    try:
        return compute_epsilon(SubsampledGaussian(sigma, q, steps), delta=delta, accountant=accountant).epsilon
    except (MemoryError, OverflowError, FloatingPointError, ValueError):
        # prv-accountant cannot discretise the huge privacy loss of a tiny noise multiplier;
        # treating it as infinite epsilon is the conservative reading during the search.
        return float("inf")


def calibrate_noise_multiplier(
    *,
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    accountant: str = "rdp",
    use_cache: bool = True,
) -> Calibration:
    """Noise multiplier for a Poisson-subsampled Gaussian run meeting (target_epsilon, delta)."""
    target = positive_finite("epsilon", target_epsilon)
    delta = open_unit("delta", delta)
    q = half_open_unit("sample_rate", sample_rate)
    steps = positive_int("steps", steps)
    if accountant not in ("rdp", "prv"):
        raise UsageError(f"accountant must be one of rdp, prv, got {accountant!r}.")

    key = _cache_key(accountant, target, delta, q, steps)
    if use_cache:
        cached = _load_cache().get(key)
        if isinstance(cached, (int, float)) and cached > 0:
            eps = _epsilon(float(cached), q, steps, delta, accountant)
            if eps <= target:
                return Calibration(float(cached), eps, target, delta, q, steps, accountant, cached=True)

    hi = 1.0
    eps_hi = _epsilon(hi, q, steps, delta, accountant)
    while eps_hi > target:
        hi *= 2.0
        if hi > MAX_NOISE_MULTIPLIER:
            raise CalibrationError(
                f"epsilon target {target} at delta {delta} with sample_rate {q} and {steps} steps "
                f"needs a noise multiplier above {MAX_NOISE_MULTIPLIER:g}; choose a larger epsilon or fewer steps."
            )
        eps_hi = _epsilon(hi, q, steps, delta, accountant)
    lo = hi / 2.0
    # Invariant: epsilon(lo) > target, epsilon(hi) <= target. When 1.0 already meets the
    # target, walk down until the lower end exceeds it.
    while _epsilon(lo, q, steps, delta, accountant) <= target:
        hi = lo
        eps_hi = _epsilon(hi, q, steps, delta, accountant)
        lo = hi / 2.0
        if lo < MIN_NOISE_MULTIPLIER:
            break
    for _ in range(200):
        if target - eps_hi <= EPSILON_TOLERANCE:
            break
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break  # floating-point resolution reached; hi is the conservative answer
        eps_mid = _epsilon(mid, q, steps, delta, accountant)
        if eps_mid <= target:
            hi, eps_hi = mid, eps_mid
        else:
            lo = mid
    assert eps_hi <= target  # the contract of this function
    if use_cache:
        _store_cache(key, hi)
    return Calibration(hi, eps_hi, target, delta, q, steps, accountant)

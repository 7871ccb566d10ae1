"""Independent reference for the Poisson-subsampled Gaussian: a direct numerical privacy profile.

Written for the tests from the definitions only (no accountant library): the privacy loss
L(x) = ln p(x)/q(x) of a dominating pair (P, Q) is tabulated on a fine grid of x, its
distribution under P is binned to a loss grid of width ``h`` (rounded to nearest: an
*estimate*, not a bound), composed T times by FFT on a window around T * mean (wide enough
that no mass aliases), and epsilon(delta) is found by root-finding on the hockey-stick divergence
delta(eps) = E_P[(1 - e^(eps - L))_+] (max over both orders of the pair).

Conventions (units of the clipping norm C; noise multiplier s = noise std / C; each record's
clipped contribution to the sum has norm <= C; Poisson inclusion probability q):
- add/remove: P = (1-q) N(0, s^2) + q N(1, s^2), Q = N(0, s^2), both orders;
- replace-one: P = (1-q) N(0, s^2) + q N(1, s^2), Q = (1-q) N(0, s^2) + q N(-1, s^2) (the sum
  moves by up to 2C; symmetric under x -> -x, so one order suffices).
For q = 1 the closed form of Balle & Wang (2018) applies: N(0, 1) vs N(mu, 1) with
mu = sqrt(T) * Delta / s, Delta = 1 (add/remove) or 2 (replace-one).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
from scipy import optimize, special


def load():
    """This module, loaded by path (the tests run with --import-mode=importlib)."""
    spec = importlib.util.spec_from_file_location("dpaudit_test_privacy_profile", Path(__file__))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def gaussian_closed_form_epsilon(mu: float, delta: float) -> float:
    """Exact epsilon of N(0,1) vs N(mu,1) at delta (Balle & Wang 2018, Thm. 8)."""

    def d(eps: float) -> float:  # e^eps Phi(b) in log space: eps reaches hundreds at q = 1
        return float(
            special.ndtr(-eps / mu + mu / 2) - math.exp(eps + special.log_ndtr(-eps / mu - mu / 2))
        )

    if d(0.0) <= delta:
        return 0.0
    hi = 1.0
    while d(hi) > delta:
        hi *= 2.0
    return optimize.brentq(lambda e: d(e) - delta, 0.0, hi, xtol=1e-12)


def _log_normal_pdf(x: np.ndarray, mean: float, s: float) -> np.ndarray:
    return -0.5 * ((x - mean) / s) ** 2 - math.log(s * math.sqrt(2 * math.pi))


def _composed_loss(
    logp: np.ndarray, logq: np.ndarray, dx: float, steps: int, h: float
) -> tuple[np.ndarray, np.ndarray]:
    """(loss values, probabilities under P) of the T-fold composed privacy loss."""
    loss = logp - logq
    mass = np.exp(logp) * dx
    k = np.round(loss / h).astype(np.int64)
    kmin = int(k.min())
    pmf = np.bincount(k - kmin, weights=mass)
    idx = np.arange(len(pmf)) + kmin
    if steps == 1:
        return idx * h, pmf
    mean = float(np.sum(pmf * idx))
    var = float(np.sum(pmf * (idx - mean) ** 2))
    # window: +-60 standard deviations of the sum, and at least 4 one-step supports, so the
    # cyclic convolution aliases no mass that matters at delta ~ 1e-5
    half = int(max(60 * math.sqrt(steps * var), 4 * (idx.max() - idx.min()))) + 1000
    m = 1 << int(math.ceil(math.log2(2 * half)))
    folded = np.zeros(m)
    np.add.at(folded, idx % m, pmf)
    out = np.clip(np.fft.irfft(np.fft.rfft(folded) ** steps, n=m), 0.0, None)
    window = np.arange(int(round(steps * mean)) - m // 2, int(round(steps * mean)) + m // 2)
    return window * h, out[window % m]


def subsampled_gaussian_epsilon(
    sigma: float, q: float, steps: int, delta: float, replace: bool, h: float = 1e-3
) -> float:
    """Epsilon estimate of ``steps`` Poisson-subsampled Gaussian steps at ``delta``."""
    s = float(sigma)
    dx = 2e-4 * s
    x = (
        np.arange(-1.0 - 12.0 * s, 1.0 + 12.0 * s, dx) + 0.5 * dx
    )  # cell midpoints; mass beyond is < 1e-30
    base = _log_normal_pdf(x, 0.0, s)
    log1mq = math.log1p(-q) if q < 1.0 else -np.inf
    plus = np.logaddexp(log1mq + base, math.log(q) + _log_normal_pdf(x, 1.0, s))
    if replace:
        minus = np.logaddexp(log1mq + base, math.log(q) + _log_normal_pdf(x, -1.0, s))
        pairs = [(plus, minus)]
    else:
        pairs = [(plus, base), (base, plus)]  # remove, add
    profiles = [_composed_loss(p, qq, dx, steps, h) for p, qq in pairs]

    def d(eps: float) -> float:
        with np.errstate(over="ignore"):
            return max(
                float(np.sum(pr * np.clip(1.0 - np.exp(eps - loss), 0.0, None)))
                for loss, pr in profiles
            )

    if d(0.0) <= delta:
        return 0.0
    hi = 1.0
    while d(hi) > delta:
        hi *= 2.0
    return optimize.brentq(lambda e: d(e) - delta, 0.0, hi, xtol=1e-9)


class memory_cap:
    """Context manager: cap this process's address space at its current size + ``extra`` bytes
    (Linux), so a test that guards against a memory blow-up fails with MemoryError instead of
    getting the machine's OOM killer to end the test run (or a neighbour's)."""

    def __init__(self, extra: int = 2 << 30) -> None:
        self.extra = extra
        self.saved = None

    def __enter__(self):
        try:
            import os
            import resource

            with open("/proc/self/statm") as f:
                vm = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            self.saved = resource.getrlimit(resource.RLIMIT_AS)
            hard = self.saved[1]
            cap = vm + self.extra if hard == resource.RLIM_INFINITY else min(vm + self.extra, hard)
            resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
        except (OSError, ValueError, ImportError):
            self.saved = None  # no cap on this platform: the test still runs
        return self

    def __exit__(self, *exc):
        if self.saved is not None:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, self.saved)
        return False

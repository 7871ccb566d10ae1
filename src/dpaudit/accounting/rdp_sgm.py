"""RDP of the Poisson-subsampled Gaussian and its (epsilon, delta) conversion, with numpy only.

The rdp accountant's numbers are those of Opacus's analysis (``opacus/accountants/analysis/rdp.py``:
Mironov, Talwar & Zhang 2019, Sec. 3.3; conversion of Balle et al. 2020, Thm. 21). That file
needs ``scipy.special`` (``binom``, ``log_ndtr``) and evaluates each order in a Python loop: with
the 350 orders of ``RDP_ORDERS`` (up to 16384) a curve costs ~0.4 s plus ~0.3 s of scipy import,
most of the start-up of ``dpaudit account`` / ``calibrate`` / ``ledger summary``. This module
computes the same series, written independently, the same way (integer orders in blocks with
numpy: :func:`_log_a_int`; fractional orders term by term: :func:`_log_a_frac`; the conversion
with the same numpy expression).

Privacy contract: :func:`compute_rdp` returns the reference's curve to within the rounding of
the reference itself: both evaluate the same series in doubles with different special functions,
and where a fractional-order series cancels (tiny q, or long tails) the two differ by up to ~1e-9
of a curve value while each is further than that from the exact value (mpmath). On epsilon the
largest difference seen is 2.2e-12 relative (tests/accounting/test_rdp_sgm.py: a grid of q,
sigma, steps, delta, composed and parallel events, and a hypothesis property test, against
Opacus's own module; the tests allow 5e-12). Inputs where the two could differ by more than
rounding are handed to the reference itself (:mod:`dpaudit.accounting.opacus_rdp`): non-finite
or extreme parameters, integer orders whose largest binomial coefficient is within 1e-6 (in log)
of the largest double (the reference turns an overflowing coefficient into inf / NaN; elsewhere
we decide which exactly: every order >= 2048 of ``RDP_ORDERS`` is NaN there and here), and
non-integer orders above 64.
"""

from __future__ import annotations

import functools
import math
import sys

from ..lazy import lazy_import
from . import opacus_rdp  # Opacus's own file (loads scipy only when it computes)

np = lazy_import("numpy")

#: log of the largest double: a binomial coefficient above it is inf in scipy (Opacus's reference).
_LOG_DBL_MAX = math.log(sys.float_info.max)
#: Integer orders whose largest binomial coefficient is within this factor (in log) of the largest
#: double are ambiguous (scipy's Beta-based binom rounds): the reference computes them.
_OVERFLOW_MARGIN = 1e-6
#: Fractional orders above this go to the reference (RDP_ORDERS has none above 10.9).
_MAX_FRACTIONAL_ORDER = 64.0
#: scipy's binom uses its multiplication formula for (symmetry-reduced) k below this.
_PRODUCT_FORMULA_LIMIT = 20


def _binom_product(n: float, k: int) -> float:
    """scipy.special.binom(n, k) for integer 0 <= k < 20 (after its symmetry reduction): the
    same multiplication formula, operation for operation, so the same double."""
    num, den = 1.0, 1.0
    for i in range(1, k + 1):
        num *= i + n - k
        den *= i
        if abs(num) > 1e50:
            num /= den
            den = 1.0
    return num / den


@functools.lru_cache(maxsize=16)
def _log_binom_matrix(orders: tuple[int, ...]) -> np.ndarray:
    """Row j: log C(orders[j], i) for i = 0..orders[j], then -inf (independent of q and sigma).

    As scipy's ``binom`` (the reference's) sees it: symmetric in i <-> a - i (scipy reduces k to
    a - k above a/2); for min(i, a - i) < 20 scipy's multiplication formula, bit for bit; above,
    where scipy goes through its Beta function, the running product C(a, k) = C(a, k-1) (a-k+1)/k
    (relative error ~sqrt(k) ulp; scipy's own is up to ~1e-13 at a = 170, ~1e-12 at a = 1024)."""
    width = max(orders) + 1
    half = width // 2 + 1
    n = np.asarray(orders, dtype=float)[:, None]
    k = np.arange(1, half, dtype=float)[None, :]
    ratios = np.where(k <= n / 2, (n - k + 1) / k, 1.0)
    prod = np.empty((len(orders), half))
    prod[:, 0] = 1.0
    prod[:, 1:] = np.cumprod(ratios, axis=1)
    for kk in range(min(_PRODUCT_FORMULA_LIMIT, half)):
        prod[:, kk] = [_binom_product(float(a), kk) for a in orders]
    with np.errstate(divide="ignore"):  # the formula's zeros past a/2 (k > a/2 is never looked up)
        log_half = np.log(prod)
    i = np.arange(width)[None, :]
    reduced = np.where(i > n / 2, n - i, i).astype(int)  # scipy's k -> a - k above a/2
    out = np.take_along_axis(log_half, np.clip(reduced, 0, half - 1), axis=1)
    out[i > n] = -np.inf  # beyond the order: adds nothing to a log-sum
    out.setflags(write=False)
    return out


def _log_comb(a: int, i: int) -> float:
    # abs error ~1e-12 here, far below the margin
    return math.lgamma(a + 1) - math.lgamma(i + 1) - math.lgamma(a - i + 1)


def _overflow_count(a: int) -> int | None:
    """How many of C(a, i), i = 0..a, exceed the largest double: 0, 1 or 2 (meaning "2 or
    more"); None when a coefficient is too close to the largest double to say (rounding)."""
    margin = _OVERFLOW_MARGIN * _LOG_DBL_MAX
    top = _log_comb(a, a // 2)  # the largest coefficient
    if abs(top - _LOG_DBL_MAX) <= margin:
        return None
    if top < _LOG_DBL_MAX:
        return 0
    if a % 2:
        return 2  # two equal middle coefficients
    second = _log_comb(a, a // 2 - 1)  # the next largest, twice (i = a/2 -+ 1)
    if abs(second - _LOG_DBL_MAX) <= margin:
        return None
    return 2 if second > _LOG_DBL_MAX else 1


@functools.lru_cache(maxsize=64)
def _overflow_counts(orders: tuple[int, ...]) -> tuple[int | None, ...]:
    return tuple(_overflow_count(a) for a in orders)


def _log_a_int(q: float, sigma: float, orders: tuple[int, ...]) -> np.ndarray:
    """log A_a for integer orders (ascending, none overflowing).

    Per order this is the reference's sum: log_a <- log_add(log_a, s_i), i = 0..a, in that order,
    with s_i = log C(a, i) + i log q + (a - i) log(1 - q) + (i^2 - i) / (2 sigma^2) evaluated in
    the same order of operations. ``np.logaddexp`` is the same log-add (``b + log1p(exp(a - b))``
    with b the larger, the other one when one is -inf) and its reduction runs along i in order;
    the orders are reduced in blocks of similar length (the padding is -inf: adds nothing)."""
    log_q, log_1q = math.log(q), math.log(1 - q)
    two_s2 = 2 * (sigma**2)
    out = np.empty(len(orders))
    start = 0
    while start < len(orders):
        # a block: every order up to twice the first one (little padding), at least one order
        stop = start + 1
        while stop < len(orders) and orders[stop] <= max(2 * orders[start], 64):
            stop += 1
        block = orders[start:stop]
        lbm = _log_binom_matrix(block)
        a = np.asarray(block, dtype=float)[:, None]
        i = np.arange(lbm.shape[1], dtype=float)[None, :]
        with np.errstate(invalid="ignore"):
            s = lbm + i * log_q + (a - i) * log_1q + (i * i - i) / two_s2
        s[np.isneginf(lbm)] = -np.inf  # padding stays -inf whatever the other terms are
        out[start:stop] = np.logaddexp.reduce(s, axis=1)
        start = stop
    return out


#: 1/sqrt(2) rounded to a double, as in C's M_SQRT1_2.
_SQRT1_2 = 0.70710678118654752440
_LOG2 = math.log(2)


def _erfcx(y: float) -> float:
    """exp(y^2) erfc(y) for y >= 0.7, to a few ulp: y^2 is split exactly into hi + lo (Dekker),
    so exp(y^2) = exp(hi) (1 + lo) loses nothing to the rounding of y^2; beyond y = 25 (erfc
    near underflow) the asymptotic series erfcx(y) = 1 / (y sqrt(pi)) * sum_k (-1)^k (2k-1)!! /
    (2y^2)^k, whose 12 terms kept are exact to double precision there."""
    if y < 25.0:
        c = 134217729.0 * y  # 2^27 + 1
        yh = c - (c - y)
        yl = y - yh
        hi = y * y
        lo = ((yh * yh - hi) + 2.0 * yh * yl) + yl * yl
        return math.erfc(y) * math.exp(hi) * (1.0 + lo)
    inv = 1.0 / (2.0 * y * y)
    term, total = 1.0, 1.0
    for k in range(1, 12):
        term *= -(2 * k - 1) * inv
        total += term
    return total / (y * math.sqrt(math.pi))


def log_erfc(x: float) -> float:
    """log(erfc(x)), accurate over the whole line, evaluated as the reference evaluates it.

    The reference computes ``log(2) + log_ndtr(-x * sqrt(2))`` with scipy, whose ``log_ndtr(a)``
    (t = a / sqrt(2)) is ``log1p(-erfc(t) / 2)`` for a >= -1 and ``log(erfcx(-t) / 2) - t^2``
    below. The same argument t (same roundings), the same split and the same final operations
    are used here, with ``math.erfc`` and :func:`_erfcx`: the results agree to an ulp or two
    (in the series of a fractional order, terms far below the sum; tests/accounting/test_rdp_sgm.py)."""
    a = -x * 2**0.5
    t = a * _SQRT1_2
    if a >= -1.0:
        return _LOG2 + math.log1p(-math.erfc(t) / 2)
    return _LOG2 + (math.log(_erfcx(-t) / 2) - t * t)


def _log_add(x: float, y: float) -> float:
    lo, hi = min(x, y), max(x, y)
    if lo == -math.inf:
        return hi
    return math.log1p(math.exp(lo - hi)) + hi


def _log_sub(x: float, y: float) -> float:
    if x < y:
        raise ValueError("The result of subtraction must be non-negative.")
    if y == -math.inf:
        return x
    if x == y:
        return -math.inf
    try:
        return math.log(math.expm1(x - y)) + y
    except OverflowError:
        return x


#: scipy's (cephes) limit above which its Beta function goes through log-Gamma.
_MAXGAM = 171.624376956302725


def _binom_frac(alpha: float, i: int) -> tuple[float, bool]:
    """(log |C(alpha, i)|, C(alpha, i) > 0) for a non-integer alpha > 0 and integer i >= 0,
    evaluated as scipy's ``binom`` does: its multiplication formula below 20 terms, else
    ``1 / (alpha + 1) / Beta(1 + alpha - i, 1 + i)`` with cephes' Beta (Gamma functions while
    the arguments are below MAXGAM, log-Gamma beyond), here with ``math.gamma`` / ``math.lgamma``."""
    if i < _PRODUCT_FORMULA_LIMIT:
        c = _binom_product(alpha, i)
        return math.log(abs(c)), c > 0
    # the factors alpha - j, j < i, are negative for j > alpha: i - 1 - floor(alpha) of them
    positive = (i - 1 - math.floor(alpha)) % 2 == 0
    a, b = 1.0 + alpha - i, 1.0 + i
    if abs(a) < abs(b):
        a, b = b, a
    y = a + b
    if abs(y) > _MAXGAM or abs(a) > _MAXGAM or abs(b) > _MAXGAM:
        log_beta = math.lgamma(a) + (math.lgamma(b) - math.lgamma(y))
        return -math.log(alpha + 1) - log_beta, positive
    gy, ga, gb = math.gamma(y), math.gamma(a), math.gamma(b)
    if abs(abs(ga) - abs(gy)) > abs(abs(gb) - abs(gy)):
        beta = (gb / gy) * ga
    else:
        beta = (ga / gy) * gb
    return math.log(abs(1 / (alpha + 1) / beta)), positive


def _log_a_frac(q: float, sigma: float, alpha: float) -> float:
    """log A_alpha for a fractional order: the reference's two-sided series, stopped where it
    stops (both new terms below e^-30)."""
    log_a0, log_a1 = -math.inf, -math.inf
    i = 0
    z0 = sigma**2 * math.log(1 / q - 1) + 0.5
    log_q, log_1q, log_half = math.log(q), math.log(1 - q), math.log(0.5)
    root2_sigma = math.sqrt(2) * sigma
    two_s2 = 2 * (sigma**2)
    while True:
        log_coef, positive = _binom_frac(alpha, i)
        j = alpha - i
        log_t0 = log_coef + i * log_q + j * log_1q
        log_t1 = log_coef + j * log_q + i * log_1q
        log_e0 = log_half + log_erfc((i - z0) / root2_sigma)
        log_e1 = log_half + log_erfc((z0 - j) / root2_sigma)
        log_s0 = log_t0 + (i * i - i) / two_s2 + log_e0
        log_s1 = log_t1 + (j * j - j) / two_s2 + log_e1
        combine = _log_add if positive else _log_sub  # the sign of C(alpha, i)
        log_a0, log_a1 = combine(log_a0, log_s0), combine(log_a1, log_s1)
        i += 1
        if max(log_s0, log_s1) < -30:
            break
    return _log_add(log_a0, log_a1)


def compute_rdp(*, q: float, noise_multiplier: float, steps: int, orders) -> np.ndarray:
    """RDP of ``steps`` compositions of the Poisson-subsampled Gaussian at ``orders``: the values
    of ``opacus.accountants.analysis.rdp.compute_rdp`` (same arguments; a 1-D float array)."""
    orders = [float(o) for o in np.atleast_1d(np.asarray(orders, dtype=float))]
    q, sigma = float(q), float(noise_multiplier)
    special = _special_case(q, sigma, steps, orders)
    if special is not None:
        return special
    rdp = _one_step(q, sigma, orders)
    return np.array([rdp[o] for o in orders], dtype=float) * steps


def _one_step(q: float, sigma: float, orders: list) -> dict:
    """Order -> one-step RDP: integer orders by the series where it cannot overflow, fractional
    ones by theirs, the rest from the reference."""
    ints = sorted({int(o) for o in orders if o.is_integer()})
    counts = dict(zip(ints, _overflow_counts(tuple(ints))))
    safe = tuple(a for a in ints if counts[a] == 0)
    rdp = {float(a): float(la) / (a - 1) for a, la in zip(safe, _log_a_int(q, sigma, safe))}
    rdp.update({o: _order_value(q, sigma, o, counts) for o in orders if o not in rdp})
    return _fill_from_reference(q, sigma, rdp)


def _fill_from_reference(q: float, sigma: float, rdp: dict) -> dict:
    """``rdp`` with the orders the series left open (None) taken from the reference."""
    reference = [o for o, value in rdp.items() if value is None]
    if reference:
        ref = opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=reference)
        rdp.update(zip(reference, map(float, np.atleast_1d(ref))))
    return rdp


def _special_case(q: float, sigma: float, steps: int, orders: list) -> np.ndarray | None:
    """The RDP where the series is not used (no sampling, no subsampling, or the reference's own
    special cases: sigma 0, infinite orders, ...), else None."""
    normal_sigma = math.isfinite(sigma) and sigma > 0.0 and 1e-100 < sigma**2 < 1e100
    if q == 0.0:
        return np.zeros(len(orders)) * steps  # nothing is sampled: 0 at every order
    if q == 1.0 and normal_sigma:
        # no subsampling: the Gaussian mechanism's alpha / (2 sigma^2) (also at infinite orders)
        return np.array([o / (2 * sigma**2) for o in orders], dtype=float) * steps
    if not _series_applies(q, normal_sigma, orders):
        return np.asarray(
            opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=orders),
            dtype=float,
        )
    return None


def _series_applies(q: float, normal_sigma: bool, orders: list) -> bool:
    """Whether the series covers the case: 0 < q < 1, a normal sigma, finite orders above 1."""
    finite_orders = all(math.isfinite(o) and o > 1.0 for o in orders)
    return math.isfinite(q) and 0.0 < q < 1.0 and normal_sigma and finite_orders


def _order_value(q: float, sigma: float, o: float, counts: dict) -> float | None:
    """The one-step RDP at an order the integer series did not give (None: ask the reference)."""
    if o.is_integer():
        c = counts[int(o)]
        # the reference adds an infinite term once (inf) or twice or more (inf - inf: NaN)
        return None if c is None else (math.inf if c == 1 else math.nan)
    return _log_a_frac(q, sigma, o) / (o - 1) if o <= _MAX_FRACTIONAL_ORDER else None


def get_privacy_spent(*, orders, rdp, delta: float) -> tuple[float, float]:
    """(epsilon, optimal order): ``opacus.accountants.analysis.rdp.get_privacy_spent`` (Balle et
    al. 2020, Thm. 21), the same numpy expression, without its warning about extreme orders."""
    orders_vec = np.atleast_1d(orders)
    rdp_vec = np.atleast_1d(rdp)
    if len(orders_vec) != len(rdp_vec):
        raise ValueError(
            f"orders and rdp must have the same length, got {len(orders_vec)} and {len(rdp_vec)}."
        )
    eps = (
        rdp_vec
        - (np.log(delta) + np.log(orders_vec)) / (orders_vec - 1)
        + np.log((orders_vec - 1) / orders_vec)
    )
    if np.isnan(eps).all():
        return np.inf, np.nan
    idx = np.nanargmin(eps)
    return eps[idx], orders_vec[idx]

"""Laplace noise samplers: an exact discrete sampler (default) and the textbook one (leaky).

Why two samplers. The textbook Laplace sampler computes ``-b sgn(V) ln(1 - 2|V|)`` from a
uniform double V. In floating point the set of doubles it can return is sparse and irregular,
so ``f(D) + noise`` takes values that ``f(D') + noise`` can never take: the low bits of a
release can reveal the input, and pure epsilon-DP fails outright (Mironov 2012, "On
significance of the least significant bits for differential privacy", CCS). It is kept here
only to compare against published implementations (``sampler="textbook"``: ``NoiseSource.laplace``).

The safe default (``sampler="discrete-laplace"``) never touches doubles on the private path:

1. the statistic is made integer-valued on a fixed power-of-two grid *before* noise (rounding
   each record's contribution, so the L1 sensitivity bound holds exactly; DP-ELM's grids are in
   :mod:`dpaudit.mechanisms.elm.mechanism`), and
2. integer noise is drawn *exactly* from the discrete Laplace distribution
   ``P(k) = (1 - e^{-1/t}) / (1 + e^{-1/t}) * e^{-|k|/t}`` with rational scale ``t`` (in grid
   units), using only uniform random integers and rational arithmetic (the rejection sampler
   of Canonne, Kamath & Steinke 2020, "The discrete Gaussian for differential privacy",
   Algorithms 1 and 2; written from the paper's description).

Guarantee of the discrete sampler: for an integer-valued query with L1 sensitivity ``Delta``
(grid units), adding independent discrete Laplace noise of scale ``t`` to every coordinate is
exactly ``Delta / t``-DP (pure, delta = 0): the ratio of probabilities at any output is
``exp(sum_j (|k_j| - |k_j + d_j|) / t) <= exp(||d||_1 / t)``. With ``t = b * 2^g`` for a
real-valued scale ``b`` and grid ``2^-g``, this is exactly the ideal Laplace epsilon
``Delta_real / b``: the epsilon inflation is **0**. The scale is computed as an exact rational
from the float ``epsilon`` the user gave, so no rounding enters the claim. The statement
assumes uniform random bits from the noise source: true up to ChaCha20's security for
``--noise-source cryptographic``; PCG64 (the default) is statistically uniform but not a
cryptographic generator. Post-processing (converting the noised integers to doubles, solving)
cannot weaken the guarantee.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from fractions import Fraction

from ...errors import UsageError
from ...lazy import lazy_import
from ...noise import NoiseSource
from ...validation import one_of

np = lazy_import("numpy")

SAMPLERS = ("discrete-laplace", "textbook")
DEFAULT_SAMPLER = "discrete-laplace"


@dataclass(frozen=True)
class SamplerGuarantee:
    """What a Laplace sampler's output is guaranteed to be, as recorded in a release.

    ``epsilon_inflation``: additive epsilon to add to the ideal-arithmetic analysis (0 for the
    exact discrete sampler); ``None`` when no finite-precision bound exists (textbook).
    """

    sampler: str
    certified: bool
    epsilon_inflation: float | None
    statement: str
    reference: str

    def to_dict(self) -> dict:
        return asdict(self)


_GUARANTEES = {
    "discrete-laplace": SamplerGuarantee(
        sampler="discrete-laplace",
        certified=True,
        epsilon_inflation=0.0,
        statement=(
            "exact pure epsilon-DP in finite precision: the statistic is an exact integer on a "
            "power-of-two grid (rounding applied to each record's contribution before the sum, so "
            "the L1 sensitivity bound holds exactly), and integer noise is drawn exactly from the "
            "discrete Laplace distribution on that grid with the scale as an exact rational; "
            "epsilon inflation 0; assumes uniform random bits from the noise source"
        ),
        reference="Canonne, Kamath & Steinke 2020 (exact discrete Laplace sampling); Mironov 2012 (why not doubles)",
    ),
    "textbook": SamplerGuarantee(
        sampler="textbook",
        certified=False,
        epsilon_inflation=None,
        statement=(
            "ideal-arithmetic guarantee only: inverse-CDF Laplace doubles added to float64 "
            "statistics leak through their low bits, so the pure-DP claim is NOT certified in "
            "finite precision; kept for comparison with published implementations"
        ),
        reference="Mironov 2012, On significance of the least significant bits for differential privacy",
    ),
}


def sampler_guarantee(sampler: str) -> SamplerGuarantee:
    """The finite-precision guarantee of ``sampler`` (one of :data:`SAMPLERS`)."""
    one_of("sampler", sampler, SAMPLERS)
    return _GUARANTEES[sampler]


def as_fraction(name: str, value: float | int | Fraction) -> Fraction:
    """``value`` as an exact rational (a float converts exactly, without rounding), > 0."""
    numeric = (int, float, Fraction, np.integer, np.floating)
    ok = isinstance(value, numeric) and not isinstance(value, bool)
    if ok and isinstance(value, (float, np.floating)):
        ok = math.isfinite(float(value))
    f = Fraction(float(value) if isinstance(value, np.floating) else value) if ok else None
    if f is None or f <= 0:
        raise UsageError(f"{name} must be a finite number > 0, got {value!r}.")
    return f


class _Bits:
    """Uniform random integers from a noise source's byte stream (buffered)."""

    def __init__(self, noise: NoiseSource, chunk: int = 4096):
        self._noise = noise
        self._chunk = chunk
        self._buf = b""
        self._pos = 0

    def _take(self, nbytes: int) -> int:
        if self._pos + nbytes > len(self._buf):
            self._buf = self._buf[self._pos :] + self._noise.random_bytes(max(self._chunk, nbytes))
            self._pos = 0
        v = int.from_bytes(self._buf[self._pos : self._pos + nbytes], "little")
        self._pos += nbytes
        return v

    def below(self, n: int) -> int:
        """Uniform on {0, ..., n - 1} by rejection (exact)."""
        if n == 1:
            return 0
        k = (n - 1).bit_length()
        nbytes = (k + 7) // 8
        mask = (1 << k) - 1
        while True:
            v = self._take(nbytes) & mask
            if v < n:
                return v

    def bernoulli_exp(self, num: int, den: int) -> bool:
        """Bernoulli(exp(-num / den)) for num / den >= 0, exact (CKS 2020, Algorithm 1)."""
        whole, num = divmod(num, den)
        for _ in range(whole):  # exp(-g) = exp(-1)^floor(g) * exp(-(g - floor(g)))
            if not self._bernoulli_exp_unit(1, 1):
                return False
        return self._bernoulli_exp_unit(num, den)

    def _bernoulli_exp_unit(self, num: int, den: int) -> bool:
        # For gamma in [0, 1]: count K = 1 + the length of the run of successes of
        # Bernoulli(gamma / K); P(K odd) = sum_{k odd} gamma^(k-1)/(k-1)! (1 - gamma/k) = e^-gamma.
        k = 1
        while self.below(den * k) < num:  # exact Bernoulli(num / (den k))
            k += 1
        return k % 2 == 1


def discrete_laplace(noise: NoiseSource, size: int, scale: float | int | Fraction) -> np.ndarray:
    """``size`` exact draws from the discrete Laplace distribution with scale ``scale``.

    P(k) proportional to exp(-|k| / scale) on the integers. ``scale`` is converted to an exact
    rational ``s / d``. Returns an object array of Python ints (exact even beyond 2^63).
    Method (CKS 2020, Algorithm 2): X = U + s V with U uniform on {0..s-1} accepted with
    probability exp(-U/s) and V geometric with P(V = v) proportional to e^-v has
    P(X = x) proportional to exp(-x/s); Y = floor(X / d) then has P(Y = y) proportional to
    exp(-y d / s); a random sign, rejecting (-, 0), gives the two-sided law.
    """
    t = as_fraction("scale", scale)
    s, d = t.numerator, t.denominator
    bits = _Bits(noise)
    out = np.empty(int(size), dtype=object)
    for i in range(int(size)):
        while True:
            u = bits.below(s)
            if not bits.bernoulli_exp(u, s):
                continue
            v = 0
            while bits.bernoulli_exp(1, 1):
                v += 1
            y = (u + s * v) // d
            negative = bits.below(2) == 1
            if negative and y == 0:
                continue
            out[i] = -y if negative else y
            break
    return out


def add_grid_laplace(
    units: np.ndarray, scale: float | int | Fraction, grid_log2: int, noise: NoiseSource
) -> np.ndarray:
    """Noised copy of an integer statistic held in units of ``2^-grid_log2``.

    Each entry gets independent discrete Laplace noise of real-valued scale ``scale`` (i.e.
    ``scale * 2^grid_log2`` grid units). Returns an object array of exact Python ints, still in
    grid units; :func:`grid_to_float` converts them (post-processing).
    """
    units = np.asarray(units)
    if units.dtype.kind not in "iuO":
        raise UsageError(f"units must be an integer array, got dtype {units.dtype}.")
    t = as_fraction("scale", scale) * (Fraction(2) ** int(grid_log2))
    z = discrete_laplace(noise, units.size, t).reshape(units.shape)
    return units.astype(object) + z


def grid_to_float(units: np.ndarray, grid_log2: int) -> np.ndarray:
    """Float64 values ``units * 2^-grid_log2`` (each a multiple of the grid step)."""
    flat = [
        math.ldexp(float(int(v)), -int(grid_log2)) for v in np.asarray(units, dtype=object).ravel()
    ]
    return np.asarray(flat, dtype=np.float64).reshape(np.shape(units))

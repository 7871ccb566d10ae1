"""Where DP noise comes from.

Public randomness (data splits, random features, weight initialisation) is derived from the user's ``--seed``. The mechanism's
private randomness is not: the Gaussian/Laplace noise *and* the Poisson sampling masks (amplification by subsampling assumes the
adversary does not know who was sampled) come from a :class:`NoiseSource`, by default seeded with fresh OS entropy, so knowing the
public seed tells an adversary nothing about them. Only when the user asks for ``reproducible`` noise is it derived from the seed,
and the release says so.

Four sources (``NOISE_SOURCES``):

- ``os-entropy`` (default): numpy PCG64 and torch MT19937 generators seeded with 128 bits from :func:`secrets.randbits` (OS
  entropy). Fast, unpredictable from the seed, but PCG64 and MT19937 are not cryptographically secure generators: an adversary who
  saw enough raw output could predict the rest. Opacus calls this mode "not secure". (The Gaussian noise's uniforms come from
  AES-256-CTR keyed from the same 128 bits; the Poisson masks and Laplace draws from PCG64.)
- ``reproducible``: the same generators derived from ``seed`` (explicit opt-in, marked in the release as not secret). The seed is
  published, so the noise is known to anyone: such a release is **not private** and the ledger counts it as unbounded
  (:func:`dpaudit.records.public_noise_reason`).
- ``reproducible-secret``: the same generators derived from a secret noise seed (``--noise-seed-file``,
  :func:`dpaudit.releasing.secret_noise_seed`) that is never recorded: reproducible by whoever holds the seed file, private to
  everyone else. The seed given here is one release's own stream seed (the file's secret, a
  per-release use number and a fresh nonce, :func:`dpaudit.releasing.read_noise_seed`): two
  releases never share it.
- ``cryptographic``: every draw made through the methods of :class:`NoiseSource` (:meth:`~NoiseSource.uniform`,
  :meth:`~NoiseSource.random_bytes`, :meth:`~NoiseSource.gaussian_numpy`, :meth:`~NoiseSource.gaussian_torch`,
  :meth:`~NoiseSource.laplace`, :meth:`~NoiseSource.poisson_mask`) is computed from a ChaCha20 keystream (OpenSSL, through the
  ``cryptography`` package) keyed with 256 bits from :func:`os.urandom`, re-keyed from ``os.urandom`` every 2^34 bytes. This
  replaces Opacus's ``secure_mode`` (which needs torchcsprng, not installable with current torch). Gaussian draws use the sampler
  below, its AES-256-CTR uniforms keyed from this keystream (also a CSPRNG); the ``.numpy`` and ``.torch`` attributes of a
  cryptographic source are *auxiliary* generators seeded from the keystream (for randomness outside the privacy analysis, e.g.
  dropout seeds) and are **not** cryptographic: DP noise and sampling masks must be drawn through the methods.

The Gaussian sampler (every source, every DP path: :data:`GAUSSIAN_SAMPLER`). torch's own ``torch.randn`` is not used for DP
noise: on CPU its float32 draws (tensors of 16 or more elements) are Box–Muller on 24-bit uniforms, so every pair has radius at
most sqrt(48 ln 2) = 5.768 sigma. Truncated noise makes some outputs of a shifted sum impossible under the neighbour, a floor
under delta that an earlier review estimated at 4.2e-5 for the MNIST DP-RVFL release (claimed delta 1e-5). Instead, every Gaussian value is
Box–Muller (:func:`box_muller`) on uniforms drawn by this module:

- u1 in (0, 1] from 53 bits: u1 = 1 - k 2^-53 with k uniform on {0, ..., 2^53 - 1}; the lowest cell (u1 = 2^-53, probability
  2^-53) is refined once with another 53 bits, u1 = (1 - k' 2^-53) 2^-53 (:func:`refine_lowest_cell`). So u1 is the uniform on (0,
  1] rounded up to a grid whose smallest point is :data:`U1_MIN` = 2^-106, and the radius r = sqrt(-2 ln u1), always computed in
  float64, is at most :data:`MAX_RADIUS` = sqrt(212 ln 2) = 12.13.
- the angle 2 pi u2: u2 = k 2^-53 and float64 trigonometry for float64 outputs; u2 = k 2^-24 and float32 trigonometry for float32
  (and narrower) outputs, which are then rounded.
- z = (r cos, r sin), both used, scaled by sigma; the result is rounded to the output dtype.

Uniforms come from an AES-256-CTR keystream (:class:`_AesCtrStream`, a CSPRNG and the fastest generator available here) keyed, per
source, from the source's own entropy: the public seed for ``reproducible`` (so reproducible noise stays reproducible from the
seed), the 128 secret bits for ``os-entropy``, the ChaCha20 keystream for ``cryptographic`` (secret noise stays secret; the key
derivation uses its own branch, so these uniforms are independent of the Poisson masks' generator and buffered Gaussian draws
never change which records are sampled). float32 draws are computed in chunks of :data:`_CHUNK_PAIRS` pairs and handed out in
order (one buffer per source): the values a run receives depend only on the seed and the sequence of requests.

Tail delta (:func:`noise_tail_delta`). Idealise the uniforms as continuous (rounding them to their grids is caveat (1) below). u1
is then uniform on (0, 1] and the pair is exactly N(0, I_2); the sampler differs from that only on the lowest u1 cell (0, 2^-106],
which it maps to radius R = :data:`MAX_RADIUS`: the event "r > R", of probability exp(-R^2 / 2) = 2^-106 =: tau1 per pair. A run
draws a fixed, public number N of values (steps x noised coordinates, independent of the data; every pair it uses holds at least
one drawn value, so at most N pairs). Let B be the event that none of its pairs falls in the lowest cell: 1 - P(B) =: p <= tau = N
tau1 (union bound), and B is independent of the data and of the sampling masks. Write M for the ideal mechanism, assumed (eps,
delta)-DP, M_B for M with its noise conditioned on B, and M~ for the real one: M~(D) = (1 - p) M_B(D) + p A(D) for some
distribution A(D) (whatever happens when a pair hits the lowest cell). For every output set S: M_B(D)(S) <= M(D)(S) / (1 - p) <=
(e^eps M(D')(S) + delta) / (1 - p) and M(D')(S) <= (1 - p) M_B(D')(S) + p, so (1 - p) M_B(D)(S) <= e^eps (1 - p) M_B(D')(S) +
delta + e^eps p, hence M~(D)(S) <= (1 - p) M_B(D)(S) + p <= e^eps M~(D')(S) + delta + (e^eps + 1) p. The real mechanism is (eps,
delta + tail)-DP with tail = (e^eps + 1) tau. The same argument applies to a composition of releases (eps and delta those of the
composition, tau the sum of their tail masses); since e^eps + 1 >= 1 each release's tail delta bounds its tail mass, which is how
the ledger composes them (:func:`dpaudit.ledger.compose.bounds`). For the built-in configurations the tail is below
1e-19 even at eps = 8 (BENCHMARKS.md); releases refuse a configuration whose tail exceeds 1 % of delta (:func:`check_noise_tail`),
before training.

What this does *not* cover (documented caveats): (1) the uniforms are not continuous. Every output is a deterministic rounding of
the ideal conditioned draw (u1 and u2 to their grids, then float64/float32 arithmetic and the rounding of the noisy sum); the set
of attainable outputs is not shift-invariant, so low bits can leak (Mironov 2012). This is not bounded here; for Laplace noise use
the exact discrete sampler of :mod:`dpaudit.mechanisms.elm.laplace`, which draws only integers from :meth:`random_bytes`. (2) The
numpy/torch generators of the ``os-entropy`` and ``reproducible`` sources are not cryptographically secure (see above).
(3) Releases made before this sampler (float32 ``torch.randn``) carry no tail statement and
their recorded delta does not include their tail (an earlier review estimated a floor of about 4.2e-5 under the MNIST DP-RVFL headline
run's claimed 1e-5); the ledger counts them as 0."""

from __future__ import annotations

import math
import os
import secrets
from dataclasses import dataclass

from .errors import UsageError
from .lazy import lazy_import
from .validation import one_of

np = lazy_import("numpy")
# requests and mechanisms validate without torch (docs/architecture.md, rule 2)
torch = lazy_import("torch")
ciphers = lazy_import("cryptography.hazmat.primitives.ciphers")

NOISE_SOURCES = ("os-entropy", "reproducible", "cryptographic", "reproducible-secret")
#: Reproducible sources and the seed their noise is a function of (recorded as ``reproducible``): the public ``--seed`` (not
#: private, see :func:`dpaudit.records.public_noise_reason`) or a secret noise seed that is never published (kept in the
#: operator's seed file and ``local.json``).
REPRODUCIBLE_SOURCES = {"reproducible": "public-seed", "reproducible-secret": "secret-seed"}

# A fixed, public tag mixed into the seed so that reproducible noise never coincides with the public stream derived from the same
# seed.
_NOISE_STREAM_TAG = 0x6E6F697365  # "noise"

_GENERATORS = {
    "os-entropy": "numpy PCG64 + torch MT19937 seeded with 128 bits of OS entropy (not a CSPRNG); Gaussian uniforms: "
    "AES-256-CTR keyed from the same entropy",
    "reproducible": "numpy PCG64 + torch MT19937 derived from the public seed (not secret); Gaussian uniforms: "
    "AES-256-CTR keyed from the seed",
    "cryptographic": "ChaCha20 keystream (OpenSSL via cryptography) keyed with 256 bits from os.urandom; Gaussian "
    "uniforms: AES-256-CTR keyed from the ChaCha20 keystream",
    "reproducible-secret": "numpy PCG64 + torch MT19937 derived from a secret noise seed (>= 128 bits, kept in the "
    "operator's seed file, never published); Gaussian uniforms: AES-256-CTR keyed from it",
}
# A fixed, public tag for noise derived from a secret noise seed (its own stream family).
_SECRET_STREAM_TAG = 0x736563726574  # "secret"

_TWO_POW_M53 = 2.0**-53
_REKEY_BYTES = 2**34  # well below the 2^32-block (256 GiB) ChaCha20 counter space
_CHUNK_BYTES = 1 << 20
# A fixed, public tag for the generator of the Gaussian uniforms (os-entropy / reproducible): its stream is independent of the
# masks' generator, so buffered Gaussian draws never change which records a Poisson mask selects.
_GAUSS_STREAM_TAG = 0x6761757373  # "gauss"
#: float32 Gaussian draws are computed this many pairs at a time (1 MiB of float32 values per source) and handed out in order:
#: fewer, larger chunks measured fastest on the benchmark machine (per-call overheads dominate below 64k pairs; 128k and 256k
#: measured equal).
_CHUNK_PAIRS = 131072

#: Short public name of the Gaussian sampler of every DP path (recorded in releases).
GAUSSIAN_SAMPLER = "box-muller-u106"
#: Smallest attainable u1: the lowest 2^-53 cell is refined once more (module docstring).
U1_MIN = 2.0**-106
#: Largest attainable radius sqrt(-2 ln U1_MIN) = sqrt(212 ln 2) of a pair, hence of |z|.
MAX_RADIUS = math.sqrt(-2.0 * math.log(U1_MIN))
#: Ideal Gaussian mass beyond MAX_RADIUS, per pair: exp(-MAX_RADIUS^2 / 2) = 2^-106.
TAIL_MASS_PER_PAIR = U1_MIN
#: The public description written into each release (``noise_sampler``).
GAUSSIAN_SAMPLER_DESCRIPTION = (
    "box-muller-u106: float64 radius from 53-bit uniforms, lowest cell refined (|z| <= 12.13 sigma, tail mass "
    "<= 2^-106 per value); angle 53-bit (float64) / 24-bit (float32); AES-256-CTR uniforms keyed by the noise "
    "source; tails in noise_tail_delta, floating-point rounding not covered (dpaudit.noise)"
)


def box_muller(
    u1: np.ndarray,
    u2: np.ndarray,
    out: np.ndarray | None = None,
    *,
    scratch: bool = False,
    work: np.ndarray | None = None,
) -> np.ndarray:
    """The Gaussian sampler as a pure function of its uniforms: an array (2, P) holding ``r cos(2 pi u2)`` (row 0) and ``r sin(2
    pi u2)`` (row 1), r = sqrt(-2 ln u1).

    ``u1``: float64 in (0, 1] (the radius is always computed in float64, so its tails are the same for every output dtype).
    ``u2``: in [0, 1), float64 (angle and output in float64) or float32 (angle, trigonometry and output in float32, the radius
    rounded to float32 once). Both of shape (P,). ``out``: an optional C-contiguous (2, P) array of u2's dtype to write into.
    ``scratch=True`` lets the function overwrite ``u1`` and ``u2`` (contiguous arrays of exactly these dtypes; the samplers' own
    buffers) instead of allocating temporaries, and ``work`` (float32, shape (P,)) holds the float32 radius.
    |z| <= sqrt(-2 ln min(u1)): 12.13 for the smallest u1 this module draws (:data:`U1_MIN`).
    """
    dt = np.float32 if np.asarray(u2).dtype == np.float32 else np.float64
    if not scratch:
        u1 = np.array(u1, dtype=np.float64)
        u2 = np.array(u2, dtype=dt)
    if out is None:
        out = np.empty((2,) + u1.shape, dtype=dt)
    # NumPy's vectorised float64 log (measured 3.5x torch's here, and no torch import)
    np.log(u1, out=u1)
    if dt == np.float64:
        r = np.sqrt(np.multiply(u1, -2.0, out=u1), out=u1)
    else:
        r = np.empty(u1.shape, dtype=np.float32) if work is None else work
        np.sqrt(np.multiply(u1, -2.0, out=r, casting="same_kind"), out=r)
    np.multiply(u2, dt(2.0 * math.pi), out=u2)
    np.cos(u2, out=out[0])
    np.sin(u2, out=out[1])
    np.multiply(out, r, out=out)
    return out


def refine_lowest_cell(u1: np.ndarray, fine) -> np.ndarray:
    """Refine, in place, every ``u1`` in the lowest cell (== 2^-53) with ``fine(m)`` (m uniforms k 2^-53 in [0, 1)): u1 = (1 - k
    2^-53) 2^-53 >= 2^-106. Returns ``u1``."""
    low = np.flatnonzero(u1 == _TWO_POW_M53)
    if low.size:
        u1[low] = (1.0 - np.asarray(fine(low.size), dtype=np.float64)) * _TWO_POW_M53
    return u1


def noise_tail_delta(n_values: int, epsilon: float, delta: float) -> float:
    """The delta that the sampler's truncated tails add to an (epsilon, delta) claim over a run drawing ``n_values`` Gaussian
    values: (e^eps + 1) tau with tau = n 2^-106, capped at 1, the union bound (one pair per value) on the probability that the
    run touches a pair beyond :data:`MAX_RADIUS` (module docstring; ``delta`` is accepted for the callers' clarity, the bound
    does not depend on it).

    0 for a run without Gaussian noise; inf when tau = 1 or e^eps overflows (no claim)."""
    n = int(n_values)
    if n < 0:
        raise ValueError(f"n_values must be >= 0, got {n_values}.")
    tau = min(1.0, n * TAIL_MASS_PER_PAIR)
    if tau == 0.0:
        return 0.0
    if tau >= 1.0 or not math.isfinite(epsilon) or epsilon > 700:
        return math.inf
    return (math.exp(epsilon) + 1.0) * tau


#: A release whose tail delta exceeds this fraction of its delta is refused.
MAX_TAIL_FRACTION = 0.01


def gaussian_run_tail(
    steps: int, values_per_step: int, epsilon: float, delta: float, *, what: str = "release"
) -> float:
    """The checked ``noise_tail_delta`` of a Gaussian run that draws ``values_per_step`` noise values at each of ``steps`` steps
    (both public: every step is noised, empty Poisson batches included): :func:`noise_tail_delta`, refused above 1 % of ``delta``
    (:func:`check_noise_tail`). Call it with the target epsilon before training (the tail grows with epsilon) and with the claimed
    epsilon for the release."""
    return check_noise_tail(
        noise_tail_delta(int(steps) * int(values_per_step), epsilon, delta), delta, what=what
    )


def check_noise_tail(tail_delta: float, delta: float, *, what: str = "release") -> float:
    """Refuse (UsageError) a tail delta above 1 % of the claimed delta; returns ``tail_delta``."""
    if not tail_delta <= MAX_TAIL_FRACTION * delta:
        raise UsageError(
            f"noise tail delta must be at most {MAX_TAIL_FRACTION:.0%} of delta={delta:g}, got {tail_delta:.3g} for this {what} "
            f"(sampler {GAUSSIAN_SAMPLER}: 2^-106 per value; fewer steps/coordinates or a smaller epsilon)."
        )
    return tail_delta


@dataclass(frozen=True)
class NoiseSpec:
    """How DP noise was produced, as recorded in a release (``noise_source``)."""

    source: str  # one of NOISE_SOURCES
    seed: int | None  # only for "reproducible"; None otherwise (entropy is never recorded)

    def to_dict(self) -> dict:
        d = {
            "source": self.source,
            "seed": self.seed,
            "secret": self.source != "reproducible",
            "generator": _GENERATORS[self.source],
        }
        if self.source in REPRODUCIBLE_SOURCES:  # which seed the noise is a function of
            d["reproducible"] = REPRODUCIBLE_SOURCES[self.source]
        return d


class _ChaCha20Stream:
    """A ChaCha20 keystream: the cipher applied to zero bytes, i.e. raw pseudorandom bytes. Keyed with 256 bits of OS entropy
    (``key`` may be given only by tests). The 16-byte nonce is the 4-byte block counter (starting at 0) and 12 random bytes; the
    stream is re-keyed from ``os.urandom`` after 2^34 bytes so the counter never wraps."""

    def __init__(self, key: bytes | None = None):
        self._fixed_key = key
        self._rekey()

    def _rekey(self) -> None:
        if self._fixed_key is not None:
            key, nonce = self._fixed_key, bytes(16)
            # A fixed (test) key is used for one stream only; re-keying continues from it.
            self._fixed_key = bytes(a ^ b for a, b in zip(key, b"\x5a" * 32))
        else:
            key, nonce = os.urandom(32), bytes(4) + os.urandom(12)
        self._enc = ciphers.Cipher(ciphers.algorithms.ChaCha20(key, nonce), mode=None).encryptor()
        self._used = 0

    def read(self, n: int) -> bytes:
        out = bytearray()  # n <= 0: nothing read
        while len(out) < n:
            if self._used >= _REKEY_BYTES:
                self._rekey()
            take = min(n - len(out), _CHUNK_BYTES, _REKEY_BYTES - self._used)
            out += self._enc.update(bytes(take))
            self._used += take
        return bytes(out)

    def uint64(self, count: int) -> np.ndarray:
        return np.frombuffer(self.read(8 * count), dtype="<u8").astype(np.uint64, copy=False)


class _AesCtrStream:
    """The Gaussian sampler's uniforms: an AES-256-CTR keystream (OpenSSL, AES-NI) under a 32-byte key; counter blocks from 0. A
    CSPRNG and, on the benchmark machine, about 3x faster per byte than numpy's SFC64 and 4x faster than ChaCha20 (BENCHMARKS.md),
    which is what keeps 53-bit Box-Muller as cheap as torch's 24-bit ``randn``."""

    def __init__(self, key: bytes):
        self._enc = ciphers.Cipher(
            ciphers.algorithms.AES(bytes(key)), ciphers.modes.CTR(bytes(16))
        ).encryptor()
        self._zeros = memoryview(b"")

    def read_into(self, buf: np.ndarray) -> np.ndarray:
        """Overwrite the C-contiguous array ``buf`` with keystream bytes; returns ``buf``."""
        n = buf.nbytes
        if len(self._zeros) < n + 16:  # update_into wants room for one more block
            self._zeros = memoryview(bytes(max(n + 16, 2 * len(self._zeros))))
        # a memoryview slice, not a bytes slice: no copy (a copy costs as much as the cipher)
        done = self._enc.update_into(self._zeros[:n], memoryview(buf).cast("B"))
        if done != n:  # CTR is a stream mode: it never buffers
            raise RuntimeError(f"AES-CTR returned {done} bytes, expected {n}.")
        return buf

    def uint64(self, count: int) -> np.ndarray:
        return self.read_into(np.empty(count, dtype=np.uint64))


def _gauss_key(entropy) -> bytes:
    """The 32-byte AES key of the Gaussian uniforms, derived from a source's entropy (its own SeedSequence branch, so independent
    of the source's numpy/torch streams)."""
    sequence = np.random.SeedSequence(entropy, spawn_key=(_GAUSS_STREAM_TAG,))
    return sequence.generate_state(8, np.uint32).astype("<u4").tobytes()


def _shape_size(shape) -> tuple[tuple[int, ...], int]:
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    shape = tuple(int(s) for s in shape)
    return shape, int(np.prod(shape, dtype=np.int64)) if shape else 1


class NoiseSource:
    """The private randomness of a mechanism: DP noise and Poisson sampling masks, from one of the four ``source`` kinds of the
    module docstring (``seed`` only for the reproducible ones; a secret noise seed is never recorded: ``spec.seed`` is None).
    Draw DP noise and masks through the methods; they work for every source (``.numpy``/``.torch`` of a cryptographic source are
    auxiliary, non-cryptographic generators)."""

    def __init__(self, source: str = "os-entropy", seed: int | None = None):
        one_of("noise_source", source, NOISE_SOURCES)
        self._stream: _ChaCha20Stream | None = None
        if source in REPRODUCIBLE_SOURCES:
            if seed is None:
                raise ValueError("reproducible noise needs a seed")
            tag = _NOISE_STREAM_TAG if source == "reproducible" else _SECRET_STREAM_TAG
            entropy = [int(seed), tag]
        elif source == "cryptographic":
            self._stream = _ChaCha20Stream()
            entropy = int.from_bytes(self._stream.read(32), "little")
        else:
            entropy = secrets.randbits(128)
        self.spec = NoiseSpec(source=source, seed=int(seed) if source == "reproducible" else None)
        self._init_generators(entropy)

    def _init_generators(self, entropy) -> None:
        """numpy and torch generators seeded from ``entropy``, and the Gaussian sampler's state: its uniforms' keystream, keyed from
        ``entropy`` (a cryptographic source keys it from its ChaCha20 keystream instead), and an empty float32 buffer."""
        self.numpy = np.random.default_rng(np.random.SeedSequence(entropy))
        # drawn now (the numpy stream's position does not depend on whether torch is ever used);
        # the generator itself is built on first use of :attr:`torch`, so heads never import torch
        self._torch_seed, self._torch = int(self.numpy.integers(0, 2**63 - 1)), None
        key = self._stream.read(32) if self._stream is not None else _gauss_key(entropy)
        self._gauss = _AesCtrStream(key)
        self._buf32 = np.empty(0, dtype=np.float32)
        self._pos32 = 0

    @classmethod
    def _cryptographic_with_key(cls, key: bytes) -> "NoiseSource":
        """A ChaCha20 source with a *known* key: for deterministic tests only, never for releases."""
        c = cls("cryptographic")
        c._stream = _ChaCha20Stream(key=bytes(key))
        c._init_generators(int.from_bytes(c._stream.read(32), "little"))
        return c

    @property
    def torch(self):
        """A ``torch.Generator`` drawn from this source (auxiliary: dropout, torch-side draws)."""
        if self._torch is None:
            self._torch = torch.Generator()
            self._torch.manual_seed(self._torch_seed)
        return self._torch

    @property
    def cryptographic(self) -> bool:
        """True for a ChaCha20 source: its Poisson masks must not come from ``numpy`` (PCG64)."""
        return self._stream is not None

    # ------------------------------------------------------------------ primitives
    def random_bytes(self, n: int) -> bytes:
        """``n`` uniformly random bytes (the input of the exact integer samplers)."""
        if self._stream is not None:
            return self._stream.read(int(n))
        return self.numpy.bytes(int(n))

    def aux_seed(self) -> int:
        """A 63-bit seed for auxiliary generators (e.g. dropout), drawn from this source."""
        if self._stream is not None:
            return int.from_bytes(self._stream.read(8), "little") >> 1
        return int(self.numpy.integers(0, 2**63 - 1))

    def uniform(self, shape) -> np.ndarray:
        """Doubles k * 2^-53 with k uniform on {0, ..., 2^53 - 1}: uniform on [0, 1)."""
        shape, size = _shape_size(shape)
        if self._stream is not None:
            k = self._stream.uint64(size) >> np.uint64(11)
            return (k.astype(np.float64) * _TWO_POW_M53).reshape(shape)
        return self.numpy.random(shape)  # numpy's random() is also k * 2^-53, 53-bit

    def poisson_mask(self, n: int, sample_rate: float) -> np.ndarray:
        """Boolean mask of a Poisson sample: each of ``n`` units included with ``sample_rate``."""
        return self.uniform(n) < sample_rate

    # ------------------------------------------------------------------ continuous noise
    def _u53(self, n: int) -> np.ndarray:
        """``n`` uniforms k 2^-53 in [0, 1) (k = the top 53 bits of a keystream word)."""
        return (self._gauss.uint64(n) >> np.uint64(11)).astype(np.float64) * _TWO_POW_M53

    def _u1(
        self, n: int, out: np.ndarray | None = None, words: np.ndarray | None = None
    ) -> np.ndarray:
        """``n`` radius uniforms u1 = 1 - k 2^-53, the lowest cell refined (module docstring), into ``out`` if given (``words``: a
        uint64 (n,) scratch array)."""
        k = self._gauss.read_into(np.empty(n, dtype=np.uint64) if words is None else words)
        np.right_shift(k, np.uint64(11), out=k)
        lowest = k.max(initial=0) == 2**53 - 1  # u1 = 2^-53, the lowest cell: rare (2^-53)
        # exact: k < 2^53
        u1 = np.multiply(k.view(np.int64), -_TWO_POW_M53, out=out, casting="unsafe")
        np.add(u1, 1.0, out=u1)
        return refine_lowest_cell(u1, self._u53) if lowest else u1

    def _u24_into(self, out: np.ndarray, words: np.ndarray | None = None) -> None:
        """Fill float32 ``out`` with uniforms k 2^-24 in [0, 1) (k = the top 24 bits of a 32-bit keystream word): the float32
        angle's uniform (``words``: a uint32 scratch array)."""
        k = self._gauss.read_into(np.empty(out.size, dtype=np.uint32) if words is None else words)
        np.right_shift(k, np.uint32(8), out=k)
        np.multiply(k.view(np.int32), np.float32(2.0**-24), out=out, casting="unsafe")

    def _standard64(self, size: int) -> np.ndarray:
        """``size`` N(0, 1) float64 values (53-bit angle, float64 arithmetic)."""
        pairs = (size + 1) // 2
        u1 = self._u1(pairs)
        return box_muller(u1, self._u53(pairs), scratch=True).reshape(-1)[:size]

    def _refill32(self) -> None:
        p = _CHUNK_PAIRS
        # allocated once per source: fresh pages cost as much as the math
        if self._buf32.size != 2 * p:
            self._buf32 = np.empty(2 * p, dtype=np.float32)
            # u1, u2, the float32 radius, the keystream words
            kinds = (np.float64, np.float32, np.float32, np.uint64)
            self._work = tuple(np.empty(p, dtype=kind) for kind in kinds)
        u1, u2, r, words = self._work
        self._u1(p, out=u1, words=words)
        self._u24_into(u2, words=words[: (p + 1) // 2].view(np.uint32)[:p])
        box_muller(u1, u2, out=self._buf32.reshape(2, p), scratch=True, work=r)
        self._pos32 = 0

    def _fill32(self, out: np.ndarray, std: float) -> np.ndarray:
        """Write ``std`` x the next ``out.size`` float32 N(0, 1) values into float32 ``out`` (C-contiguous), from the chunked
        buffer. Returns ``out``."""
        flat = out.reshape(-1)
        n, pos = flat.size, 0
        scale = np.float32(std)
        while pos < n:
            if self._pos32 >= self._buf32.size:
                self._refill32()
            take = min(n - pos, self._buf32.size - self._pos32)
            chunk = self._buf32[self._pos32 : self._pos32 + take]
            np.multiply(chunk, scale, out=flat[pos : pos + take])
            self._pos32 += take
            pos += take
        return out

    def gaussian_into(self, out: np.ndarray, std: float) -> np.ndarray:
        """Fill the C-contiguous float32 or float64 array ``out`` with N(0, std^2) in place (the trainers' reusable buffers); the
        same draws as :meth:`gaussian_torch` of that shape and dtype. Returns ``out``."""
        if not out.flags.c_contiguous:
            raise UsageError("out must be a C-contiguous array, got a strided view.")
        if out.dtype == np.float32:
            return self._fill32(out, std)
        if out.dtype == np.float64:
            np.multiply(self._standard64(out.size).reshape(out.shape), std, out=out)
            return out
        raise UsageError(f"out must be a float32 or float64 array, got {out.dtype}.")

    def gaussian_numpy(self, shape, std: float) -> np.ndarray:
        """N(0, std^2) doubles of ``shape`` (float64), from :data:`GAUSSIAN_SAMPLER`."""
        shape, size = _shape_size(shape)
        return (self._standard64(size) * std).reshape(shape)

    def gaussian_torch(self, shape, std: float, dtype=None) -> torch.Tensor:
        """N(0, std^2) tensor of ``shape`` and ``dtype`` (CPU; default float32), from :data:`GAUSSIAN_SAMPLER`: float64 arithmetic
        for float64, float32 for every other dtype (then rounded)."""
        dtype = torch.float32 if dtype is None else dtype
        shape, size = _shape_size(shape)
        if dtype == torch.float64:
            return torch.from_numpy(self.gaussian_numpy(shape, std))
        z = self._fill32(np.empty(shape, dtype=np.float32), std)
        return torch.from_numpy(z).to(dtype)

    def laplace(self, shape, scale: float) -> np.ndarray:
        """Textbook inverse-CDF Laplace(0, ``scale``) doubles: ``-scale sgn(V) ln(1 - 2|V|)``. V = U - 1/2 with U = (k + 1/2)
        2^-52, k uniform on {0, ..., 2^52 - 1} (U and V are exact doubles, U in [2^-53, 1 - 2^-53]), so the logarithm is always
        finite. **Leaky in floating point** (Mironov 2012): adding these doubles to a real-valued statistic is not epsilon-DP.
        Kept for comparison with published implementations; DP-ELM uses :func:`dpaudit.mechanisms.elm.laplace.discrete_laplace`."""
        shape, size = _shape_size(shape)
        if self._stream is not None:
            k = self._stream.uint64(size) >> np.uint64(12)
        else:
            k = self.numpy.integers(0, 2**52, size=size, dtype=np.uint64)
        v = (k.astype(np.float64) + 0.5) * 2.0**-52 - 0.5
        return (-scale * np.sign(v) * np.log1p(-2.0 * np.abs(v))).reshape(shape)


def public_rng(seed: int, *tags: int) -> np.random.Generator:
    """Generator for public randomness (splits, random features, init) derived from ``seed``."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), *map(int, tags)]))

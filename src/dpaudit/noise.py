"""Where DP noise comes from.

Public randomness (data splits, random features, weight initialisation) is derived from the
user's ``--seed``. The mechanism's private randomness is not: the Gaussian/Laplace noise *and*
the Poisson sampling masks (amplification by subsampling assumes the adversary does not know
who was sampled) come from a :class:`NoiseSource`, by default seeded with fresh OS entropy, so
knowing the public seed tells an adversary nothing about them. Only when the user asks for
``reproducible`` noise is it derived from the seed, and the release says so.

Three sources (``NOISE_SOURCES``):

- ``os-entropy`` (default): numpy PCG64 and torch MT19937 generators seeded with 128 bits from
  :func:`secrets.randbits` (OS entropy). Fast, unpredictable from the seed, but PCG64 and
  MT19937 are not cryptographically secure generators: an adversary who saw enough raw output
  could predict the rest. Opacus calls this mode "not secure".
- ``reproducible``: the same generators derived from ``seed`` (explicit opt-in, marked in the
  release as not secret).
- ``cryptographic``: every draw made through the methods of :class:`NoiseSource`
  (:meth:`~NoiseSource.uniform`, :meth:`~NoiseSource.random_bytes`,
  :meth:`~NoiseSource.gaussian_numpy`, :meth:`~NoiseSource.gaussian_torch`,
  :meth:`~NoiseSource.laplace`, :meth:`~NoiseSource.poisson_mask`) is computed from a ChaCha20
  keystream (OpenSSL, through the ``cryptography`` package) keyed with 256 bits from
  :func:`os.urandom`, re-keyed from ``os.urandom`` every 2^34 bytes. This replaces Opacus's
  ``secure_mode`` (which needs torchcsprng, not installable with current torch). Gaussian draws
  use the Box–Muller transform on 53-bit uniforms (so |z| <= sqrt(2 * 53 ln 2) ~ 8.57: a
  truncation of mass ~1e-17); the ``.numpy`` and ``.torch`` attributes of a cryptographic
  source are *auxiliary* generators seeded from the keystream (for randomness outside the
  privacy analysis, e.g. dropout seeds) and are **not** cryptographic: DP noise and sampling
  masks must be drawn through the methods.

Floating-point caveat (all sources): Gaussian and textbook Laplace samples are doubles computed
by transcendental functions of uniforms; the set of attainable outputs is not shift-invariant,
so their low bits can leak (Mironov 2012). For Laplace noise use the exact discrete sampler of
:mod:`dpaudit.mechanisms.laplace`, which draws only integers from :meth:`random_bytes`.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass

import numpy as np
import torch

from .validation import one_of

NOISE_SOURCES = ("os-entropy", "reproducible", "cryptographic")

# A fixed, public tag mixed into the seed so that reproducible noise never coincides with the
# public stream derived from the same seed.
_NOISE_STREAM_TAG = 0x6E6F697365  # "noise"

_GENERATORS = {
    "os-entropy": "numpy PCG64 + torch MT19937 seeded with 128 bits of OS entropy (not a CSPRNG)",
    "reproducible": "numpy PCG64 + torch MT19937 derived from the public seed (not secret)",
    "cryptographic": "ChaCha20 keystream (OpenSSL via cryptography) keyed with 256 bits from os.urandom",
}

_TWO_POW_M53 = 2.0 ** -53
_REKEY_BYTES = 2**34  # well below the 2^32-block (256 GiB) ChaCha20 counter space
_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class NoiseSpec:
    """How DP noise was produced, as recorded in a release (``noise_source``)."""

    source: str  # one of NOISE_SOURCES
    seed: int | None  # only for "reproducible"; None otherwise (entropy is never recorded)

    def to_dict(self) -> dict:
        return {
            "source": self.source,
            "seed": self.seed,
            "secret": self.source != "reproducible",
            "generator": _GENERATORS[self.source],
        }


class _ChaCha20Stream:
    """A ChaCha20 keystream: the cipher applied to zero bytes, i.e. raw pseudorandom bytes.

    Keyed with 256 bits of OS entropy (``key`` may be given only by tests). The 16-byte nonce is
    the 4-byte block counter (starting at 0) and 12 random bytes; the stream is re-keyed from
    ``os.urandom`` after 2^34 bytes so the counter never wraps.
    """

    def __init__(self, key: bytes | None = None):
        self._fixed_key = key
        self._rekey()

    def _rekey(self) -> None:
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

        if self._fixed_key is not None:
            key, nonce = self._fixed_key, bytes(16)
            # A fixed (test) key is used for one stream only; re-keying continues from it.
            self._fixed_key = bytes(a ^ b for a, b in zip(key, b"\x5a" * 32))
        else:
            key, nonce = os.urandom(32), bytes(4) + os.urandom(12)
        self._enc = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor()
        self._used = 0

    def read(self, n: int) -> bytes:
        if n <= 0:
            return b""
        out = bytearray()
        while len(out) < n:
            if self._used >= _REKEY_BYTES:
                self._rekey()
            take = min(n - len(out), _CHUNK_BYTES, _REKEY_BYTES - self._used)
            out += self._enc.update(bytes(take))
            self._used += take
        return bytes(out)

    def uint64(self, count: int) -> np.ndarray:
        return np.frombuffer(self.read(8 * count), dtype="<u8").astype(np.uint64, copy=False)


def _shape_size(shape) -> tuple[tuple[int, ...], int]:
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    shape = tuple(int(s) for s in shape)
    return shape, int(np.prod(shape, dtype=np.int64)) if shape else 1


class NoiseSource:
    """The private randomness of a mechanism: DP noise and Poisson sampling masks.

    ``source``:
      - ``os-entropy`` (default): seeded from ``secrets.randbits(128)``; not reproducible.
      - ``reproducible``: derived from ``seed`` (explicit opt-in, marked in the release).
      - ``cryptographic``: a ChaCha20 keystream keyed from ``os.urandom`` (see module docs);
        ``.numpy``/``.torch`` are then auxiliary non-cryptographic generators seeded from it.

    Draw DP noise and masks through the methods; they work for every source.
    """

    def __init__(self, source: str = "os-entropy", seed: int | None = None):
        one_of("noise_source", source, NOISE_SOURCES)
        self._stream: _ChaCha20Stream | None = None
        if source == "reproducible":
            if seed is None:
                raise ValueError("reproducible noise needs a seed")
            entropy = [int(seed), _NOISE_STREAM_TAG]
        elif source == "cryptographic":
            self._stream = _ChaCha20Stream()
            entropy = int.from_bytes(self._stream.read(32), "little")
        else:
            entropy = secrets.randbits(128)
        self.spec = NoiseSpec(source=source, seed=int(seed) if source == "reproducible" else None)
        self.numpy = np.random.default_rng(np.random.SeedSequence(entropy))
        self.torch = torch.Generator()
        self.torch.manual_seed(int(self.numpy.integers(0, 2**63 - 1)))

    @classmethod
    def _cryptographic_with_key(cls, key: bytes) -> "NoiseSource":
        """A ChaCha20 source with a *known* key: for deterministic tests only, never for releases."""
        c = cls("cryptographic")
        c._stream = _ChaCha20Stream(key=bytes(key))
        entropy = int.from_bytes(c._stream.read(32), "little")
        c.numpy = np.random.default_rng(np.random.SeedSequence(entropy))
        c.torch = torch.Generator()
        c.torch.manual_seed(int(c.numpy.integers(0, 2**63 - 1)))
        return c

    @property
    def cryptographic(self) -> bool:
        return self._stream is not None

    def spawn(self, n: int) -> list["NoiseSource"]:
        """Independent child sources (one per trial), same kind of source."""
        if self._stream is not None:
            if self._stream._fixed_key is not None:  # test key: children keyed from the stream
                return [NoiseSource._cryptographic_with_key(self._stream.read(32)) for _ in range(n)]
            return [NoiseSource("cryptographic") for _ in range(n)]
        children = []
        for child_seed in self.numpy.integers(0, 2**63 - 1, size=n):
            c = object.__new__(NoiseSource)
            c.spec = self.spec
            c._stream = None
            c.numpy = np.random.default_rng(int(child_seed))
            c.torch = torch.Generator()
            c.torch.manual_seed(int(c.numpy.integers(0, 2**63 - 1)))
            children.append(c)
        return children

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
    def _box_muller(self, size: int) -> np.ndarray:
        pairs = (size + 1) // 2
        k = self._stream.uint64(2 * pairs) >> np.uint64(11)
        u1 = (k[:pairs].astype(np.float64) + 1.0) * _TWO_POW_M53  # (0, 1]: log is finite
        u2 = k[pairs:].astype(np.float64) * _TWO_POW_M53  # [0, 1)
        r = np.sqrt(-2.0 * np.log(u1))
        theta = 2.0 * np.pi * u2
        return np.concatenate([r * np.cos(theta), r * np.sin(theta)])[:size]

    def gaussian_numpy(self, shape, std: float) -> np.ndarray:
        """N(0, std^2) doubles of ``shape`` (float64)."""
        if self._stream is not None:
            shape, size = _shape_size(shape)
            return (self._box_muller(size) * std).reshape(shape)
        return self.numpy.normal(0.0, std, size=shape)

    def gaussian_torch(self, shape, std: float, dtype=torch.float32) -> torch.Tensor:
        """N(0, std^2) tensor of ``shape`` and ``dtype`` (CPU)."""
        if self._stream is not None:
            shape, size = _shape_size(shape)
            z = self._box_muller(size).reshape(shape) * std
            return torch.from_numpy(np.asarray(z)).to(dtype)
        return torch.randn(shape, generator=self.torch, dtype=dtype) * std

    def laplace(self, shape, scale: float) -> np.ndarray:
        """Textbook inverse-CDF Laplace(0, ``scale``) doubles: ``-scale sgn(V) ln(1 - 2|V|)``.

        V = U - 1/2 with U = (k + 1/2) 2^-52, k uniform on {0, ..., 2^52 - 1} (U and V are exact
        doubles, U in [2^-53, 1 - 2^-53]), so the logarithm is always finite. **Leaky in floating point** (Mironov 2012): adding these doubles to a
        real-valued statistic is not epsilon-DP. Kept for comparison with published
        implementations; DP-ELM uses :func:`dpaudit.mechanisms.laplace.discrete_laplace`.
        """
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

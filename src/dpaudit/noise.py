"""Where DP noise comes from.

Public randomness (data splits, random features, weight initialisation) is derived from the
user's ``--seed``. The mechanism's private randomness is not: the Gaussian/Laplace noise *and*
the Poisson sampling masks (amplification by subsampling assumes the adversary does not know
who was sampled) come from a :class:`NoiseSource`, by default seeded with fresh OS entropy, so
knowing the public seed tells an adversary nothing about them. Only when the user asks for
``reproducible`` noise is it derived from the seed, and the release says so.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import numpy as np
import torch

from .validation import one_of

NOISE_SOURCES = ("os-entropy", "reproducible", "cryptographic")

# A fixed, public tag mixed into the seed so that reproducible noise never coincides with the
# public stream derived from the same seed.
_NOISE_STREAM_TAG = 0x6E6F697365  # "noise"


@dataclass(frozen=True)
class NoiseSpec:
    """How DP noise was produced, as recorded in a release (``noise_source``)."""

    source: str  # one of NOISE_SOURCES
    seed: int | None  # only for "reproducible"; None otherwise (entropy is never recorded)

    def to_dict(self) -> dict:
        return {"source": self.source, "seed": self.seed, "secret": self.source != "reproducible"}


class NoiseSource:
    """Draws Gaussian noise for DP mechanisms from a numpy and a torch generator.

    ``source``:
      - ``os-entropy`` (default): seeded from ``secrets.randbits(128)``; not reproducible.
      - ``reproducible``: derived from ``seed`` (explicit opt-in, marked in the release).
      - ``cryptographic``: see :mod:`dpaudit.mechanisms.secure_noise` (added by the noise issue);
        here it falls back to fresh OS entropy per draw batch.
    """

    def __init__(self, source: str = "os-entropy", seed: int | None = None):
        one_of("noise_source", source, NOISE_SOURCES)
        if source == "reproducible":
            if seed is None:
                raise ValueError("reproducible noise needs a seed")
            entropy = [int(seed), _NOISE_STREAM_TAG]
        else:
            entropy = secrets.randbits(128)
        self.spec = NoiseSpec(source=source, seed=int(seed) if source == "reproducible" else None)
        self.numpy = np.random.default_rng(np.random.SeedSequence(entropy))
        self.torch = torch.Generator()
        self.torch.manual_seed(int(self.numpy.integers(0, 2**63 - 1)))

    def spawn(self, n: int) -> list["NoiseSource"]:
        """Independent child sources (one per trial), same kind of source."""
        children = []
        for child_seed in self.numpy.integers(0, 2**63 - 1, size=n):
            c = object.__new__(NoiseSource)
            c.spec = self.spec
            c.numpy = np.random.default_rng(int(child_seed))
            c.torch = torch.Generator()
            c.torch.manual_seed(int(c.numpy.integers(0, 2**63 - 1)))
            children.append(c)
        return children

    def poisson_mask(self, n: int, sample_rate: float) -> np.ndarray:
        """Boolean mask of a Poisson sample: each of ``n`` units included with ``sample_rate``."""
        return self.numpy.random(n) < sample_rate

    def gaussian_numpy(self, shape, std: float) -> np.ndarray:
        return self.numpy.normal(0.0, std, size=shape)

    def gaussian_torch(self, shape, std: float, dtype=torch.float32) -> torch.Tensor:
        return torch.randn(shape, generator=self.torch, dtype=dtype) * std


def public_rng(seed: int, *tags: int) -> np.random.Generator:
    """Generator for public randomness (splits, random features, init) derived from ``seed``."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), *map(int, tags)]))

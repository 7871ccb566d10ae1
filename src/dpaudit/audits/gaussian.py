"""The plain Gaussian mechanism: the auditor's own calibration target, with an exact epsilon.

Mechanism: n public records x_j in R^d, each clipped to L2 norm <= C (the clipping norm, i.e. the
add/remove L2 sensitivity of the sum); release = sum_j x_j + N(0, (sigma C)^2 I_d), sigma the
noise multiplier. Its privacy curve is known exactly: with mu = 1/sigma it is (eps, delta)-DP
iff delta >= Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu) (the analytic Gaussian mechanism,
Balle & Wang 2018, Thm 8; identical to mu-GDP, Dong, Roth & Su 2019). Calibration inverts it,
so the claim is exact, not an upper bound: a sound audit must give eps_LB <= epsilon, and the
GDP estimate should land near it.

Canaries: ``max-clip`` (a record of norm exactly C in a fixed direction: the worst case, whose
projection is the likelihood-ratio statistic) and ``natural`` (a held-out record from the same
distribution, usually shorter than C). ``broken_noise_factor`` > 1 divides the noise while the
claim stays the same: a deliberately broken mechanism the audit must catch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..accounting.events import SubsampledGaussian
from ..lazy import lazy_import
from ..noise import NoiseSource, public_rng
from ..validation import one_of, open_unit, positive_finite, positive_int
from .stats import gdp_epsilon, gdp_mu_for_epsilon
from .targets import AuditTarget

np = lazy_import("numpy")

GAUSSIAN_CANARIES = ("max-clip", "natural")
#: The target's fields its audit record's config lists first, in their written order.
_CONFIG_FIELDS = "noise_multiplier clipping_norm dimension n_records broken_noise_factor".split()


def exact_epsilon(noise_multiplier: float, delta: float) -> float:
    """Exact epsilon at ``delta`` of one Gaussian release with noise std = noise_multiplier * sensitivity."""
    return gdp_epsilon(1.0 / positive_finite("noise_multiplier", noise_multiplier), delta)


def calibrate_exact(epsilon: float, delta: float) -> float:
    """Noise multiplier whose exact (analytic Gaussian) epsilon at ``delta`` equals ``epsilon``,
    rounded up in the 12th significant digit so the exact epsilon never exceeds the target."""
    return float(1.0 / gdp_mu_for_epsilon(epsilon, delta) * (1 + 1e-12))


@dataclass
class GaussianTarget(AuditTarget):
    """Audit target for the plain Gaussian mechanism (see module docstring)."""

    noise_multiplier: float
    delta: float = 1e-5
    canary: str = "max-clip"
    clipping_norm: float = 1.0
    dimension: int = 8
    n_records: int = 100
    seed: int = 0
    # > 1 divides the noise; the claim is NOT changed (test target)
    broken_noise_factor: float = 1.0
    noise: bool = True
    mechanism: str = "gaussian"
    adjacency: str = "add-remove-record"
    default_chunk_size: int = 4096
    # The claim is the exact (analytic Gaussian) epsilon; the PLD accountant reproduces it for one
    # Gaussian (to ~1e-12), so the claimed-curve eps_LB is stated on the same scale. RDP would be
    # looser (1.09 for a claim of 1) and could put eps_LB above the exact claim without evidence.
    accountant: str = "pld"

    def __post_init__(self) -> None:
        positive_finite("noise_multiplier", self.noise_multiplier)
        open_unit("delta", self.delta)
        one_of("canary", self.canary, GAUSSIAN_CANARIES)
        positive_finite("clipping_norm", self.clipping_norm)
        positive_int("dimension", self.dimension)
        positive_int("n_records", self.n_records)
        positive_finite("broken_noise_factor", self.broken_noise_factor)
        rng = public_rng(self.seed, 0x6761)
        # Records: random directions, norms uniform in (0, C]; the last one is held out as the
        # natural canary. All public: the adversary knows every record but the canary.
        x = rng.normal(size=(self.n_records + 1, self.dimension))
        x *= (
            rng.uniform(0, 1, size=(self.n_records + 1, 1)) * self.clipping_norm
        ) / np.linalg.norm(x, axis=1, keepdims=True)
        self._base = x[:-1].sum(axis=0)
        self._canary_vec = (
            self.clipping_norm * np.eye(self.dimension)[0] if self.canary == "max-clip" else x[-1]
        )
        self._direction = self._canary_vec / np.linalg.norm(self._canary_vec)

    @property
    def claimed_epsilon(self) -> float:  # type: ignore[override]
        """The exact epsilon of the *correct* mechanism (the broken variant claims the same)."""
        return exact_epsilon(self.noise_multiplier, self.delta)

    @property
    def claimed_event(self):  # type: ignore[override]
        """One Gaussian release with the *correct* noise multiplier (the broken variant and the
        no-noise control claim the same): ``SubsampledGaussian(noise_multiplier, 1.0, 1)``."""
        return SubsampledGaussian(float(self.noise_multiplier), 1.0, 1)

    @classmethod
    def for_epsilon(cls, epsilon: float, delta: float = 1e-5, **kw) -> "GaussianTarget":
        return cls(noise_multiplier=calibrate_exact(epsilon, delta), delta=delta, **kw)

    def release(self, canary_in: np.ndarray, noise: NoiseSource) -> np.ndarray:
        """The released vectors, one row per trial."""
        c = np.asarray(canary_in, dtype=bool)
        out = np.broadcast_to(self._base, (c.size, self.dimension)) + c[:, None] * self._canary_vec
        if self.noise:
            std = self.noise_multiplier * self.clipping_norm / self.broken_noise_factor
            out = out + noise.gaussian_numpy((c.size, self.dimension), std)
        return out

    def scores(self, canary_in: np.ndarray, noise: NoiseSource) -> np.ndarray:
        # Projection on the canary direction: the Neyman–Pearson statistic for this pair of worlds.
        return self.release(canary_in, noise) @ self._direction

    def without_noise(self) -> "GaussianTarget":
        return dataclasses.replace(self, noise=False)

    def describe(self) -> dict:
        return {
            "task": None,
            "dataset": f"synthetic-gaussian(n={self.n_records}, d={self.dimension}, seed={self.seed})",
            "config": {
                **{name: getattr(self, name) for name in _CONFIG_FIELDS},
                "exact_epsilon": self.claimed_epsilon,
                "seed": self.seed,
            },
            "canary_info": {"kind": self.canary, "norm": float(np.linalg.norm(self._canary_vec))},
        }

"""DP-MixMin: private learning of public-data mixture weights (DP-MixMin paper, Algorithms 1 and 2).

Objective (paper eq. 2/3): F(lambda) = E_{(x,y) ~ D_mix} L(sum_i lambda_i f_i(x), y) over the
simplex Delta_k, where f_i are proxy predictions computed once on public data only.

Algorithm 1 (record level), exactly as in section 4:
  lambda_i <- 1/k; for j = 1..n: Poisson-subsample a batch (rate q = B / |D_mix|), per-example
  gradient g(x, y) = grad_lambda L(f_lambda(x), y), clip to norm C, sum, add N(0, sigma^2 C^2 I),
  divide by the FIXED expected batch size B (never the realised size, which would leak), entropic
  mirror-descent step lambda_i <- lambda_i exp(-eta g_i), renormalise onto the simplex.
Algorithm 2 (user level, appendix A.9): users are Poisson-sampled with rate q, each sampled user
  contributes k_u = min(G, |D_u|) of its records (sampled without replacement), the loss is averaged
  over them before one per-user gradient is clipped; the sum plus noise is divided by the expected
  number of sampled users.

Privacy contract: with proxies that never saw private data, the released lambda after ``steps``
steps is exactly a Poisson-subsampled Gaussian mechanism composed ``steps`` times with noise
multiplier sigma and sample rate q (:class:`~dpaudit.accounting.SubsampledGaussian`), under
``add-remove-record`` (Algorithm 1) or ``add-remove-user`` (Algorithm 2) adjacency. Everything
after the noisy sum is post-processing. All private randomness (Poisson masks, record subsampling
inside users, Gaussian noise) comes from a :class:`~dpaudit.noise.NoiseSource`.

Per-example gradients are closed form. For every supported loss the gradient with respect to
lambda is a scalar times the proxy vector f(x):
  - ``bce``  L = -y log p - (1-y) log(1-p), p = lambda . f(x):  g = (-y/p + (1-y)/(1-p)) f(x)
  - ``nll``  L = -log sum_i lambda_i p_i(x) (generative sources; labels unused):  g = -f(x) / p
  - ``mse``  L = (p - y)^2:  g = 2 (p - y) f(x)
so ||g|| = |c| ||f(x)|| and clipping scales c only, which is what makes the batched runner fast.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from ..accounting.adjacency import Adjacency
from ..accounting.events import SubsampledGaussian
from ..errors import DataError, UsageError
from ..noise import NoiseSource
from ..validation import half_open_unit, non_negative_finite, one_of, positive_finite, positive_int

LOSSES = ("bce", "nll", "mse")
PRIVACY_UNITS = ("record", "user")
#: Mixture probabilities are kept inside [PROB_FLOOR, 1 - PROB_FLOOR] in the BCE gradient so a
#: proxy that outputs exactly 0 or 1 gives a large but finite gradient (clipping bounds it anyway).
PROB_FLOOR = 1e-6


@dataclass(frozen=True)
class MixMinConfig:
    """Privacy-relevant settings of one DP-MixMin run (Algorithm 1 or 2).

    k: number of public sources. loss: ``bce`` | ``nll`` | ``mse``.
    noise_multiplier: noise std divided by the clipping norm (0 = no noise: no privacy claim).
    sample_rate: Poisson inclusion probability q of a record (or user) per step, q = B / |D_mix|.
    expected_batch_size: the fixed normaliser B = q * |D_mix| (expected records or users per step).
    steps: number of mirror-descent steps n. clipping_norm: C (per record, or per user).
    step_size: mirror-descent step size eta.
    privacy_unit: ``record`` (Algorithm 1) or ``user`` (Algorithm 2).
    records_per_user: G, the cap k_u = min(G, |D_u|) of records per sampled user (Algorithm 2).
    """

    k: int
    loss: str
    noise_multiplier: float
    sample_rate: float
    expected_batch_size: float
    steps: int
    clipping_norm: float
    step_size: float
    privacy_unit: str = "record"
    records_per_user: int = 1

    def __post_init__(self) -> None:
        positive_int("k", self.k)
        one_of("loss", self.loss, LOSSES)
        non_negative_finite("noise_multiplier", self.noise_multiplier)
        half_open_unit("sample_rate", self.sample_rate)
        positive_finite("expected_batch_size", self.expected_batch_size)
        positive_int("steps", self.steps)
        positive_finite("clipping_norm", self.clipping_norm)
        positive_finite("step_size", self.step_size)
        one_of("privacy_unit", self.privacy_unit, PRIVACY_UNITS)
        positive_int("records_per_user", self.records_per_user)

    @property
    def adjacency(self) -> Adjacency:
        return Adjacency.ADD_REMOVE_USER if self.privacy_unit == "user" else Adjacency.ADD_REMOVE_RECORD

    def event(self) -> SubsampledGaussian:
        """The guarantee as data; refused for a noise-free run (it has no finite epsilon)."""
        if self.noise_multiplier <= 0:
            raise UsageError("noise_multiplier must be > 0 for a privacy claim, got 0.0.")
        return SubsampledGaussian(float(self.noise_multiplier), float(self.sample_rate), int(self.steps))

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class MixMinResult:
    weights: np.ndarray  # (k,) on the simplex
    steps_executed: int
    batch_sizes: tuple = field(default=(), repr=False)  # realised (private!) sizes; never released


@dataclass(frozen=True)
class MixMinCanary:
    """A canary for audits of the batched runner (appendix A.8).

    kind ``record``: one extra example (``probs`` (k,), ``label``) that is Poisson-sampled with rate
    q like every record in runs that include it; its gradient is clipped like any other.
    kind ``gradient``: whenever sampled (rate q) in an including run, the fixed vector
    ``direction`` rescaled to norm exactly C is added to the clipped sum (the max-clip canary).
    """

    kind: str
    probs: np.ndarray | None = None
    label: float = 0.0
    direction: np.ndarray | None = None

    def __post_init__(self) -> None:
        one_of("canary kind", self.kind, ("record", "gradient"))
        if self.kind == "record" and self.probs is None:
            raise UsageError("canary probs must be given for a record canary, got None.")
        if self.kind == "gradient":
            if self.direction is None:
                raise UsageError("canary direction must be given for a gradient canary, got None.")
            d = np.asarray(self.direction, dtype=np.float64)
            if not (np.all(np.isfinite(d)) and np.linalg.norm(d) > 0):
                raise UsageError("canary direction must be a finite non-zero vector, got norm 0 or non-finite values.")


# ---------------------------------------------------------------------------------------------
# Input checks


def check_inputs(probs, labels, loss: str, k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Validate proxy predictions (n, k) and labels (n,); one-line DataError naming the bad array."""
    p = np.asarray(probs)
    y = np.asarray(labels)
    if p.ndim != 2 or p.shape[0] < 1 or p.shape[1] < 1:
        raise DataError(f"probs must be a 2-d array (n records, k sources), got shape {p.shape}.")
    if not np.issubdtype(p.dtype, np.number) or not np.all(np.isfinite(p)):
        raise DataError("probs must hold finite numbers, got non-finite or non-numeric values.")
    if k is not None and p.shape[1] != k:
        raise DataError(f"probs must have k = {k} columns, got {p.shape[1]}.")
    if np.any(p < 0):
        raise DataError(f"probs must be >= 0, got minimum {float(p.min())!r}.")
    if loss in ("bce", "mse") and np.any(p > 1):
        raise DataError(f"probs must be probabilities in [0, 1] for loss {loss}, got maximum {float(p.max())!r}.")
    if loss == "nll" and np.any(p.max(axis=1) <= 0):
        raise DataError("probs must have a positive density for at least one source in every row, got an all-zero row.")
    if y.ndim != 1 or y.shape[0] != p.shape[0]:
        raise DataError(f"labels must be a 1-d array with one entry per row of probs ({p.shape[0]}), got shape {y.shape}.")
    if loss != "nll":
        if not np.issubdtype(y.dtype, np.number) and y.dtype != bool:
            raise DataError(f"labels must be numeric, got dtype {y.dtype}.")
        yf = y.astype(np.float64)
        if not np.all(np.isfinite(yf)):
            raise DataError("labels must be finite, got non-finite values.")
        if loss == "bce" and (np.any(yf < 0) or np.any(yf > 1)):
            raise DataError("labels must lie in [0, 1] for loss bce, got values outside.")
    return p, y


def _prepare(probs: np.ndarray, labels: np.ndarray, loss: str, dtype) -> tuple[np.ndarray, np.ndarray]:
    F = np.asarray(probs, dtype=dtype)
    if loss == "nll":
        # The NLL gradient -f/(lambda.f) is invariant to scaling a row by a positive constant;
        # scaling by the row maximum keeps tiny densities away from underflow.
        F = F / F.max(axis=1, keepdims=True)
        y = np.zeros(F.shape[0], dtype=dtype)
    else:
        y = np.asarray(labels, dtype=dtype)
    return F, y


# ---------------------------------------------------------------------------------------------
# Closed-form per-example gradients


def loss_coefficient(p, y, loss: str):
    """dL/dp at the mixture prediction p (numpy or torch, elementwise). g = coefficient * f(x)."""
    if loss == "bce":
        pc = p.clip(PROB_FLOOR, 1 - PROB_FLOOR) if isinstance(p, np.ndarray) else p.clamp(PROB_FLOOR, 1 - PROB_FLOOR)
        return -y / pc + (1 - y) / (1 - pc)
    if loss == "nll":
        return -1.0 / p
    if loss == "mse":
        return 2.0 * (p - y)
    raise UsageError(f"loss must be one of {', '.join(LOSSES)}, got {loss!r}.")


def loss_values(p, y, loss: str):
    """Per-example loss at mixture prediction p (numpy)."""
    if loss == "bce":
        pc = np.clip(p, PROB_FLOOR, 1 - PROB_FLOOR)
        return -(y * np.log(pc) + (1 - y) * np.log(1 - pc))
    if loss == "nll":
        return -np.log(p)
    return (p - y) ** 2


def per_example_gradients(probs, labels, weights, loss: str) -> np.ndarray:
    """Per-example gradients (n, k) of L(weights . f(x), y) with respect to the weights."""
    F = np.asarray(probs, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64) if loss != "nll" else np.zeros(F.shape[0])
    p = F @ np.asarray(weights, dtype=np.float64)
    return loss_coefficient(p, y, loss)[:, None] * F


def clip_scale(coef, fnorm, clipping_norm: float):
    """Scalar per example: the clipped gradient is clip_scale * f(x) (norm min(|c| ||f||, C))."""
    if isinstance(coef, np.ndarray):
        gnorm = np.abs(coef) * fnorm
        factor = np.minimum(1.0, clipping_norm / np.maximum(gnorm, 1e-300))
        return coef * factor
    gnorm = coef.abs() * fnorm
    factor = torch.clamp(clipping_norm / gnorm.clamp_min(1e-30), max=1.0)
    return coef * factor


def objective(probs, labels, weights, loss: str) -> float:
    """Mean loss F(lambda) of the mixture on the given data (no privacy; for evaluation)."""
    F, y = _prepare(probs, labels, loss, np.float64)
    p = F @ np.asarray(weights, dtype=np.float64)
    return float(np.mean(loss_values(p, y, loss)))


def _mirror_step(log_w: np.ndarray, grad: np.ndarray, step_size: float) -> np.ndarray:
    """Entropic mirror descent lambda_i <- lambda_i exp(-eta g_i), then renormalise (in log space)."""
    z = log_w - step_size * grad
    return z - (np.max(z) + np.log(np.sum(np.exp(z - np.max(z)))))


# ---------------------------------------------------------------------------------------------
# Algorithm 1 / 2: one run


def _user_index(user_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Order records by user (users in order of first appearance). Returns order, starts, sizes."""
    uniq, first, inverse = np.unique(user_ids, return_index=True, return_inverse=True)
    rank = np.empty(len(uniq), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(uniq))
    user_of_record = rank[inverse.ravel()]
    order = np.argsort(user_of_record, kind="stable")
    sizes = np.bincount(user_of_record, minlength=len(uniq))
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return order, starts, sizes


def run_mixmin(
    probs,
    labels,
    config: MixMinConfig,
    *,
    noise: NoiseSource,
    user_ids=None,
    init=None,
) -> MixMinResult:
    """One run of Algorithm 1 (``privacy_unit="record"``) or Algorithm 2 (``"user"``), float64.

    ``probs`` (n, k): proxy predictions f_i(x) on the private mixture split (computed once).
    ``labels`` (n,): targets (ignored for ``nll``). ``user_ids`` (n,): required for user level.
    ``init``: starting weights (default uniform 1/k, as in Algorithm 1 line 1).
    """
    check_inputs(probs, labels, config.loss, config.k)
    F, y = _prepare(probs, labels, config.loss, np.float64)
    n, k = F.shape
    C, q, B, eta = config.clipping_norm, config.sample_rate, config.expected_batch_size, config.step_size
    std = config.noise_multiplier * C
    log_w = np.full(k, -math.log(k)) if init is None else np.log(_check_weights(init, k))
    sizes_seen = []

    if config.privacy_unit == "record":
        fnorm = np.linalg.norm(F, axis=1)
        for _ in range(config.steps):
            idx = np.flatnonzero(noise.poisson_mask(n, q)) if q < 1.0 else np.arange(n)
            sizes_seen.append(len(idx))
            Fb = F[idx]
            p = Fb @ np.exp(log_w)
            s = clip_scale(loss_coefficient(p, y[idx], config.loss), fnorm[idx], C)
            gsum = s @ Fb
            if std > 0:
                gsum = gsum + noise.gaussian_numpy(k, std)
            log_w = _mirror_step(log_w, gsum / B, eta)
        return MixMinResult(np.exp(log_w), config.steps, tuple(sizes_seen))

    if user_ids is None:
        raise UsageError("user_ids must be given for privacy_unit user, got None.")
    user_ids = np.asarray(user_ids)
    if user_ids.shape != (n,):
        raise DataError(f"user_ids must be a 1-d array with one entry per row of probs ({n}), got shape {user_ids.shape}.")
    order, starts, usizes = _user_index(user_ids)
    F, y = F[order], y[order]
    n_users = len(usizes)
    G = config.records_per_user
    need_subsample = bool(np.any(usizes > G))
    record_user = np.repeat(np.arange(n_users), usizes)
    pos_in_user = np.arange(n) - starts[record_user]
    for _ in range(config.steps):
        umask = noise.poisson_mask(n_users, q) if q < 1.0 else np.ones(n_users, dtype=bool)
        sizes_seen.append(int(umask.sum()))
        rec_mask = umask[record_user]
        if need_subsample:
            # k_u = min(G, |D_u|) records without replacement: rank uniform keys within each user.
            keys = noise.uniform(n)
            within = np.empty(n, dtype=np.int64)
            o = np.lexsort((keys, record_user))
            within[o] = pos_in_user  # o lists records user by user, keys ascending
            rec_mask &= within < G
        idx = np.flatnonzero(rec_mask)
        w = np.exp(log_w)
        gsum = np.zeros(k)
        if len(idx):
            Fb = F[idx]
            coef = loss_coefficient(Fb @ w, y[idx], config.loss)
            ku = np.minimum(G, usizes)[record_user[idx]]
            contrib = (coef / ku)[:, None] * Fb
            # per-user average gradients: segment sums over the (user-ordered) selected records
            ub = record_user[idx]
            seg_start = np.flatnonzero(np.r_[True, ub[1:] != ub[:-1]])
            gu = np.add.reduceat(contrib, seg_start, axis=0)
            norms = np.linalg.norm(gu, axis=1)
            gu *= np.minimum(1.0, C / np.maximum(norms, 1e-300))[:, None]
            gsum = gu.sum(axis=0)
        if std > 0:
            gsum = gsum + noise.gaussian_numpy(k, std)
        log_w = _mirror_step(log_w, gsum / B, eta)
    return MixMinResult(np.exp(log_w), config.steps, tuple(sizes_seen))


def _check_weights(w, k: int) -> np.ndarray:
    w = np.asarray(w, dtype=np.float64)
    if w.shape != (k,) or not np.all(np.isfinite(w)) or np.any(w <= 0):
        raise UsageError(f"init must be {k} positive finite weights, got {w!r}.")
    return w / w.sum()


# ---------------------------------------------------------------------------------------------
# Non-private MixMin (the reference lambda*)


def solve_mixmin(probs, labels, loss: str, *, steps: int = 3000, step_size: float = 1.0, tol: float = 1e-10) -> np.ndarray:
    """Non-private MixMin: full-batch entropic mirror descent on the mean loss, no clipping/noise.

    Returns the minimiser lambda* of the convex objective (paper eq. 2) on the given data, to the
    precision reachable in ``steps`` steps (stops early when the weights move less than ``tol``).
    """
    check_inputs(probs, labels, loss)
    F, y = _prepare(probs, labels, loss, np.float64)
    n, k = F.shape
    log_w = np.full(k, -math.log(k))
    for _ in range(int(steps)):
        w = np.exp(log_w)
        g = loss_coefficient(F @ w, y, loss) @ F / n
        new = _mirror_step(log_w, g, step_size)
        if np.max(np.abs(np.exp(new) - w)) < tol:
            log_w = new
            break
        log_w = new
    return np.exp(log_w)


def cosine_similarity(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# ---------------------------------------------------------------------------------------------
# Batched runner: many independent runs as one tensor computation (for audits)


#: Sample rates at or above this draw dense Bernoulli masks (every (run, record) pair costs one
#: random byte and one prediction); below it the sparse geometric sampler only touches the sampled
#: pairs. A speed setting: both give exactly independent Bernoulli(q) inclusions (measured: the
#: sparse path is faster at q = 0.11 with n = 9,000, k = 14; the dense one 3x faster at q = 0.33).
DENSE_SAMPLE_RATE = 0.15
#: Runs x records per block of the dense path: big enough that per-step call overhead is small,
#: small enough that the (runs, n) working arrays stay in cache (best of 2^15..2^20 measured).
DENSE_BLOCK_ELEMENTS = 1 << 19
_TWO_POW_45 = 1 << 45
#: Gaussian noise values (and canary coins) drawn per sampler call in the batched runner.
_PREDRAW_ELEMENTS = 1 << 18


def _bernoulli_mask(rng: np.random.Generator, size: int, q: float) -> np.ndarray:
    """``size`` independent inclusions, each true with probability exactly P(U < q) for U a
    53-bit uniform k 2^-53 (the distribution of ``NoiseSource.poisson_mask``), from ~1 random byte each.

    U < q iff k < t with t = ceil(q 2^53). Write k = 2^45 a + b with a the top byte (one random
    byte) and b 45 fresh bits: k < t iff a < t >> 45, or a == t >> 45 and b < t mod 2^45. The
    second case (probability 1/256) draws its 45 bits only where it occurs.
    """
    t = math.ceil(q * 2.0**53)  # exact: q * 2^53 is a float64 scaling by a power of two
    hi, lo = t >> 45, t & (_TWO_POW_45 - 1)
    top = rng.integers(0, 2**64, size=-(-size // 8), dtype=np.uint64).view(np.uint8)[:size]  # 8 uniform bytes per word
    mask = top < hi
    ties = np.flatnonzero(top == hi)
    if ties.size:
        mask[ties] = rng.integers(0, _TWO_POW_45, size=ties.size, dtype=np.int64) < lo
    return mask


#: numpy's Generator.geometric samples by inversion below this rate (its own constant).
_NUMPY_GEOMETRIC_INVERSION_BELOW = 0.333333333333333333333333


def _geometric(rng: np.random.Generator, q: float, m: int) -> np.ndarray:
    """``m`` Geometric(q) draws on {1, 2, ...}: exactly ``rng.geometric(q, size=m)``, value for value.

    Below 1/3 numpy draws each one as ceil(-E / log1p(-q)) with E its standard exponential; the
    same formula on a vector of ``rng.standard_exponential`` draws consumes the generator
    identically and gives the identical integers at half the cost (no per-draw log1p).
    """
    if not (1e-12 < q < _NUMPY_GEOMETRIC_INVERSION_BELOW):  # search method, or huge gaps: numpy's own
        return rng.geometric(q, size=m)
    e = rng.standard_exponential(m)
    np.divide(e, -math.log1p(-q), out=e)  # (-E) / log1p(-q) exactly: negating both operands is exact
    np.ceil(e, out=e)
    return e.astype(np.int64)


def _poisson_csr(runs: int, n: int, q: float, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Independent Poisson(q) samples of {0..n-1} for each of ``runs`` runs, as CSR (crow, col).

    The runs x n inclusion indicators are i.i.d. Bernoulli(q); in the flattened index space the
    gaps between consecutive included indices are i.i.d. Geometric(q), so cumulative sums of
    geometric draws (numpy's exact float64 sampler) give exactly this Poisson sample at a cost
    proportional to the number of sampled records instead of runs x n. Draws are extended until
    the end of the index space is passed.
    """
    total = runs * n
    mean = total * q
    m = int(math.ceil(mean + 8.0 * math.sqrt(max(mean, 1.0)) + 16))
    pieces = []
    last = -1
    while last < total:
        g = np.cumsum(_geometric(rng, q, m))
        g += last
        pieces.append(g)
        last = int(g[-1])
        m = max(64, m // 8)
    g = torch.from_numpy(np.concatenate(pieces) if len(pieces) > 1 else pieces[0])
    g = g[: int(torch.searchsorted(g, total))]
    crow = torch.searchsorted(g, torch.arange(runs + 1, dtype=torch.int64) * n)
    return crow, torch.remainder(g, n)


def _clipped_coefficients_torch(p: torch.Tensor, yv: torch.Tensor, cap: torch.Tensor, loss: str) -> torch.Tensor:
    """Clipped per-example scalars s with clipped gradient s * f(x): s = clamp(c, -C/||f||, C/||f||).

    Same values as ``clip_scale(loss_coefficient(p, y), ||f||, C)``, written with few in-place
    passes because these elementwise ops dominate the batched runner's time. Consumes ``p``.
    """
    if loss == "bce":
        pc = p.clamp_(PROB_FLOOR, 1 - PROB_FLOOR)
        c = (pc - yv).div_(pc * (1 - pc))  # -y/p + (1-y)/(1-p) = (p - y) / (p (1 - p))
    elif loss == "nll":
        c = p.reciprocal_().neg_()
    else:
        c = p.sub_(yv).mul_(2.0)
    return torch.maximum(torch.minimum(c, cap), cap.neg())


def _clipped_coefficients_dense(P: torch.Tensor, yv: torch.Tensor, cap: torch.Tensor, ncap: torch.Tensor, loss: str,
                                scratch: torch.Tensor) -> torch.Tensor:
    """In place on ``P`` (runs, n): the clipped scalars clamp(c, -cap, cap) of every (run, record)
    pair, as :func:`_clipped_coefficients_torch` (``yv``, ``cap``, ``ncap`` = -cap: (n,), broadcast).
    ``scratch``: a tensor shaped like ``P``. Six passes over the block, none allocating."""
    if loss == "bce":
        P.clamp_(PROB_FLOOR, 1 - PROB_FLOOR)
        torch.sub(P, 1.0, out=scratch).mul_(P)  # p (p - 1): 1 - p is exact for p >= 1/2, so no cancellation
        torch.sub(yv, P, out=P).div_(scratch)  # (y - p) / (p (p - 1)) = -y/p + (1-y)/(1-p)
    elif loss == "nll":
        P.reciprocal_().neg_()
    else:
        P.sub_(yv).mul_(2.0)
    return torch.clamp(P, min=ncap, max=cap, out=P)


def run_mixmin_batched(
    probs,
    labels,
    config: MixMinConfig,
    *,
    noise: NoiseSource,
    runs: int,
    canary: MixMinCanary | None = None,
    canary_in=None,
    dtype: torch.dtype = torch.float32,
    max_elements: int = 40_000_000,
    progress=None,
) -> np.ndarray:
    """``runs`` independent runs of Algorithm 1 at once; returns the final weights (runs, k).

    Each run has its own Poisson masks (``noise.numpy``) and Gaussian noise (the source's sampler). With
    ``canary`` and ``canary_in`` (bool (runs,)), runs where ``canary_in`` is true also contain
    the canary (see :class:`MixMinCanary`); the normaliser stays the fixed B either way.
    ``dtype`` and ``max_elements`` (chunking of runs) are speed settings and change nothing
    privacy-relevant. ``progress(done_steps_fraction)`` is called after each chunk if given.
    Record level only: user-level (Algorithm 2) runs use :func:`run_mixmin`.
    """
    if config.privacy_unit != "record":
        raise UsageError("privacy_unit must be record for the batched runner, got 'user'.")
    runs = positive_int("runs", runs)
    check_inputs(probs, labels, config.loss, config.k)
    Fn, yn = _prepare(probs, labels, config.loss, np.float64)
    n, k = Fn.shape
    if canary_in is None:
        canary_in = np.zeros(runs, dtype=bool) if canary is None else np.ones(runs, dtype=bool)
    canary_in = np.asarray(canary_in, dtype=bool)
    if canary_in.shape != (runs,):
        raise UsageError(f"canary_in must be a bool array of shape ({runs},), got shape {canary_in.shape}.")
    if canary is None and canary_in.any():
        raise UsageError("canary must be given when canary_in has true entries, got None.")

    F = torch.as_tensor(Fn, dtype=dtype)
    y = torch.as_tensor(yn, dtype=dtype)
    Ft = F.T.contiguous()
    fnorm = F.norm(dim=1)
    C = config.clipping_norm

    can_f = can_dir = None
    can_y = 0.0
    if canary is not None:
        if canary.kind == "record":
            cf = np.asarray(canary.probs, dtype=np.float64).reshape(1, -1)
            check_inputs(cf, np.array([canary.label]), config.loss, k)
            if config.loss == "nll":
                cf = cf / cf.max()
            can_f = torch.as_tensor(cf[0], dtype=dtype)
            can_y = float(canary.label) if config.loss != "nll" else 0.0
        else:
            d = np.asarray(canary.direction, dtype=np.float64)
            if d.shape != (k,):
                raise UsageError(f"canary direction must have shape ({k},), got {d.shape}.")
            can_dir = torch.as_tensor(d / np.linalg.norm(d) * C, dtype=dtype)

    with warnings.catch_warnings():
        # torch flags its CSR support as beta / invariant checks off; the tensors built here are
        # valid by construction (sorted, in-range column indices).
        warnings.filterwarnings("ignore", message=".*[Ss]parse.*")
        return _batched_loop(F, Ft, y, fnorm, config, noise, runs, canary_in, canary, can_f, can_y, can_dir, dtype, max_elements, progress)


def _batched_loop(F, Ft, y, fnorm, config, noise, runs, canary_in, canary, can_f, can_y, can_dir, dtype, max_elements, progress):
    n, k = F.shape
    C, q, B, eta = config.clipping_norm, config.sample_rate, config.expected_batch_size, config.step_size
    std = config.noise_multiplier * C
    cap = C / fnorm  # inf for an all-zero proxy row, whose gradient is zero anyway
    ncap = -cap
    # Private randomness: Poisson masks from noise.numpy (dense Bernoulli bytes, or the exact
    # geometric sampler for small q), canary inclusion from noise.torch (for a "cryptographic"
    # source these are its auxiliary generators: the batched runner serves audits, not
    # releases; run_mixmin does), Gaussian noise from the source's sampler
    # (dpaudit.noise.GAUSSIAN_SAMPLER, as every DP path).
    gen = noise.torch
    out = np.empty((runs, k), dtype=np.float64)
    dense = q >= DENSE_SAMPLE_RATE
    limit = min(max_elements, DENSE_BLOCK_ELEMENTS) if dense else max_elements
    chunk = max(1, min(runs, limit // max(n, 1)))
    for start in range(0, runs, chunk):
        R = min(chunk, runs - start)
        cin = torch.as_tensor(canary_in[start:start + R])
        log_w = torch.full((R, k), -math.log(k), dtype=dtype)
        if dense:
            P, scratch = torch.empty((R, n), dtype=dtype), torch.empty((R, n), dtype=dtype)
        # The per-step Gaussian noise and canary coins are drawn for groups of steps at once (one
        # sampler call instead of one per step: same i.i.d. draws, less call overhead).
        group = max(1, _PREDRAW_ELEMENTS // (R * k))
        for step in range(config.steps):
            j = step % group
            if j == 0:
                g_steps = min(group, config.steps - step)
                noise_buf = noise.gaussian_torch((g_steps, R, k), std, dtype=dtype) if std > 0 else None
                coin_buf = torch.rand((g_steps, R), generator=gen, dtype=torch.float64) if canary is not None and q < 1.0 else None
            w = log_w.exp()
            if dense:
                # Every (run, record) pair: predictions, clipped scalars, then the Poisson mask
                # zeroes the records a run did not sample (the same sum as over the sample only).
                torch.mm(w, Ft, out=P)
                s = _clipped_coefficients_dense(P, y, cap, ncap, config.loss, scratch)
                if q < 1.0:
                    s.mul_(torch.from_numpy(_bernoulli_mask(noise.numpy, R * n, q).view(np.uint8)).view(R, n))
                gsum = torch.mm(Ft, s.T).T  # (k, n) @ (n, R): several times faster than (R, n) @ (n, k) here
            else:
                crow, col = _poisson_csr(R, n, q, noise.numpy)
                ones = torch.sparse_csr_tensor(crow, col, torch.ones(col.numel(), dtype=dtype), (R, n))
                # mixture predictions only at the sampled (run, record) pairs (sampled dense-dense mm)
                p = torch.sparse.sampled_addmm(ones, w, Ft, beta=0.0).values()
                # index_select is several times faster than advanced indexing for large index vectors
                s = _clipped_coefficients_torch(p, torch.index_select(y, 0, col), torch.index_select(cap, 0, col), config.loss)
                gsum = torch.sparse_csr_tensor(crow, col, s, (R, n)) @ F
            if canary is not None:
                hit = cin & ((coin_buf[j] < q) if q < 1.0 else torch.ones(R, dtype=torch.bool))
                if can_f is not None:
                    pc = w @ can_f
                    sc = clip_scale(loss_coefficient(pc, torch.full_like(pc, can_y), config.loss), can_f.norm(), C)
                    gsum = gsum + torch.where(hit, sc, torch.zeros((), dtype=dtype))[:, None] * can_f[None, :]
                else:
                    gsum = gsum + hit.to(dtype)[:, None] * can_dir[None, :]
            if std > 0:
                gsum = gsum + noise_buf[j]
            log_w = torch.log_softmax(log_w - eta * (gsum / B), dim=1)
        out[start:start + R] = log_w.double().exp().numpy()
        if progress is not None:
            progress((start + R) / runs)
    return out


def max_clip_direction(weights_reference, *, top: int = 1, toward: bool = True) -> np.ndarray:
    """Unit direction for the max-clip gradient canary (appendix A.8).

    Aligned with the ``top`` most-weighted sources of ``weights_reference``: the gradient is
    negative on those sources (a mirror-descent step moves weight *toward* them) when
    ``toward`` is true, positive otherwise. The direction has zero sum because a constant shift
    of the gradient does not change lambda after renormalisation, so all of the canary's clipping
    norm goes into a component that moves the released weights. The batched runner rescales it
    to exactly the clipping norm C.
    """
    w = np.asarray(weights_reference, dtype=np.float64)
    k = w.shape[0] if w.ndim == 1 else 0
    if k < 2:
        raise UsageError(f"weights_reference must be a 1-d array of at least 2 weights, got shape {w.shape}.")
    top = positive_int("top", top)
    if top >= k:
        raise UsageError(f"top must be < k = {k}, got {top}.")
    chosen = np.argsort(-w, kind="stable")[:top]
    d = np.full(k, 1.0 / k)
    d[chosen] -= 1.0 / top
    if not toward:
        d = -d
    return d / np.linalg.norm(d)


def train_and_release_mixmin(**kwargs):
    """See :func:`dpaudit.mechanisms.mixmin_pipeline.train_and_release_mixmin` (re-exported here)."""
    from .mixmin_pipeline import train_and_release_mixmin as _impl

    return _impl(**kwargs)

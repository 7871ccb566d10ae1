"""DP-MixMin: private learning of public-data mixture weights (DP-MixMin paper, Algorithms 1 and 2).

Objective (paper eq. 2/3): F(lambda) = E_{(x,y) ~ D_mix} L(sum_i lambda_i f_i(x), y) over the simplex Delta_k, where f_i are proxy
predictions computed once on public data only.

Algorithm 1 (record level), exactly as in section 4:
  lambda_i <- 1/k; for j = 1..n: Poisson-subsample a batch (rate q = B / |D_mix|), per-example gradient g(x, y) = grad_lambda
  L(f_lambda(x), y), clip to norm C, sum, add N(0, sigma^2 C^2 I), divide by the FIXED expected batch size B (never the realised
  size, which would leak), entropic mirror-descent step lambda_i <- lambda_i exp(-eta g_i), renormalise onto the simplex.
Algorithm 2 (user level, appendix A.9): users are Poisson-sampled with rate q, each sampled user
  contributes k_u = min(G, |D_u|) of its records (sampled without replacement), the loss is averaged over them before one per-user
  gradient is clipped; the sum plus noise is divided by the expected number of sampled users.

Privacy contract: with proxies that never saw private data, the released lambda after ``steps`` steps is exactly a
Poisson-subsampled Gaussian mechanism composed ``steps`` times with noise multiplier sigma and sample rate q
(:class:`~dpaudit.accounting.SubsampledGaussian`), under ``add-remove-record`` (Algorithm 1) or ``add-remove-user`` (Algorithm 2)
adjacency. Everything after the noisy sum is post-processing. All private randomness (Poisson masks, record subsampling inside
users, Gaussian noise) comes from a :class:`~dpaudit.noise.NoiseSource`.

Per-example gradients are closed form. For every supported loss the gradient with respect to lambda is a scalar times the proxy
vector f(x):
  - ``bce``  L = -y log p - (1-y) log(1-p), p = lambda . f(x):  g = (-y/p + (1-y)/(1-p)) f(x)
  - ``nll``  L = -log sum_i lambda_i p_i(x) (generative sources; labels unused):  g = -f(x) / p
  - ``mse``  L = (p - y)^2:  g = 2 (p - y) f(x)
so ||g|| = |c| ||f(x)|| and clipping scales c only. Releases and audits run the one loop :func:`run_mixmin_runs` (a release: one
run; an audit: R runs with and without a canary)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ...accounting.adjacency import Adjacency
from ...accounting.events import SubsampledGaussian
from ...data.users import index_users
from ...errors import DataError, UsageError
from ...lazy import lazy_import
from ...noise import NoiseSource
from ..dpsgd import loop as dpsgd_loop
from ...validation import half_open_unit, non_negative_finite, one_of, positive_finite, positive_int

np = lazy_import("numpy")
torch = lazy_import("torch")

LOSSES = ("bce", "nll", "mse")
PRIVACY_UNITS = ("record", "user")
#: Mixture probabilities are kept inside [PROB_FLOOR, 1 - PROB_FLOOR] in the BCE gradient so a proxy that outputs exactly 0 or 1
#: gives a large but finite gradient (clipping bounds it anyway).
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
    records_per_user: G, the cap k_u = min(G, |D_u|) of records per sampled user (Algorithm 2)."""

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
        user = self.privacy_unit == "user"
        return Adjacency.ADD_REMOVE_USER if user else Adjacency.ADD_REMOVE_RECORD

    def event(self) -> SubsampledGaussian:
        """The guarantee as data; refused for a noise-free run (it has no finite epsilon)."""
        if self.noise_multiplier <= 0:
            raise UsageError("noise_multiplier must be > 0 for a privacy claim, got 0.0.")
        return SubsampledGaussian(
            float(self.noise_multiplier), float(self.sample_rate), int(self.steps)
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def normalizer(self) -> float:
        """The DP-SGD loop's fixed divisor of the noisy sum: the expected batch size B."""
        return self.expected_batch_size

    @property
    def noise_std(self) -> float:
        """Standard deviation of the noise added to the clipped sum (sigma * C)."""
        return self.noise_multiplier * self.clipping_norm


@dataclass(frozen=True)
class MixMinResult:
    weights: np.ndarray  # (k,) on the simplex
    steps_executed: int


@dataclass(frozen=True)
class MixMinCanary:
    """A canary for audits (appendix A.8) of :func:`run_mixmin_runs`.

    kind ``record``: one extra example (``probs`` (k,), ``label``) that is Poisson-sampled with rate q like every record in runs
    that include it; its gradient is clipped like any other.
    kind ``gradient``: whenever sampled (rate q) in an including run, the fixed vector ``direction`` rescaled to norm exactly C is
    added to the clipped sum (the max-clip canary)."""

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
                raise UsageError(
                    "canary direction must be a finite non-zero vector, got norm 0 or non-finite values."
                )


# ---- Input checks


def check_inputs(probs, labels, loss: str, k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Validate proxy predictions and labels before any private computation.

    Args:
        probs: (n, k) proxy predictions: probabilities for ``bce`` / ``mse``, densities with a positive entry per row for ``nll``.
        labels: (n,) numeric targets, in [0, 1] for ``bce`` (not checked beyond shape for ``nll``).
        loss: ``bce`` | ``nll`` | ``mse``.
        k: the number of columns required, or None.

    Returns:
        (probs, labels) as arrays.

    Raises:
        DataError: a one-line message naming the bad array.
    """
    p, y = _check_probs(np.asarray(probs), loss, k), np.asarray(labels)
    if y.ndim != 1 or y.shape[0] != p.shape[0]:
        raise DataError(
            f"labels must be a 1-d array with one entry per row of probs ({p.shape[0]}), got shape {y.shape}."
        )
    if loss == "nll":
        return p, y
    if not np.issubdtype(y.dtype, np.number) and y.dtype != bool:
        raise DataError(f"labels must be numeric, got dtype {y.dtype}.")
    yf = y.astype(np.float64)
    if not np.all(np.isfinite(yf)):
        raise DataError("labels must be finite, got non-finite values.")
    if loss == "bce" and (np.any(yf < 0) or np.any(yf > 1)):
        raise DataError("labels must lie in [0, 1] for loss bce, got values outside.")
    return p, y


def _check_probs(p: np.ndarray, loss: str, k: int | None) -> np.ndarray:
    if p.ndim != 2 or min(p.shape) < 1:
        raise DataError(f"probs must be a 2-d array (n records, k sources), got shape {p.shape}.")
    if not np.issubdtype(p.dtype, np.number) or not np.all(np.isfinite(p)):
        raise DataError("probs must hold finite numbers, got non-finite or non-numeric values.")
    if k is not None and p.shape[1] != k:
        raise DataError(f"probs must have k = {k} columns, got {p.shape[1]}.")
    return _check_prob_range(p, loss)


def _check_prob_range(p: np.ndarray, loss: str) -> np.ndarray:
    """Probabilities (bce, mse) or densities with a positive entry in every row (nll)."""
    if np.any(p < 0):
        raise DataError(f"probs must be >= 0, got minimum {float(p.min())!r}.")
    if loss in ("bce", "mse") and np.any(p > 1):
        raise DataError(
            f"probs must be probabilities in [0, 1] for loss {loss}, got maximum {float(p.max())!r}."
        )
    if loss == "nll" and np.any(p.max(axis=1) <= 0):
        raise DataError(
            "probs must have a positive density for at least one source in every row, got an all-zero row."
        )
    return p


def _prepare(
    probs: np.ndarray, labels: np.ndarray, loss: str, dtype
) -> tuple[np.ndarray, np.ndarray]:
    F = np.asarray(probs, dtype=dtype)
    if loss == "nll":
        # The NLL gradient -f/(lambda.f) is invariant to scaling a row by a positive constant; scaling by the row maximum keeps
        # tiny densities away from underflow.
        F = F / F.max(axis=1, keepdims=True)
        y = np.zeros(F.shape[0], dtype=dtype)
    else:
        y = np.asarray(labels, dtype=dtype)
    return F, y


# ---- Closed-form per-example gradients


def loss_coefficient(p, y, loss: str):
    """dL/dp at the mixture prediction p (elementwise). g = coefficient * f(x)."""
    if loss == "bce":
        pc = np.clip(p, PROB_FLOOR, 1 - PROB_FLOOR)
        return -y / pc + (1 - y) / (1 - pc)
    if loss == "nll":
        return -1.0 / p
    if loss == "mse":
        return 2.0 * (p - y)
    raise UsageError(f"loss must be one of {', '.join(LOSSES)}, got {loss!r}.")


def per_example_gradients(probs, labels, weights, loss: str) -> np.ndarray:
    """Per-example gradients (n, k) of L(weights . f(x), y) with respect to the weights."""
    F = np.asarray(probs, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64) if loss != "nll" else np.zeros(F.shape[0])
    p = F @ np.asarray(weights, dtype=np.float64)
    return loss_coefficient(p, y, loss)[:, None] * F


def clip_scale(coef, fnorm, clipping_norm: float):
    """Scalar per example: the clipped gradient is clip_scale * f(x) (norm min(|c| ||f||, C))."""
    return coef * np.minimum(1.0, clipping_norm / np.maximum(np.abs(coef) * fnorm, 1e-300))


def objective(probs, labels, weights, loss: str) -> float:
    """Mean loss F(lambda) of the mixture on the given data. Not private: for evaluation on public or test data only.

    Args:
        probs, labels: (n, k) proxy predictions and (n,) targets. weights: (k,) lambda. loss: ``bce`` | ``nll`` | ``mse``.

    Returns:
        The mean loss as a float.
    """
    F, y = _prepare(probs, labels, loss, np.float64)
    p = F @ np.asarray(weights, dtype=np.float64)
    if loss == "bce":
        pc = np.clip(p, PROB_FLOOR, 1 - PROB_FLOOR)
        return float(np.mean(-(y * np.log(pc) + (1 - y) * np.log(1 - pc))))
    return float(np.mean(-np.log(p) if loss == "nll" else (p - y) ** 2))


def _mirror_step(log_w: np.ndarray, grad: np.ndarray, step_size: float) -> np.ndarray:
    """Entropic mirror descent lambda_i <- lambda_i exp(-eta g_i), then renormalise (in log space)."""
    z = log_w - step_size * grad
    top = np.max(z, axis=-1, keepdims=True)
    return z - (top + np.log(np.sum(np.exp(z - top), axis=-1, keepdims=True)))


# ---- Algorithm 1 / 2: one run


def run_mixmin(
    probs, labels, config: MixMinConfig, *, noise: NoiseSource, user_ids=None, init=None
) -> MixMinResult:
    """One run of Algorithm 1 (``privacy_unit="record"``) or Algorithm 2 (``"user"``), float64: a release.

    Privacy contract (module docstring): ``SubsampledGaussian(sigma, q, steps)`` under add/remove-record (or add/remove-user)
    adjacency on the rows of ``probs``, provided the proxies never saw them. Public: ``config``, ``init``, the proxies.

    Args:
        probs: (n, k) proxy predictions f_i(x) on the private mixture split (computed once).
        labels: (n,) targets (ignored for ``nll``).
        config: the run's settings (public).
        noise: the private randomness (Poisson masks, within-user samples, Gaussian noise).
        user_ids: (n,) user of each row; required for user level.
        init: starting weights (public; default uniform 1/k, as in Algorithm 1 line 1).

    Returns:
        The weights lambda (k,) on the simplex and the executed steps (``config.steps``).

    Raises:
        DataError: malformed probabilities, labels or user ids.
        UsageError: bad ``init``, or user level without ``user_ids``.
    """
    return MixMinResult(
        run_mixmin_runs(probs, labels, config, noise=noise, user_ids=user_ids, init=init)[0],
        config.steps,
    )


def run_mixmin_runs(
    probs,
    labels,
    config: MixMinConfig,
    *,
    noise: NoiseSource,
    runs: int = 1,
    user_ids=None,
    init=None,
    canary: MixMinCanary | None = None,
    canary_in=None,
) -> np.ndarray:
    """``runs`` independent runs of Algorithm 1 / 2 (module docstring) through the one DP-SGD loop of releases and audits
    (:func:`~dpaudit.mechanisms.dpsgd.loop.run_dp_sgd`, with DP-MixMin's uniform-mask sampler, float normaliser B and
    mirror descent). Draws per step, all from ``noise``: the Poisson masks of all runs (one ``noise.poisson_mask``), the
    canary's coin (rate q; record level only, added in the runs where ``canary_in`` is true), the within-user record samples,
    the Gaussian noise of all runs (one draw). One run without a canary draws exactly what a release draws.

    Args:
        probs, labels, config, noise, user_ids, init: as for :func:`run_mixmin`.
        runs: the number of independent runs R.
        canary: an audit's canary (:class:`MixMinCanary`; record level only), or None for a release.
        canary_in: (R,) bool, the runs whose input holds the canary (a neighbouring input); all runs when omitted.

    Returns:
        The final weights (R, k), each row on the simplex.

    Raises:
        DataError: malformed probabilities, labels or user ids.
        UsageError: bad ``runs``, ``init`` or ``canary_in``, or a canary at user level.
    """
    check_inputs(probs, labels, config.loss, config.k)
    F, y = _prepare(probs, labels, config.loss, np.float64)
    runs, k = positive_int("runs", runs), F.shape[1]
    n_units, clipped_sum = (
        _record_sum(F, y, config)
        if config.privacy_unit == "record"
        else _user_sum(F, y, config, user_ids, noise)
    )
    coins, canary_sum = _canary_step(canary, canary_in, runs, config, noise)
    log_w = np.tile(
        np.full(k, -math.log(k)) if init is None else np.log(_check_weights(init, k)), (runs, 1)
    )
    units = _MaskedUnits(n_units, clipped_sum, canary_sum)
    dpsgd_loop.run_dp_sgd(
        units, [log_w], config, noise=noise, runs=runs, canary=coins, optimizer=MirrorDescent
    )
    return np.exp(log_w)


class _MaskedUnits:
    """DP-MixMin's units (records or users) for :func:`~dpaudit.mechanisms.dpsgd.loop.run_dp_sgd`:
    sampled as one uniform draw per (run, unit) (``uniform < q``, the draws of every DP-MixMin
    release), summed by ``clipped_sum(w, mask)`` at the weights w = exp(log-weights); a sampled
    canary's contribution at its run's weights (``canary_sum``) is added to that run's sum."""

    def __init__(self, n_units: int, clipped_sum, canary_sum):
        self.n_units, self.clipped_sum, self.canary_sum = n_units, clipped_sum, canary_sum

    def sample(self, noise: NoiseSource, runs: int, q: float) -> tuple:
        if q >= 1.0:  # everyone, no draw
            return (np.ones((runs, self.n_units), dtype=bool),)
        return (noise.poisson_mask(runs * self.n_units, q).reshape(runs, self.n_units),)

    def bind(self, params: list, sums: list):
        log_w, out = params[0], sums[0]

        def step(mask: np.ndarray, hit) -> None:
            w = np.exp(log_w)
            out[...] = self.clipped_sum(w, mask)
            if hit is not None and hit.any():
                out[hit] += self.canary_sum(w[hit])

        return step


class _CanaryCoins:
    """The canary's coins for the loop: in each run marked ``included``, Bernoulli(q) per step (no
    draw at q = 1); the units add the sampled canary (``rows``) at that run's weights."""

    rows = True

    def __init__(self, included: np.ndarray, noise: NoiseSource, q: float):
        self.included, self.noise, self.q = included, noise, q

    def draw(self) -> np.ndarray:
        return self.included & (
            self.noise.poisson_mask(self.included.size, self.q) if self.q < 1.0 else True
        )

    def add(self, hit: np.ndarray, sums: list) -> None:
        """Nothing: the units added the sampled canaries."""


class MirrorDescent:
    """DP-MixMin's update rule for the loop (:class:`~dpaudit.mechanisms.dpsgd.core.NoisyStep`):
    entropic mirror descent on the log-weights (R, k), step size ``config.step_size``."""

    def __init__(self, params: list, config: MixMinConfig):
        self.log_w, self.step_size = params[0], config.step_size

    def step(self, grads: list, t: int) -> None:
        self.log_w[...] = _mirror_step(self.log_w, grads[0], self.step_size)


def _record_sum(F: np.ndarray, y: np.ndarray, config: MixMinConfig):
    """(n, clipped_sum(w (R, k), mask (R, n)) -> (R, k)): each run's sum of the clipped per-record gradients over its sampled
    records, float64. Every (run, record) pair is computed and the unsampled ones zeroed (the same sum), in a few in-place passes:
    clipping to norm C clamps the scalar c of g = c f(x) to +-C / ||f(x)|| (inf for an all-zero row, whose gradient is zero)."""
    Ft = torch.from_numpy(np.ascontiguousarray(F.T))
    Fm, yv = torch.from_numpy(F), torch.from_numpy(y)
    cap = torch.from_numpy(config.clipping_norm / np.linalg.norm(F, axis=1))
    ncap = -cap

    def clipped_sum(w: np.ndarray, mask: np.ndarray) -> np.ndarray:
        P = torch.from_numpy(w) @ Ft  # mixture predictions of every (run, record) pair
        if config.loss == "bce":
            P.clamp_(PROB_FLOOR, 1 - PROB_FLOOR)
            # p (p - 1): 1 - p is exact for p >= 1/2, so no cancellation
            scratch = torch.sub(P, 1.0).mul_(P)
            torch.sub(yv, P, out=P).div_(scratch)  # (y - p) / (p (p - 1)) = -y/p + (1-y)/(1-p)
        elif config.loss == "nll":
            P.reciprocal_().neg_()
        else:
            P.sub_(yv).mul_(2.0)
        s = torch.clamp(P, min=ncap, max=cap, out=P).mul_(torch.from_numpy(mask))
        return (s @ Fm).numpy()

    return F.shape[0], clipped_sum


def _user_sum(F: np.ndarray, y: np.ndarray, config: MixMinConfig, user_ids, noise: NoiseSource):
    """(users, clipped_sum(w (R, k), user_mask (R, users)) -> (R, k)) of Algorithm 2: each sampled user's k_u = min(G, |D_u|)
    records (without replacement, from ``noise``), its averaged gradient clipped to C, summed."""
    n = F.shape[0]
    if user_ids is None:
        raise UsageError("user_ids must be given for privacy_unit user, got None.")
    user_ids = np.asarray(user_ids)
    if user_ids.shape != (n,):
        raise DataError(
            f"user_ids must be a 1-d array with one entry per row of probs ({n}), got shape {user_ids.shape}."
        )
    index = index_users(user_ids)  # users in order of first appearance
    order, starts, usizes = index.order, index.offsets[:-1], index.counts
    F, y, G, C = F[order], y[order], config.records_per_user, config.clipping_norm
    record_user = np.repeat(np.arange(len(usizes)), usizes)
    pos_in_user = np.arange(n) - starts[record_user]
    need_subsample = bool(np.any(usizes > G))

    def clipped_sum(w: np.ndarray, umask: np.ndarray) -> np.ndarray:
        return np.stack([user_sum(w[r], umask[r]) for r in range(len(w))])

    def user_sum(w: np.ndarray, umask: np.ndarray) -> np.ndarray:
        rec_mask = umask[record_user]
        if need_subsample:
            # k_u = min(G, |D_u|) records without replacement: rank uniform keys within each user
            # (the sort lists records user by user, keys ascending).
            within = np.empty(n, dtype=np.int64)
            within[np.lexsort((noise.uniform(n), record_user))] = pos_in_user
            rec_mask &= within < G
        idx = np.flatnonzero(rec_mask)
        if not len(idx):
            return np.zeros(F.shape[1])
        Fb, ub = F[idx], record_user[idx]
        # each record's gradient over its user's k_u records
        scale = loss_coefficient(Fb @ w, y[idx], config.loss) / np.minimum(G, usizes)[ub]
        contrib = scale[:, None] * Fb
        # per-user average gradients: segment sums over the (user-ordered) selected records
        gu = np.add.reduceat(contrib, np.flatnonzero(np.r_[True, ub[1:] != ub[:-1]]), axis=0)
        gu *= np.minimum(1.0, C / np.maximum(np.linalg.norm(gu, axis=1), 1e-300))[:, None]
        return gu.sum(axis=0)

    return len(usizes), clipped_sum


def _canary_step(canary: MixMinCanary | None, canary_in, runs: int, config: MixMinConfig, noise):
    """(coins, canary_sum): the canary's coins for the loop (:class:`_CanaryCoins`; None without a
    canary) and its contribution canary_sum(w (m, k)) -> (m, k) (:class:`MixMinCanary`) at each
    including run's weights."""
    included = (
        np.full(runs, canary is not None) if canary_in is None else np.asarray(canary_in, bool)
    )
    if included.shape != (runs,):
        raise UsageError(
            f"canary_in must be a bool array of shape ({runs},), got shape {included.shape}."
        )
    if canary is None:
        if included.any():
            raise UsageError("canary must be given when canary_in has true entries, got None.")
        return None, None
    if config.privacy_unit != "record":
        raise UsageError("privacy_unit must be record for a canary, got 'user'.")
    C, k, coins = config.clipping_norm, config.k, _CanaryCoins(included, noise, config.sample_rate)
    if canary.kind == "gradient":
        d = np.asarray(canary.direction, dtype=np.float64)
        if d.shape != (k,):
            raise UsageError(f"canary direction must have shape ({k},), got {d.shape}.")
        g = d / np.linalg.norm(d) * C
        return coins, lambda w: np.broadcast_to(g, w.shape)
    probs = np.asarray(canary.probs, dtype=np.float64).reshape(1, -1)
    checked = check_inputs(probs, np.array([canary.label]), config.loss, k)
    cf, cy = _prepare(*checked, config.loss, np.float64)
    cf, cnorm = cf[0], np.linalg.norm(cf[0])

    def record_sum(w: np.ndarray) -> np.ndarray:
        """The record canary's clipped gradient at each including run's weights."""
        coef = loss_coefficient(w @ cf, cy[0], config.loss)
        return clip_scale(coef, cnorm, C)[:, None] * cf[None, :]

    return coins, record_sum


def _check_weights(w, k: int) -> np.ndarray:
    w = np.asarray(w, dtype=np.float64)
    if w.shape != (k,) or not np.all(np.isfinite(w)) or np.any(w <= 0):
        raise UsageError(f"init must be {k} positive finite weights, got {w!r}.")
    return w / w.sum()


# ---- Non-private MixMin (the reference lambda*)


def solve_mixmin(
    probs, labels, loss: str, *, steps: int = 3000, step_size: float = 1.0, tol: float = 1e-10
) -> np.ndarray:
    """Non-private MixMin: full-batch entropic mirror descent on the mean loss, no clipping/noise. NOT private: for public
    data, or for a reference lambda* an audit or benchmark compares against; its output must never be released.

    Args:
        probs, labels: (n, k) proxy predictions and (n,) targets, as for :func:`run_mixmin`.
        loss: ``bce`` | ``nll`` | ``mse``.
        steps: at most this many mirror-descent steps; step_size: eta.
        tol: stop once no weight moves more than this in a step.

    Returns:
        The minimiser lambda* (k,) of the convex objective (paper eq. 2) on the given data, to the reachable precision.

    Raises:
        DataError: malformed probabilities or labels.
    """
    check_inputs(probs, labels, loss)
    F, y = _prepare(probs, labels, loss, np.float64)
    n, k = F.shape
    log_w = np.full(k, -math.log(k))
    for _ in range(int(steps)):
        w = np.exp(log_w)
        log_w = _mirror_step(log_w, loss_coefficient(F @ w, y, loss) @ F / n, step_size)
        if np.max(np.abs(np.exp(log_w) - w)) < tol:
            break
    return np.exp(log_w)


def max_clip_direction(weights_reference, *, top: int = 1, toward: bool = True) -> np.ndarray:
    """Unit direction for the max-clip gradient canary (appendix A.8). Aligned with the ``top`` most-weighted sources of
    ``weights_reference``: the gradient is negative on those sources (a mirror-descent step moves weight *toward* them) when
    ``toward`` is true, positive otherwise. The direction has zero sum because a constant shift of the gradient does not change
    lambda after renormalisation, so all of the canary's clipping norm goes into a component that moves the released weights.

    Args:
        weights_reference: (k,) weights, k >= 2, from public data (e.g. :func:`solve_mixmin` on public data).
        top: how many of the most-weighted sources the canary pushes; < k.
        toward: push weight toward them (True) or away (False).

    Returns:
        A (k,) unit vector with zero sum.

    Raises:
        UsageError: fewer than 2 weights, or ``top`` not in [1, k).
    """
    w = np.asarray(weights_reference, dtype=np.float64)
    k = w.shape[0] if w.ndim == 1 else 0
    if k < 2:
        raise UsageError(
            f"weights_reference must be a 1-d array of at least 2 weights, got shape {w.shape}."
        )
    top = positive_int("top", top)
    if top >= k:
        raise UsageError(f"top must be < k = {k}, got {top}.")
    chosen = np.argsort(-w, kind="stable")[:top]
    d = np.full(k, 1.0 / k)
    d[chosen] -= 1.0 / top
    if not toward:
        d = -d
    return d / np.linalg.norm(d)

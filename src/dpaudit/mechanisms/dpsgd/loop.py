"""The one DP-SGD loop, :func:`run_dp_sgd`: linear heads and trainable modules, R runs at once,
releases and audits alike.

R = 1 is a release (:meth:`~dpaudit.mechanisms.dpsgd.mechanism.DPSGDMechanism.run`: heads through
:func:`train_heads`, modules through :func:`~dpaudit.mechanisms.dpsgd.module_training.train_module_dp_sgd`);
R = trials is a head audit (:class:`~dpaudit.mechanisms.dpsgd.head_audit.HeadTarget`,
:class:`~dpaudit.mechanisms.dpsgd.user_head_audit.UserHeadTarget`); one-run audits are R = 1 with
canaries (:mod:`~dpaudit.mechanisms.dpsgd.one_run_heads`, :mod:`~dpaudit.mechanisms.dpsgd.one_run_modules`).
Because releases and audits run this same loop and the same clipped sums, a bug in the released
mechanism is a bug in what is audited (pinned by ``tests/audits/test_release_engine_is_audited.py``
with planted faults).

Protocol per run (DP-RVFL paper, section 3.2 / Algorithm 1, reproduced to the letter; user
level: DP-MixMin paper, appendix A.9, Algorithm 2), at each of ``config.steps`` steps:

1. every unit is included independently with probability q (eq. 2; Poisson sampling from the
   private :class:`~dpaudit.noise.NoiseSource`, because amplification by subsampling assumes the
   adversary does not know who was sampled; the R runs' masks are independent): the units'
   sampler, gap sampling for DP-SGD (:func:`~dpaudit.mechanisms.dpsgd.core.poisson_batch`), one
   uniform draw per unit for DP-MixMin (the same distribution, its releases' draws);
2. the sampled units' gradients are clipped to joint L2 norm C (eq. 4) and summed by the *units*
   strategy, which fixes the privacy unit and the model kind: :class:`RecordUnits` (a unit is a
   record of a head, closed-form gradients), :class:`UserUnits` (a unit is a user of a head,
   whose min(G, |D_u|) records drawn without replacement are averaged and clipped as one
   contribution), :class:`SumUnits` (a clipped-sum function: module records or users,
   :mod:`dpaudit.mechanisms.dpsgd.module_training`); an empty sample gives a zero sum;
3. N(0, (sigma C)^2 I) is added to each run's sum (eq. 5), the result is divided by the fixed,
   public normaliser m0 -- never the realised batch size, which is private -- and the optimizer
   (Adam, eq. 6, SGD with momentum, or DP-MixMin's mirror descent on the simplex) updates each
   run's parameters from this sanitised gradient only
   (:class:`~dpaudit.mechanisms.dpsgd.core.NoisyStep`).

Private draws from ``noise``, in this order per step: the R Poisson samples; the canary draw
(head canaries only); within-user record samples (user units, run by run); the Gaussian noise
(one draw per parameter buffer: (R, K, d+1) for heads). Module canaries draw from a generator of
their own, never from ``noise``. Without canaries these are exactly the draws of a release, so a
``--reproducible-noise`` release is unchanged by any audit instrument.

**Privacy contract.** Each run is ``SubsampledGaussian(noise_multiplier, q, steps)`` under
add/remove-one-unit adjacency: the clipped sum has L2 sensitivity C conditional on all earlier
outputs. This holds for any units strategy whose sum is over per-unit contributions of norm
<= C, so the unit (record, user) is swapped without touching the loop. An empty batch still
produces a noise-only update and counts as one step; the executed steps are returned so callers
check them against the accounted ``steps``. Frozen parts of a model (random features,
projections, initialisation) must come from public randomness only.

**Canaries** (audits only; None for every release) enter through one interface: an object with
``draw()``, the canaries sampled at this step (private), ``add(hit, sums)``, which adds fixed
canary gradients to the clipped sums before the noise, and ``rows``, True when the sampled
canaries are instead units of the units strategy (their rows join the sample and are clipped by
the same code as every unit). Head canaries: :class:`CanaryHook` (the audits' description) made
into :class:`_HeadCanaries`; in runs marked ``included`` each canary is Poisson-sampled with rate
q at every step (one Bernoulli(q) draw per run and canary, row-major, from ``noise``). Module
canaries: :class:`~dpaudit.mechanisms.dpsgd.one_run_modules.DiracCanaries`. A canary adds one more unit
(or a contribution of norm <= C) to the runs it marks, as a neighbouring input would.

**Recording the trajectory** (``record``, heads, an audit instrument for the trajectory threat
model): the privatised sum -- clipped sum plus Gaussian noise, before division by m0 and the
optimizer -- at given parameter coordinates, for every run and step; exactly the values the
sanitised step then used. Recording reads the private outputs only, it draws nothing and changes
no update.

**Planted faults** (weakened clipping, noise or sampling) are test fixtures only
(``tests/conftest.py``): the library has no switch that weakens it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...data.users import UserIndex
from ...errors import UsageError
from ...lazy import lazy_import
from ...noise import NoiseSource
from ...validation import positive_int
from . import core as dpsgd_core, user_level
from .core import (
    DPSGDConfig,
    HeadWorkspace,
    NoisyStep,
    Progress,
    _clipped_sum_kernel,
    check_head_inputs,
    head_threads,
)

np = lazy_import("numpy")

# ---------------------------------------------------------------- the canary hook


@dataclass(frozen=True, eq=False)
class CanaryHook:
    """Where an audit's head canary (or canaries) enters the clipped sums (module docstring).

    One canary: ``included`` (R,), the runs whose input holds it. Exactly one of:
    ``z`` (G, d) with labels ``y`` (G,): canary rows, one more unit (G = 1 for record units);
    ``gradient`` (K, d+1): a fixed contribution, added whenever the canary is sampled (the audit
    sizes it, normally to norm C; the engine does not rescale it).

    M canaries (one-run audits): ``included`` (R, M), canary j in run r iff ``included[r, j]``
    (a private draw made by the caller), and either ``gradient`` (M, K, d+1) (or a SciPy sparse
    (M, K(d+1)) matrix of the flattened rows) or ``z`` (M, d) with ``y`` (M,) (record units only).
    """

    included: np.ndarray
    z: np.ndarray | None = None
    y: np.ndarray | None = None
    gradient: np.ndarray | None = None

    def __post_init__(self) -> None:
        if (self.z is None) == (self.gradient is None) or (self.z is None) != (self.y is None):
            raise UsageError(
                "a canary hook must have either rows (z and y) or a gradient, got neither or both."
            )
        if np.ndim(self.included) not in (1, 2):
            raise UsageError(
                f"canary included must have shape (runs,) or (runs, canaries), got {np.shape(self.included)}."
            )

    @property
    def many(self) -> bool:
        """True for M canaries (``included`` (R, M)), False for one (``included`` (R,))."""
        return np.ndim(self.included) == 2


class _HeadCanaries:
    """A :class:`CanaryHook` for one group of runs of the loop (module docstring, canaries):
    ``included`` (R,) or (R, M); ``gradient`` None (canary rows, units of the units strategy),
    one (K, d+1) array or :class:`_SparseCanaries`. ``counts``: steps at which each was sampled."""

    def __init__(self, included: np.ndarray, gradient, noise: NoiseSource, q: float):
        self.included, self.gradient, self.noise, self.q = included, gradient, noise, q
        self.rows = gradient is None
        self.counts = np.zeros(included.shape, dtype=np.int64)

    def draw(self) -> np.ndarray:
        # one Bernoulli(q) per run and canary, row-major (M = 1: the single-canary draw)
        drawn = self.noise.poisson_mask(self.included.size, self.q)
        hit = np.asarray(drawn, dtype=bool).reshape(self.included.shape) & self.included
        self.counts += hit
        return hit

    def add(self, hit: np.ndarray, sums: list) -> None:
        if isinstance(self.gradient, _SparseCanaries):
            self.gradient.add_to(sums[0], hit)
        elif self.gradient is not None:
            s = sums[0]
            s += hit.astype(s.dtype)[:, None, None] * self.gradient


# ---------------------------------------------------------------- units


@dataclass(frozen=True)
class UserSampling:
    """User-level units for :func:`train_heads`: ``index`` (a UserIndex over the training rows),
    ``records_per_user`` G."""

    index: object
    records_per_user: int


class PoissonUnits:
    """Units sampled by the loop's default sampler: each unit in each run independently with
    probability q, by gap sampling (:func:`~dpaudit.mechanisms.dpsgd.core.poisson_batch`); the
    sample is (flat indices, offsets)."""

    def sample(self, noise: NoiseSource, runs: int, q: float) -> tuple:
        # module lookup: tests may spy on it
        return dpsgd_core.poisson_batch(noise, runs, self.n_units, q)


class _HeadUnits(PoissonUnits):
    """Head units over the rows of a :class:`HeadLayout` ``lay`` (canary rows last), clipped as
    ``config`` says: ``bind`` makes the per-run views of the heads (R, K, d+1) and their sums once."""

    def __init__(self, lay: HeadLayout, config: DPSGDConfig):
        self.z1, self.z1_norm, self.y = lay.z1, lay.z1_norm, lay.labels
        self.clipping_norm, self.clip = config.clipping_norm, not config.non_private
        self.binary, self.canary_rows = lay.k == 1, lay.z1.shape[0] - lay.n

    def bind(self, params: list, sums: list):
        w_rows, sum_rows = list(params[0]), list(sums[0])  # (K, d+1) views, one per run
        return lambda flat, offsets, hit: self.step(flat, offsets, hit, w_rows, sum_rows)


class RecordUnits(_HeadUnits):
    """Records as units (module docstring): unit i is row i of ``z1``; rows n.. hold canary
    records, never drawn by the ordinary sample (with ``many``, canary j at row n + j)."""

    def __init__(self, lay: HeadLayout, config: DPSGDConfig, *, many: bool = False):
        super().__init__(lay, config)
        if self.canary_rows > 1 and not many:
            raise UsageError(f"a record canary must be one record, got {self.canary_rows} rows.")
        self.n_units, self.canary_unit = lay.n, lay.n if self.canary_rows else None
        n, q = lay.n, config.sample_rate
        rows = int(n * q + 8.0 * math.sqrt(n * q) + 16) + 1
        self.ws = HeadWorkspace(lay.k, lay.z1.shape[1], lay.z1.dtype, rows=rows)

    def step(self, flat: np.ndarray, offsets: np.ndarray, hit, w_rows, sum_rows) -> None:
        zn_f, y_f = self.z1_norm[flat], self.y[flat]  # one fancy index for all runs
        for r in range(len(w_rows)):
            lo, hi = offsets[r], offsets[r + 1]
            ix, zn, yb = flat[lo:hi], zn_f[lo:hi], y_f[lo:hi]
            if hit is not None and hit.ndim == 2:
                extra = np.flatnonzero(hit[r])
                if extra.size:  # the sampled canary records: more units, last, in canary order
                    ix, zn, yb = np.concatenate([ix, self.canary_unit + extra]), None, None
            elif hit is not None and hit[r]:  # the canary record: one more unit, last
                ix, zn, yb = np.append(ix, self.canary_unit), None, None
            self.clipped_sum(ix, w_rows[r], sum_rows[r], zn, yb)

    def clipped_sum(self, ix, w, out, zn=None, yb=None) -> None:
        """One run's clipped sum over rows ``ix`` at head ``w`` into ``out`` (zero for an empty
        batch), on the reused workspace. ``zn``, ``yb``: the rows' norms and labels when already
        gathered."""
        b = ix.size
        if b == 0:
            out.fill(0.0)  # Algorithm 1, step 6: an empty batch has a zero clipped sum
            return
        self.ws.ensure(b)
        # mode="clip" avoids numpy's defensive copy of ``out``; every index is in range anyway.
        np.take(self.z1, ix, axis=0, out=self.ws.batch[:b], mode="clip")
        zn = self.z1_norm[ix] if zn is None else zn
        yb = self.y[ix] if yb is None else yb
        _clipped_sum_kernel(
            self.ws, w, b, zn, yb, self.clipping_norm, self.binary, self.clip, out=out
        )


class UserUnits(_HeadUnits):
    """Users as units (module docstring; kernels of :mod:`~dpaudit.mechanisms.dpsgd.user_level`):
    canary rows form user ``n_users``, one more user of the index."""

    def __init__(self, lay: HeadLayout, config: DPSGDConfig, users: UserSampling, noise):
        super().__init__(lay, config)
        index = user_level._check_users(users.index, lay.n)
        self.n_units, self.canary_unit = index.n_users, None
        if self.canary_rows:
            index = _with_extra_user(index, lay.n, self.canary_rows)
            self.canary_unit = self.n_units
        self.index, self.noise = index, noise
        self.records_per_user = positive_int("records_per_user", users.records_per_user)

    def step(self, flat, offsets, hit, w_rows, sum_rows) -> None:
        for r in range(len(w_rows)):
            sampled = flat[offsets[r] : offsets[r + 1]]
            if hit is not None and hit[r]:  # the canary user, last (users stay ascending)
                sampled = np.append(sampled, self.canary_unit)
            if sampled.size == 0:
                sum_rows[r].fill(0.0)  # Algorithm 1, step 6
                continue
            rows, seg, kk = user_level.sample_user_records(
                self.index, sampled, self.records_per_user, self.noise
            )
            sum_rows[r][...] = user_level.user_head_clipped_sum(
                w_rows[r],
                self.z1,
                self.z1_norm,
                self.y,
                rows,
                seg,
                kk,
                self.clipping_norm,
                binary_logit=self.binary,
                clip=self.clip,
            )


def _with_extra_user(index, first_row: int, size: int):
    """``index`` with one more user (number ``index.n_users``) owning rows first_row..first_row+size-1."""
    return UserIndex(
        ids=np.arange(index.n_users + 1, dtype=np.int64),
        order=np.concatenate([index.order, np.arange(first_row, first_row + size, dtype=np.int64)]),
        offsets=np.concatenate([index.offsets, [index.offsets[-1] + size]]).astype(np.int64),
    )


class SumUnits(PoissonUnits):
    """Units whose clipped sum is a function, one run (module docstring): ``clipped_sum(params,
    idx)``, one tensor per parameter, is never called for an empty sample (the sum is then zero)."""

    def __init__(self, clipped_sum, n_units: int):
        self.clipped_sum, self.n_units = clipped_sum, positive_int("n_units", n_units)

    def bind(self, params: list, sums: list):
        def step(idx, offsets, hit) -> None:
            if idx.size:
                for buf, part in zip(sums, self.clipped_sum(params, idx)):
                    buf.copy_(part)
            else:
                for buf in sums:
                    buf.zero_()

        return step


# ---------------------------------------------------------------- inputs


@dataclass(frozen=True)
class BatchedHeadResult:
    """``weights`` (R, K, d+1), last column the bias; ``canary_samples[r]`` counts the steps at which
    the canary was sampled in run r (0 for runs without it; None without a canary; (R, M) for M
    canaries); ``recorded`` (R, T, P) (float32 by default): the privatised sums at the ``record``
    coordinates (None unless asked for)."""

    weights: np.ndarray
    steps_executed: int
    canary_samples: np.ndarray | None = None
    recorded: np.ndarray | None = None


def augmented_features(parts: list, d: int, np_dtype) -> tuple[np.ndarray, np.ndarray]:
    """(z1, ||z1 rows||): the feature blocks stacked with a bias column of ones, written in place
    (no second copy of the feature matrix)."""
    z1 = np.empty((sum(len(p) for p in parts), d + 1), dtype=np_dtype)
    start = 0
    for part in parts:
        z1[start : start + len(part), :d] = part
        start += len(part)
    z1[:, d] = 1.0
    return z1, np.sqrt(np.einsum("ij,ij->i", z1, z1))


def initial_heads(init, runs: int, k: int, d: int) -> np.ndarray:
    """Every run's starting head (R, K, d+1): zeros, one (K, d+1) head shared (a broadcast view), or one per run."""
    if init is None:
        return np.zeros((runs, k, d + 1))
    init = np.asarray(init)
    if init.shape == (k, d + 1):
        init = np.broadcast_to(init, (runs, k, d + 1))
    if init.shape != (runs, k, d + 1):
        raise UsageError(
            f"init must have shape {(k, d + 1)} or {(runs, k, d + 1)}, got {init.shape}."
        )
    return init


@dataclass(frozen=True, eq=False)
class HeadLayout:
    """The rows a head loop trains on, laid out once (:func:`head_layout`): ``z1`` = [z, 1] with
    the canary rows (if any) last, ``z1_norm`` its row norms, ``labels``; ``n`` training rows, ``d``
    features, ``k`` logits. Public set-up: an audit builds it once and every trial reads it."""

    z1: np.ndarray
    z1_norm: np.ndarray
    labels: np.ndarray
    n: int
    d: int
    k: int


def head_layout(
    z,
    y,
    n_classes: int,
    *,
    canary: CanaryHook | None = None,
    binary_logit: bool = False,
    dtype=None,
    z_has_bias_column: bool = False,
) -> HeadLayout:
    """The :class:`HeadLayout` of features ``z`` (n, d) and labels ``y`` (n,), with ``canary``'s
    rows (a record canary) after them: the arrays :func:`train_heads` otherwise builds per call."""
    z, y, k = check_head_inputs(z, y, n_classes, binary_logit)
    np_dtype = _numpy_dtype(dtype)
    z1, z1_norm, labels, d = _features(z, y, canary, n_classes, np_dtype, z_has_bias_column)
    return HeadLayout(z1, z1_norm, labels, int(z.shape[0]), d, k)


def _features(z, y, canary: CanaryHook | None, n_classes: int, np_dtype, z_has_bias_column: bool):
    """(z1, ||z1 rows||, labels, d): the training rows with a bias column, canary rows (if any) last."""
    if z_has_bias_column and (z.shape[1] < 1 or not np.all(z[:, -1] == 1)):
        raise UsageError(
            "z must end with a column of ones when z_has_bias_column is set, got another last column."
        )
    features = z[:, :-1] if z_has_bias_column else z
    d, labels = features.shape[1], y.astype(np.int64)
    if canary is not None and canary.z is not None:
        canary_z, canary_y = _canary_rows(canary, d, n_classes)
        z1, z1_norm = augmented_features([features, canary_z], d, np_dtype)
        return z1, z1_norm, np.concatenate([labels, canary_y]), d
    # used as is, no copy (e.g. FrozenFeatures.transform(..., bias_column=True))
    if z_has_bias_column:
        z1 = np.ascontiguousarray(z, dtype=np_dtype)
        return z1, np.sqrt(np.einsum("ij,ij->i", z1, z1)), labels, d
    return (*augmented_features([features], d, np_dtype), labels, d)


def _canary_rows(canary: CanaryHook, d: int, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """A record canary's rows (G, d) and labels (G,), checked against the training rows' shape."""
    rows = np.asarray(canary.z, dtype=np.float64)
    rows = rows[None] if rows.ndim == 1 and not canary.many else rows  # one record given as (d,)
    labels = np.asarray(canary.y, dtype=np.int64).reshape(-1)
    bad_shape = rows.ndim != 2 or rows.shape[1] != d or labels.shape != (rows.shape[0],)
    if bad_shape or labels.min() < 0 or labels.max() >= n_classes:
        raise UsageError(
            f"canary rows must have {d} features and labels in [0, {n_classes}), got shape {np.shape(canary.z)} and {labels.tolist()}."
        )
    return rows, labels


# ---------------------------------------------------------------- the engine


def train_heads(
    z: np.ndarray,
    y: np.ndarray,
    n_classes: int,
    config: DPSGDConfig,
    *,
    noise: NoiseSource,
    runs: int = 1,
    init: np.ndarray | None = None,
    users: UserSampling | None = None,
    canary: CanaryHook | None = None,
    binary_logit: bool = False,
    dtype=None,  # float32 (a NumPy or torch dtype)
    z_has_bias_column: bool = False,
    progress: Progress | None = None,
    chunk_runs: int | None = None,
    record=None,
    layout: HeadLayout | None = None,
) -> BatchedHeadResult:
    """Train ``runs`` independent DP-SGD linear heads on frozen features ``z`` (n, d) at once.

    Units: records (default) or users (``users``). ``init``: (K, d+1) shared by all runs or
    (R, K, d+1), from public randomness; zeros when omitted. ``canary``: an audit's
    :class:`CanaryHook` (one canary or M). ``chunk_runs`` (speed/memory only): runs are trained in
    groups of this many, one group after another; ``progress(steps_done, steps)`` is reported
    per group. ``record``: parameter coordinates (P, 2) as (row k, column j), j = d the bias,
    whose privatised sums the result's ``recorded`` (R, T, P) holds. ``layout``: the rows already
    laid out by :func:`head_layout` with this ``canary`` (then ``z``, ``y``, ``dtype`` and
    ``z_has_bias_column`` are not read). Privacy contract: module docstring.
    """
    runs = positive_int("runs", runs)
    step = positive_int("chunk_runs", chunk_runs) if chunk_runs is not None else runs
    lay = layout or head_layout(
        z,
        y,
        n_classes,
        canary=canary,
        binary_logit=binary_logit,
        dtype=dtype,
        z_has_bias_column=z_has_bias_column,
    )
    included = _included(canary, runs)
    grad_canary = _gradient_canary(canary, included, lay.k, lay.d, lay.z1.dtype)
    canary_rows = lay.z1.shape[0] - lay.n
    many = _check_canary_rows(canary, included, canary_rows, users is not None, runs)
    if users is None:
        units = RecordUnits(lay, config, many=many)
    else:
        units = UserUnits(lay, config, users, noise)
    coords = None if record is None else _record_coordinates(record, lay.k, lay.d)
    w0 = initial_heads(init, runs, lay.k, lay.d)
    groups = []
    with head_threads():
        for start in range(0, runs, step):
            stop = min(runs, start + step)
            hook = (
                None
                if included is None
                else _HeadCanaries(included[start:stop], grad_canary, noise, config.sample_rate)
            )
            groups.append(
                _train_group(units, w0[start:stop], config, noise, hook, coords, progress)
            )
    weights, executed, counts, recorded = zip(*groups)
    return BatchedHeadResult(
        weights=np.concatenate(weights),
        steps_executed=min(executed),
        canary_samples=None if canary is None else np.concatenate(counts),
        recorded=None if coords is None else np.concatenate(recorded),
    )


def _check_canary_rows(canary, included, canary_rows: int, user_units: bool, runs: int) -> bool:
    """Check that the layout's ``canary_rows`` are the canary's rows, one record per canary, and
    that user units get one record canary at most; True for M canaries."""
    has_rows = canary is not None and canary.z is not None
    if canary_rows != (np.asarray(canary.y).size if has_rows else 0):
        raise UsageError(f"layout must hold the canary's rows ({canary_rows}), got another canary.")
    many = canary is not None and canary.many
    many_rows = many and has_rows
    if many_rows and canary_rows != included.shape[1]:
        raise UsageError(
            f"canary rows must be one record per canary ({included.shape[1]}), got {canary_rows}."
        )
    # Many gradient canaries with user units: each canary is one more user, whose jointly
    # clipped contribution is its gradient.
    if user_units and many_rows:
        raise UsageError(
            f"a user-level canary with records must be one user (included of shape ({runs},)), got {included.shape}."
        )
    return many


def _train_group(units, w0, config: DPSGDConfig, noise, hook, coords, progress):
    """One group of runs of :func:`train_heads` from heads ``w0``: (weights as float64, executed
    steps, the canary's sample counts or None, the recorded sums or None)."""
    w = np.array(w0, dtype=units.z1.dtype, order="C")  # C order: ``init`` may be a broadcast view
    recorder = None if coords is None else _Recorder(coords, config.steps)
    # the optimizer updates w in place, the clipped sums read it
    executed = run_dp_sgd(
        units,
        [w],
        config,
        noise=noise,
        runs=len(w),
        canary=hook,
        recorder=recorder,
        progress=progress,
    )
    counts = None if hook is None else hook.counts
    return w.astype(np.float64), executed, counts, None if recorder is None else recorder.values


def _numpy_dtype(dtype) -> np.dtype:
    """float32 (None), or the NumPy dtype of a NumPy or torch float dtype (``torch.float64`` -> float64)."""
    if dtype is None:
        return np.dtype(np.float32)
    # a torch dtype prints as torch.float64 (read without importing torch here)
    name = str(dtype).removeprefix("torch.")
    return np.dtype(name if name in ("float32", "float64") else dtype)


def _included(canary: CanaryHook | None, runs: int) -> np.ndarray | None:
    """The canary's inclusion marks, (R,) or (R, M), checked against ``runs``."""
    if canary is None:
        return None
    included = np.asarray(canary.included, dtype=bool)
    if included.shape[0] != runs or (canary.many and included.shape[1] < 1):
        want = f"({runs},)" if not canary.many else f"({runs}, canaries >= 1)"
        raise UsageError(
            f"canary_in must be a boolean array of shape {want}, got {included.shape}."
        )
    return included


def _gradient_canary(canary: CanaryHook | None, included, k: int, d: int, np_dtype):
    """A gradient canary's contribution: one (K, d+1) array, or M of them kept sparse; None without one."""
    if canary is None or canary.gradient is None:
        return None
    if canary.many:
        return _SparseCanaries(canary.gradient, (included.shape[1], k, d + 1), np_dtype)
    grad = np.asarray(canary.gradient, dtype=np.float64)
    if grad.shape != (k, d + 1) or not np.all(np.isfinite(grad)):
        raise UsageError(
            f"canary gradient must be a finite array of shape {(k, d + 1)}, got {grad.shape}."
        )
    return grad.astype(np_dtype)


def _record_coordinates(record, k: int, d: int) -> np.ndarray:
    """``record`` as flat indices into a (K, d+1) head, checked."""
    rc = np.asarray(record)
    pairs = rc.ndim == 2 and rc.shape[1] == 2 and rc.shape[0] >= 1
    if not (
        pairs and np.issubdtype(rc.dtype, np.integer) and np.all((rc >= 0) & (rc <= (k - 1, d)))
    ):
        raise UsageError(
            f"record must be integer (row, column) pairs with rows in [0, {k}) and columns in [0, {d}], got {rc.tolist()}."
        )
    return (rc[:, 0] * (d + 1) + rc[:, 1]).astype(np.int64)


class _SparseCanaries:
    """M fixed canary gradients, given as an array (M, K, d+1) or a SciPy sparse matrix
    (M, K(d+1)) (row j: canary j's gradient flattened), kept sparse: one-run Dirac canaries have
    one non-zero each, so adding the sampled ones costs O(R nnz) per step instead of O(R M K d)."""

    def __init__(self, gradients, shape: tuple[int, int, int], np_dtype):
        from scipy import sparse

        m, k, d1 = shape
        if sparse.issparse(gradients):
            g = sparse.csr_matrix(gradients, dtype=np.float64)
            ok = g.shape == (m, k * d1) and bool(np.all(np.isfinite(g.data)))
            got = g.shape
        else:
            a = np.asarray(gradients, dtype=np.float64)
            ok, got = a.shape == shape and bool(np.all(np.isfinite(a))), a.shape
            g = sparse.csr_matrix(a.reshape(m, -1)) if ok else None
        if not ok:
            raise UsageError(
                f"canary gradients must be finite, shaped {shape} (or sparse {(m, k * d1)}), got {got}."
            )
        g.eliminate_zeros()
        self.matrix_t = g.astype(np_dtype).T.tocsr()  # (K(d+1), M)
        self.touched = np.unique(self.matrix_t.nonzero()[0])
        self.sub_t = self.matrix_t[self.touched]  # only the touched coordinates: (U, M)

    def add_to(self, sums: np.ndarray, hit: np.ndarray) -> None:
        """sums (R, K, d+1) += sum_j hit[:, j] * gradient[j], only at the touched coordinates."""
        flat = sums.reshape(sums.shape[0], -1)
        flat[:, self.touched] += (self.sub_t @ hit.T.astype(sums.dtype)).T.astype(
            sums.dtype, copy=False
        )


class _Recorder:
    """Records the privatised sums of a head loop at flat coordinates ``coords`` (module docstring):
    read by the noisy step after the noise is added (``sums += noise``, the step's own float
    additions) and before the division by m0, hence bit for bit the values the step then uses;
    without noise (``non_private``), the clipped sum itself."""

    def __init__(self, coords: np.ndarray, steps: int):
        self.coords, self.steps, self.values = coords, steps, None

    def record(self, t: int, arrays: list) -> None:
        flat = arrays[0].reshape(arrays[0].shape[0], -1)  # the one (R, K, d+1) array of the heads
        if self.values is None:
            self.values = np.zeros((len(flat), self.steps, self.coords.size), dtype=flat.dtype)
        self.values[:, t - 1] = flat[:, self.coords]


# ---------------------------------------------------------------- the loop


def run_dp_sgd(
    units,
    params: list,
    config: DPSGDConfig,
    *,
    noise: NoiseSource,
    runs: int = 1,
    canary=None,
    recorder=None,
    progress: Progress | None = None,
    optimizer=None,
) -> int:
    """Algorithm 1 on ``params`` (arrays for heads, tensors on one device for modules; updated in
    place) for ``runs`` runs: the one DP-SGD loop
    (module docstring: protocol, order of draws, privacy contract). Returns the executed steps.

    ``units``: the privacy unit and model kind (:class:`RecordUnits`, :class:`UserUnits`,
    :class:`SumUnits`; DP-MixMin's units): ``units.sample(noise, runs, q)``, the step's private
    Poisson samples of all runs (:class:`PoissonUnits`: (flat, offsets)), and
    ``units.bind(params, sums)``, a function ``step(*sample, hit)`` that writes each run's clipped
    sum over its sampled units (run r's ``flat[offsets[r]:offsets[r + 1]]``, plus the sampled
    canary units ``hit``) into ``sums``. ``canary``: an audit's canaries (module docstring);
    ``recorder``: reads the privatised sums (``record(t, arrays)``: :class:`_Recorder`, the white-box
    observer; :meth:`~dpaudit.mechanisms.dpsgd.core.NoisyStep.apply`); ``optimizer``: the update rule, when not
    ``config.optimizer`` (:class:`~dpaudit.mechanisms.dpsgd.core.NoisyStep`). ``config`` needs
    ``steps``, ``sample_rate`` and what :class:`~dpaudit.mechanisms.dpsgd.core.NoisyStep` reads.
    """
    sanitise = NoisyStep(params, config, noise=noise, optimizer=optimizer)
    _check_recordable(sanitise, recorder)
    step = units.bind(params, sanitise.sums)
    rows = canary is not None and canary.rows
    report = _reporter(progress, config.steps)
    for t in range(1, config.steps + 1):
        sample = units.sample(noise, runs, config.sample_rate)
        hit = None if canary is None else canary.draw()
        step(*sample, hit if rows else None)
        if canary is not None:
            canary.add(hit, sanitise.sums)
        sanitise.apply(t, recorder)  # + N(0, (sigma C)^2), / m0, the optimizer: every run at once
        report(t)  # t: executed steps, each one accountant step, empty batches included
    return t


def _check_recordable(sanitise: NoisyStep, recorder) -> None:
    """Refuse a recorder on a run whose sums live on another device than the CPU: the recorder
    reads the host buffers, which then do not hold the privatised sums the step uses."""
    sums = sanitise.device_sums
    if recorder is not None and sums is not None and sums.device.type != "cpu":
        raise UsageError(
            f"device must be the CPU for a recorded (white-box or trajectory) run, got {sums.device}."
        )


def _reporter(progress: Progress | None, steps: int):
    """``report(t)``: ``progress(t, steps)`` every ``steps // 200`` steps and at the last one."""
    every = max(1, steps // 200)
    if progress is None:
        return lambda t: None
    return lambda t: (t % every == 0 or t == steps) and progress(t, steps)

"""The pieces of the one DP-SGD loop (:func:`dpaudit.mechanisms.dpsgd.loop.run_dp_sgd`, where the
protocol and the privacy contract are stated): the public config, Poisson sampling
(:func:`poisson_batch`), the one clipping rule (:func:`clip_factors`), the one noisy step
(:class:`NoisyStep`, optimizers :data:`OPTIMIZERS`) and the clipped-sum kernels.

Gradient kernels: linear heads on frozen features in closed form, ``g_i = outer(p_i - y_i,
[z_i, 1])`` with ``||g_i|| = ||p_i - y_i|| * ||[z_i, 1]||``, so the clipped sum is one matrix
product and no per-example gradient is materialised (:func:`_clipped_sum_kernel`); trainable
modules by ghost clipping (:mod:`dpaudit.mechanisms.dpsgd.ghost_clip`) with ``torch.func`` per-sample
gradients (:func:`per_sample_clipped_sum`) as reference and fallback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Sequence

from ...errors import UsageError
from ...lazy import lazy_import
from ...noise import NoiseSource
from ...threads import limited_threads
from ...validation import half_open_unit, non_negative_finite, one_of, positive_finite, positive_int

np = lazy_import("numpy")
torch = lazy_import("torch")

#: Progress callback: called as ``progress(steps_done, steps_total)``.
Progress = Callable[[int, int], None]
#: The no-noise control's noise multiplier (DPSGDConfig refuses 0 without ``non_private``, which
#: would also switch clipping off).
NO_NOISE_MULTIPLIER = 1e-12


@dataclass(frozen=True)
class DPSGDConfig:
    """Public, privacy-relevant settings of one DP-SGD run (paper section 3.2, Table 2).

    sample_rate: Poisson inclusion probability q = 1/J.
    steps: total updates T = E * J (empty batches included).
    normalizer: fixed divisor m0 = max(1, floor(q N0)) of the noisy clipped sum.
    noise_multiplier: sigma = noise std / clipping_norm. 0 only with ``non_private=True``.
    clipping_norm: C, the joint L2 bound of each unit's gradient.
    optimizer: the update rule applied to the sanitised gradient (:data:`OPTIMIZERS`; paper: adam).
    momentum: the heavy-ball momentum of ``optimizer="sgd"`` in [0, 1) (0 for adam).
    lr, betas, adam_eps: optimizer settings (paper: Adam, 1e-3, (0.9, 0.999), 1e-8, no weight decay).
    non_private: the optimizer on Poisson batches with neither clipping nor noise (no claim; the
        gradient is still divided by m0 so the update scale matches the private runs).
    A release records :meth:`to_dict` (``config["dp_sgd"]``); :meth:`from_dict` reads it back, so
    an audit of a plan trains with the plan's own settings.
    """

    sample_rate: float
    steps: int
    normalizer: int
    noise_multiplier: float
    clipping_norm: float = 1.0
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    non_private: bool = False
    optimizer: str = "adam"
    momentum: float = 0.0

    def __post_init__(self) -> None:
        one_of("optimizer", self.optimizer, tuple(OPTIMIZERS))
        if not (0.0 <= float(self.momentum) < 1.0) or (self.optimizer != "sgd" and self.momentum):
            raise UsageError(
                f"momentum must be in [0, 1) with optimizer sgd and 0 otherwise, got {self.momentum!r} with {self.optimizer}."
            )
        half_open_unit("sample_rate", self.sample_rate)
        positive_int("steps", self.steps)
        positive_int("normalizer", self.normalizer)
        positive_finite("clipping_norm", self.clipping_norm)
        positive_finite("lr", self.lr)
        positive_finite("adam_eps", self.adam_eps)
        if len(self.betas) != 2 or not all(0.0 <= float(b) < 1.0 for b in self.betas):
            raise UsageError(f"betas must be two numbers in [0, 1), got {self.betas!r}.")
        if self.non_private:
            non_negative_finite("noise_multiplier", self.noise_multiplier)
        else:
            positive_finite("noise_multiplier", self.noise_multiplier)

    @property
    def noise_std(self) -> float:
        """Standard deviation of the noise added to the clipped sum (sigma * C)."""
        return 0.0 if self.non_private else self.noise_multiplier * self.clipping_norm

    def without_noise(self) -> "DPSGDConfig":
        """The no-noise control's config: the same clipping and schedule, noise multiplier
        :data:`NO_NOISE_MULTIPLIER` (an audit's control must find the leakage)."""
        return dataclasses.replace(self, noise_multiplier=NO_NOISE_MULTIPLIER)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        return {**d, "betas": list(self.betas), "weight_decay": 0.0}

    @classmethod
    def from_dict(cls, d: dict, **override) -> "DPSGDConfig":
        """The config recorded by :meth:`to_dict` (older records lack ``optimizer``: Adam), with
        ``override`` fields replaced (e.g. a release's recorded schedule)."""
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in {**d, **override}.items() if k in names}
        if "betas" in kw:
            kw["betas"] = tuple(kw["betas"])
        return cls(**kw)


#: DPSGDConfig fields a request may set (its optimizer's public settings; the schedule and noise
#: come from the plan): read by :func:`optimizer_settings`.
OPTIMIZER_SETTINGS = ("optimizer", "momentum")


def optimizer_settings(request) -> dict:
    """The optimizer settings ``request`` carries (:data:`OPTIMIZER_SETTINGS`), for its DPSGDConfig."""
    return {k: getattr(request, k) for k in OPTIMIZER_SETTINGS if hasattr(request, k)}


# ---------------------------------------------------------------- Adam


@dataclass
class AdamState:
    """Moments and step counter of Adam (Kingma & Ba 2015), as in ``torch.optim.Adam``."""

    m: list
    v: list
    t: int = 0

    @classmethod
    def zeros_like(cls, params: Sequence[torch.Tensor]) -> "AdamState":
        return cls([torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params], 0)


def adam_update(
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    state: AdamState,
    config: DPSGDConfig,
) -> None:
    """One in-place Adam step (no weight decay, no amsgrad), bit for bit the CPU step of
    ``torch.optim.Adam`` (its single-tensor path: the same operations in the same order).

    The moments only ever see the sanitised gradient (paper, eq. 6). ``config`` needs ``lr``,
    ``betas`` and ``adam_eps`` only (public training, e.g. the DP-MixMin proxies, passes those).
    Calling this instead of ``torch.optim.Adam`` also spares the import of ``torch._dynamo`` that an
    optimizer's first use triggers (~2 s).
    """
    b1, b2 = config.betas
    state.t += 1
    step = float(state.t)
    bc1 = 1.0 - b1**step
    bc2_sqrt = (1.0 - b2**step) ** 0.5
    step_size = config.lr / bc1
    with torch.no_grad():
        for p, g, m, v in zip(params, grads, state.m, state.v):
            m.lerp_(g, 1.0 - b1)
            v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
            denom = (v.sqrt() / bc2_sqrt).add_(config.adam_eps)
            p.addcdiv_(m, denom, value=-step_size)


#: BLAS threads of a head's training (:func:`head_threads`), published in a release's timings.
HEAD_BLAS_THREADS = 1


def head_threads():
    """One BLAS (and torch) thread while heads train (a speed setting, never a privacy one): their
    skinny products gain nothing from a second thread on a quiet 2-core machine and ran 5x slower
    with two threads beside other jobs (BENCHMARKS.md, section 4); restored afterwards."""
    return limited_threads(HEAD_BLAS_THREADS)


#: Elements per block of the NumPy optimizers' array passes: each block's temporaries stay in cache.
_BLOCK = 1 << 15


def _is_tensor(params: Sequence) -> bool:
    """True for torch parameters (a module's), False for NumPy arrays (a head's); checked without importing torch."""
    return bool(params) and not isinstance(params[0], np.ndarray)


class Adam:
    """Adam (Kingma & Ba 2015; no weight decay, no amsgrad) on parameters updated in place, the
    arithmetic of ``torch.optim.Adam``'s CPU step (tested against it): m <- m + (1 - b1)(g - m);
    v <- b2 v + (1 - b2) g^2; p <- p - (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps).

    In the parameters' own library, fixed by the model kind (so a model's releases and audits step
    with the same code): a head's NumPy arrays in NumPy, a dozen array passes per cache-sized block
    (its release then never imports torch, BENCHMARKS.md section 4); a module's tensors with
    ``torch.optim.Adam(fused=True)``'s kernel when this torch has it, else :func:`adam_update`.
    """

    def __init__(self, params: Sequence, config: DPSGDConfig):
        self.params, self.config = list(params), config
        self.tensors = _is_tensor(self.params)
        if self.tensors:
            self.state = AdamState.zeros_like(self.params)
            self.m = self.state.m
            self.fused = getattr(torch, "_fused_adam_", None)
            self.steps = [
                torch.zeros((), dtype=torch.float32, device=p.device) for p in self.params
            ]
        else:
            self.m = [np.zeros_like(p) for p in self.params]
            self.v = [np.zeros_like(p) for p in self.params]
            self._tmp = {}

    def step(self, grads: Sequence, t: int) -> None:
        """Adam step number ``t`` (1, 2, ...) with gradients ``grads`` (of the parameters' kind)."""
        if not self.tensors:
            self._numpy_step(grads, t)
        elif self.fused is None:
            self.state.t = t - 1
            adam_update(self.params, grads, self.state, self.config)
        else:
            c = self.config
            for s in self.steps:
                s.fill_(t)
            self.fused(
                self.params,
                list(grads),
                self.state.m,
                self.state.v,
                [],
                self.steps,
                amsgrad=False,
                lr=c.lr,
                beta1=c.betas[0],
                beta2=c.betas[1],
                weight_decay=0.0,
                eps=c.adam_eps,
                maximize=False,
            )

    def _numpy_step(self, grads: Sequence[np.ndarray], t: int) -> None:
        c = self.config
        b1, b2 = c.betas
        bc2_sqrt = (1.0 - b2 ** float(t)) ** 0.5
        step_size = c.lr / (1.0 - b1 ** float(t))
        for p, g, m, v in zip(self.params, grads, self.m, self.v):
            tmp = self._tmp.setdefault(p.dtype, np.empty(_BLOCK, dtype=p.dtype))
            pf, gf, mf, vf = (a.reshape(-1) for a in (p, g, m, v))
            for s in range(0, pf.size, _BLOCK):
                pb, gb, mb, vb = (a[s : s + _BLOCK] for a in (pf, gf, mf, vf))
                d = tmp[: pb.size]
                np.subtract(gb, mb, out=d)  # lerp(m, g, 1 - b1)
                d *= 1.0 - b1
                mb += d
                vb *= b2
                np.multiply(gb, gb, out=d)
                d *= 1.0 - b2
                vb += d
                np.sqrt(vb, out=d)  # denominator
                d /= bc2_sqrt
                d += c.adam_eps
                np.divide(mb, d, out=d)
                d *= step_size
                pb -= d


class SGD:
    """SGD with heavy-ball momentum on parameters updated in place (arrays or tensors, like
    :class:`Adam`): the arithmetic of ``torch.optim.SGD(lr, momentum)`` (no dampening, weight
    decay or Nesterov): b_1 = g_1, b_t = mu b_{t-1} + g_t, p -= lr b_t (p -= lr g_t without momentum)."""

    def __init__(self, params: Sequence, config: DPSGDConfig):
        self.params, self.config, self.buffers = list(params), config, None
        self.tensors = _is_tensor(self.params)

    def step(self, grads: Sequence, t: int) -> None:
        with torch.no_grad() if self.tensors else contextlib.nullcontext():
            self._step(grads)

    def _step(self, grads: Sequence) -> None:
        lr, mu = self.config.lr, self.config.momentum
        if mu and self.buffers is None:  # the callers' gradient buffers are reused: copies
            self.buffers = [g.detach().clone() if self.tensors else np.array(g) for g in grads]
        elif mu:
            for b, g in zip(self.buffers, grads):
                b *= mu
                b += g
        for p, d in zip(self.params, self.buffers if mu else grads):
            if self.tensors:
                p.add_(d, alpha=-lr)
            else:
                p -= lr * d


#: The update rules of :class:`NoisyStep` by ``DPSGDConfig.optimizer``: a class built as
#: ``cls(params, config)`` whose ``step(grads, t)`` updates ``params`` in place at step t = 1, 2, ...
OPTIMIZERS = {"adam": Adam, "sgd": SGD}


class NoisyStep:
    """The one noisy step of the DP-SGD loop (protocol step 3 of :mod:`dpaudit.mechanisms.dpsgd.loop`).

    ``params``: arrays (heads) or tensors (modules, on one device), updated in place. The caller
    writes the clipped sum for ``params[i]`` into ``sums[i]`` (reused C-ordered buffers shaped like
    the parameters, of the same kind); :meth:`apply` adds the noise (:func:`gaussian_filler`, one
    draw per buffer, in order), divides by m0 (``config.normalizer``: DP-SGD's integer m0, or
    DP-MixMin's expected batch size, a float) and steps the optimizer: ``optimizer`` (a class
    built as ``optimizer(params, config)``, e.g. DP-MixMin's mirror descent) or, by default,
    ``OPTIMIZERS[config.optimizer]``.

    Modules: ``sums`` are views of one flat tensor on the parameters' device (on the CPU, the
    memory of the host buffers ``_arrays``). The noise is always drawn on the CPU by ``noise``'s
    sampler, whose tails are certified (never a device RNG), into one flat host buffer, and added
    as one tensor moved once per step (no copy on the CPU).
    """

    def __init__(
        self, params: Sequence, config: DPSGDConfig, *, noise: NoiseSource, optimizer=None
    ):
        self.config, self.device_sums = config, None
        if _is_tensor(params):
            buffers = self._module_buffers(params)
        else:
            self._arrays = self.sums = [np.empty(p.shape, dtype=p.dtype) for p in params]
            buffers = [np.empty_like(a) for a in self._arrays]  # own buffers
        std = config.noise_std
        self._fills = [gaussian_filler(noise, b, std) for b in buffers] if std > 0.0 else []
        self.optimizer = (optimizer or OPTIMIZERS[config.optimizer])(params, config)

    def _module_buffers(self, params: Sequence) -> list:
        """Set up a module's sums (module docstring); returns the views of the host noise buffer."""
        shapes, dtypes = [tuple(p.shape) for p in params], {p.dtype for p in params}
        if len(dtypes) != 1:
            raise UsageError(
                f"module parameters must share one dtype, got {sorted(map(str, dtypes))}."
            )
        host = torch.empty(sum(math.prod(s) for s in shapes), dtype=dtypes.pop()).numpy()
        self._arrays = _split(host, shapes)
        # on the CPU: the same memory
        self.device_sums = torch.from_numpy(host).to(params[0].device)
        self.sums = _split(self.device_sums, shapes)
        self._noise = np.empty_like(host)
        return _split(self._noise, shapes)

    def apply(self, t: int, recorder=None) -> None:
        """Step ``t``: + noise, ``recorder.record(t, arrays)`` (an audit instrument reading the
        privatised sums in the host buffers, on the CPU: exactly the values the step then uses;
        it draws and changes nothing), / m0, the optimizer."""
        if self.device_sums is None:
            for a, fill in zip(self._arrays, self._fills):
                a += fill()
        elif self._fills:
            for fill in self._fills:  # into the views of the one host buffer, in order
                fill()
            self.device_sums += torch.from_numpy(self._noise).to(self.device_sums.device)
        if recorder is not None:
            recorder.record(t, self._arrays)
        for s in self._arrays if self.device_sums is None else [self.device_sums]:
            s /= self.config.normalizer
        self.optimizer.step(self.sums, t)


def _split(flat, shapes: list) -> list:
    """Views of consecutive blocks of the 1-D array or tensor ``flat``, shaped ``shapes``."""
    views, start = [], 0
    for shape in shapes:
        size = math.prod(shape)
        views.append(flat[start : start + size].reshape(shape))
        start += size
    return views


# ---------------------------------------------------------------- Poisson sampling


def poisson_flat(
    rng: np.random.Generator, runs: int, n: int, q: float
) -> tuple[np.ndarray, np.ndarray]:
    """Independent Bernoulli(q) draws on range(n) for each of ``runs`` runs, as one flat array of
    kept indices (run r's indices are ``flat[offsets[r]:offsets[r + 1]]``, increasing).

    Gap sampling: in a Bernoulli(q) sequence the gaps between successes are i.i.d. Geometric(q)
    (support 1, 2, ...), so the included positions are the partial sums of the gaps minus one --
    exactly the distribution of ``flatnonzero(uniform(n) < q)`` at O(q n) instead of O(n) cost.
    The runs' masks are consecutive blocks of one Bernoulli sequence of length ``runs * n``
    (i.i.d. across positions, hence independent across runs), so all runs cost one draw.
    """
    total = runs * n
    if q >= 1.0:
        return np.tile(np.arange(n), runs), np.arange(runs + 1) * n
    mean = total * q
    m = int(mean + 8.0 * math.sqrt(mean * (1.0 - q)) + 16)
    pos = rng.geometric(q, size=m)
    pos.cumsum(out=pos)
    # positions 0 .. total - 1 (more gaps drawn if rarely needed)
    pos = _extend_gaps(rng, pos, total, q)
    if runs == 1:
        return pos, np.array([0, pos.size])
    offsets = np.searchsorted(pos, np.arange(runs + 1) * n)
    run_of = np.repeat(np.arange(runs), np.diff(offsets))
    pos -= run_of * n
    return pos, offsets


def poisson_indices(rng: np.random.Generator, runs: int, n: int, q: float) -> list[np.ndarray]:
    """For each of ``runs`` runs, the indices kept by independent Bernoulli(q) draws on range(n)
    (:func:`poisson_flat`, split per run)."""
    flat, offsets = poisson_flat(rng, runs, n, q)
    return [flat[offsets[r] : offsets[r + 1]] for r in range(runs)]


def _extend_gaps(rng: np.random.Generator, pos: np.ndarray, total: int, q: float) -> np.ndarray:
    """Continue cumulative gap positions ``pos`` (1-based) until they pass ``total``; return the
    0-based positions < total."""
    m = pos.size
    while pos[-1] <= total:
        more = rng.geometric(q, size=m)
        more.cumsum(out=more)
        pos = np.concatenate([pos, pos[-1] + more])
    pos = pos[: pos.searchsorted(total, side="right")]
    pos -= 1
    return pos


def _numpy_backed(noise: NoiseSource) -> bool:
    """True when ``noise`` draws its masks with the stock Bernoulli sampler on ``noise.numpy``
    (os-entropy / reproducible sources), so the same generator may be used more efficiently."""
    return type(noise).poisson_mask is NoiseSource.poisson_mask and not noise.cryptographic


def poisson_batch(noise: NoiseSource, runs: int, n: int, q: float) -> tuple[np.ndarray, np.ndarray]:
    """One step's private Poisson samples of range(n) for ``runs`` independent runs, as (flat
    indices, offsets): run r's sample is ``flat[offsets[r]:offsets[r + 1]]``, ascending.

    Numpy-backed sources (:func:`_numpy_backed`): the same generator by gap sampling (same
    distribution, O(q n): :func:`poisson_flat`). Any other source: its ``poisson_mask``, run by
    run.
    """
    if _numpy_backed(noise):
        return poisson_flat(noise.numpy, runs, n, q)
    parts = [np.flatnonzero(noise.poisson_mask(n, q)) for _ in range(runs)]
    offsets = np.concatenate([[0], np.cumsum([p.size for p in parts])]).astype(np.int64)
    return (np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)), offsets


def gaussian_filler(noise: NoiseSource, out: np.ndarray, std: float) -> Callable[[], np.ndarray]:
    """A function that refills ``out`` with fresh N(0, std^2) draws from ``noise`` at each call
    (the per-call checks done once, for the loop).

    Every stock :class:`NoiseSource` (any kind): its Gaussian sampler
    (:data:`dpaudit.noise.GAUSSIAN_SAMPLER`, never ``torch.randn``, whose float32 draws are
    truncated at 5.77 sigma), the same draws as ``noise.gaussian_torch``, written straight into a
    contiguous float32 or float64 ``out`` (``noise.gaussian_into``: float64 the draws of
    ``noise.gaussian_numpy``, also DP-MixMin's, without a copy); a source that overrides
    ``gaussian_torch``: that method.
    """
    stock = type(noise).gaussian_torch is NoiseSource.gaussian_torch
    if stock and out.dtype in (np.float32, np.float64) and out.flags.c_contiguous:

        def fill() -> np.ndarray:
            return noise.gaussian_into(out, std)
    else:
        shape, dtype = tuple(out.shape), torch.from_numpy(out).dtype

        def fill() -> np.ndarray:
            out[...] = noise.gaussian_torch(shape, std, dtype=dtype).numpy()
            return out

    return fill


# ---------------------------------------------------------------- linear heads


def head_outputs(n_classes: int, binary_logit: bool) -> int:
    """Number of logits K: 1 for a binary task with a single sigmoid logit, else n_classes."""
    n_classes = positive_int("n_classes", n_classes, 2)
    return 1 if (binary_logit and n_classes == 2) else n_classes


def init_head(d: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """PyTorch's ``nn.Linear`` default initialisation, U(-1/sqrt(d), 1/sqrt(d)) for weight and bias,
    drawn from a public generator. Returns (k, d+1) with the bias in the last column."""
    bound = 1.0 / math.sqrt(d) if d > 0 else 1.0
    return rng.uniform(-bound, bound, size=(k, d + 1))


def residuals_numpy(logits: np.ndarray, y: np.ndarray, binary_logit: bool) -> np.ndarray:
    """dLoss/dlogits per example, in place on ``logits``: p - onehot(y) (softmax CE) or sigmoid(s) - y (single-logit BCE)."""
    if binary_logit:
        r = 1.0 / (1.0 + np.exp(-logits, out=logits))
        r[:, 0] -= y
        return r
    logits -= logits.max(axis=1, keepdims=True)
    np.exp(logits, out=logits)
    logits /= logits.sum(axis=1, keepdims=True)
    logits[np.arange(logits.shape[0]), y] -= 1.0
    return logits


def clip_factors(norms, clipping_norm: float):
    """The clipping coefficients min(1, C / ||g_u||) of per-unit gradient norms (eq. 4), written
    C / max(||g_u||, C) (the same floats): in place for a NumPy array, a new tensor for a torch one.
    The one clipping rule of every clipped-sum kernel (record and user heads, modules)."""
    if not isinstance(norms, np.ndarray):  # a tensor (checked without importing torch)
        return clipping_norm / torch.clamp(norms, min=clipping_norm)
    np.maximum(norms, clipping_norm, out=norms)
    return np.divide(clipping_norm, norms, out=norms)


class HeadWorkspace:
    """Reused buffers for the closed-form clipped sum of one (K, d+1) head (a speed device only:
    fresh arrays per step cost page faults and cache misses). Both matrix products are NumPy
    GEMMs writing into these buffers (about 10 % slower than torch's here, 207-217 vs 189-197 us a
    step, ``benchmarks/bench_head_gemm.py``; without torch's ~1.6 s import).
    """

    def __init__(self, k: int, d1: int, dtype, rows: int = 1):
        self.k, self.d1, self.dtype = k, d1, np.dtype(dtype)
        self.out = np.empty((k, d1), dtype=self.dtype)
        self._grow(max(1, rows))

    def _grow(self, rows: int) -> None:
        self.rows = rows
        self.batch = np.empty((rows, self.d1), dtype=self.dtype)
        self.res = np.empty(self.k * rows, dtype=self.dtype)
        self.logits = np.empty(self.k * rows, dtype=self.dtype)
        self.scale = np.empty(rows, dtype=self.dtype)
        self.cols = np.arange(rows, dtype=np.int64)

    def ensure(self, rows: int) -> None:
        if rows > self.rows:
            self._grow(rows)


def _clipped_sum_kernel(
    ws: HeadWorkspace,
    w: np.ndarray,
    b: int,
    zn: np.ndarray,
    y: np.ndarray,
    clipping_norm: float,
    binary_logit: bool,
    clip: bool,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """The clipped sum over the first ``b`` rows of ``ws.batch`` at head ``w`` (K, d+1) into
    ``ws.out`` (or ``out``, C-ordered; see :func:`head_clipped_sum`). Residuals are kept as (K, b)
    so that both products are plain GEMMs. ``zn`` and ``y``: norms ||[z_i, 1]|| and labels of
    those rows."""
    k = ws.k
    zb = ws.batch[:b]
    r = ws.res[: k * b].reshape(k, b)
    # logits s = W [z, 1] of every sampled row, as (K, b); computed (b, K) = Z1 W^T, then
    # transposed: OpenBLAS takes ~1.7x as long for the (K, b) product of this skinny shape (bench_head_gemm.py)
    np.copyto(r, np.matmul(zb, w.T, out=ws.logits[: b * k].reshape(b, k)).T)
    if binary_logit:  # dLoss/ds = sigmoid(s) - y
        np.negative(r, out=r)
        np.exp(r, out=r)
        r += 1.0
        np.reciprocal(r, out=r)
        r[0] -= y
    else:  # dLoss/ds = softmax(s) - onehot(y); max subtracted for a finite exp
        r -= r.max(axis=0)
        np.exp(r, out=r)
        r /= r.sum(axis=0)
        r.reshape(-1)[y * b + ws.cols[:b]] -= 1.0
    if clip:
        # ||g_i|| = ||r_i|| ||[z_i, 1]||; coefficient min(1, C / ||g_i||) written as C / max(||g_i||, C)
        c = ws.scale[:b]
        np.einsum("kb,kb->b", r, r, out=c)
        np.sqrt(c, out=c)
        c *= zn
        r *= clip_factors(c, clipping_norm)
    # sum_i c_i outer(r_i, [z_i, 1]) = (c * R) Z1
    return np.matmul(r, zb, out=ws.out if out is None else out)


def head_clipped_sum(
    w: np.ndarray,
    z1: np.ndarray,
    z1_norm: np.ndarray,
    y: np.ndarray,
    clipping_norm: float,
    *,
    binary_logit: bool = False,
    clip: bool = True,
) -> np.ndarray:
    """Sum over rows of ``z1`` of clipped per-example head gradients, in closed form (module
    docstring), (K, d+1); ``z1_norm`` holds ||z1_i||. The arithmetic of :func:`_clipped_sum_kernel`,
    which the trainers call on reused buffers.
    """
    w, z1, z1_norm, y = (np.asarray(a) for a in (w, z1, z1_norm, y))
    dtype = np.result_type(w.dtype, z1.dtype)
    k, d1 = w.shape
    b = z1.shape[0]
    ws = HeadWorkspace(k, d1, dtype, rows=b)
    if b == 0:
        return np.zeros((k, d1), dtype=dtype)
    ws.batch[:b] = z1
    w = np.asarray(w, dtype=dtype)
    zn, labels = z1_norm.astype(dtype, copy=False), y.astype(np.int64, copy=False)
    return _clipped_sum_kernel(ws, w, b, zn, labels, clipping_norm, binary_logit, clip).copy()


def check_head_inputs(
    z, y, n_classes: int, binary_logit: bool
) -> tuple[np.ndarray, np.ndarray, int]:
    """Features (n, d) with one label in [0, n_classes) per row; returns (z, y, K logits)."""
    z = np.asarray(z)
    y = np.asarray(y)
    if z.ndim != 2 or y.shape != (z.shape[0],):
        raise UsageError(f"z must be (n, d) and y (n,), got {z.shape} and {y.shape}.")
    k = head_outputs(n_classes, binary_logit)
    if y.size and (y.min() < 0 or y.max() >= n_classes):
        raise UsageError(f"labels must be in [0, {n_classes}), got range [{y.min()}, {y.max()}].")
    return z, y, k


#: Rows per block of :func:`head_probabilities` (4 MiB of float64 features at d = 512).
_EVAL_ROWS = 1024


def head_probabilities(weight: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Class probabilities (n, n_classes) of a (K, d+1) head on features (n, d) from its logits s;
    a single-logit head gives [1 - s, s]."""
    weight = np.asarray(weight)
    z = np.asarray(z)
    w, s = weight[:, :-1].T.astype(np.float64), np.empty((z.shape[0], weight.shape[0]))
    # float64 rows, a block at a time (no float64 copy of z)
    buf = np.empty((min(_EVAL_ROWS, z.shape[0]), z.shape[1]))
    for i in range(0, z.shape[0], _EVAL_ROWS):
        rows = buf[: min(_EVAL_ROWS, z.shape[0] - i)]
        rows[...] = z[i : i + rows.shape[0]]
        np.matmul(rows, w, out=s[i : i + rows.shape[0]])
    s += weight[:, -1].astype(np.float64)
    if s.shape[1] == 1:
        p1 = 1.0 / (1.0 + np.exp(-s[:, 0]))
        return np.stack([1.0 - p1, p1], axis=1)
    s = s - s.max(axis=1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(axis=1, keepdims=True)


# ---------------------------------------------------------------- trainable modules


def _loss_fn(kind: str, reduction: str = "mean"):
    if kind == "cross_entropy":
        return lambda out, target: torch.nn.functional.cross_entropy(
            out, target, reduction=reduction
        )
    if kind == "bce":
        return lambda out, target: torch.nn.functional.binary_cross_entropy_with_logits(
            out.reshape(-1), target.to(out.dtype).reshape(-1), reduction=reduction
        )
    raise UsageError(f"loss must be one of cross_entropy, bce, got {kind!r}.")


def per_sample_grads(
    module: torch.nn.Module,
    params: dict,
    x: torch.Tensor,
    y: torch.Tensor,
    loss: str,
    randomness: str = "different",
) -> dict[str, torch.Tensor]:
    """Unclipped per-sample gradients (n, *shape) of ``module`` at ``params`` over (x, y), by
    ``torch.func.vmap(torch.func.grad(...))``; ``randomness="different"`` gives each example its
    own dropout mask, as a batch would."""
    from torch.func import functional_call, grad, vmap

    lf = _loss_fn(loss)
    buffers = dict(module.named_buffers())

    def one(p, xi, yi):
        out = functional_call(module, (p, buffers), (xi.unsqueeze(0),))
        return lf(out, yi.unsqueeze(0))

    return vmap(grad(one), in_dims=(None, 0, 0), randomness=randomness)(params, x, y)


def per_sample_clipped_sum(
    module: torch.nn.Module,
    params: dict[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    clipping_norm: float,
    *,
    loss: str = "cross_entropy",
    clip: bool = True,
    randomness: str = "different",
) -> dict[str, torch.Tensor]:
    """Clipped sum over the batch (x, y) of the per-sample gradients (:func:`per_sample_grads`) of
    ``module`` at ``params``, each clipped to joint L2 norm ``clipping_norm`` over all of them."""
    return clipped_sum_of(
        per_sample_grads(module, params, x, y, loss, randomness), clipping_norm, clip
    )


def clipped_sum_of(grads: dict, clipping_norm: float, clip: bool = True) -> dict:
    """The sum over units of their gradients (by parameter name, (U, ...) each), each unit's
    clipped to joint norm C over all of them (when ``clip``)."""
    if not clip:
        return {n: g.sum(0) for n, g in grads.items()}
    sq = sum(g.reshape(g.shape[0], -1).pow(2).sum(1) for g in grads.values())
    coef = clip_factors(sq.sqrt(), clipping_norm)
    return {n: torch.tensordot(coef, g, dims=([0], [0])) for n, g in grads.items()}

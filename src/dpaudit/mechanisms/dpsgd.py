"""The DP-SGD engine: Poisson sampling, per-unit clipping, Gaussian noise, fixed normaliser, Adam.

Protocol (DP-RVFL paper, section 3.2 and Algorithm 1), reproduced to the letter:

1. at each of ``steps`` updates every unit (record) is included independently with probability
   ``sample_rate`` (eq. 2); the mask comes from the private :class:`~dpaudit.noise.NoiseSource`,
   because amplification by subsampling assumes the adversary does not know who was sampled;
2. each included unit's gradient is clipped to joint L2 norm ``clipping_norm`` (eq. 4);
3. N(0, (noise_multiplier * clipping_norm)^2 I) is added to the clipped *sum* (eq. 5);
4. the result is divided by the fixed, public ``normalizer`` m0 -- never the realised batch size,
   which is private;
5. Adam (eq. 6) updates the parameters from this sanitised gradient only.

An empty batch still produces a noise-only update and counts as one step; the number of executed
steps is returned so callers can check it against the accounted ``steps``.

**Privacy contract.** Under add/remove-one-unit adjacency the clipped sum has L2 sensitivity
``clipping_norm`` conditional on all earlier outputs, so ``steps`` runs of the loop are the event
``SubsampledGaussian(noise_multiplier, sample_rate, steps)``. This holds for any function that
returns a sum of per-unit contributions each of norm <= ``clipping_norm``: the engine takes that
function as an argument (:func:`run_dp_sgd`), so a per-user (group) gradient function can be swapped
in without touching the loop. Frozen parts of a model (random features, projections) must be
built from public randomness only.

Two gradient back-ends:
- linear heads on frozen features (:func:`train_linear_head`): per-example gradients in closed form,
  ``g_i = outer(p_i - y_i, [z_i, 1])`` with ``||g_i|| = ||p_i - y_i|| * ||[z_i, 1]||``, so the clipped
  sum is one matrix product and no per-example gradient is ever materialised;
- trainable representations (:func:`train_module_dp_sgd`): per-sample gradients with ``torch.func``
  (``vmap(grad(...))``), joint norm over all parameters, clipped sum by a weighted reduction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from ..errors import UsageError
from ..noise import NoiseSource
from ..validation import half_open_unit, non_negative_finite, positive_finite, positive_int

#: Progress callback: called as ``progress(steps_done, steps_total)``.
Progress = Callable[[int, int], None]
#: Clipped-sum function: ``(params, unit_indices) -> list of tensors shaped like params``; each
#: unit's contribution must have joint L2 norm <= clipping_norm (the sensitivity of the sum).
ClippedSum = Callable[[list, np.ndarray], list]


@dataclass(frozen=True)
class DPSGDConfig:
    """Public, privacy-relevant settings of one DP-SGD run (paper section 3.2, Table 2).

    sample_rate: Poisson inclusion probability q = 1/J.
    steps: total updates T = E * J (empty batches included).
    normalizer: fixed divisor m0 = max(1, floor(q N0)) of the noisy clipped sum.
    noise_multiplier: sigma = noise std / clipping_norm. 0 only with ``non_private=True``.
    clipping_norm: C, the joint L2 bound of each unit's gradient.
    lr, betas, adam_eps: Adam settings (paper: 1e-3, (0.9, 0.999), 1e-8, no weight decay).
    non_private: plain Adam on Poisson batches with neither clipping nor noise (no claim; the
        gradient is still divided by m0 so the update scale matches the private runs).
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

    def __post_init__(self) -> None:
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

    def to_dict(self) -> dict:
        return {
            "sample_rate": self.sample_rate, "steps": self.steps, "normalizer": self.normalizer,
            "noise_multiplier": self.noise_multiplier, "clipping_norm": self.clipping_norm,
            "lr": self.lr, "betas": list(self.betas), "adam_eps": self.adam_eps,
            "weight_decay": 0.0, "non_private": self.non_private,
        }


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


def adam_update(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], state: AdamState, config: DPSGDConfig) -> None:
    """One in-place Adam step (no weight decay, no amsgrad), identical to ``torch.optim.Adam``.

    The moments only ever see the sanitised gradient (paper, eq. 6).
    """
    b1, b2 = config.betas
    state.t += 1
    bc1 = 1.0 - b1**state.t
    bc2_sqrt = math.sqrt(1.0 - b2**state.t)
    step_size = config.lr / bc1
    with torch.no_grad():
        for p, g, m, v in zip(params, grads, state.m, state.v):
            m.mul_(b1).add_(g, alpha=1.0 - b1)
            v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
            denom = (v.sqrt() / bc2_sqrt).add_(config.adam_eps)
            p.addcdiv_(m, denom, value=-step_size)


# ---------------------------------------------------------------- the loop


def run_dp_sgd(
    params: list[torch.Tensor],
    clipped_sum: ClippedSum,
    n_units: int,
    config: DPSGDConfig,
    *,
    noise: NoiseSource,
    progress: Progress | None = None,
) -> int:
    """Algorithm 1, steps 5-8, on ``params`` (updated in place). Returns the executed step count.

    ``clipped_sum(params, idx)`` returns the sum over the sampled units ``idx`` of their clipped
    gradients (or, for ``non_private`` configs, their unclipped gradients). It is called even
    for an empty sample only if it wants to be: the engine uses a zero sum for empty batches.
    """
    n_units = positive_int("n_units", n_units)
    state = AdamState.zeros_like(params)
    std = config.noise_std
    steps_done = 0
    report_every = max(1, config.steps // 200)
    for _ in range(config.steps):
        mask = noise.poisson_mask(n_units, config.sample_rate)
        idx = np.flatnonzero(mask)
        if idx.size:
            sums = clipped_sum(params, idx)
        else:
            sums = [torch.zeros_like(p) for p in params]  # Algorithm 1, step 6
        grads = []
        for s in sums:
            if std > 0.0:
                s = s + noise.gaussian_torch(tuple(s.shape), std, dtype=s.dtype)
            grads.append(s / config.normalizer)
        adam_update(params, grads, state, config)
        steps_done += 1  # Algorithm 1, step 8: one accountant step, empty batches included
        if progress is not None and (steps_done % report_every == 0 or steps_done == config.steps):
            progress(steps_done, config.steps)
    return steps_done


# ---------------------------------------------------------------- linear heads


@dataclass(frozen=True)
class HeadResult:
    """A trained linear head: ``weight`` is (K, d+1), the last column the bias."""

    weight: np.ndarray
    steps_executed: int
    binary_logit: bool = False
    config: DPSGDConfig | None = field(default=None, compare=False)


def head_outputs(n_classes: int, binary_logit: bool) -> int:
    """Number of logits K: 1 for a binary task with a single sigmoid logit, else n_classes."""
    n_classes = positive_int("n_classes", n_classes)
    if n_classes < 2:
        raise UsageError(f"n_classes must be an integer >= 2, got {n_classes!r}.")
    return 1 if (binary_logit and n_classes == 2) else n_classes


def init_head(d: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """PyTorch's ``nn.Linear`` default initialisation, U(-1/sqrt(d), 1/sqrt(d)) for weight and bias,
    drawn from a public generator. Returns (k, d+1) with the bias in the last column."""
    bound = 1.0 / math.sqrt(d) if d > 0 else 1.0
    return rng.uniform(-bound, bound, size=(k, d + 1))


def with_bias_column(z: np.ndarray | torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """[z, 1] as a torch tensor (the bias is the last coefficient of the head)."""
    zt = torch.as_tensor(np.asarray(z) if not isinstance(z, torch.Tensor) else z, dtype=dtype)
    return torch.cat([zt, torch.ones(zt.shape[0], 1, dtype=dtype)], dim=1)


def residuals(logits: torch.Tensor, y: torch.Tensor, binary_logit: bool) -> torch.Tensor:
    """dLoss/dlogits per example: p - onehot(y) (softmax CE) or sigmoid(s) - y (single-logit BCE)."""
    if binary_logit:
        return torch.sigmoid(logits) - y.to(logits.dtype).unsqueeze(1)
    r = torch.softmax(logits, dim=1)
    r[torch.arange(r.shape[0]), y] -= 1.0
    return r


def head_clipped_sum(
    w: torch.Tensor,
    z1: torch.Tensor,
    z1_norm: torch.Tensor,
    y: torch.Tensor,
    clipping_norm: float,
    *,
    binary_logit: bool = False,
    clip: bool = True,
) -> torch.Tensor:
    """Sum over rows of ``z1`` of clipped per-example head gradients, in closed form.

    g_i = outer(r_i, z1_i) with r_i = p_i - y_i, so ||g_i||_F = ||r_i|| * ||z1_i||; the clipped sum
    is ``(c * R)^T Z1`` with c_i = min(1, C / ||g_i||) (eq. 4). ``z1_norm`` holds ||z1_i||.
    """
    r = residuals(z1 @ w.T, y, binary_logit)
    if clip:
        gnorm = torch.linalg.vector_norm(r, dim=1) * z1_norm
        coef = torch.clamp(clipping_norm / torch.clamp(gnorm, min=1e-30), max=1.0)
        r = r * coef.unsqueeze(1)
    return r.T @ z1


def train_linear_head(
    z: np.ndarray,
    y: np.ndarray,
    n_classes: int,
    config: DPSGDConfig,
    *,
    noise: NoiseSource,
    init: np.ndarray | None = None,
    progress: Progress | None = None,
    binary_logit: bool = False,
    dtype: torch.dtype = torch.float32,
) -> HeadResult:
    """DP-SGD (Adam) on a linear softmax head over frozen features ``z`` (n, d).

    Loss: softmax cross-entropy over ``n_classes`` logits; with ``binary_logit=True`` and two
    classes, one logit with sigmoid binary cross-entropy (the paper's K = 1, section 3.5).
    The privacy contract is that of :func:`run_dp_sgd` with one unit per row of ``z``.
    ``init`` (K, d+1) must come from public randomness; zeros when omitted.
    """
    z = np.asarray(z)
    y = np.asarray(y)
    if z.ndim != 2 or y.shape != (z.shape[0],):
        raise UsageError(f"z must be (n, d) and y (n,), got {z.shape} and {y.shape}.")
    k = head_outputs(n_classes, binary_logit)
    if y.size and (y.min() < 0 or y.max() >= n_classes):
        raise UsageError(f"labels must be in [0, {n_classes}), got range [{y.min()}, {y.max()}].")
    d = z.shape[1]
    z1 = with_bias_column(z, dtype)
    z1_norm = torch.linalg.vector_norm(z1, dim=1)
    yt = torch.as_tensor(y, dtype=torch.long)
    if init is None:
        w = torch.zeros(k, d + 1, dtype=dtype)
    else:
        init = np.asarray(init)
        if init.shape != (k, d + 1):
            raise UsageError(f"init must have shape {(k, d + 1)}, got {init.shape}.")
        w = torch.tensor(init, dtype=dtype)
    clip = not config.non_private

    def clipped_sum(params, idx):
        j = torch.from_numpy(idx)
        return [head_clipped_sum(params[0], z1[j], z1_norm[j], yt[j], config.clipping_norm, binary_logit=k == 1, clip=clip)]

    steps = run_dp_sgd([w], clipped_sum, z.shape[0], config, noise=noise, progress=progress)
    return HeadResult(weight=w.numpy().astype(np.float64), steps_executed=steps, binary_logit=k == 1, config=config)


def head_logits(weight: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Logits of a (K, d+1) head on features (n, d)."""
    weight = np.asarray(weight)
    return np.asarray(z, dtype=np.float64) @ weight[:, :-1].T.astype(np.float64) + weight[:, -1].astype(np.float64)


def head_probabilities(weight: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Class probabilities (n, n_classes); a single-logit head gives [1 - s, s]."""
    s = head_logits(weight, z)
    if s.shape[1] == 1:
        p1 = 1.0 / (1.0 + np.exp(-s[:, 0]))
        return np.stack([1.0 - p1, p1], axis=1)
    s = s - s.max(axis=1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(axis=1, keepdims=True)


# ---------------------------------------------------------------- trainable modules


def _loss_fn(kind: str):
    if kind == "cross_entropy":
        return lambda out, target: torch.nn.functional.cross_entropy(out, target)
    if kind == "bce":
        return lambda out, target: torch.nn.functional.binary_cross_entropy_with_logits(out.reshape(-1), target.to(out.dtype).reshape(-1))
    raise UsageError(f"loss must be one of cross_entropy, bce, got {kind!r}.")


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
    """Clipped sum of per-sample gradients of ``module`` at ``params`` over the batch (x, y).

    Per-sample gradients via ``torch.func.vmap(torch.func.grad(...))``; each example's gradient is
    clipped to joint L2 norm ``clipping_norm`` over *all* trainable parameters (eq. 4).
    ``randomness="different"`` gives each example its own dropout mask, as a batch would.
    """
    from torch.func import functional_call, grad, vmap

    lf = _loss_fn(loss)
    buffers = dict(module.named_buffers())

    def one(p, xi, yi):
        out = functional_call(module, (p, buffers), (xi.unsqueeze(0),))
        return lf(out, yi.unsqueeze(0))

    gs = vmap(grad(one), in_dims=(None, 0, 0), randomness=randomness)(params, x, y)
    if not clip:
        return {k: g.sum(0) for k, g in gs.items()}
    sq = sum(g.reshape(g.shape[0], -1).pow(2).sum(1) for g in gs.values())
    coef = torch.clamp(clipping_norm / torch.clamp(sq.sqrt(), min=1e-30), max=1.0)
    return {k: torch.tensordot(coef, g, dims=([0], [0])) for k, g in gs.items()}


def train_module_dp_sgd(
    module: torch.nn.Module,
    x: np.ndarray | torch.Tensor,
    y: np.ndarray | torch.Tensor,
    config: DPSGDConfig,
    *,
    noise: NoiseSource,
    loss: str = "cross_entropy",
    progress: Progress | None = None,
    max_chunk: int = 1024,
) -> int:
    """DP-SGD (Adam) on every trainable parameter of ``module`` (in place). Returns executed steps.

    ``x`` must already have the shape the module expects (e.g. (n, C, H, W)). The module is put in
    training mode (dropout active; each example its own mask). Dropout masks are drawn from a
    generator seeded from the private noise source inside a forked RNG, so global torch RNG
    state is left untouched. Same privacy contract as :func:`run_dp_sgd`.
    """
    xt = torch.as_tensor(x)
    yt = torch.as_tensor(y)
    if xt.shape[0] != yt.shape[0]:
        raise UsageError(f"x and y must have the same number of rows, got {xt.shape[0]} and {yt.shape[0]}.")
    names = [n for n, p in module.named_parameters() if p.requires_grad]
    params = [p.detach().clone() for n, p in module.named_parameters() if p.requires_grad]
    frozen = {n: p.detach() for n, p in module.named_parameters() if not p.requires_grad}
    clip = not config.non_private
    module.train()

    def clipped_sum(ps, idx):
        pd = dict(zip(names, ps))
        pd.update(frozen)
        total = None
        for start in range(0, idx.size, max_chunk):  # bounds memory of per-sample gradients
            j = torch.as_tensor(idx[start:start + max_chunk])
            part = per_sample_clipped_sum(module, pd, xt[j], yt[j], config.clipping_norm, loss=loss, clip=clip)
            total = part if total is None else {k: total[k] + part[k] for k in total}
        return [total[n] for n in names]

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(noise.numpy.integers(0, 2**63 - 1)))
        steps = run_dp_sgd(params, clipped_sum, int(xt.shape[0]), config, noise=noise, progress=progress)
    with torch.no_grad():
        for (n, p), new in zip([(n, p) for n, p in module.named_parameters() if p.requires_grad], params):
            p.copy_(new)
    return steps

"""R independent DP-SGD runs of a linear head at once (for audits).

Each run is exactly the protocol of :func:`dpaudit.mechanisms.dpsgd.train_linear_head`: its own
Poisson sample at every step (independent across runs and steps), per-example clipping in
closed form, its own Gaussian noise N(0, (sigma C)^2 I) on the clipped sum, division by m0 and
its own Adam state. What is shared: the feature matrix (built once), and the per-step sampling,
noise draw and Adam update, which are single array operations over all R runs. The clipped sums
are computed run by run, each from a cache-resident gather of that run's rows into a reused
workspace (one padded tensor for all runs was measured slower: it falls out of cache).

Poisson sampling here draws the *gaps* between included records (i.i.d. Geometric(q) for a
Bernoulli(q) sequence), which gives exactly the same distribution as an (n,)-mask of Bernoulli
draws at O(q n) cost per run instead of O(n); the R runs' masks are consecutive blocks of one
Bernoulli sequence of length R n, hence independent. All of it comes from the private
:class:`~dpaudit.noise.NoiseSource` (a cryptographic source through its methods).

Canaries (for membership audits), :class:`HeadCanary`:
- ``kind="record"``: an extra example (``z``, ``y``) that belongs to the training set of every
  run with ``canary_in[r]`` True; like any record it is Poisson-sampled with rate q and clipped.
- ``kind="gradient"``: a fixed ``direction`` (K, d+1), rescaled to norm exactly ``clipping_norm``
  (the worst case allowed by clipping), added to the clipped sum at every step at which the
  canary is Poisson-sampled in a run with ``canary_in[r]`` True (Dirac canary).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..errors import UsageError
from ..noise import NoiseSource
from ..validation import one_of, positive_int
from .dpsgd import (DPSGDConfig, HeadWorkspace, Progress, _HeadAdam, _clipped_sum_kernel, _numpy_backed, blas_threads, check_head_inputs,
                    gaussian_filler, poisson_flat)


@dataclass(frozen=True, eq=False)
class HeadCanary:
    """An audit canary for linear-head runs (see module docstring)."""

    kind: str  # "record" or "gradient"
    z: np.ndarray | None = None  # (d,) features of a record canary
    y: int | None = None  # label of a record canary
    direction: np.ndarray | None = None  # (K, d+1) for a gradient canary

    def __post_init__(self) -> None:
        one_of("canary kind", self.kind, ("record", "gradient"))
        if self.kind == "record" and (self.z is None or self.y is None):
            raise UsageError("a record canary must have z and y, got None.")
        if self.kind == "gradient":
            if self.direction is None or not np.all(np.isfinite(self.direction)) or not np.any(self.direction):
                raise UsageError("a gradient canary direction must be a finite non-zero array, got an invalid one.")


def _bernoulli(noise: NoiseSource, runs: int, q: float) -> np.ndarray:
    """Independent Bernoulli(q) per run, from the private source."""
    return np.asarray(noise.poisson_mask(runs, q), dtype=bool)


def batched_head_clipped_sum(
    w: np.ndarray,
    z1: np.ndarray,
    z1_norm: np.ndarray,
    y: np.ndarray,
    idx_list: list[np.ndarray],
    clipping_norm: float,
    *,
    binary_logit: bool = False,
    clip: bool = True,
    buf: HeadWorkspace | None = None,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, HeadWorkspace]:
    """Per run r, the clipped sum of head gradients over rows ``idx_list[r]`` of ``z1`` at ``w[r]``.

    The closed form of :func:`~dpaudit.mechanisms.dpsgd.head_clipped_sum` (the same kernel), run
    by run: each run's sampled rows (about q n of them, ~1 MB for MNIST) are gathered into a reused
    buffer and both matrix products read them from cache. (Measured: one padded (R, b, d+1)
    tensor for all runs falls out of cache and is slower.) ``buf``, a workspace, is returned,
    possibly grown; ``out`` (R, K, d+1), if given, receives the sums. Returns (sums, buf).
    """
    runs, k, d1 = w.shape
    dtype = np.result_type(w.dtype, z1.dtype)
    z1 = np.require(z1, dtype=dtype, requirements=["C"])
    w = np.require(w, dtype=dtype, requirements=["C", "W"])
    z1_norm = np.asarray(z1_norm).astype(dtype, copy=False)
    y = np.asarray(y).astype(np.int64, copy=False)
    if out is None:
        out = np.zeros((runs, k, d1), dtype=dtype)
    bmax = max((ix.size for ix in idx_list), default=0)
    if buf is None or buf.dtype != dtype or buf.k != k or buf.d1 != d1:
        buf = HeadWorkspace(k, d1, dtype, rows=bmax)
    buf.ensure(bmax)
    w_t, out_t = torch.from_numpy(w), torch.from_numpy(out)
    for r, ix in enumerate(idx_list):
        _run_sum(buf, z1, z1_norm, y, ix, w_t[r], out_t[r], clipping_norm, binary_logit, clip)
    return out, buf


def _run_sum(ws, z1, z1_norm, y, ix, w_t, out_t, clipping_norm, binary_logit, clip, zn=None, yb=None) -> None:
    """One run's clipped sum over rows ``ix`` into ``out_t`` (zero for an empty batch)."""
    b = ix.size
    if b == 0:
        out_t.zero_()  # Algorithm 1, step 6: an empty batch has a zero clipped sum
        return
    ws.ensure(b)
    # mode="clip" avoids numpy's defensive copy of ``out``; every index is in range anyway.
    np.take(z1, ix, axis=0, out=ws.batch[:b], mode="clip")
    _clipped_sum_kernel(ws, w_t, b, z1_norm[ix] if zn is None else zn, y[ix] if yb is None else yb,
                        clipping_norm, binary_logit, clip, out_t=out_t)


@dataclass(frozen=True)
class BatchedHeadResult:
    """``weights`` (R, K, d+1), last column the bias; ``canary_samples[r]`` counts the steps at which
    the canary was sampled in run r (0 for runs without it)."""

    weights: np.ndarray
    steps_executed: int
    canary_samples: np.ndarray | None = None


def check_batched_inputs(z, y, n_classes: int, binary_logit: bool, runs: int, canary, canary_in):
    """Validate the inputs every batched head trainer takes; returns (z, y, K, canary_in)."""
    z, y, k = check_head_inputs(z, y, n_classes, binary_logit)
    if canary is not None:
        if canary_in is None or np.shape(canary_in) != (runs,):
            raise UsageError(f"canary_in must be a boolean array of shape ({runs},), got {None if canary_in is None else np.shape(canary_in)}.")
        canary_in = np.asarray(canary_in, dtype=bool)
    return z, y, k, canary_in


def augmented_features(parts: list, d: int, np_dtype) -> tuple[np.ndarray, np.ndarray]:
    """(z1, ||z1 rows||): the feature blocks stacked with a bias column of ones, written in place
    (no second copy of the feature matrix)."""
    z1 = np.empty((sum(len(p) for p in parts), d + 1), dtype=np_dtype)
    start = 0
    for part in parts:
        z1[start:start + len(part), :d] = part
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
        raise UsageError(f"init must have shape {(k, d + 1)} or {(runs, k, d + 1)}, got {init.shape}.")
    return init


def poisson_runs(noise: NoiseSource, fast: bool, runs: int, n: int, q: float) -> tuple[np.ndarray, np.ndarray]:
    """One step's Poisson samples of range(n) for every run: (flat indices, offsets of each run)."""
    if fast:
        return poisson_flat(noise.numpy, runs, n, q)
    # cryptographic or custom source: through its poisson_mask
    parts = [np.flatnonzero(noise.poisson_mask(n, q)) for _ in range(runs)]
    offsets = np.concatenate([[0], np.cumsum([p.size for p in parts])])
    return (np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)), offsets


def train_linear_heads_batched(
    z: np.ndarray,
    y: np.ndarray,
    n_classes: int,
    config: DPSGDConfig,
    *,
    noise: NoiseSource,
    runs: int,
    canary: HeadCanary | None = None,
    canary_in: np.ndarray | None = None,
    init: np.ndarray | None = None,
    binary_logit: bool = False,
    dtype: torch.dtype = torch.float32,
    progress: Progress | None = None,
    chunk_runs: int | None = 64,
) -> BatchedHeadResult:
    """Train ``runs`` independent private linear heads on features ``z`` (n, d) at once.

    ``init``: (K, d+1) shared by all runs or (R, K, d+1); zeros when omitted. ``canary_in``: (R,)
    booleans, which runs include the canary (required with ``canary``). Same privacy contract per
    run as :func:`~dpaudit.mechanisms.dpsgd.train_linear_head` (with the canary counted as one more
    unit in including runs).

    ``chunk_runs`` (a speed setting only): runs are trained in groups of this many, one group
    after another (bounding the memory of per-run state); the runs are independent either way.
    ``progress(steps_done, steps)`` is reported for each group in turn.
    """
    runs = positive_int("runs", runs)
    if chunk_runs is not None:
        chunk_runs = positive_int("chunk_runs", chunk_runs)
    z, y, k, canary_in = check_batched_inputs(z, y, n_classes, binary_logit, runs, canary, canary_in)
    n, d = z.shape
    np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
    rows = [z]
    labels = y.astype(np.int64)
    # The record canary is stored as row n of the feature matrix (never sampled by the ordinary
    # Poisson draw, which covers range(n) only).
    if canary is not None and canary.kind == "record":
        cz = np.asarray(canary.z, dtype=np.float64).reshape(1, -1)
        if cz.shape[1] != d or not (0 <= int(canary.y) < n_classes):
            raise UsageError(f"record canary must have {d} features and a label in [0, {n_classes}), got {cz.shape[1]} and {canary.y}.")
        rows.append(cz)
        labels = np.append(labels, int(canary.y))
    z1, z1_norm = augmented_features(rows, d, np_dtype)
    grad_canary = None
    if canary is not None and canary.kind == "gradient":
        direction = np.asarray(canary.direction, dtype=np.float64)
        if direction.shape != (k, d + 1):
            raise UsageError(f"gradient canary direction must have shape {(k, d + 1)}, got {direction.shape}.")
        grad_canary = (direction * (config.clipping_norm / np.linalg.norm(direction))).astype(np_dtype)
    w0 = initial_heads(init, runs, k, d)
    step = chunk_runs or runs
    weights, canary_counts, executed = [], [], []
    with blas_threads():
        for start in range(0, runs, step):
            stop = min(runs, start + step)
            w, steps_done, counts = _train_group(
                z1, z1_norm, labels, n, k, config, noise=noise, w0=w0[start:stop], dtype=dtype,
                canary=canary, canary_in=None if canary_in is None else canary_in[start:stop], grad_canary=grad_canary,
                progress=progress)
            weights.append(w)
            canary_counts.append(counts)
            executed.append(steps_done)
    return BatchedHeadResult(weights=np.concatenate(weights), steps_executed=min(executed),
                             canary_samples=None if canary is None else np.concatenate(canary_counts))


def _train_group(z1, z1_norm, y, n, k, config, *, noise, w0, dtype, canary, canary_in, grad_canary, progress):
    """The DP-SGD loop for one group of runs (see :func:`train_linear_heads_batched`).

    Per step: one Poisson draw for all runs (:func:`~dpaudit.mechanisms.dpsgd.poisson_flat`, the
    runs' masks being disjoint blocks of one Bernoulli sequence), the canary draws, each run's
    clipped sum, one Gaussian draw of shape (R, K, d+1), and one Adam update over all runs.
    """
    runs = w0.shape[0]
    d1 = z1.shape[1]
    np_dtype = z1.dtype
    w = np.array(w0, dtype=np_dtype, order="C")  # C order: ``init`` may be a broadcast view
    w_t = torch.from_numpy(w)  # shared memory: Adam updates w in place, the clipped sums read w_t
    adam = _HeadAdam(w, config)
    draw_noise = gaussian_filler(noise, np.empty_like(w), config.noise_std)
    std = config.noise_std
    clip = not config.non_private
    q = config.sample_rate
    fast = _numpy_backed(noise)
    counts = np.zeros(runs, dtype=np.int64) if canary is not None else None
    ws = HeadWorkspace(k, d1, np_dtype, rows=int(n * q + 8.0 * np.sqrt(n * q) + 16) + 1)
    sums = np.empty((runs, k, d1), dtype=np_dtype)  # reused every step (in-place noise and m0)
    sums_t = torch.from_numpy(sums)
    w_rows, sum_rows = list(w_t.unbind(0)), list(sums_t.unbind(0))  # per-run views, made once
    report_every = max(1, config.steps // 200)
    steps_done = 0
    for t in range(1, config.steps + 1):
        flat, offsets = poisson_runs(noise, fast, runs, n, q)
        zn_f, y_f = z1_norm[flat], y[flat]
        if canary is not None:
            hit = _bernoulli(noise, runs, q) & canary_in
            counts += hit
        for r in range(runs):
            lo, hi = offsets[r], offsets[r + 1]
            ix, zn, yb = flat[lo:hi], zn_f[lo:hi], y_f[lo:hi]
            if canary is not None and canary.kind == "record" and hit[r]:
                ix, zn, yb = np.append(ix, n), None, None  # the canary is row n of z1
            _run_sum(ws, z1, z1_norm, y, ix, w_rows[r], sum_rows[r], config.clipping_norm, k == 1, clip, zn=zn, yb=yb)
        if grad_canary is not None:
            sums += hit.astype(sums.dtype)[:, None, None] * grad_canary
        if std > 0.0:
            sums += draw_noise()
        sums /= config.normalizer
        adam.step(sums, t)  # exactly torch.optim.Adam, every run at once
        steps_done += 1
        if progress is not None and (steps_done % report_every == 0 or steps_done == config.steps):
            progress(steps_done, config.steps)
    return w.astype(np.float64), steps_done, counts

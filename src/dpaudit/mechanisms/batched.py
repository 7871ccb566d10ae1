"""R independent DP-SGD runs of a linear head at once, for record-level audits.

A thin front of the head engine :func:`dpaudit.mechanisms.engine.train_heads` -- the engine that
also trains releases (:func:`~dpaudit.mechanisms.dpsgd.train_linear_head` is its R = 1 case) -- so
each run is exactly the released protocol: its own Poisson sample at every step, per-example
clipping in closed form, its own Gaussian noise N(0, (sigma C)^2 I) on the clipped sum, division
by m0 and its own Adam state. What this module adds is the audit canary, :class:`HeadCanary`,
translated into the engine's only canary notion, a
:class:`~dpaudit.mechanisms.engine.CanaryHook`:
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
from ..validation import one_of
from .dpsgd import DPSGDConfig, HeadWorkspace, Progress, check_head_inputs, poisson_batch
from . import engine
from .engine import BatchedHeadResult, CanaryHook, _run_sum, augmented_features, canary_draw, initial_heads

__all__ = ["BatchedHeadResult", "HeadCanary", "augmented_features", "batched_head_clipped_sum", "check_batched_inputs", "initial_heads",
           "poisson_runs", "train_linear_heads_batched"]


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


def check_batched_inputs(z, y, n_classes: int, binary_logit: bool, runs: int, canary, canary_in):
    """Validate the inputs every batched head trainer takes; returns (z, y, K, canary_in)."""
    z, y, k = check_head_inputs(z, y, n_classes, binary_logit)
    if canary is not None:
        if canary_in is None or np.shape(canary_in) != (runs,):
            raise UsageError(f"canary_in must be a boolean array of shape ({runs},), got {None if canary_in is None else np.shape(canary_in)}.")
        canary_in = np.asarray(canary_in, dtype=bool)
    return z, y, k, canary_in


def poisson_runs(noise: NoiseSource, fast: bool, runs: int, n: int, q: float) -> tuple[np.ndarray, np.ndarray]:
    """One step's Poisson samples of range(n) for every run (``fast`` is ignored: the source decides),
    :func:`~dpaudit.mechanisms.dpsgd.poisson_batch`."""
    return poisson_batch(noise, runs, n, q)


_bernoulli = canary_draw  # the canary's per-run Bernoulli(q) draw (old name)


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
    unit in including runs): both are :func:`~dpaudit.mechanisms.engine.train_heads`.

    ``chunk_runs`` (a speed setting only): runs are trained in groups of this many, one group
    after another (bounding the memory of per-run state); the runs are independent either way.
    ``progress(steps_done, steps)`` is reported for each group in turn.
    """
    z, y, k, canary_in = check_batched_inputs(z, y, n_classes, binary_logit, runs, canary, canary_in)
    hook = None
    if canary is not None and canary.kind == "record":
        cz = np.asarray(canary.z, dtype=np.float64).reshape(1, -1)
        if cz.shape[1] != z.shape[1] or not (0 <= int(canary.y) < n_classes):
            raise UsageError(f"record canary must have {z.shape[1]} features and a label in [0, {n_classes}), got {cz.shape[1]} and {canary.y}.")
        hook = CanaryHook(included=canary_in, z=cz, y=np.array([int(canary.y)]))
    elif canary is not None:
        direction = np.asarray(canary.direction, dtype=np.float64)
        if direction.shape != (k, z.shape[1] + 1):
            raise UsageError(f"gradient canary direction must have shape {(k, z.shape[1] + 1)}, got {direction.shape}.")
        # the worst case clipping allows: norm exactly C
        hook = CanaryHook(included=canary_in, gradient=direction * (config.clipping_norm / np.linalg.norm(direction)))
    return engine.train_heads(z, y, n_classes, config, noise=noise, runs=runs, init=init, canary=hook, binary_logit=binary_logit, dtype=dtype,
                       progress=progress, chunk_runs=chunk_runs)

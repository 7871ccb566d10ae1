"""The record-level head audits' canary, :class:`HeadCanary`, for R runs of the head engine.

The audits train R independent runs at once with :func:`dpaudit.mechanisms.engine.train_heads`,
the loop that also trains releases (R = 1), so each run is exactly the released protocol. The
canary is translated (:meth:`HeadCanary.hook`) into the engine's only canary notion, a
:class:`~dpaudit.mechanisms.engine.CanaryHook`:
- ``kind="record"``: an extra example (``z``, ``y``) that belongs to the training set of every
  run with ``canary_in[r]`` True; like any record it is Poisson-sampled with rate q and clipped.
- ``kind="gradient"``: a fixed ``direction`` (K, d+1), rescaled to norm exactly ``clipping_norm``
  (the worst case allowed by clipping), added to the clipped sum at every step at which the
  canary is Poisson-sampled in a run with ``canary_in[r]`` True (Dirac canary).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError
from ..lazy import lazy_import
from ..validation import one_of
from .dpsgd_core import check_head_inputs
from .engine import CanaryHook
np = lazy_import("numpy")


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

    def hook(self, canary_in, *, k: int, d: int, n_classes: int, clipping_norm: float) -> CanaryHook:
        """The engine's :class:`~dpaudit.mechanisms.engine.CanaryHook` of this canary for runs
        ``canary_in`` (R,) on heads (K, d+1) over ``n_classes`` labels."""
        if self.kind == "record":
            cz = np.asarray(self.z, dtype=np.float64).reshape(1, -1)
            if cz.shape[1] != d or not (0 <= int(self.y) < n_classes):
                raise UsageError(f"record canary must have {d} features and a label in [0, {n_classes}), got {cz.shape[1]} and {self.y}.")
            return CanaryHook(included=canary_in, z=cz, y=np.array([int(self.y)]))
        direction = np.asarray(self.direction, dtype=np.float64)
        if direction.shape != (k, d + 1):
            raise UsageError(f"gradient canary direction must have shape {(k, d + 1)}, got {direction.shape}.")
        # the worst case clipping allows: norm exactly C
        return CanaryHook(included=canary_in, gradient=direction * (clipping_norm / np.linalg.norm(direction)))


def check_batched_inputs(z, y, n_classes: int, binary_logit: bool, runs: int, canary, canary_in):
    """Validate the inputs every batched head audit takes; returns (z, y, K, canary_in)."""
    z, y, k = check_head_inputs(z, y, n_classes, binary_logit)
    if canary is not None:
        if canary_in is None or np.shape(canary_in) != (runs,):
            raise UsageError(f"canary_in must be a boolean array of shape ({runs},), got {None if canary_in is None else np.shape(canary_in)}.")
        canary_in = np.asarray(canary_in, dtype=bool)
    return z, y, k, canary_in

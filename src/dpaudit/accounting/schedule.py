"""DP-SGD schedule from public quantities only (DP-RVFL paper, section 3.2).

For reference size N0, requested batch size B and E epochs:
J = ceil(N0 / B) batches per epoch, sample rate q = 1 / J, steps T = E * J, and the fixed
normaliser m0 = max(1, floor(q * N0)) that divides every noisy clipped sum (never the realised
Poisson batch size, which would leak).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..validation import positive_int
from .base import Record


@dataclass(frozen=True)
class Schedule(Record):
    batches_per_epoch: int
    sample_rate: float
    steps: int
    normalizer: int


def dp_sgd_schedule(n: int, batch_size: int, epochs: int) -> Schedule:
    n = positive_int("n", n)
    batch_size = positive_int("batch_size", batch_size)
    epochs = positive_int("epochs", epochs)
    j = -(-n // batch_size)  # ceil without floating point
    # floor(q * N0) with q = 1/J is exactly N0 // J in integers.
    return Schedule(
        batches_per_epoch=j, sample_rate=1.0 / j, steps=epochs * j, normalizer=max(1, n // j)
    )

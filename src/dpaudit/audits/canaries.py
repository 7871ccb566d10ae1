"""Canary kinds: what is inserted in the "in" world, per mechanism.

=============  ==========================================================================
``natural``    a real held-out record (never in the base data), inserted unchanged.
``max-clip``   a gradient canary: whenever Poisson-sampled, a fixed vector of norm exactly
               the clipping norm C is added to the clipped sum (the worst case clipping
               allows). DP-MixMin: zero-sum direction that moves weight toward the most-
               weighted sources of the reference mixture (appendix A.8). DP-SGD heads: one
               parameter coordinate whose data gradients vanish (a weight on an input
               feature that is zero in every training record, e.g. an MNIST border pixel,
               as in the tight-auditing literature); falls back to the coordinate with the
               smallest data activity, and says so. Gaussian: a record of norm C.
``mislabeled`` an input-space record with a wrong label (trained models).
``worst-case`` DP-ELM: the record in the data's input box whose sigmoid features are
               largest in every unit (found by a linear program), i.e. the record with the
               largest contribution to H^T H and H^T Y the sensitivity analysis allows.
=============  ==========================================================================

Canaries are public: chosen from the public seed and recorded in audit.json (``canary_info``).
"""

from __future__ import annotations

from ..errors import UsageError

CANARY_KINDS = ("natural", "max-clip", "mislabeled", "worst-case")

#: Canaries each mechanism family supports (first = default).
SUPPORTED: dict[str, tuple[str, ...]] = {
    "gaussian": ("max-clip", "natural"),
    "dp-mixmin": ("max-clip", "natural", "mislabeled"),
    "head": ("max-clip", "mislabeled", "natural"),
    "dp-elm": ("worst-case", "natural", "mislabeled"),
}


def check_canary(family: str, canary: str) -> str:
    allowed = SUPPORTED[family]
    if canary not in allowed:
        raise UsageError(f"canary for {family} must be one of {', '.join(allowed)}, got {canary!r}.")
    return canary

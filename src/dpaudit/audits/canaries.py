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

A canary's kind and norm are public (audit.json ``canary_info``); whatever its choice read from
the private data is written to audit_local.json only (:mod:`dpaudit.audit_outputs` lists which).
"""

from __future__ import annotations

from ..catalogue import CATALOGUE
from ..errors import UsageError


def audit_family(entry) -> str:
    """The audit family of a catalogue entry: ``head`` for the DP-SGD head models (one audit
    target serves them all), the mechanism's own name otherwise."""
    return "head" if entry.family == "dp-sgd-head" else entry.name


def supported(family: str) -> tuple[str, ...]:
    """The canaries an audit family supports (first = default), read from the catalogue when
    asked (an entry registered later, e.g. a new mechanism's, counts too)."""
    return next(e.canaries for e in CATALOGUE.values() if e.canaries and audit_family(e) == family)


def check_canary(family: str, canary: str) -> str:
    allowed = supported(family)
    if canary not in allowed:
        raise UsageError(
            f"canary must be one of {', '.join(allowed)} for {family} models, got {canary!r}."
        )
    return canary

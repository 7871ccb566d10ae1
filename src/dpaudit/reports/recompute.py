"""Epsilons the report recomputes from stored events (claim, budget and sweep sections), all through
:func:`dpaudit.claims.recompute_epsilon` and its cache, the one :func:`dpaudit.claims.verify_claim`
uses: no epsilon is computed twice or two ways."""

from __future__ import annotations

from typing import Any, Iterable

from ..accounting.events import Composed, event_from_dict
from ..ledger.compose import PRV_SKIP_ABOVE_RDP_EPSILON, sequential
from ..claims import recompute_epsilon
from ..errors import DPAuditError

#: The fields that group releases into one sequential composition (a row of a composition table).
GROUP_KEY = ("dataset", "partition", "adjacency")
#: Accountants recomputed side by side on every claim card.
SIDE_BY_SIDE = ("rdp", "prv")


def recomputed(guarantee: Any, delta: float | None, accountant: str, adjacency: str) -> dict:
    """{epsilon, lower, estimate, error} of :func:`dpaudit.claims.recompute_epsilon` (cached there)."""
    return recompute_epsilon(guarantee, delta, accountant, str(adjacency)).to_dict()


def compose_sequential(guarantees: Iterable[dict]) -> dict:
    """Sequential composition of stored guarantees as one event dict (the ledger's own,
    :func:`dpaudit.ledger.compose.sequential`: identical leaves merged, which is exact and
    keeps the accountants fast). Guarantees that do not parse are composed as they are (the
    accountant then reports the error)."""
    gs = list(guarantees)
    try:
        event = sequential([event_from_dict(g) for g in gs])
    except (DPAuditError, KeyError, TypeError, ValueError):
        return {"type": "composed", "events": gs} if len(gs) != 1 else gs[0]
    return (event or Composed(())).to_dict()


def composed(guarantees, delta: float | None, adjacency: str) -> dict[str, dict]:
    """rdp and prv (accountant -> :func:`recomputed`) of the sequential composition of ``guarantees`` at ``delta``
    ({} when delta is not in (0, 1)), with the ledger's rule: prv is not attempted where the rdp bound is
    already above :data:`dpaudit.ledger.compose.PRV_SKIP_ABOVE_RDP_EPSILON` (it fails there
    after seconds and GBs; leaving out a bound never lowers the reported minimum)."""
    if delta is None or not 0 < delta < 1:
        return {}
    tree = compose_sequential(guarantees)
    out: dict[str, dict] = {}
    for acc in SIDE_BY_SIDE:
        rdp = out.get("rdp", {}).get("epsilon")
        if acc == "prv" and rdp is not None and rdp > PRV_SKIP_ABOVE_RDP_EPSILON:
            why = f"not attempted: the rdp bound {rdp:.1f} exceeds {PRV_SKIP_ABOVE_RDP_EPSILON:g}, where prv-accountant is unreliable"
            out[acc] = {**dict.fromkeys(("epsilon", "lower", "estimate")), "error": why}
        else:
            out[acc] = recomputed(tree, delta, acc, adjacency)
    return out

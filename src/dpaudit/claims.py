"""Checking a release's privacy claim: the one place that decides whether a claim holds up.

A release claims ``epsilon`` at ``delta`` under its ``accountant`` and ``adjacency``, for the event tree stored in its
``guarantee``. :func:`verify_claim` re-derives that claim from the stored data and says whether it holds (:class:`ClaimCheck`),
for the reviewer report and ``dpaudit ledger record``; the release paths apply rules 2 and 3 before publishing and raise instead
(:func:`dpaudit.records.check_accounting`).

The rules, in the order of their precedence (the first that applies decides the status):

1. a non-private release makes no claim (``no-claim``);
2. steps executed must equal steps accounted (when both are recorded), else ``mismatch``: the stored guarantee does not describe
   what ran, so no epsilon computed from it is a bound;
3. the achieved (recorded) epsilon must not exceed the release's target epsilon, exactly (no tolerance: both are recorded numbers,
   and a release path withholds such a release), else ``mismatch``;
4. the epsilon recomputed from the stored guarantee with the release's own accountant, under its own adjacency, at its own delta,
   must not exceed the recorded epsilon by more than :data:`CLAIM_RTOL` (relative), else ``mismatch`` (an under-reported claim);
5. when the recomputation is impossible (an unknown accountant, an invalid delta, an event the accountant does not support, a
   malformed guarantee, a numerical failure) the claim is ``unverified``: never ``ok`` and never a guessed number.

``release`` arguments are :class:`dpaudit.records.Release` objects (read by attribute only: records imports this module for the
two rules the release paths apply)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from . import accounting
from .accounting.base import Record
from .errors import DPAuditError

#: Relative tolerance of rule 4 (plus :data:`CLAIM_ATOL`), the only tolerance of a claim check: a release written by another
#: dpaudit version (another RDP order grid, prv discretisation) recomputes slightly differently; 1e-3 is far below any difference
#: that matters and far above floating-point noise (same-version recomputations agree to ~1e-12).
CLAIM_RTOL = 1e-3
#: Absolute floor of the same rule, only relevant for claims near 0.
CLAIM_ATOL = 1e-9


def number(value: Any) -> float | None:
    """A float from a JSON value (numbers or the strings "inf"/"nan" records use), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def integer(value: Any) -> int | None:
    """An int from a finite JSON number, else None."""
    v = number(value)
    if v is None or not math.isfinite(v):
        return None
    return int(v)


def steps_accounted(release) -> int | None:
    """The number of steps the release's guarantee accounts for: ``steps``, else the steps of a top-level subsampled-Gaussian
    guarantee, else None (not recorded)."""
    if release.steps is not None:
        return integer(release.steps)
    g = release.guarantee if isinstance(release.guarantee, dict) else {}
    if g.get("type") == "subsampled-gaussian":
        return integer(g.get("steps"))
    return None


def steps_problem(
    steps_executed: int | None, steps_accounted: int | None, *, missing_ok: bool = True
) -> str | None:
    """Rule 2: why executed and accounted steps disagree, else None. ``missing_ok``: a count not recorded (None: older releases)
    is no problem; the release paths pass False (a run that cannot say how many steps it executed is withheld)."""
    if steps_executed == steps_accounted or (
        missing_ok and (steps_executed is None or steps_accounted is None)
    ):
        return None
    return f"steps executed ({steps_executed}) differ from steps accounted ({steps_accounted})"


def target_problem(epsilon: float, target_epsilon: float | None) -> str | None:
    """Rule 3: why the achieved epsilon exceeds the target (compared exactly), else None."""
    if target_epsilon is None or not epsilon > target_epsilon:
        return None
    return f"achieved epsilon {epsilon} exceeds the target {target_epsilon}"


def exceeds_claim(recomputed: float, claimed: float) -> bool:
    """Rule 4: True when ``recomputed`` is above ``claimed`` beyond :data:`CLAIM_RTOL`."""
    return recomputed > claimed * (1 + CLAIM_RTOL) + CLAIM_ATOL


@dataclass(frozen=True)
class Recomputed(Record):
    """Epsilon of a stored guarantee recomputed by one accountant; ``error`` says why not."""

    epsilon: float | None
    lower: float | None = None
    estimate: float | None = None
    error: str | None = None


#: Recomputed epsilons are a pure function of (guarantee, delta, accountant, adjacency): one process-wide cache serves every check
#: and report made in this process (a sweep's hundreds of releases share a handful of events).
_RECOMPUTED: dict[str, Recomputed] = {}


def recompute_epsilon(
    guarantee: Any, delta: float | None, accountant: str, adjacency: str
) -> Recomputed:
    """The epsilon of the stored ``guarantee`` at ``delta`` with ``accountant`` under ``adjacency``. Never raises for bad stored
    data: an unsupported event, a malformed guarantee or a numerical failure of an accountant library is returned as ``error``
    with no number (fail closed)."""
    key = json.dumps([guarantee, delta, accountant, adjacency], sort_keys=True, default=str)
    hit = _RECOMPUTED.get(key)
    if hit is not None:
        return hit
    try:
        r = accounting.compute_epsilon(
            accounting.event_from_dict(guarantee),
            delta=delta,
            accountant=accountant,
            adjacency=adjacency,
        )
        out = Recomputed(r.epsilon, r.epsilon_lower, r.epsilon_estimate)
    except DPAuditError as e:
        out = Recomputed(None, error=str(e))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        out = Recomputed(None, error=f"malformed guarantee ({type(e).__name__}: {e})")
    except (RuntimeError, ArithmeticError, MemoryError) as e:
        # e.g. prv-accountant's discretisation check: no number, never a guessed one
        out = Recomputed(None, error=f"{accountant} accountant failed ({type(e).__name__}: {e})")
    _RECOMPUTED[key] = out
    return out


@dataclass(frozen=True)
class ClaimCheck:
    """The verdict on one release's claim (the rules: module docstring). ``status``: ok | mismatch | unverified | no-claim, with
    a one-line ``reason``; ``ok`` only for ok and no-claim (an unverified claim is not ok). ``epsilon_status`` /
    ``epsilon_reason``: rules 3-5 alone (before the steps rule), so a caller can tell the two problems apart."""

    status: str
    reason: str
    release_id: str
    accountant: str
    adjacency: str
    delta: float | None
    recorded_epsilon: float | None
    recomputed_epsilon: float | None
    target_epsilon: float | None
    steps_executed: int | None
    steps_accounted: int | None
    epsilon_status: str
    epsilon_reason: str
    tolerance: float = CLAIM_RTOL

    @property
    def ok(self) -> bool:
        return self.status in ("ok", "no-claim")

    @property
    def steps_reason(self) -> str | None:
        """Rule 2 alone: why executed and accounted steps differ, else None."""
        if self.status == "no-claim":
            return None
        return steps_problem(self.steps_executed, self.steps_accounted)


def _not_recomputable(
    release, claimed: float | None, delta: float | None
) -> tuple[str, str] | None:
    """Rules 3-5 before any recomputation: (status, reason) when the claim cannot be recomputed, else None."""
    acc, known = release.accountant, accounting.ACCOUNTANTS
    if not isinstance(acc, str) or acc not in known:
        return "unverified", f"accountant {acc!r} cannot be recomputed (known: {', '.join(known)})"
    if claimed is None:
        return "mismatch", "the release states no numeric epsilon"
    if acc != "pure" and (delta is None or not 0 < delta < 1):
        return (
            "unverified",
            f"cannot recompute the {acc} epsilon: delta must be in (0, 1), got {release.delta!r}",
        )
    return None


def _epsilon_verdict(
    release, claimed: float | None, delta: float | None, target: float | None
) -> tuple[str, str, float | None]:
    """Rules 3-5: (status, reason, recomputed epsilon)."""
    acc, recomputed = release.accountant, None
    refused = _not_recomputable(release, claimed, delta)
    if refused is not None:
        status, reason = refused
    else:
        res = recompute_epsilon(release.guarantee, delta, acc, str(release.adjacency))
        recomputed = res.epsilon
        if recomputed is None:
            status, reason = "unverified", f"cannot recompute the {acc} epsilon: {res.error}"
        else:
            under_reported = exceeds_claim(recomputed, claimed)
            status = "mismatch" if under_reported else "ok"
            relation = ">" if under_reported else "<="
            reason = f"recomputed {acc} epsilon {recomputed:.4f} {relation} claimed {claimed:.4f}"
    over = target_problem(claimed, target) if claimed is not None else None
    if over is not None:
        status, reason = "mismatch", over
    return status, reason, recomputed


def verify_claim(release) -> ClaimCheck:
    """Check ``release``'s claim against its own stored guarantee, steps and target. Privacy contract: a release whose stored data
    give a larger epsilon than it claims, whose executed steps differ from the accounted ones, or whose achieved epsilon is above
    its target never gets status ``ok``; one that cannot be recomputed is ``unverified``."""
    claimed = number(release.epsilon)
    delta = number(release.delta)
    target = number(release.target_epsilon)
    s_exec = integer(release.steps_executed)
    s_acc = steps_accounted(release)
    if release.non_private:
        why = "non-private release: no privacy claim"
        eps_status, eps_reason, recomputed, steps = "no-claim", why, None, None
    else:
        eps_status, eps_reason, recomputed = _epsilon_verdict(release, claimed, delta, target)
        steps = steps_problem(s_exec, s_acc)
    status, reason = (eps_status, eps_reason) if steps is None else ("mismatch", steps)
    return ClaimCheck(
        status=status,
        reason=reason,
        release_id=str(release.id),
        accountant=str(release.accountant),
        adjacency=str(release.adjacency),
        delta=delta,
        recorded_epsilon=claimed,
        recomputed_epsilon=recomputed,
        target_epsilon=target,
        steps_executed=s_exec,
        steps_accounted=s_acc,
        epsilon_status=eps_status,
        epsilon_reason=eps_reason,
    )

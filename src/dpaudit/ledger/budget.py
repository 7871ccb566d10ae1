"""The budget arithmetic of the ledger: what a planned release or audit would do to each cap
(pure functions over the replayed, verified dataset states of :mod:`.compose` and the people
index of :mod:`.rows`; the budget book, :mod:`.book`, reads and writes around them).

Privacy contract: docs/ledger.md, "How the total is composed" and "One budget per person": a
planned spend is composed with everything its dataset (and every name sharing people with it)
already spent or holds, open reservations included unless they hold this very spend, and the
audits too when a cap counts them; a cap is decided on numbers computed here, never on a cached
file; an unbounded spend is never allowed under a cap it reaches.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from ..accounting.adjacency import Adjacency, require_same
from ..accounting.events import Event
from ..claims import integer, steps_accounted, steps_problem
from ..errors import BudgetExceededError, LedgerAdjacencyError, UsageError
from ..records import Release, public_noise_reason
from . import queries
from .compose import DatasetState, ReleaseView, dataset_total, fmt_epsilon, total_bounds
from .rows import PeopleIndex, check_caps

_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*$")


def check_name(what: str, value: object) -> str:
    """``value``, a dataset or partition name: letters, digits, '_', '-', '.', '/' separators."""
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise UsageError(
            f"{what} must be a non-empty name of letters, digits, '_', '-', '.' and "
            f"'/' separators, got {value!r}."
        )
    return value


def check_reason(reason: object) -> str:
    """``reason`` stripped: the non-empty explanation a cancel, void or version must give."""
    if not isinstance(reason, str) or not reason.strip():
        raise UsageError(f"reason must be a non-empty explanation, got {reason!r}.")
    return reason.strip()


@dataclass(frozen=True)
class PlannedSpend:
    """A release about to be made, as the budget checks see it (:meth:`~.book.Ledger.check`)."""

    dataset: str
    partition: str
    event: Event | None  # what it spends; None: non-private (unbounded)
    adjacency: str
    #: the plain digest of the private data it reads, checked against the dataset's recorded
    #: versions; ``data_info`` may hold the public ``split_seed`` / ``profile`` to name a change
    data_digest: str | None = None
    data_info: dict | None = None
    uncertified: str | None = None  # why its guarantee cannot be certified (it counts as unbounded)
    #: its Gaussian sampler's tail delta (dpaudit.noise), counted like a recorded release's
    noise_tail_delta: float = 0.0
    #: the source rows it reads (dpaudit.data.rows.RowSet s, or their keyed hashes)
    data_rows: object = None

    def __post_init__(self) -> None:
        check_name("dataset", self.dataset)
        check_name("partition", self.partition)

    def view(self, fingerprint: str) -> ReleaseView:
        """The planned spend as composition sees it (its noise tail checked to be a number >= 0)."""
        tail = float(self.noise_tail_delta)
        if not tail >= 0.0:
            raise UsageError(
                f"noise_tail_delta must be a number >= 0, got {self.noise_tail_delta!r}."
            )
        adjacency = Adjacency.parse(self.adjacency).value
        where = ("planned", self.dataset, self.partition, adjacency)
        spends = (None, None, self.event, self.event is None)  # no claim of its own yet
        known = {"fingerprint": fingerprint, "uncertified": self.uncertified}
        return ReleaseView(*where, *spends, noise_tail_delta=tail, **known)


def uncertified_reason(release: Release) -> str | None:
    """Why ``release``'s guarantee is not certified (it then counts as unbounded), else None: its DP
    noise is derived from its published seed (:func:`dpaudit.records.public_noise_reason`); its
    executed steps differ from the steps its guarantee accounts for (rule 2 of
    :mod:`dpaudit.claims`: the stored events do not describe what ran); or its noise sampler
    records ``certified: false`` in ``config["sampler_guarantee"]`` (the textbook floating-point
    Laplace sampler of DP-ELM holds its epsilon only in ideal arithmetic, Mironov 2012;
    :mod:`dpaudit.mechanisms.elm.laplace`)."""
    if getattr(release, "non_private", False):
        return None
    public = public_noise_reason(release.noise_source)
    if public is not None:
        return public
    steps = steps_problem(integer(release.steps_executed), steps_accounted(release))
    if steps is not None:
        return f"uncertified: {steps} (its stored guarantee does not describe what ran)"
    sampler = release.config.get("sampler_guarantee") if isinstance(release.config, dict) else None
    if isinstance(sampler, dict) and sampler.get("certified") is False:
        return sampler_uncertified_reason(str(sampler.get("sampler") or "unknown"))
    return None


def sampler_uncertified_reason(sampler: str) -> str:
    """The one wording of an uncertified sampler, shared by reservations and releases."""
    if sampler == "textbook":
        return (
            "uncertified: textbook floating-point Laplace sampler (ideal-arithmetic guarantee only)"
        )
    return f"uncertified: {sampler} sampler (no finite-precision guarantee)"


def unbounded_audit_refusal(dataset: str, payload: dict, cap: str) -> str:
    """The one-line refusal of an audit whose trials are unbounded (some train without DP noise)
    under ``cap``, a cap that counts audits: the cause and the way out."""
    reason = str(payload.get("unbounded_reason") or "trials without DP noise")
    if "no-noise control" in reason:
        fix = "run the audit with --no-controls (the no-noise control is what is unbounded)"
    elif "without DP noise" in reason:
        fix = "run the audit without --no-noise"
    else:
        fix = "audit a configuration with a certified, known privacy event"
    return (
        f"audit of dataset {dataset!r} refused before any trial ran: {reason}, so its cost is "
        f"unbounded (epsilon=inf) and {cap} counts audits; {fix}, or have the owner set the "
        "cap with --exclude-audits."
    )


def require_adjacency(state: DatasetState | None, adjacency: str, what: str) -> None:
    """Refuse (:class:`LedgerAdjacencyError`) an ``adjacency`` other than the one ``state``'s
    entries share (``what``: the entries compared, for the message)."""
    current = None if state is None else state.adjacency()
    if current is not None:
        require_same(current, adjacency, what, LedgerAdjacencyError)


def without_held(state: DatasetState, held) -> DatasetState:
    """``state`` without the open reservations ``held`` (those that already hold the planned
    release)."""
    if not held:
        return state
    held = set(held)
    kept = [r for r in state.releases if not (r.kind == "reservation" and r.id in held)]
    return dataclasses.replace(state, releases=kept)


def cap_columns(
    state: DatasetState, planned: ReleaseView, adjacency: str, accountants, *, allowed: bool
) -> dict:
    """The cap columns of :meth:`~.book.Ledger.check`: spent so far, what the planned release
    needs alone and the total with it, at the cap's delta."""
    cap_eps, cap_delta = state.cap
    before = dataset_total(state)
    alone = dataset_total(DatasetState(state.name, releases=[planned]))
    spent = total_bounds(before, delta=cap_delta, adjacency=adjacency, accountants=accountants)
    needs = total_bounds(alone, delta=cap_delta, adjacency=adjacency)
    total = queries.total_epsilon(state.with_release(planned), cap_delta, adjacency, accountants)
    return {
        "cap": {"epsilon": cap_eps, "delta": cap_delta},
        "spent": spent["epsilon"],
        "needs": needs["epsilon"],
        "total": total,
        "releases": before.releases_subtree,
        "reservations": before.reservations,
        "allowed": allowed and total <= cap_eps,
    }


def people_columns(
    states: dict, index: PeopleIndex, planned: ReleaseView, footprint: dict, result: dict
) -> None:
    """Role collisions (raise) and every cap reached through shared people (``result``: ``people``,
    and ``allowed`` False with ``people_refusal`` when one would be exceeded); see ledger.rows."""
    dataset = planned.dataset
    index.collisions(dataset, footprint)
    state = states.get(dataset) or DatasetState(dataset)
    after = {**states, dataset: state.with_release(planned)}
    index = index.with_planned(dataset, footprint)
    partition = planned.partition
    result["people"], refusal = check_caps(index, states, after, dataset, partition, footprint)
    if refusal is not None and result["allowed"]:
        result.update(allowed=False, people_refusal=refusal)


def refusal(plan: PlannedSpend, checked: dict) -> str | None:
    """The one-line refusal of :meth:`~.book.Ledger.preflight` for ``checked`` (None: allowed)."""
    if checked["allowed"]:
        return None
    cap = checked["cap"]
    if checked.get("people_refusal") and (cap is None or checked["total"] <= cap["epsilon"]):
        return checked["people_refusal"]
    open_held = checked.get("reservations")
    held = f" and {open_held} open reservation(s)" if open_held else ""
    why = f" ({plan.uncertified})" if plan.uncertified else ""
    spent, needs, total = (fmt_epsilon(checked[k]) for k in ("spent", "needs", "total"))
    return (
        f"budget of dataset {plan.dataset!r} exceeded: {checked['releases']} release(s){held} "
        f"already spent epsilon={spent}, this release on {plan.dataset}:{plan.partition} needs "
        f"epsilon={needs}{why} alone, composed total would be epsilon={total} > cap "
        f"epsilon={fmt_epsilon(cap['epsilon'])} at delta={cap['delta']:g}; "
        "refused before training."
    )


def check_audit(states: dict, index: PeopleIndex, view: ReleaseView, payload: dict) -> None:
    """Refuse (:class:`BudgetExceededError`) a planned audit that would push its dataset's releases
    and audits over a cap that includes audits, or any such cap reached through shared people
    (after its rows' role collisions, :class:`~dpaudit.errors.RowRoleCollisionError`)."""
    dataset = view.dataset
    state = states.get(dataset) or DatasetState(dataset)
    if state.cap is not None and state.cap_includes_audits:
        _check_audit_cap(state, view, payload)
    footprint = index.footprint(dataset, payload)
    index.collisions(dataset, footprint)
    after = {**states, dataset: dataclasses.replace(state, audits=state.audits + [view])}
    planned = index.with_planned(dataset, footprint)
    partition = payload["partition"]
    _, refused = check_caps(planned, states, after, dataset, partition, footprint, what="audit")
    if refused is not None and payload["non_private"]:
        cap = "a cap that counts audits and shares its people"
        refused = unbounded_audit_refusal(dataset, payload, cap)
    if refused is not None:
        raise BudgetExceededError(refused)


def _check_audit_cap(state: DatasetState, planned: ReleaseView, payload: dict) -> None:
    cap_eps, cap_delta = state.cap
    adj, accountants = payload["adjacency"], queries.AUDIT_ACCOUNTANTS
    # RDP only (AUDIT_ACCOUNTANTS): an upper bound, so the check is sound, and fast.
    spent = queries.total_epsilon(state.with_audits(), cap_delta, adj, accountants)
    with_it = dataclasses.replace(state, audits=state.audits + [planned]).with_audits()
    total = queries.total_epsilon(with_it, cap_delta, adj, accountants)
    if total > cap_eps and payload.get("non_private"):
        cap = f"its cap (epsilon {cap_eps:g} at delta {cap_delta:g})"
        raise BudgetExceededError(unbounded_audit_refusal(state.name, payload, cap))
    if total > cap_eps:
        raise BudgetExceededError(
            f"budget of dataset {state.name!r} exceeded: its releases and {len(state.audits)} "
            f"audit(s) already spent epsilon={fmt_epsilon(spent)}, this audit's "
            f"{payload['trials']} trials on {state.name}:{payload['partition']} would make it "
            f"epsilon={fmt_epsilon(total)} (rdp) > cap epsilon={fmt_epsilon(cap_eps)} at "
            f"delta={cap_delta:g} (the cap includes audits); refused before any trial ran."
        )

"""The budget arithmetic of the ledger: what each dataset and partition has spent (the summary
rows) and what a planned release or audit would do to each cap (pure functions over the replayed,
verified dataset states of :mod:`.compose` and the people index of :mod:`.rows`; the budget book,
:mod:`.book`, reads and writes around them).

Privacy contract: docs/ledger.md, "How the total is composed" and "One budget per person": a
planned spend is composed with everything its dataset (and every name sharing people with it)
already spent or holds, open reservations included unless they hold this very spend, and the
audits too when a cap counts them; a cap is decided on numbers computed here, never on a cached
file; an unbounded spend is never allowed under a cap it reaches.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

from ..accounting.adjacency import Adjacency, require_same
from ..accounting.events import Event
from ..claims import integer, steps_accounted, steps_problem
from ..errors import AdjacencyMismatchError, BudgetExceededError, LedgerAdjacencyError, UsageError
from ..progress import JobProgress
from ..records import Release, public_noise_reason
from .compose import DATASET_SCOPE, DEFAULT_DELTA, DatasetState, NodeTotal, ReleaseView
from .compose import dataset_total, fmt_epsilon, node_total, total_bounds
from .rows import PeopleIndex, check_caps, people_epsilon

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
        # one spelling for every check, payload and view of the spend
        object.__setattr__(self, "adjacency", Adjacency.parse(self.adjacency).value)

    def view(self, fingerprint: str) -> ReleaseView:
        """The planned spend as composition sees it (its noise tail checked to be a number >= 0)."""
        tail = float(self.noise_tail_delta)
        if not tail >= 0.0:
            raise UsageError(
                f"noise_tail_delta must be a number >= 0, got {self.noise_tail_delta!r}."
            )
        where = ("planned", self.dataset, self.partition, self.adjacency)
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


def cap_columns(state: DatasetState, planned: ReleaseView, *, allowed: bool) -> dict:
    """The cap columns of :meth:`~.book.Ledger.check`: what the cap counts spent so far, what the
    planned release needs alone and the total with it, at the cap's delta (under the planned
    adjacency)."""
    # the audits too when the cap includes them (then with the audit totals' fast RDP bound)
    with_audits = state.cap_includes_audits and state.audits
    accountants = AUDIT_ACCOUNTANTS if with_audits else ("rdp", "prv")
    (cap_eps, cap_delta), adjacency = state.cap, planned.adjacency
    state = state.budgeted()
    before = dataset_total(state)
    alone = DatasetState(state.name, releases=[planned])
    total = total_epsilon(state.with_release(planned), cap_delta, adjacency, accountants)
    return {
        "cap": {"epsilon": cap_eps, "delta": cap_delta},
        "spent": total_epsilon(state, cap_delta, adjacency, accountants),
        "needs": total_epsilon(alone, cap_delta, adjacency),
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
    state = states.get(planned.dataset) or DatasetState(planned.dataset)
    after = state.with_release(planned)
    result["people"], refusal = check_caps(index, states, planned, after, footprint)
    if refusal is not None and result["allowed"]:
        result.update(allowed=False, people_refusal=refusal)


def refuse(plan: PlannedSpend, checked: dict) -> None:
    """Raise the one-line refusal (:class:`BudgetExceededError`) of
    :meth:`~.book.Ledger.preflight` for ``checked``, unless it is allowed."""
    if checked["allowed"]:
        return
    cap = checked["cap"]
    if checked.get("people_refusal") and (cap is None or checked["total"] <= cap["epsilon"]):
        raise BudgetExceededError(checked["people_refusal"])
    open_held = checked.get("reservations")
    held = f" and {open_held} open reservation(s)" if open_held else ""
    why = f" ({plan.uncertified})" if plan.uncertified else ""
    spent, needs, total = (fmt_epsilon(checked[k]) for k in ("spent", "needs", "total"))
    raise BudgetExceededError(
        f"budget of dataset {plan.dataset!r} exceeded: {checked['releases']} release(s){held} "
        f"already spent epsilon={spent}, this release on {plan.dataset}:{plan.partition} needs "
        f"epsilon={needs}{why} alone, composed total would be epsilon={total} > cap "
        f"epsilon={fmt_epsilon(cap['epsilon'])} at delta={cap['delta']:g}; "
        "refused before training."
    )


def check_audit(states: dict, index: PeopleIndex, view: ReleaseView, payload: dict) -> None:
    """Refuse (:class:`BudgetExceededError`) a planned audit that would push its dataset's releases
    and audits over a cap that includes audits, or any such cap reached through shared people
    (after another adjacency than its releases' and audits', :class:`LedgerAdjacencyError`, and its
    rows' role collisions, :class:`~dpaudit.errors.RowRoleCollisionError`)."""
    dataset = view.dataset
    state = states.get(dataset) or DatasetState(dataset)
    what = f"the audit and the releases and audits on dataset {dataset!r}"
    require_adjacency(state.with_audits(), view.adjacency, what)
    after = dataclasses.replace(state, audits=state.audits + [view])
    if state.cap is not None and state.cap_includes_audits:
        _check_audit_cap(state, after, payload)
    footprint = index.footprint(dataset, payload)
    _, refused = check_caps(index, states, view, after, footprint)
    if refused is not None and payload["non_private"]:
        cap = "a cap that counts audits and shares its people"
        refused = unbounded_audit_refusal(dataset, payload, cap)
    if refused is not None:
        raise BudgetExceededError(refused)


def _check_audit_cap(state: DatasetState, after: DatasetState, payload: dict) -> None:
    """Refuse an audit that pushes ``state``'s releases and audits over its cap (``after``: the
    state with the audit)."""
    cap_eps, cap_delta = state.cap
    adj, accountants = payload["adjacency"], AUDIT_ACCOUNTANTS
    # RDP only (AUDIT_ACCOUNTANTS): an upper bound, so the check is sound, and fast.
    spent = total_epsilon(state.with_audits(), cap_delta, adj, accountants)
    total = total_epsilon(after.with_audits(), cap_delta, adj, accountants)
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


#: Accountants of the audit totals and of an audit's cap check: RDP, a sound upper bound that stays
#: fast on the thousands of steps an audit composes (docs/ledger.md, "Audits on the private data").
AUDIT_ACCOUNTANTS = ("rdp",)


def delta_for(state: DatasetState | None) -> float:
    """The delta a dataset's totals are reported at: its cap's, else :data:`~.compose.DEFAULT_DELTA`."""
    return state.cap[1] if state and state.cap else DEFAULT_DELTA


def total_epsilon(
    state: DatasetState, delta: float, adjacency: str | None, accountants=("rdp", "prv")
) -> float:
    """The smallest valid bound on ``state``'s dataset total at ``delta``."""
    return total_bounds(
        dataset_total(state), delta=delta, adjacency=adjacency, accountants=accountants
    )["epsilon"]


def audit_columns(state: DatasetState, delta: float) -> dict:
    """Summary keys of a dataset row with audits: the audits' own composed epsilon
    (``audit_epsilon``), releases and audits composed together (``epsilon_with_audits``), both at
    ``delta`` with :data:`AUDIT_ACCOUNTANTS` under the adjacency they share, and why the audits
    are unbounded if they are (``audit_unbounded_reasons``)."""
    adj = state.with_audits().adjacency()
    alone = dataclasses.replace(state, releases=list(state.audits), audits=[])
    return {
        "audit_epsilon": total_epsilon(alone, delta, adj, AUDIT_ACCOUNTANTS),
        "epsilon_with_audits": total_epsilon(state.with_audits(), delta, adj, AUDIT_ACCOUNTANTS),
        "audit_unbounded_reasons": list(dataset_total(alone).unbounded_reasons),
    }


def voided_epsilon(state: DatasetState, delta: float, accountants) -> float | None:
    """The composed epsilon of the releases and reservations that voids took out of the total (None: none)."""
    if not state.voided_views:
        return None
    voided = DatasetState(state.name, releases=list(state.voided_views))
    return total_epsilon(voided, delta, voided.adjacency(), accountants)


def people_summary(states: dict, index: PeopleIndex, accountants) -> dict:
    """Per dataset sharing people with others (:mod:`.rows`): the other names and the epsilon of
    all of them composed sequentially, at the dataset's delta."""
    out = {}
    for name in sorted(states):
        group = index.sharing(name)
        if not group:
            continue
        delta = delta_for(states[name])
        try:  # names that cannot be composed have no bound (a planned release is refused)
            epsilon = people_epsilon(states, [name] + group, delta, accountants=accountants)
        except AdjacencyMismatchError:
            epsilon = math.inf
        out[name] = {"shares_people_with": group, "epsilon_people": epsilon}
    return out


def summary_rows(
    states: dict, people: dict, accountants, *, whole: bool, progress: bool = False
) -> list[dict]:
    """The rows of :meth:`.book.Ledger.summary` for ``states`` (``people``: :func:`people_summary`;
    ``whole``: all of each dataset's releases, so ``remaining`` is defined)."""
    rows = []
    with JobProgress("datasets", enabled=progress) as bar:
        task = bar.add("composing the ledger", len(states))
        for name in sorted(states):
            rows += _dataset_rows(states[name], people.get(name), accountants, whole)
            bar.update(task, advance=1)
    return rows


def _cap_of(state: DatasetState) -> dict | None:
    """A dataset's cap as its summary row shows it (None: no cap)."""
    audits = {"include_audits": True} if state.cap_includes_audits else {}
    return {"epsilon": state.cap[0], "delta": state.cap[1], **audits} if state.cap else None


def _charged(epsilon: float, audits: dict, shared: dict | None) -> float:
    """What a dataset's cap is charged: its releases' epsilon, or releases + audits when the cap
    counts audits (``audits`` then holds it), and at least the epsilon of everything composed
    with the datasets that share its people."""
    counted = audits.get("epsilon_with_audits", epsilon)
    return max(counted, shared["epsilon_people"]) if shared else counted


def _dataset_rows(state: DatasetState, shared: dict | None, accountants, whole: bool) -> list[dict]:
    adj, delta = state.adjacency(), delta_for(state)
    total = dataset_total(state)
    bounds = total_bounds(total, delta=delta, adjacency=adj, accountants=accountants)
    cap = _cap_of(state)
    audits = audit_columns(state, delta) if state.audits else {}
    spent = _charged(bounds["epsilon"], audits if state.cap_includes_audits else {}, shared)
    common = {
        "adjacency": adj,
        "cap": cap,
        "remaining": (state.cap[0] - spent) if state.cap and whole else None,
    }
    scope = {
        "parent": None,
        "children": list(state.roots()),
        "subsets": [],
        "declared_by": None,
        "voided_releases": len(state.voided),
        # what voids took out of the total (never-published artefacts), shown apart
        "voided_epsilon": voided_epsilon(state, delta, accountants),
        "voided_published_releases": len(state.published_voids),
        "open_reservation_ids": [r.id for r in state.open_reservations()],
        # names whose releases read the same people, and everything composed with them; then the
        # audits on the private data, beside the releases, counted in the cap (and ``remaining``)
        # only when the cap includes audits
        "tail": {**(shared or {}), "audits": len(state.audits), **audits},
    }
    rows = [_node_row(state, DATASET_SCOPE, total, bounds, {**common, **scope})]
    for p in state.tree_order():
        node = node_total(state, p)
        where = {
            **common,
            "parent": state.parent(p),
            "children": list(state.children.get(p, ())),
            "subsets": state.subsets(p),
            "declared_by": state.declared_by.get(p),
            "tail": {"audits": None},
        }
        node_bounds = total_bounds(node, delta=delta, adjacency=adj, accountants=accountants)
        rows.append(_node_row(state, p, node, node_bounds, where))
    return rows


#: The summary's columns on voids (the dataset row's only).
_VOIDS = ("voided_releases", "voided_epsilon", "voided_published_releases")


def _node_row(st: DatasetState, p: str, nt: NodeTotal, b: dict, where: dict) -> dict:
    if nt.unbounded and nt.unbounded_reasons:
        # Say why the bound is infinite: a non-private or an uncertified release.
        # ("non-private release", "uncertified release", "uncertified reservation", ...)
        b = {**b, "bound_by": " ".join(nt.unbounded_reasons[0].split(" ")[:2])}
    return {
        "dataset": st.name,
        "partition": p,
        "node": st.name if p == DATASET_SCOPE else f"{st.name}:{p}",
        **{
            key: where[key] for key in ("parent", "children", "subsets", "declared_by", "adjacency")
        },
        "releases": nt.releases,
        "releases_subtree": nt.releases_subtree,
        "non_private_releases": nt.non_private,
        "unbounded": nt.unbounded,
        **b,
        "naive_epsilon": nt.naive_epsilon,
        "naive_delta": nt.naive_delta,
        **{key: where.get(key) for key in ("cap", "remaining", *_VOIDS)},
        "uncertified_releases": nt.uncertified,
        "unbounded_reasons": list(nt.unbounded_reasons),
        "open_reservations": nt.reservations,
        "open_reservation_ids": where.get("open_reservation_ids"),
        # keyed fingerprints only (see fingerprint.py); several = declared versions
        "dataset_fingerprints": sorted(st.fingerprints),
        **where["tail"],
    }

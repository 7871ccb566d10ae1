"""Read-only questions to the ledger: what each dataset and partition has spent (the summary rows).
Pure functions over the replayed, verified dataset states (:mod:`.compose`) and the people index (:mod:`.rows`).
"""

from __future__ import annotations

import dataclasses
import math

from ..errors import AdjacencyMismatchError
from ..progress import JobProgress
from .compose import DATASET_SCOPE, DEFAULT_DELTA, DatasetState, NodeTotal, dataset_total
from .compose import node_total, total_bounds
from .rows import PeopleIndex, adjacency_of, people_total

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


def audit_columns(
    state: DatasetState, delta: float, adj: str | None, accountants=AUDIT_ACCOUNTANTS
) -> dict:
    """Summary keys of a dataset row with audits: the audits' own composed epsilon
    (``audit_epsilon``), releases and audits composed together (``epsilon_with_audits``), both at
    ``delta`` with :data:`AUDIT_ACCOUNTANTS`, and why the audits are unbounded if they are
    (``audit_unbounded_reasons``)."""
    adj = state.with_audits().adjacency() or adj
    alone = dataclasses.replace(state, releases=list(state.audits), audits=[])
    return {
        "audit_epsilon": total_epsilon(alone, delta, adj, accountants),
        "epsilon_with_audits": total_epsilon(state.with_audits(), delta, adj, accountants),
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
        names = [name] + group
        try:  # names that cannot be composed have no bound (a planned release is refused)
            total = people_total(states, names)
        except AdjacencyMismatchError:
            out[name] = {"shares_people_with": group, "epsilon_people": math.inf}
            continue
        adj, delta = adjacency_of(states, names), delta_for(states[name])
        b = total_bounds(total, delta=delta, adjacency=adj, accountants=accountants)
        out[name] = {"shares_people_with": group, "epsilon_people": b["epsilon"]}
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
    audits = audit_columns(state, delta, adj) if state.audits else {}
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

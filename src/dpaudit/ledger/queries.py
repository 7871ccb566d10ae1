"""Read-only questions to the ledger: what each dataset and partition has spent (the summary rows).
Pure functions over the replayed, verified dataset states (:mod:`.compose`) and the people index (:mod:`.rows`).
"""

from __future__ import annotations

import dataclasses
import math

from ..errors import AdjacencyMismatchError
from ..progress import JobProgress
from . import compose as lc
from . import rows as lr

#: Accountants of the audit totals and of an audit's cap check: RDP, a sound upper bound that stays
#: fast on the thousands of steps an audit composes (docs/ledger.md, "Audits on the private data").
AUDIT_ACCOUNTANTS = ("rdp",)


def delta_for(state: lc.DatasetState | None) -> float:
    """The delta a dataset's totals are reported at: its cap's, else :data:`~.compose.DEFAULT_DELTA`."""
    return state.cap[1] if state and state.cap else lc.DEFAULT_DELTA


def total_epsilon(
    state: lc.DatasetState, delta: float, adjacency: str | None, accountants=("rdp", "prv")
) -> float:
    """The smallest valid bound on ``state``'s dataset total at ``delta``."""
    return lc.total_bounds(
        lc.dataset_total(state), delta=delta, adjacency=adjacency, accountants=accountants
    )["epsilon"]


def audit_columns(
    st: lc.DatasetState, delta: float, adj: str | None, accountants=AUDIT_ACCOUNTANTS
) -> dict:
    """Summary keys of a dataset row with audits: the audits' own composed epsilon
    (``audit_epsilon``), releases and audits composed together (``epsilon_with_audits``), both at
    ``delta`` with :data:`AUDIT_ACCOUNTANTS`, and why the audits are unbounded if they are
    (``audit_unbounded_reasons``)."""
    adj = st.with_audits().adjacency() or adj
    alone = dataclasses.replace(st, releases=list(st.audits), audits=[])
    return {
        "audit_epsilon": total_epsilon(alone, delta, adj, accountants),
        "epsilon_with_audits": total_epsilon(st.with_audits(), delta, adj, accountants),
        "audit_unbounded_reasons": list(lc.dataset_total(alone).unbounded_reasons),
    }


def voided_epsilon(state: lc.DatasetState, delta: float, accountants) -> float | None:
    """The composed epsilon of the releases and reservations that voids took out of the total (None: none)."""
    if not state.voided_views:
        return None
    voided = lc.DatasetState(state.name, releases=list(state.voided_views))
    return total_epsilon(voided, delta, voided.adjacency(), accountants)


def people_summary(states: dict, index: lr.PeopleIndex, accountants) -> dict:
    """Per dataset sharing people with others (:mod:`.rows`): the other names and the epsilon of
    all of them composed sequentially, at the dataset's delta."""
    out = {}
    for name in sorted(states):
        group = index.sharing(name)
        if not group:
            continue
        try:
            total = lr.people_total(states, [name] + group)
        except (
            AdjacencyMismatchError
        ):  # cannot be composed: no bound (a planned release is refused)
            out[name] = {"shares_people_with": group, "epsilon_people": math.inf}
            continue
        b = lc.total_bounds(
            total,
            delta=delta_for(states[name]),
            adjacency=lr.adjacency_of(states, [name] + group),
            accountants=accountants,
        )
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


def _cap_of(st: lc.DatasetState) -> dict | None:
    """A dataset's cap as its summary row shows it (None: no cap)."""
    audits = {"include_audits": True} if st.cap_includes_audits else {}
    return {"epsilon": st.cap[0], "delta": st.cap[1], **audits} if st.cap else None


def _charged(epsilon: float, audits: dict, shared: dict | None) -> float:
    """What a dataset's cap is charged: its releases' epsilon, or releases + audits when the cap
    counts audits (``audits`` then holds it), and at least the epsilon of everything composed
    with the datasets that share its people."""
    counted = audits.get("epsilon_with_audits", epsilon)
    return max(counted, shared["epsilon_people"]) if shared else counted


def _dataset_rows(st: lc.DatasetState, shared: dict | None, accountants, whole: bool) -> list[dict]:
    adj, delta = st.adjacency(), delta_for(st)
    total = lc.dataset_total(st)
    tb = lc.total_bounds(total, delta=delta, adjacency=adj, accountants=accountants)
    cap = _cap_of(st)
    audits = audit_columns(st, delta, adj) if st.audits else {}
    spent = _charged(tb["epsilon"], audits if st.cap_includes_audits else {}, shared)
    common = {
        "adjacency": adj,
        "cap": cap,
        "remaining": (st.cap[0] - spent) if st.cap and whole else None,
    }
    scope = {
        "parent": None,
        "children": list(st.roots()),
        "subsets": [],
        "declared_by": None,
        "voided_releases": len(st.voided),
        # what voids took out of the total (never-published artefacts), shown apart
        "voided_epsilon": voided_epsilon(st, delta, accountants),
        "voided_published_releases": len(st.published_voids),
        "open_reservation_ids": [r.id for r in st.open_reservations()],
        # names whose releases read the same people, and everything composed with them; then the
        # audits on the private data, beside the releases, counted in the cap (and ``remaining``)
        # only when the cap includes audits
        "tail": {
            **(
                {
                    "shares_people_with": shared["shares_people_with"],
                    "epsilon_people": shared["epsilon_people"],
                }
                if shared
                else {}
            ),
            "audits": len(st.audits),
            **audits,
        },
    }
    rows = [_node_row(st, lc.DATASET_SCOPE, total, tb, {**common, **scope})]
    for p in st.tree_order():
        nt = lc.node_total(st, p)
        where = {
            **common,
            "parent": st.parent(p),
            "children": list(st.children.get(p, ())),
            "subsets": st.subsets(p),
            "declared_by": st.declared_by.get(p),
            "tail": {"audits": None},
        }
        rows.append(
            _node_row(
                st,
                p,
                nt,
                lc.total_bounds(nt, delta=delta, adjacency=adj, accountants=accountants),
                where,
            )
        )
    return rows


def _node_row(st: lc.DatasetState, p: str, nt: lc.NodeTotal, b: dict, where: dict) -> dict:
    if nt.unbounded and nt.unbounded_reasons:
        # Say why the bound is infinite: a non-private or an uncertified release.
        # ("non-private release", "uncertified release", "uncertified reservation", ...)
        b = {**b, "bound_by": " ".join(nt.unbounded_reasons[0].split(" ")[:2])}
    return {
        "dataset": st.name,
        "partition": p,
        "node": st.name if p == lc.DATASET_SCOPE else f"{st.name}:{p}",
        "parent": where["parent"],
        "children": where["children"],
        "subsets": where["subsets"],
        "declared_by": where["declared_by"],
        "adjacency": where["adjacency"],
        "releases": nt.releases,
        "releases_subtree": nt.releases_subtree,
        "non_private_releases": nt.non_private,
        "unbounded": nt.unbounded,
        **b,
        "naive_epsilon": nt.naive_epsilon,
        "naive_delta": nt.naive_delta,
        "cap": where["cap"],
        "remaining": where["remaining"],
        "voided_releases": where.get("voided_releases"),
        "voided_epsilon": where.get("voided_epsilon"),
        "voided_published_releases": where.get("voided_published_releases"),
        "uncertified_releases": nt.uncertified,
        "unbounded_reasons": list(nt.unbounded_reasons),
        "open_reservations": nt.reservations,
        "open_reservation_ids": where.get("open_reservation_ids"),
        # keyed fingerprints only (see fingerprint.py); several = declared versions
        "dataset_fingerprints": sorted(st.fingerprints),
        **where["tail"],
    }

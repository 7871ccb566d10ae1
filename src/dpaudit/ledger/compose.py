"""Budget composition over the ledger's partition tree (pure functions, no I/O).

Privacy contract: docs/ledger.md, "How the total is composed": ``total(P) = Composed(releases on P,
undeclared subsets of P, Parallel(declared children of P))`` (the worst child, McSherry 2009),
disjointness declared, never inferred, unbounded never 0; every reported epsilon an upper bound,
the headline the smallest; noise tails summed and composed soundly (:func:`bounds`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import OrderedDict
from dataclasses import dataclass, field

from ..accounting.accountants import compute_epsilon, merge_leaves
from ..accounting.adjacency import Adjacency
from ..accounting.base import first_line
from ..accounting.events import Composed, Event, Parallel, PureEpsilon, SubsampledGaussian
from ..accounting.events import event_from_dict
from ..claims import number
from ..errors import AdjacencyMismatchError, LedgerError, UnsupportedEventError, UsageError
from . import result_cache

#: delta used to report composed epsilons for a dataset without a cap.
DEFAULT_DELTA = 1e-5
#: the summary row that stands for the whole dataset (all root partitions).
DATASET_SCOPE = "*"
#: Parents of the DP-MixMin split declared before the keyed split rule, not honoured as disjoint (see :func:`replay`).
_UNSTABLE_SPLIT = re.compile(r"^train/mixmin(-user)?-rho[^/]*-seed-?\d+$")


def fmt_epsilon(x: float) -> str:
    """An epsilon as the ledger's refusals print it."""
    return "inf" if math.isinf(x) else f"{x:.4f}"


def unstable_declaration(parent: str, declared_by: str) -> bool:
    """True for a partition declaration whose disjointness no longer holds (see :data:`_UNSTABLE_SPLIT`)."""
    return declared_by == "dp-mixmin" and bool(_UNSTABLE_SPLIT.match(parent))


def parse_event(data: object, what: str = "guarantee") -> Event:
    """Decode a stored event; anything unreadable is an error, never epsilon 0."""
    try:
        return event_from_dict(data)  # type: ignore[arg-type]
    except UnsupportedEventError as e:
        raise UnsupportedEventError(f"{what} cannot be parsed: {e}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise UnsupportedEventError(
            f"{what} must be a valid event dict, got {data!r} ({type(e).__name__}: {e})."
        ) from None


# ---------------------------------------------------------------- state


@dataclass(frozen=True)
class ReleaseView:
    """What composition needs from one release entry."""

    id: str
    dataset: str
    partition: str
    adjacency: str
    epsilon: float | None  # the release's own claim (for the naive sum)
    delta: float | None
    event: Event | None  # None only for a non-private release
    non_private: bool
    mechanism: str = ""
    #: the dataset identity the release was made on (:func:`entry_identity`); "" unknown.
    fingerprint: str = ""
    #: "release", or "reservation" for budget held by a run that has not released yet.
    kind: str = "release"
    #: why the release's guarantee cannot be certified (it then counts as unbounded), else None.
    uncertified: str | None = None
    #: delta added by the noise sampler's truncated tails (dpaudit.noise); 0 when not recorded.
    noise_tail_delta: float = 0.0


@dataclass
class DatasetState:
    """Everything the ledger knows about one dataset, replayed from the entries in order."""

    name: str
    releases: list = field(default_factory=list)  # ReleaseView, not voided
    voided: dict = field(default_factory=dict)  # release id -> void entry id
    cap: tuple | None = None  # (epsilon, delta), latest cap entry wins
    children: dict = field(default_factory=dict)  # parent -> tuple of children
    parent_of: dict = field(default_factory=dict)  # child -> parent
    declared_by: dict = field(default_factory=dict)  # parent -> who declared the split
    fingerprints: set = field(default_factory=set)  # every data identity recorded under the name
    #: declared extra identity -> declare-version entry id
    versions: dict = field(default_factory=dict)
    #: audits that trained on this dataset's private records (ReleaseView kind "audit", not voided):
    #: shown beside the releases, and counted in a cap only when that cap says so
    audits: list = field(default_factory=list)
    cap_includes_audits: bool = False  # the latest cap entry's ``include_audits``
    #: voided releases / reservations whose artefacts were never published: not counted
    voided_views: list = field(default_factory=list)
    #: voided entries whose artefacts were published (or not said): withdrawn, but their budget stays spent
    published_voids: set = field(default_factory=set)

    def partitions(self) -> list[str]:
        """Every partition named by a release or a declaration, plus its path ancestors."""
        names = {r.partition for r in self.releases}
        names.update(self.children)
        names.update(self.parent_of)
        for n in list(names):
            while "/" in n:  # "train/mix" lies inside "train", so "train" is a node too
                n = n.rsplit("/", 1)[0]
                names.add(n)
        return sorted(names)

    def parent(self, partition: str) -> str | None:
        """The declared parent, else the path prefix ("train" for "train/x"), else None."""
        if partition in self.parent_of:
            return self.parent_of[partition]
        return partition.rsplit("/", 1)[0] if "/" in partition else None

    def subsets(self, partition: str) -> list[str]:
        """Undeclared sub-partitions (by path): subsets that may overlap each other."""
        return [
            n
            for n in self.partitions()
            if n not in self.parent_of and "/" in n and n.rsplit("/", 1)[0] == partition
        ]

    def tree_order(self) -> list[str]:
        """Partitions depth-first from the roots: declared children in order, then subsets."""
        out: list[str] = []

        def visit(p: str) -> None:
            if p in out:
                return
            out.append(p)
            for c in list(self.children.get(p, ())) + self.subsets(p):
                visit(c)

        for r in self.roots():
            visit(r)
        return out

    def roots(self) -> list[str]:
        return [p for p in self.partitions() if self.parent(p) is None]

    def with_release(self, release: "ReleaseView") -> "DatasetState":
        """A copy with one more (planned) release; the budget pre-check composes this."""
        return dataclasses.replace(self, releases=self.releases + [release])

    def with_audits(self) -> "DatasetState":
        """A copy whose releases include the audits: what releases and audits spent together."""
        return dataclasses.replace(self, releases=self.releases + self.audits)

    def budgeted(self) -> "DatasetState":
        """What the cap counts: the releases, and the audits too when the cap includes them."""
        return self.with_audits() if self.cap_includes_audits else self

    def open_reservations(self) -> list["ReleaseView"]:
        return [r for r in self.releases if r.kind == "reservation"]

    def known_identity(self, fingerprint: str) -> bool:
        """True when releases on ``fingerprint`` may be recorded under this name: nothing with an
        identity is recorded yet, or ``fingerprint`` is a recorded or declared version."""
        return not self.fingerprints or fingerprint in self.fingerprints

    def version_groups(self) -> list["DatasetState"]:
        """One state per data identity (keyed fingerprint; unknown identity is a group of its own).
        Versions may share records in any way: each version's tree is composed on its own and the
        versions *sequentially* (a disjoint split of one says nothing about the other's records)."""
        groups: dict[str, list] = {}
        for r in self.releases:
            groups.setdefault(r.fingerprint, []).append(r)
        if len(groups) <= 1:
            return [self]
        return [dataclasses.replace(self, releases=rs) for rs in groups.values()]

    def adjacency(self) -> str | None:
        """The one adjacency all releases share; two different ones is an error naming both."""
        first: ReleaseView | None = None
        for r in self.releases:
            if first is None:
                first = r
            elif Adjacency.parse(r.adjacency) is not Adjacency.parse(first.adjacency):
                raise AdjacencyMismatchError(
                    f"cannot compose releases on dataset {self.name!r} under different adjacency: "
                    f"{first.adjacency} (release {first.id}) vs {r.adjacency} (release {r.id})."
                )
        return None if first is None else Adjacency.parse(first.adjacency).value

    def check_partition(self, parent: str, children: tuple[str, ...]) -> bool:
        """Validate a new split; True if the identical split is already declared (no-op)."""
        if parent in self.children:
            if set(self.children[parent]) == set(children):
                return True
            raise UsageError(
                f"partition {self.name}:{parent} must be split only once, got a second split into "
                f"{', '.join(children)} (already {', '.join(self.children[parent])})."
            )
        for c in children:
            if c in self.parent_of:
                raise UsageError(
                    f"partition {self.name}:{c} must have one parent, got {parent!r} besides {self.parent_of[c]!r}."
                )
        # A child that is an ancestor of the parent (declared or by path) would make a cycle.
        node: str | None = parent
        seen = set()
        while node is not None and node not in seen:
            seen.add(node)
            node = self.parent(node)
            if node in children:
                raise UsageError(
                    f"partition {self.name}:{parent} must not be split into its own ancestor, got {node!r}."
                )
        return False

    def add_partition(self, parent: str, children: tuple[str, ...], declared_by: str) -> None:
        if self.check_partition(parent, children):
            return
        self.children[parent] = tuple(children)
        for c in children:
            self.parent_of[c] = parent
        self.declared_by[parent] = declared_by


def entry_identity(payload: dict) -> str:
    """The keyed ``dataset_fingerprint`` of a release or reservation payload; for entries written
    before keyed fingerprints, the plain ``dataset_sha256`` (the book shows and composes such
    entries with the keyed fingerprint it derives, :meth:`~.book.Ledger._public_payload`); ""
    unknown."""
    for key in ("dataset_fingerprint", "dataset_sha256"):
        if isinstance(payload.get(key), str) and payload[key]:
            return payload[key]
    return ""


def release_view(entry_id: str, dataset: str, payload: dict, kind: str = "release") -> ReleaseView:
    """Decode a stored release (or reservation) payload (see ``Ledger.record`` and
    ``Ledger.reserve``); fail closed on anything odd."""
    non_private = bool(payload.get("non_private", False))
    event = None
    if not non_private:
        event = parse_event(payload.get("guarantee"), f"guarantee of {kind} {entry_id}")
    uncertified = payload.get("uncertified")
    tail = payload.get("noise_tail_delta")
    tail = 0.0 if tail is None else number(tail)
    # unreadable or negative: no bound on the tails (fail closed)
    tail = math.inf if tail is None or not tail >= 0.0 else tail
    where = (entry_id, dataset, str(payload["partition"]), str(payload["adjacency"]))
    claim = (number(payload.get("epsilon")), number(payload.get("delta")))
    return ReleaseView(
        *where,
        *claim,
        event,
        non_private,
        mechanism=str(payload.get("mechanism", "")),
        fingerprint=entry_identity(payload),
        kind=kind,
        uncertified=str(uncertified) if uncertified else None,
        noise_tail_delta=tail,
    )


#: Entries that close an open reservation (the run released, failed, or the operator voided it).
CLOSING_KINDS = ("settle", "cancel", "void")


def _close(st: DatasetState, e, r: ReleaseView) -> None:
    """Apply a settle / cancel / void entry ``e`` to its target ``r``."""
    void = e.kind == "void"
    if void and r.kind != "reservation":
        st.voided[r.id] = e.id
    if void and e.payload.get("artefacts_published") is not False:
        _keep_published(st, r)
        return
    if void:
        st.voided_views.append(r)
    st.releases = [x for x in st.releases if x.id != r.id]
    st.audits = [x for x in st.audits if x.id != r.id]


def _keep_published(st: DatasetState, r: ReleaseView) -> None:
    """A published artefact (or one not said to be unpublished) has spent its budget: a void takes
    nothing back. A voided release or reservation counts as a release; an audit stays counted
    beside the releases."""
    st.published_voids.add(r.id)
    if r.kind != "audit":
        st.releases = [
            dataclasses.replace(x, kind="release") if x.id == r.id else x for x in st.releases
        ]


def _state(states: dict, name: str) -> DatasetState:
    return states.setdefault(name, DatasetState(name))


def _spend(states: dict, by_id: dict, e) -> None:
    """A release, reservation or audit: composed from here on."""
    r = by_id[e.id] = release_view(e.id, e.dataset, e.payload, e.kind)
    st = _state(states, e.dataset)
    if e.kind == "audit":
        st.audits.append(r)
        return
    st.releases.append(r)
    if r.fingerprint:
        st.fingerprints.add(r.fingerprint)


def _closing(states: dict, by_id: dict, e) -> None:
    target = e.payload["target"]
    r = by_id.get(target)
    if r is None:
        raise LedgerError(
            f"{e.kind} entry {e.id} references unknown entry {target}; run `dpaudit ledger verify`."
        )
    if e.kind != "void" and r.kind != "reservation":
        raise LedgerError(
            f"{e.kind} entry {e.id} references {r.kind} {target}, not a reservation; "
            "run `dpaudit ledger verify`."
        )
    _close(_state(states, r.dataset), e, r)


def _version(states: dict, by_id: dict, e) -> None:
    st, fingerprint = _state(states, e.dataset), str(e.payload["fingerprint"])
    st.versions[fingerprint] = e.id
    st.fingerprints.add(fingerprint)


def _cap(states: dict, by_id: dict, e) -> None:
    st = _state(states, e.dataset)
    st.cap = (float(e.payload["epsilon"]), float(e.payload["delta"]))
    st.cap_includes_audits = bool(e.payload.get("include_audits", False))


def _partition(states: dict, by_id: dict, e) -> None:
    parent, declared_by = str(e.payload["parent"]), str(e.payload.get("declared_by", ""))
    if unstable_declaration(parent, declared_by):
        # A seeded permutation of n records: a neighbouring dataset
        # moves other records between the sides, so the parallel claim does not hold.
        # Ignored, the children stay undeclared subsets: sequential (sound).
        return
    _state(states, e.dataset).add_partition(parent, tuple(e.payload["children"]), declared_by)


#: How each entry kind changes the dataset states; ledger-wide kinds (signing keys, signature
#: policy, row sets, audit plans, seals) spend no budget of any dataset.
_APPLY = {"version": _version, "cap": _cap, "partition": _partition}
_APPLY.update(dict.fromkeys(("release", "reservation", "audit"), _spend))
_APPLY.update(dict.fromkeys(CLOSING_KINDS, _closing))
_APPLY.update(dict.fromkeys(("key", "policy", "rows", "plan", "seal"), lambda *_: None))
#: Every entry kind a ledger may hold (any other is unreadable: written by a newer dpaudit or edited).
ENTRY_KINDS = tuple(_APPLY)


def replay(entries) -> dict[str, DatasetState]:
    """Rebuild every dataset's state from entries (objects with id, kind, dataset, payload) in
    order. An open reservation counts like a release until a ``settle``, ``cancel`` or ``void``
    entry closes it."""
    states: dict[str, DatasetState] = {}
    by_id: dict[str, ReleaseView] = {}
    for e in entries:
        apply = _APPLY.get(e.kind)
        if apply is None:
            raise LedgerError(
                f"entry {e.id} has unknown kind {e.kind!r}; it was written by a "
                "newer dpaudit or edited."
            )
        try:
            apply(states, by_id, e)
        except (KeyError, TypeError, ValueError) as ex:
            raise LedgerError(
                f"entry {e.id} ({e.kind}) is malformed ({type(ex).__name__}: {ex}); "
                "run `dpaudit ledger verify`."
            ) from None
    return states


# ---------------------------------------------------------------- event trees


def sequential(events) -> Event | None:
    """Sequential composition, flattened, with identical leaves merged (exact: steps add; see
    :func:`~dpaudit.accounting.accountants.merge_leaves`). Parallel nodes are kept as they are.
    None when nothing is spent."""
    leaves, others = _flatten(events)
    merged = merge_leaves(leaves)
    # Sorted: composition is commutative, and one canonical order lets a dataset total and a
    # partition with the same releases share one (cached) accountant call.
    gaussians = [x for x in merged if isinstance(x, SubsampledGaussian) and x.steps > 0]
    pures = [x for x in merged if isinstance(x, PureEpsilon) and x.count > 0]
    out: list = sorted(gaussians, key=lambda x: (x.noise_multiplier, x.sample_rate))
    out += sorted(pures, key=lambda x: x.epsilon)
    out += others
    if not out:
        return None
    return out[0] if len(out) == 1 else Composed(tuple(out))


def _flatten(events) -> tuple[list, list]:
    """``(leaves, others)``: the leaves of ``events`` with every Composed node opened (None
    skipped), and the other nodes (Parallel) as they are, in traversal order."""
    leaves: list = []
    others: list = []
    for ev in events:
        stack = [] if ev is None else [ev]
        while stack:
            x = stack.pop()
            if isinstance(x, Composed):
                stack.extend(x.events)
            elif isinstance(x, (SubsampledGaussian, PureEpsilon)):
                leaves.append(x)
            else:
                others.append(x)
    return leaves, others


def _par(events) -> Event | None:
    """Parallel composition; empty children contribute nothing (max with 0)."""
    # Identical children have identical worst cases; keep one of each.
    uniq = list(dict.fromkeys(e for e in events if e is not None))
    if not uniq:
        return None
    return uniq[0] if len(uniq) == 1 else Parallel(tuple(uniq))


@dataclass(frozen=True)
class NodeTotal:
    event: Event | None  # None: nothing spent (or unbounded)
    unbounded: bool  # a non-private release lies in this subtree
    releases: int  # releases made directly on this partition
    releases_subtree: int
    non_private: int  # non-private releases in the subtree
    naive_epsilon: float  # own claims summed + worst child's naive total
    naive_delta: float
    reservations: int = 0  # open reservations in the subtree (they count like releases)
    uncertified: int = 0  # releases whose guarantee is not certified (they make it unbounded)
    unbounded_reasons: tuple = ()  # one line per release that makes the subtree unbounded
    #: sum of the noise tail deltas in the subtree (parallel children summed too: every draw of
    #: every release is in the truncation event); :func:`bounds` composes it soundly.
    noise_tail: float = 0.0


#: NodeTotal counts and tails that add up over a whole subtree (parallel children included).
_SUBTREE_SUMMED = ("releases_subtree", "non_private", "reservations", "uncertified", "noise_tail")


#: NodeTotal fields that add up over sequentially composed totals.
_SUMMED = ("releases", "naive_epsilon", "naive_delta", *_SUBTREE_SUMMED)


def _sequential_totals(totals: list[NodeTotal]) -> NodeTotal:
    """Totals of versions of one dataset, composed sequentially (see DatasetState.version_groups)."""
    return NodeTotal(
        event=sequential([t.event for t in totals]),
        unbounded=any(t.unbounded for t in totals),
        unbounded_reasons=tuple(x for t in totals for x in t.unbounded_reasons),
        **{f: sum(getattr(t, f) for t in totals) for f in _SUMMED},
    )


def _unbounded_reason(r: ReleaseView) -> str | None:
    what = r.kind  # release, reservation or audit
    if r.non_private:
        return f"non-private {what} {r.id}"
    if r.uncertified:
        return f"uncertified {what} {r.id}: {r.uncertified}"
    return None


def node_total(state: DatasetState, partition: str) -> NodeTotal:
    """Composed guarantee of everything that touched ``partition`` (see module docstring):
    its own releases and its undeclared subsets sequentially, then the worst declared child.
    Releases on different versions of the dataset compose sequentially (one tree per version)."""
    groups = state.version_groups()
    if len(groups) == 1:
        return _node_total(state, partition)
    return _sequential_totals([_node_total(g, partition) for g in groups])


def _node_total(state: DatasetState, partition: str, _seen: frozenset = frozenset()) -> NodeTotal:
    if partition in _seen:  # cannot happen with validated declarations; fail closed anyway
        raise LedgerError(f"partition tree of dataset {state.name!r} has a cycle at {partition!r}.")
    everything = [r for r in state.releases if r.partition == partition]
    seen = _seen | {partition}
    subs = [_node_total(state, c, seen) for c in state.subsets(partition)]
    kids = [_node_total(state, c, seen) for c in state.children.get(partition, ())]
    event = sequential(
        [r.event for r in everything if not r.non_private]
        + [k.event for k in subs]
        + [_par([k.event for k in kids])]
    )
    return _with_subtree(_own_total(everything), event, subs, kids)


def _with_subtree(
    own: NodeTotal, event: Event | None, subs: list[NodeTotal], kids: list[NodeTotal]
) -> NodeTotal:
    """A node's total: its own releases' (``own``), its undeclared subsets' in sequence and the
    worst declared child's (naive sums); counts and tails of the whole subtree."""
    inner = subs + kids
    return dataclasses.replace(
        own,
        event=event,
        unbounded=own.unbounded or any(k.unbounded for k in inner),
        unbounded_reasons=own.unbounded_reasons
        + tuple(x for k in inner for x in k.unbounded_reasons),
        **{f: _naive_sum(f, own, subs, kids) for f in ("naive_epsilon", "naive_delta")},
        **{f: getattr(own, f) + sum(getattr(k, f) for k in inner) for f in _SUBTREE_SUMMED},
    )


def _naive_sum(field: str, own: NodeTotal, subs: list[NodeTotal], kids: list[NodeTotal]) -> float:
    """A naive total: own claims, plus the undeclared subsets' summed and the worst declared child's."""
    subsets = sum(getattr(k, field) for k in subs)
    return getattr(own, field) + subsets + max([getattr(k, field) for k in kids], default=0.0)


def _own_total(everything: list[ReleaseView]) -> NodeTotal:
    """The counts, naive sums and tails of the releases and reservations made directly on a node
    (no event: the caller composes it with the subtree's)."""
    own = [r for r in everything if r.kind == "release"]  # the naive sum and counts: releases only
    # An uncertified guarantee is no guarantee: like a non-private release, it makes the subtree
    # unbounded (fail closed) until the operator voids it.
    reasons = tuple(filter(None, map(_unbounded_reason, everything)))
    return NodeTotal(
        event=None,
        unbounded=bool(reasons),
        releases=len(own),
        releases_subtree=len(own),
        non_private=sum(r.non_private for r in own),
        naive_epsilon=sum(_claim(r.epsilon, r.non_private) for r in own),
        naive_delta=sum(_claim(r.delta, r.non_private, 0.0) + r.noise_tail_delta for r in own),
        reservations=sum(r.kind == "reservation" for r in everything),
        uncertified=sum(map(_uncertified, own)),
        unbounded_reasons=reasons,
        noise_tail=sum(r.noise_tail_delta for r in everything if not r.non_private),
    )


def _uncertified(r: ReleaseView) -> bool:
    """A private release whose guarantee is not certified."""
    return bool(r.uncertified) and not r.non_private


def _claim(v: float | None, non_private: bool, missing: float = math.inf) -> float:
    if non_private:
        return math.inf
    return missing if v is None else float(v)


def dataset_total(state: DatasetState) -> NodeTotal:
    """All root partitions composed *sequentially*: undeclared partitions may overlap. With
    several versions of the dataset, each version's total, then the versions sequentially."""
    totals = _sequential_totals(
        [_sequential_totals([_node_total(g, r) for r in g.roots()]) for g in state.version_groups()]
    )
    return dataclasses.replace(totals, releases=0)


# ---------------------------------------------------------------- epsilon bounds

_CACHE: "OrderedDict[tuple, object]" = OrderedDict()
_CACHE_SIZE = 512


def _cached_epsilon(event: Event, delta: float, accountant: str, adjacency: str):
    key = (event, delta, accountant, adjacency)
    cached = _CACHE.get(key)
    # An answer read from the on-disk file is remembered as such: a budget decision
    # (result_cache.recomputed) never uses it, it computes its own.
    if cached is None or (result_cache.deciding() and cached[1]):
        # prv answers are also kept on disk (result_cache.py: exact key incl. the code, checked
        # entries), so a summary of an unchanged ledger does not import prv-accountant (~1.3 s).
        res = result_cache.lookup(*key)
        from_file = res is not None
        if res is None:
            try:
                res = compute_epsilon(
                    event, delta=delta, accountant=accountant, adjacency=adjacency
                )
            except Exception as e:  # noqa: BLE001 - a failure is remembered too (a dataset total and its
                res = e  # only partition are the same event; prv may take seconds to fail)
            result_cache.store(*key, res)
        cached = _CACHE[key] = (res, from_file)
    _CACHE.move_to_end(key)
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    if isinstance(cached[0], Exception):
        raise cached[0]
    return cached[0]


def _pure_only(event: Event) -> bool:
    if isinstance(event, PureEpsilon):
        return True
    if isinstance(event, SubsampledGaussian):
        return event.steps == 0
    return all(_pure_only(e) for e in event.events)  # type: ignore[union-attr]


#: Ledger totals whose rdp bound is above this are not sent to prv-accountant (see :func:`bounds`).
PRV_SKIP_ABOVE_RDP_EPSILON = 40.0


#: Fractions of the delta budget tried, in order, for the noise tails (see :func:`bounds`).
TAIL_MARGINS = (1e-9, 1e-3, 0.1, 0.5)


#: The bounds :func:`bounds` reports (None until an accountant gives one).
_BOUND_FIELDS = ("epsilon_rdp", "epsilon_prv", "epsilon_prv_lower", "epsilon_prv_estimate")
_BOUND_FIELDS += ("epsilon_pure",)


def bounds(
    event: Event | None,
    *,
    delta: float,
    adjacency: str | None,
    unbounded: bool = False,
    accountants=("rdp", "prv"),
    noise_tail: float = 0.0,
) -> dict:
    """Upper bounds on epsilon at ``delta`` for ``event``; ``epsilon`` is the smallest of them.

    ``noise_tail``: the sum tau of the releases' noise tail deltas (each bounds its release's
    tail mass, since e^eps + 1 >= 1). The real, truncated-noise composition differs from the
    ideal one only on an event of probability <= tau (dpaudit.noise), so if the ideal
    composition is (eps, d1)-DP the real one is (eps, d1 + (e^eps + 1) tau)-DP. The bounds are
    therefore evaluated at d1 = delta (1 - m) for the first margin m of :data:`TAIL_MARGINS`
    with (e^eps + 1) tau <= m delta: the real composition is then (eps, delta)-DP.
    ``delta_evaluated`` says which d1 was used; when no margin works the bound is infinite
    (``bound_by`` says why). With tau = 0 (no tails recorded) nothing changes.

    Each accountant's answer is a valid upper bound, so their minimum is one too. An
    accountant that fails on the event is skipped with its reason in ``accountant_errors``
    (skipping a bound can only raise the minimum); if none succeeds, the error propagates
    (never epsilon 0).
    """
    adj = adjacency or Adjacency.ADD_REMOVE_RECORD.value
    out: dict = {"delta": delta, **dict.fromkeys(_BOUND_FIELDS), "accountant_errors": {}}
    if unbounded or event is None:
        return _trivial_bounds(out, event, unbounded)
    if noise_tail > 0.0:
        return _bounds_with_tail(
            event, delta=delta, adjacency=adjacency, accountants=accountants, tau=noise_tail
        )
    candidates: dict[str, float] = {}
    errors = [_try_accountant(name, event, delta, adj, out, candidates) for name in accountants]
    if _pure_only(event):
        pure = _cached_epsilon(event, delta, "pure", adj).epsilon
        out["epsilon_pure"] = candidates["pure"] = pure
    if not candidates and "pld" not in accountants:
        # rdp and prv decline subsampled Gaussians under replace-record (their analyses are of the
        # add/remove pair; relabelling would under-report); pld analyses the replace-one pair.
        errors.append(_try_accountant("pld", event, delta, adj, out, candidates))
    if not candidates:
        raise _no_bound(errors, out["accountant_errors"])
    best = min(candidates, key=lambda k: candidates[k])
    out["epsilon"] = candidates[best]
    out["bound_by"] = best
    return out


def _no_bound(errors: list, reasons: dict) -> Exception:
    """What :func:`bounds` raises when no accountant bounds the event: the last refusal, else one naming every reason."""
    last = next((e for e in reversed(errors) if e is not None), None)
    if isinstance(last, UnsupportedEventError):
        return last
    return UnsupportedEventError(
        f"no accountant could bound the composed event ({'; '.join(f'{k}: {v}' for k, v in reasons.items())})."
    )


#: The bounds an unbounded total sets to infinity (and nothing spent to 0, with the pure one).
_HEADLINE = ("epsilon", "epsilon_rdp", "epsilon_prv")


def _trivial_bounds(out: dict, event: Event | None, unbounded: bool) -> dict:
    """:func:`bounds` of an unbounded total (infinite) or of nothing spent (0)."""
    if unbounded:
        out.update(dict.fromkeys(_HEADLINE, math.inf), bound_by="non-private release")
        if event is None or _pure_only(event):
            out["epsilon_pure"] = math.inf
        return out
    out.update(dict.fromkeys((*_HEADLINE, "epsilon_pure"), 0.0), bound_by="nothing spent")
    return out


def _try_accountant(
    name: str, event: Event, delta: float, adj: str, out: dict, candidates: dict
) -> Exception | None:
    """One accountant's bound into ``out`` and ``candidates``; a failure is noted in
    ``out["accountant_errors"]`` and returned (dropping one bound can only raise the minimum)."""
    if name == "prv" and candidates.get("rdp", 0.0) > PRV_SKIP_ABOVE_RDP_EPSILON:
        # Far out in the tails prv-accountant's discretisation fails after seconds and GBs
        # (measured: a 160-release Heart total at rdp eps 81); skipping a bound only raises the minimum.
        out["accountant_errors"][name] = (
            f"not attempted: the rdp bound {candidates['rdp']:.1f} exceeds "
            f"{PRV_SKIP_ABOVE_RDP_EPSILON:g}, where prv-accountant is unreliable"
        )
        return None
    try:
        res = _cached_epsilon(event, delta, name, adj)
    except Exception as e:  # noqa: BLE001 - dropping one bound can only raise the minimum
        out["accountant_errors"][name] = first_line(e)
        return e
    out[f"epsilon_{name}"] = res.epsilon
    candidates[name] = res.epsilon
    if name == "prv":
        out["epsilon_prv_lower"] = res.epsilon_lower
        out["epsilon_prv_estimate"] = res.epsilon_estimate
    return None


def total_bounds(
    t: NodeTotal, *, delta: float, adjacency: str | None, accountants=("rdp", "prv")
) -> dict:
    """:func:`bounds` of a composed total (its event, whether it is unbounded, its noise tails)."""
    flags = {"unbounded": t.unbounded, "noise_tail": t.noise_tail}
    return bounds(t.event, delta=delta, adjacency=adjacency, accountants=accountants, **flags)


def _bounds_with_tail(
    event: Event, *, delta: float, adjacency: str | None, accountants, tau: float
) -> dict:
    """:func:`bounds` of the truncated-noise composition at ``delta`` (see there)."""
    if math.isfinite(tau) and tau < 1.0:
        for m in TAIL_MARGINS:
            d1 = delta * (1.0 - m)
            b = bounds(event, delta=d1, adjacency=adjacency, accountants=accountants)
            eps = b["epsilon"]
            if math.isfinite(eps) and eps < 700 and (math.exp(eps) + 1.0) * tau <= m * delta:
                b.update(delta=delta, delta_evaluated=d1, noise_tail=tau)
                return b
    out = bounds(event, delta=delta, adjacency=adjacency, unbounded=True, accountants=accountants)
    out.update(
        bound_by=f"noise tails: tail delta {tau:.3g} cannot be covered at delta={delta:g}",
        noise_tail=tau,
    )
    return out

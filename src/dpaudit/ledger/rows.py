"""One budget per person, whatever the dataset is called (rows of named sources; dpaudit.data.rows).

Privacy contract: docs/ledger.md, "One budget per person". A row hash is ``blake2b(key = the ledger's
fingerprint key, source | id)``, 8 bytes (two rows collide with probability 2^-64 per pair, which
only makes the ledger compose more); ``"*"`` stands for every row of a source.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field

from ..data.rows import SOURCES
from ..errors import AdjacencyMismatchError, RowRoleCollisionError
from .compose import _sequential_totals, dataset_total, fmt_epsilon, total_bounds

ROWS_KIND = "rows"
EVERY_ROW = "*"
#: The set id standing for :func:`assumed_spec`'s rows (never stored: the entry has no ``rows``).
ASSUMED_EVERY_ROW = "assumed:*"
_HASH_BYTES = 8


@dataclass
class Side:
    """Rows of one source in one role: ``every`` (all rows) or the keyed ``hashes``. ``assumed``:
    ``every`` stands for rows the entry did not record (module docstring), not for a declaration."""

    every: bool = False
    hashes: set = field(default_factory=set)
    assumed: bool = False

    def counts_every(self, declared: bool) -> bool:
        """Whether this side stands for every row (``declared``: only when the entry declared so)."""
        return self.every and not (declared and self.assumed)

    def meets(self, other: "Side", *, declared: bool = False) -> bool:
        """Whether the two share a row; ``declared``: only rows stated as read (for role collisions:
        an assumed "every row" composes budgets, but cannot show a role the entry never declared)."""
        mine, theirs = self.counts_every(declared), other.counts_every(declared)
        if (mine and (theirs or other.hashes)) or (theirs and self.hashes):
            return True
        return not self.hashes.isdisjoint(other.hashes)


def _empty() -> dict:
    return {"private": {}, "public": {}}


def _keyed_row_hashes(key: bytes, source: str, ids):
    """blake2b(source | id, key) of each row id: the keyed state after the prefix is copied per row
    (the same digests as hashing ``prefix + id`` afresh, without re-keying 70,000 times)."""
    head = hashlib.blake2b(source.encode("utf-8") + b"|", key=key, digest_size=_HASH_BYTES)
    for i in ids:
        h = head.copy()
        h.update(b"%d" % i)
        yield h.digest()


def hash_rows(key: bytes, row_sets) -> dict:
    """``{role: {source: Side}}`` of a planned release's :class:`~dpaudit.data.rows.RowSet` s."""
    out = _empty()
    for rs in row_sets or ():
        side = out[rs.role].setdefault(rs.source, Side())
        if rs.ids is None:
            side.every = True
            continue
        side.hashes.update(_keyed_row_hashes(key, rs.source, rs.ids))
    for source, side in out["public"].items():
        if side.meets(out["private"].get(source, Side()), declared=True):
            raise RowRoleCollisionError(
                f"rows of a release must be private or public, got rows of {source} read as both."
            )
    return out


def _set_id(source: str, blob: bytes) -> str:
    return hashlib.sha256(source.encode("utf-8") + b"\0" + blob).hexdigest()


def declare(ledger, footprint: dict) -> dict:
    """Store the row sets of ``footprint`` not stored yet (inside the caller's write transaction);
    returns the ``rows`` value of the release payload (set ids, ``"*"`` for every row)."""
    known = {json.loads(r[5]).get("set") for r in ledger.store.rows() if r[2] == ROWS_KIND}
    out = _empty()
    for role, by_source in footprint.items():
        for source, side in sorted(by_source.items()):
            if side.every and side.assumed:
                continue  # rows never recorded are not declared (module docstring)
            if side.every:
                out[role][source] = EVERY_ROW
                continue
            blob = b"".join(sorted(side.hashes))
            sid = _set_id(source, blob)
            if sid not in known:
                payload = {
                    "source": source,
                    "set": sid,
                    "count": len(side.hashes),
                    "hashes": base64.b64encode(blob).decode("ascii"),
                }
                ledger._append(ROWS_KIND, "", payload)
                known.add(sid)
            out[role][source] = sid
    return out


def _stored_sets(raw_rows) -> dict:
    sets = {}
    for r in raw_rows:
        if r[2] == ROWS_KIND:
            p = json.loads(r[5])
            blob = base64.b64decode(p["hashes"])
            sets[p["set"]] = {blob[i : i + _HASH_BYTES] for i in range(0, len(blob), _HASH_BYTES)}
    return sets


def entry_spec(dataset: str, payload: dict) -> list[tuple[str, str, str]]:
    """``(role, source, set id or "*")`` of a recorded release or reservation (module docstring)."""
    spec = payload.get("rows")
    if not isinstance(spec, dict):
        return assumed_spec(dataset)
    return [
        (role, source, sid)
        for role in ("private", "public")
        for source, sid in sorted((spec.get(role) or {}).items())
    ]


def footprint_of(spec, sets: dict) -> dict:
    """``{role: {source: Side}}`` of an entry's ``(role, source, set id)`` s (:func:`entry_spec`)."""
    fp = _empty()
    for role, source, sid in sorted(spec):
        # A set id the ledger does not hold cannot be tested: every row (fail closed), assumed.
        if sid == EVERY_ROW:
            side = Side(every=True)
        else:
            side = Side(hashes=sets[sid]) if sid in sets else Side(every=True, assumed=True)
        _merge(fp, {role: {source: side}})
    return fp


def assumed_spec(dataset: str) -> list[tuple[str, str, str]]:
    """What an entry that recorded no rows is taken to read: every row of a built-in name's source,
    privately (fail closed); nothing for any other name (it shares budget by name only)."""
    return [("private", SOURCES[dataset], ASSUMED_EVERY_ROW)] if dataset in SOURCES else []


def _merge(into: dict, footprint: dict) -> None:
    """Add ``footprint``'s rows to ``into`` (new Side objects: footprints are shared, never mutated)."""
    for role, by_source in footprint.items():
        for source, side in by_source.items():
            old = into[role].get(source)
            into[role][source] = side if old is None else _joined(old, side)


def _joined(a: Side, b: Side) -> Side:
    """Both sides' rows; "every row" stays assumed only while no declared one joined it."""
    declared_every = a.counts_every(True) or b.counts_every(True)
    every = a.every or b.every
    return Side(every, a.hashes | b.hashes, every and not declared_every)


def _meet(a: dict, b: dict, role_a: str, role_b: str, *, declared: bool = False) -> list[str]:
    """Sources on which ``a``'s ``role_a`` rows and ``b``'s ``role_b`` rows share a row
    (``declared``: see Side.meets)."""
    theirs = b[role_b]
    return sorted(
        s
        for s, side in a[role_a].items()
        if s in theirs and side.meets(theirs[s], declared=declared)
    )


def _specs(entries, live: set) -> tuple[dict, dict]:
    """Per name, the ``(role, source, set id)`` s of its live entries and of its caps that declared
    rows; and those a cap that declared none is taken to cover (:func:`assumed_spec`: coverage only,
    never a collision)."""
    specs: dict = {}
    assumed: dict = {}
    for e in entries:
        if e.kind == "cap":
            into = specs if isinstance(e.payload.get("rows"), dict) else assumed
            into.setdefault(e.dataset, set()).update(entry_spec(e.dataset, e.payload))
        elif e.kind in ("release", "reservation", "audit") and e.id in live:
            specs.setdefault(e.dataset, set()).update(entry_spec(e.dataset, e.payload))
    return specs, assumed


@dataclass
class PeopleIndex:
    """Per dataset name: the rows (per role and source) its live releases, reservations and audits
    read, and the rows its caps declared (at cap time, so a cap covers its people before any release)."""

    names: dict  # name -> footprint
    sets: dict = field(default_factory=dict)  # stored row sets: set id -> keyed hashes
    #: name -> rows a cap that declared none is taken to cover (:func:`assumed_spec`): coverage only
    capped: dict = field(default_factory=dict)

    @classmethod
    def build(cls, raw_rows, entries, states: dict) -> "PeopleIndex":
        sets = _stored_sets(raw_rows)
        # audits train on the private rows of what they audit: they link names as releases do
        live = {r.id for st in states.values() for r in st.releases + st.audits}
        specs, assumed = _specs(entries, live)
        return cls(
            {name: footprint_of(spec, sets) for name, spec in specs.items()},
            sets,
            {name: footprint_of(spec, sets) for name, spec in assumed.items() if spec},
        )

    def footprint(self, dataset: str, payload: dict) -> dict:
        """The rows a recorded (or planned) entry's payload says it reads."""
        return footprint_of(entry_spec(dataset, payload), self.sets)

    def covered(self, name: str) -> dict | None:
        """The rows a cap on ``name`` covers: its entries' and caps' rows (and an undeclared cap's
        assumed rows)."""
        mine, extra = self.names.get(name), self.capped.get(name)
        if extra is None:
            return mine
        out = _empty()
        for fp in (mine, extra):
            if fp is not None:
                _merge(out, fp)
        return out

    def collisions(self, dataset: str, planned: dict) -> None:
        """Refuse a planned entry on ``dataset`` that reads as public rows held private (or the reverse):
        any declared row in common, a declared "every row" included."""
        for name, fp in sorted(self.names.items()):
            for mine, theirs in (("public", "private"), ("private", "public")):
                shared = _meet(planned, fp, mine, theirs, declared=True)
                if shared:
                    raise RowRoleCollisionError(
                        f"rows of {', '.join(shared)} must not be read as {mine} by dataset {dataset!r}: dataset {name!r} "
                        f"already reads them as {theirs}; refused before training. Use rows the other dataset does not "
                        f"read as {theirs} (see dpaudit.data.rows)."
                    )

    def with_planned(self, dataset: str, planned: dict) -> "PeopleIndex":
        names = {
            n: {r: dict(by_source) for r, by_source in fp.items()} for n, fp in self.names.items()
        }
        _merge(names.setdefault(dataset, _empty()), planned)
        return PeopleIndex(names, self.sets, self.capped)

    def sharing(self, name: str) -> list[str]:
        """Other names whose private rows meet the private rows ``name`` covers (:meth:`covered`)."""
        mine = self.covered(name)
        if mine is None:
            return []
        return sorted(
            n for n, fp in self.names.items() if n != name and _meet(mine, fp, "private", "private")
        )


def caps_to_check(
    index: PeopleIndex, states: dict, dataset: str, planned: dict
) -> list[tuple[str, list[str]]]:
    """``(capped name X, names composed with X)`` for every cap the planned release on ``dataset``
    can raise through shared people: X is ``dataset``, X's rows meet the planned rows, or
    ``dataset`` shares people with X. Caps without sharing are left to the per-name check."""
    out = []
    for name in sorted(n for n, st in states.items() if st.cap is not None):
        group = index.sharing(name)
        if not group:
            continue
        mine = index.covered(name) or _empty()
        if name == dataset or dataset in group or _meet(planned, mine, "private", "private"):
            out.append((name, [name] + group))
    return out


def people_epsilon(
    states: dict, names, delta: float, audits: bool = False, accountants=("rdp", "prv")
) -> float:
    """The smallest bound at ``delta`` on the names' dataset totals (with their audits when
    ``audits``) composed sequentially (they may share people); one adjacency."""
    kept = [states[n] for n in names if n in states]
    adjacencies = {st.name: st.adjacency() for st in kept if st.adjacency() is not None}
    if len(set(adjacencies.values())) > 1:
        shown = ", ".join(f"{n} ({a})" for n, a in sorted(adjacencies.items()))
        raise AdjacencyMismatchError(
            f"releases on datasets that share people must use one adjacency to be composed, got {shown}."
        )
    total = _sequential_totals([dataset_total(st.with_audits() if audits else st) for st in kept])
    adjacency = next(iter(adjacencies.values()), None)
    return total_bounds(total, delta=delta, adjacency=adjacency, accountants=accountants)["epsilon"]


def check_caps(index: PeopleIndex, before: dict, view, planned_state, planned: dict) -> tuple:
    """Every cap reached through shared people (:func:`caps_to_check`), composed before and with
    the planned release or audit (``view``, its kind saying which; ``planned_state``: its dataset's
    state with it, ``planned``: the rows it reads, refused first on a role collision): the checked
    caps, and the refusal of the first cap exceeded (None if none is). A cap that includes audits
    composes every name's audits too; a planned audit is checked against those caps only."""
    dataset, partition = view.dataset, view.partition
    what = "audit" if view.kind == "audit" else "release"
    index.collisions(dataset, planned)
    after, index = {**before, dataset: planned_state}, index.with_planned(dataset, planned)
    checked, refusal = [], None
    for name, group in caps_to_check(index, after, dataset, planned):
        audits = after[name].cap_includes_audits
        if what == "audit" and not audits:
            continue
        cap_eps, cap_delta = after[name].cap
        total = people_epsilon(after, group, cap_delta, audits)
        checked.append({"dataset": name, "composed_with": group, "total": total, "cap": cap_eps})
        if total > cap_eps and refusal is None:
            spent = "releases and audits" if audits else "releases"
            refusal = (
                f"budget of dataset {name!r} exceeded through shared people: the {spent} of {', '.join(group)} read rows "
                f"{name} holds private and compose to epsilon={fmt_epsilon(people_epsilon(before, group, cap_delta, audits))}; with this "
                f"{what} on {dataset}:{partition} the composed total would be epsilon={fmt_epsilon(total)} > cap "
                f"epsilon={fmt_epsilon(cap_eps)} at delta={cap_delta:g}; refused before "
                f"{'any trial ran' if what == 'audit' else 'training'}."
            )
    return checked, refusal

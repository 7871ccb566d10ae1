"""The ledger's integrity checker (pure functions over one snapshot of a store): the hash chain
(:func:`entry_hash`; the store's ``chain_head`` holds the last hash and the entry count), the
entries' readability, the signatures (:mod:`.signing`) and published anchors; :func:`verify_snapshot`
names the entry that was edited, deleted, reordered or forged, and the budget book refuses a ledger
that fails here (fail closed). Also the export / import of a ledger's rows verbatim.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections import namedtuple
from dataclasses import dataclass, field

from ..accounting.base import first_line
from ..errors import LedgerAuthorityError, LedgerError, UsageError
from ..records import _json_safe
from . import signing
from .compose import ENTRY_KINDS, DatasetState, parse_event, replay, unstable_declaration
from .fingerprint import KEY_BYTES, is_fingerprint
from .paths import GENESIS_HASH
from .rows import ROWS_KIND
from .signing import Problem
from .store import ENTRY_COLUMNS

EXPORT_FORMAT = "dpaudit-ledger-export-v1"


def canonical_json(obj) -> str:
    """The one serialisation that is hashed: sorted keys, no spaces, non-finite floats as strings."""
    return json.dumps(
        _json_safe(obj), sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )


def entry_hash(
    prev_hash: str,
    entry_id: str,
    kind: str,
    created_at: str,
    dataset: str,
    payload_text: str,
    signer: str | None = None,
    signature: str | None = None,
) -> str:
    """sha256 over the previous hash and every stored column of the entry (seq excluded:
    an entry's place in the chain is fixed by ``prev_hash``). A signed entry's hash covers its
    signer and signature too (so the next entry's signature covers them); an unsigned entry
    keeps the original material, so ledgers written before signatures verify unchanged."""
    material = [prev_hash, entry_id, kind, created_at, dataset, payload_text]
    if signer is None and signature is None:
        material = ["dpaudit-ledger-v1", *material]
    else:
        material = ["dpaudit-ledger-v2", *material, signer, signature]
    return hashlib.sha256(json.dumps(material, separators=(",", ":")).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class VerifyReport:
    """Result of the hash-chain check; ``ok`` is derived from ``problems``."""

    path: str
    entries: int
    head_hash: str
    schema_version: int
    problems: tuple = field(default_factory=tuple)
    #: registered keys, owner, signed / unsigned counts (see signing.KeyRing.to_dict)
    signatures: dict = field(default_factory=dict)
    anchor: str | None = None
    backend: str = "sqlite"

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        shown = ("entries", "head_hash", "schema_version", "signatures", "anchor")
        out = {"ledger": self.path, "backend": self.backend, "ok": self.ok}
        out.update({name: getattr(self, name) for name in shown})
        return {**out, "problems": [p.to_dict() for p in self.problems]}

    def __str__(self) -> str:
        if not self.ok:
            return "\n".join(p.message for p in self.problems)
        sig = self.signatures or {}
        keys = f"{sig.get('signed', 0)} signed by {len(sig.get('keys', []))} registered key(s)"
        signed = f", {keys}" if sig.get("keys") else ""
        anchor = f", contains anchor {self.anchor[:16]}" if self.anchor else ""
        intact = f"ledger {self.path}: {self.entries} entries, hash chain intact{signed}{anchor}"
        return f"{intact} (head {self.head_hash[:16]})." + seal_note(sig)


def seal_note(signatures: dict) -> str:
    """`` Sealed by the owner through entry #N; M later entries unsealed ...`` for a signed ledger
    (the key ring's dict), else empty: what a member key could still rewrite undetected."""
    if not signatures or signatures.get("owner") is None:
        return ""
    n, through = signatures.get("unsealed") or 0, signatures.get("sealed_through")
    tail = "; nothing unsealed"
    if n:
        tail = (
            f"; {n} later entr{'y' if n == 1 else 'ies'} UNSEALED: a registered member key could rewrite "
            f"{'it' if n == 1 else 'them'} undetected (the owner runs `dpaudit ledger seal`)"
        )
    return f" Signed by the owner through entry #{through}{tail}."


def chain_problems(head, rows, *, withheld: bool = False) -> list[Problem]:
    """Hash-chain findings for ``rows`` (seq order) against the chain head, naming each entry (``withheld``: a shareable
    export, whose withheld row-set entries are checked by their links and :func:`withheld_problems`, not their content)."""
    problems: list[Problem] = []
    by_hash = {r[7]: r for r in rows}
    prev_row = None
    for r in rows:
        seq, eid, prev, h = r[0], r[1], r[6], r[7]
        signer, signature = (r[8], r[9]) if len(r) > 9 else (None, None)
        skipped = withheld and is_withheld(r)
        if not skipped and entry_hash(prev, *r[1:6], signer, signature) != h:
            edited = f"{signing.label(r)} was edited: its content no longer matches its hash."
            problems.append(Problem("edited", edited, seq, eid))
        if prev != (prev_row[7] if prev_row else GENESIS_HASH):
            problems.append(_link_problem(r, prev_row, by_hash.get(prev)))
        prev_row = r
    last_hash = prev_row[7] if prev_row else GENESIS_HASH
    return problems + _check_head(head, rows, by_hash, last_hash, problems)


def _link_problem(r, prev_row, after) -> Problem:
    """Why row ``r`` does not follow ``prev_row`` (None: ``r`` is stored first); ``after``: the row
    its ``prev_hash`` names, if still there."""
    seq, eid, prev, label = r[0], r[1], r[6], signing.label(r)
    if after is not None and after is not r:
        now = f"after entry #{prev_row[0]} ({prev_row[1]})." if prev_row else "first."
        message = f"{label} was reordered: it was appended after entry #{after[0]} ({after[1]}) but is now stored "
        return Problem("reordered", message + now, seq, eid)
    if prev == GENESIS_HASH:
        message = f"{label} was reordered: it was the first entry but is now stored after entry #{prev_row[0]} ({prev_row[1]})."
        return Problem("reordered", message, seq, eid)
    if prev_row is None or seq != prev_row[0] + 1:
        gone = (
            f"entry/entries between entry #{prev_row[0]} ({prev_row[1]}) and {label}"
            if prev_row is not None
            else f"entry/entries before {label}"
            if seq != 1
            else "the first entry/entries"
        )
        message = f"{gone} were deleted: {label} follows an entry that is no longer in the ledger."
        return Problem("deleted", message, seq, eid)
    message = (
        f"entry #{prev_row[0]} ({prev_row[2]} {prev_row[1]}) was edited and re-hashed: {label} no longer follows it "
        "(or entries between them were deleted and the rest renumbered)."
    )
    return Problem("edited", message, prev_row[0], prev_row[1])


def _check_head(head, rows, by_hash, last_hash, found) -> list[Problem]:
    """Compare the chain head (last hash, entry count) with what the table holds."""
    if head is None:
        return [
            Problem("deleted", "the chain head is missing: the ledger was altered outside dpaudit.")
        ]
    _, head_count, head_hash = head
    if head_hash == last_hash and head_count == len(rows):
        return []
    if head_hash in by_hash:
        return _after_head(rows, by_hash[head_hash][0], head_count, found)
    if head_hash != GENESIS_HASH or rows:
        return _head_entry_gone(head, rows, found)
    return _count_mismatch(head_count, rows, found)


def _after_head(rows, head_seq: int, head_count: int, found) -> list[Problem]:
    """The head's entry is in the table: entries after it were added outside dpaudit, or the
    counts differ."""
    if any(p.kind == "reordered" for p in found):
        return []  # already named
    tail = [r for r in rows if r[0] > head_seq]
    if not tail:
        return _count_mismatch(head_count, rows, found)
    first_seq, first_id = tail[0][0], tail[0][1]
    message = f"entry #{first_seq} ({first_id}) and later were added outside dpaudit (after the chain head)."
    return [Problem("edited", message, first_seq, first_id)]


def _count_mismatch(head_count: int, rows, found) -> list[Problem]:
    """The head's entry count against the table's, unless a deletion is already named."""
    if head_count == len(rows) or any(p.kind == "deleted" for p in found):
        return []
    message = f"the chain head records {head_count} entries but the ledger holds {len(rows)}."
    return [Problem("deleted", message)]


def _head_entry_gone(head, rows, found) -> list[Problem]:
    """The head's hash is not in the table: its entry was edited and re-hashed, or deleted."""
    head_seq, head_count, _ = head
    r = next((x for x in rows if x[0] == head_seq), None)
    if r is not None:
        if any(p.kind == "edited" and p.seq == head_seq for p in found):
            return []
        message = f"entry #{head_seq} ({r[2]} {r[1]}) was edited and re-hashed: its hash differs from the chain head."
        return [Problem("edited", message, head_seq, r[1])]
    last = rows[-1] if rows else None
    ending = f" ending at entry #{last[0]} ({last[1]})." if last else "."
    message = (
        f"the last entry #{head_seq} was deleted: the chain head records {head_count} entries ending at entry #{head_seq}, "
        f"but the ledger holds {len(rows)}{ending}"
    )
    return [Problem("deleted", message, head_seq, None)]


# ---------------------------------------------------------------- one snapshot


@dataclass(frozen=True)
class Snapshot:
    """One read of a store (head and rows from the same transaction), as :func:`verify_snapshot` checks it."""

    path: str
    backend: str
    schema_version: int
    head: tuple | None
    rows: list
    #: ``(kind, message)`` of the store's own checks (SQLite's integrity check, the append-only triggers)
    health: list = field(default_factory=list)


def signed_rows(rows) -> list[signing.SignedRow]:
    return [signing.SignedRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[8], r[9]) for r in rows]


def verify_snapshot(snap: Snapshot, *, anchor: str | None, owner: str | None) -> VerifyReport:
    """The store's own checks, the hash chain, every entry parsed (an unreadable guarantee is a
    problem, never 0), every signature against the keys registered before it (``owner``: the key
    id the first registered key must have) and ``anchor`` (a head hash published earlier: the
    chain must still contain it)."""
    # only a bundle's shareable export may withhold row sets
    rows, shared = snap.rows, snap.backend == "export"
    readable = [r for r in rows if not (shared and is_withheld(r))]
    problems = (
        [Problem(k, m) for k, m in snap.health]
        + chain_problems(snap.head, rows, withheld=shared)
        + _unreadable(rows)
    )
    problems += withheld_problems(rows) if shared else []
    ring, found = signing.check_signatures(signed_rows(readable), owner=owner)
    problems += found + authority_problems(readable)
    problems += _anchor_problems(anchor, rows)
    last_hash = rows[-1][7] if rows else GENESIS_HASH
    found = (snap.schema_version, tuple(problems), ring.to_dict(), anchor, snap.backend)
    return VerifyReport(snap.path, len(rows), last_hash, *found)


def _anchor_problems(anchor: str | None, rows) -> list[Problem]:
    """``anchor`` (a head hash published earlier) must still be in the chain."""
    if anchor is None:
        return []
    a = anchor.strip().lower()
    if not is_fingerprint(a):
        raise UsageError(
            f"anchor must be a 64-hex head hash printed by `dpaudit ledger head`, got {anchor!r}."
        )
    if a == GENESIS_HASH or a in {r[7] for r in rows}:
        return []
    message = f"anchor {a[:16]} is not in the chain: the ledger was truncated or rewritten "
    return [Problem("anchor", message + "since that head was published.")]


def held_children(state: DatasetState, children) -> list[str]:
    """The releases and open reservations of ``state`` that lie in one of ``children`` (or below)."""
    kids = set(children)
    held = []
    for r in state.releases:
        node: str | None = r.partition
        while node is not None and node not in kids:
            node = state.parent(node)
        if node is not None:
            held.append(f"{r.kind} {r.id[:12]} on {state.name}:{r.partition}")
    return held


def refuse_held_children(state: DatasetState, parent: str, children) -> None:
    """Raise LedgerAuthorityError if a release or open reservation lies in one of ``children``."""
    held = held_children(state, children)
    if held:
        raise LedgerAuthorityError(
            f"partition {state.name}:{parent} must be declared before its children hold releases, "
            f"got {', '.join(held)}: they were composed sequentially with the rest of the dataset "
            "and keep composing so; declare a split before releasing on it."
        )


#: The fields :func:`~.compose.replay` reads from an entry, and where it is stored.
_Row = namedtuple("_Row", "seq id kind dataset payload")


def _parsed(rows) -> list[_Row]:
    """The readable entries of ``rows`` (the others are named by _unreadable)."""
    payloads = [(r, signing.payload_of(r[5])) for r in rows]
    return [_Row(*r[:3], r[4], payload) for r, payload in payloads if payload is not None]


def partition_problems(rows) -> list[Problem]:
    """Partition declarations that turn recorded spend parallel: the children already held a release
    or an open reservation when it was appended. ``declare_partition`` refuses that for every key;
    one inserted behind its back (a member key can sign any entry it writes) is named here, so no
    budget answer composes with it (fail closed)."""
    entries = _parsed(rows)
    out = []
    for i, e in enumerate(entries):
        if e.kind != "partition":
            continue
        parent, children = str(e.payload.get("parent")), tuple(e.payload.get("children") or ())
        if unstable_declaration(parent, str(e.payload.get("declared_by", ""))):
            continue  # ignored by replay: composes sequentially
        held = _held_when_declared(entries[:i], e, parent, children)
        if held:
            message = (
                f"entry #{e.seq} (partition {e.id}) declares {e.dataset}:{parent} disjoint "
                f"after its children hold {', '.join(held)}: parallel composition would lower "
                "what they spent."
            )
            out.append(Problem("authority", message, e.seq, e.id))
    return out


def _held_when_declared(earlier: list[_Row], e: _Row, parent: str, children) -> list[str]:
    """What ``children`` held when ``e`` declared them disjoint (empty for the identical split
    declared again, which changes nothing); an invalid declaration is itself a finding."""
    try:
        state = replay([x for x in earlier if x.dataset == e.dataset]).get(e.dataset)
        state = state or DatasetState(e.dataset)
        return [] if state.check_partition(parent, children) else held_children(state, children)
    except Exception as ex:  # noqa: BLE001 - an invalid declaration is a finding, never skipped
        return [f"an invalid split ({first_line(ex)})"]


def seal_problems(rows) -> list[Problem]:
    """A seal made on this machine (:func:`~.signing.remember_seal`) that is no longer in the chain."""
    ring, _ = signing.check_signatures(signed_rows(rows), verify=False)
    if ring.owner is None:
        return []
    seal = signing.remembered_seal(ring.keys[ring.owner].entry_id)
    if seal is None or seal["hash"] in {r[7] for r in rows}:
        return []
    return [
        Problem(
            "seal",
            f"the owner's seal of entry #{seal.get('seq')} (hash {seal['hash'][:16]}), made on this machine, is no "
            "longer in the chain: the ledger was truncated or rewritten after it was sealed.",
        )
    ]


def authority_problems(rows) -> list[Problem]:
    """What the signatures alone cannot show (:func:`partition_problems`, :func:`seal_problems`)."""
    return partition_problems(rows) + seal_problems(rows)


def _unreadable(rows) -> list[Problem]:
    out = []
    for seq, eid, kind, _c, _d, text, _p, _h, *_sig in rows:
        try:
            payload = json.loads(text)
            if kind not in ENTRY_KINDS:
                raise ValueError(f"unknown kind {kind!r}")
            if kind in ("release", "reservation", "audit") and not payload.get("non_private"):
                parse_event(payload.get("guarantee"))
        except Exception as e:  # noqa: BLE001 - any failure to read an entry is reported, never skipped
            message = f"entry #{seq} ({kind} {eid}) cannot be read: {first_line(e)}"
            out.append(Problem("unreadable", message, seq, eid))
    return out


# ---------------------------------------------------------------- export / import


def export_dump(snap: Snapshot, key: bytes | None) -> dict:
    """Every stored row verbatim (hashes and signatures included) and the fingerprint key if given."""
    return {
        "format": EXPORT_FORMAT,
        "schema_version": snap.schema_version,
        "head_hash": snap.head[2],
        "fingerprint_key": base64.b64encode(key).decode("ascii") if key is not None else None,
        "columns": list(ENTRY_COLUMNS),
        "rows": [list(r) for r in snap.rows],
    }


def export_key(dump: dict) -> bytes:
    """The fingerprint key an export carries (b"": exported without it), refused unless it is the
    32 bytes :func:`export_dump` wrote, so an import never writes a key every later fingerprint
    would fail on."""
    key = base64.b64decode(dump.get("fingerprint_key") or "")
    if key and len(key) != KEY_BYTES:
        raise UsageError(
            f"fingerprint_key of the export must hold exactly {KEY_BYTES} bytes, got {len(key)}; "
            "nothing was imported."
        )
    return key


#: The payload that stands, in a shareable export, for a withheld row-set entry (:func:`withhold_row_sets`).
WITHHELD = "withheld"


def _withheld_payload(text: str) -> str:
    return canonical_json({WITHHELD: ROWS_KIND, "set": json.loads(text).get("set")})


def withhold_row_sets(dump: dict) -> dict:
    """A shareable copy of an export: each row-set entry keeps its place, id, hashes and signature, but its payload (the keyed
    row hashes and their count, whose number is the private training count) is replaced by its set id alone. The chain still
    verifies around it (:func:`withheld_problems`); such an export cannot be imported. Privacy contract: no count or row hash
    of any private set is published, only set ids, which are hashes of keyed hashes."""
    rows = [list(r) for r in dump.get("rows") or []]
    for r in rows:
        if r[2] == ROWS_KIND:
            r[5] = _withheld_payload(r[5])
    return {**dump, "fingerprint_key": None, "rows": rows, WITHHELD: ROWS_KIND}


def is_withheld(row) -> bool:
    """A row-set entry whose payload a shareable export withheld (its content hash cannot be recomputed)."""
    return row[2] == ROWS_KIND and WITHHELD in (signing.payload_of(row[5]) or {})


def _referenced_sets(rows) -> set:
    out = set()
    for r in rows:
        if r[2] in ("release", "reservation", "audit"):
            spec = (signing.payload_of(r[5]) or {}).get("rows") or {}
            out.update(
                sid for role in spec.values() if isinstance(role, dict) for sid in role.values()
            )
    return out


def withheld_problems(rows) -> list[Problem]:
    """Withheld entries must each stand for a distinct row set that a verifiable release, reservation or audit names:
    a withheld placeholder can then not hide any other entry (there is no set left for it to claim)."""
    referenced, seen, out = _referenced_sets(r for r in rows if not is_withheld(r)), set(), []
    for r in rows:
        if is_withheld(r):
            sid = json.loads(r[5]).get("set")
            if sid in seen or sid not in referenced:
                why = "is withheld but stands for no row set a release names once"
                why += ": a withheld entry may only be a row set."
                out.append(Problem("edited", f"{signing.label(r)} {why}", r[0], r[1]))
            seen.add(sid)
    return out


def require_export(dump) -> None:
    if not isinstance(dump, dict) or dump.get("format") != EXPORT_FORMAT:
        raise UsageError(
            f"import must be a dpaudit ledger export (format {EXPORT_FORMAT}), got {str(dump)[:60]!r}."
        )


def import_chain(dump: dict) -> list:
    """The export's rows, each checked to continue the chain from the genesis hash to its head
    (LedgerError otherwise: nothing is imported)."""
    rows = dump.get("rows") or []
    prev = GENESIS_HASH
    for i, r in enumerate(rows, 1):
        seq, eid, prev_hash, h, signer, signature = r[0], r[1], *r[6:]
        linked = seq == i and prev_hash == prev
        if not linked or entry_hash(prev_hash, *r[1:6], signer, signature) != h:
            raise LedgerError(
                f"import: entry #{seq} ({eid}) does not continue the chain; nothing was imported."
            )
        prev = h
    if dump.get("head_hash") != prev:
        raise LedgerError(
            "import: the export's head hash does not match its last entry; nothing was imported."
        )
    return rows

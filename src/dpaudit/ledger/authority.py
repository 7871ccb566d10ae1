"""Who may write what on one ledger, and the chain every entry extends (docs/ledger.md, "Who may
write what"; the rules themselves are :mod:`.signing` and :mod:`.integrity`).

Privacy contract: every entry is appended after the chain head it names and signed by this
ledger's key once that key is registered; an entry the key may not sign (an owner-only kind, a
reservation another key opened) is refused before anything is written; a budget answer is only
ever computed from rows whose chain, signatures and authority rules all hold (fail closed). The
writers and the readers apply the one rule, :func:`~.signing.authority_problem`.
"""

from __future__ import annotations

import uuid

from ..errors import LedgerAuthorityError, LedgerError, LedgerVerificationError, UsageError
from . import integrity
from .signing import KEY_KIND, LEDGER_KINDS, LEDGER_SCOPE, OWNER_KINDS, OWNER_POWERS, POLICY_KIND
from .signing import SEAL_KIND, KeyRing, SigningKey, authority_problem, check_signatures, key_id
from .signing import Problem, key_payload, parse_public_key, seal_payload, signing_material
from .integrity import GENESIS_HASH, Snapshot, canonical_json, entry_hash
from .paths import utc_now


class Authority:
    """The signing side of a ledger: its store, its shown ``path``, the analyst's ``key`` (or None)
    and the pinned ``owner`` key id (or None). Remembers which signatures it already checked and
    the last head whose authority check was clean (an Ed25519 check per entry per write would make
    large ledgers slow)."""

    def __init__(self, store, path, key: "SigningKey | None", owner: str | None) -> None:
        self.store, self.path, self.key, self.owner = store, path, key, owner
        self._verified: set[tuple[str, str]] = set()  # (id, hash) of entries whose signature held
        self._clean_head: str | None = None

    def append(self, kind: str, dataset: str, payload: dict, entry_id: str | None = None) -> str:
        """Append one entry inside the caller's write transaction and advance the chain head:
        signed when this ledger's key is registered, refused unsigned when signatures are
        required."""
        entry_id = entry_id or uuid.uuid4().hex
        head = self.store.head()
        if head is None:
            raise LedgerError(f"ledger {self.path} has no chain head; run `dpaudit ledger verify`.")
        last = self.store.last()
        if (last[1] if last else GENESIS_HASH) != head[2]:
            # Appending after a broken chain would bury the break; refuse instead.
            raise LedgerError(
                f"ledger {self.path} fails its integrity check (last entry does not "
                "match the chain head); run `dpaudit ledger verify`."
            )
        columns = (entry_id, kind, utc_now(), dataset, canonical_json(payload))
        signer = signature = None
        key = self._signer_for(kind, payload)
        if key is not None:
            signer = key.key_id
            signature = key.sign(signing_material(head[2], *columns, signer))
        digest = entry_hash(head[2], *columns, signer, signature)
        self.store.insert(*columns, head[2], digest, signer, signature)
        return entry_id

    def ring(self, rows=None) -> KeyRing:
        """Registered keys and the signature policy of ``rows`` (default: every stored row;
        signatures not re-checked)."""
        rows = self.store.rows() if rows is None else rows
        return check_signatures(integrity.signed_rows(rows), verify=False)[0]

    def _signer_for(self, kind: str, payload: dict) -> "SigningKey | None":
        key, ring = self.key, self.ring()
        own_id = None if key is None else key.key_id
        if kind == KEY_KIND and not ring.keys and own_id and payload.get("key_id") == own_id:
            return key  # the owner's self-signed registration
        if key is not None and key.key_id in ring.keys:
            self.require(ring, kind, payload)
            return key
        self._refuse_unsigned(ring, kind)
        return None

    def _refuse_unsigned(self, ring: KeyRing, kind: str) -> None:
        """Refuse an entry this ledger's key cannot sign where a signature is required."""
        key = self.key
        if ring.required_since is not None:
            why = (
                "no signing key (create one with `dpaudit ledger keygen`)"
                if key is None
                else f"signing key {key.key_id} is not registered in it"
            )
            raise LedgerError(
                f"ledger {self.path} requires signed entries (since entry "
                f"#{ring.required_since}), but {why}; nothing was written."
            )
        if kind in LEDGER_KINDS:
            got = "no signing key." if key is None else f"unregistered key {key.key_id}."
            raise UsageError(f"a {kind} entry must be signed by a registered key, got {got}")

    def require(self, ring: KeyRing, kind: str, payload: dict) -> None:
        """Refuse (:class:`LedgerAuthorityError`, nothing written) an entry this ledger's key may
        not sign (:func:`~.signing.authority_problem`, the rule ``verify`` applies when reading)."""
        kid = None if self.key is None else self.key.key_id
        if authority_problem(ring, kind, payload, kid) is None:
            return
        got = "no signing key" if kid is None else f"key {kid}"
        if kind in OWNER_KINDS:
            raise LedgerAuthorityError(
                f"{kind} on signed ledger {self.path} must be signed by its owner's key "
                f"{ring.owner}, got {got}: only the owner may {OWNER_POWERS[kind]}; "
                "nothing was written."
            )
        raise LedgerAuthorityError(
            f"{kind} of reservation {payload.get('target')} on signed ledger {self.path} must be "
            f"signed by the key that opened it or by the owner's key {ring.owner}, got {got}; "
            "nothing was written."
        )

    def require_void(self, published: bool | None) -> None:
        """A void on a signed ledger: the owner's, stating whether artefacts were published."""
        ring = self.ring()
        if ring.owner is None:
            return
        self.require(ring, "void", {})
        if published is None:
            raise LedgerAuthorityError(
                "void on a signed ledger must state whether the artefacts were ever published "
                "(--published / --never-published), got neither."
            )

    def public_raw(self, public_key: str | None) -> bytes:
        """The raw key to register: ``public_key``, else this ledger's own (UsageError if none)."""
        if self.key is None:
            raise UsageError(
                "signing key must exist to register keys, got none (create one with "
                "`dpaudit ledger keygen`)."
            )
        return self.key.public_raw if public_key is None else parse_public_key(public_key)

    def register_key(self, raw: bytes, name: str) -> str:
        """See :meth:`~.book.Ledger.register_key` (inside the caller's write transaction)."""
        key = self.key
        ring, kid = self.ring(), key_id(raw)
        if kid in ring.keys:
            return ring.keys[kid].entry_id
        if not ring.keys and kid != key.key_id:
            raise UsageError(
                f"the first key registered must be your own (the owner's, "
                f"{key.key_id}), got {kid}; run `dpaudit ledger register-key` "
                "without --public-key first."
            )
        label = name or (key.name if kid == key.key_id else kid[:12])
        role = "member" if ring.keys else "owner"
        return self.append(KEY_KIND, LEDGER_SCOPE, key_payload(raw, label, role))

    def require_signatures(self) -> str:
        """See :meth:`~.book.Ledger.require_signatures` (inside the caller's write transaction)."""
        for r in self.store.rows():
            if r[2] == POLICY_KIND and r[8] is not None:
                return r[1]
        return self.append(POLICY_KIND, LEDGER_SCOPE, {"require_signatures": True})

    def seal(self, rows) -> tuple[str, int, str]:
        """Append the owner's seal of the head after the verified ``rows`` (inside the caller's
        write transaction); returns its id, the seq it seals through and the owner's
        registration id."""
        ring = self.ring(rows)
        if ring.owner is None:
            raise UsageError(
                f"ledger to seal must have an owner (run `dpaudit ledger "
                f"register-key` first), got {self.path} with none."
            )
        seq, _, prev = self.store.head()
        eid = self.append(SEAL_KIND, LEDGER_SCOPE, seal_payload(seq, prev))
        return eid, seq, ring.keys[ring.owner].entry_id

    def intact(self, snap: Snapshot) -> list:
        """``snap``'s rows after checking the whole hash chain, every signature and the authority
        rules: budgets are never computed from a ledger that was edited, truncated, reordered or
        forged (:class:`LedgerVerificationError` otherwise)."""
        rows = snap.rows
        problems = (
            integrity.chain_problems(snap.head, rows)
            or self._signature_problems(rows)
            or self._authority_problems(rows)
        )
        if problems:
            first = problems[0].message.rstrip(".")
            raise LedgerVerificationError(
                f"ledger {self.path} fails verification ({first}); run `dpaudit ledger verify`."
            )
        return snap.rows

    def _signature_problems(self, rows) -> list[Problem]:
        done = {r[1] for r in rows if (r[1], r[7]) in self._verified}
        _, found = check_signatures(integrity.signed_rows(rows), verified=done, owner=self.owner)
        if not found:
            self._verified.update((r[1], r[7]) for r in rows if r[8] is not None)
        return found

    def _authority_problems(self, rows) -> list[Problem]:
        """:func:`.integrity.authority_problems`; a clean answer is kept per head hash."""
        head = rows[-1][7] if rows else GENESIS_HASH
        if self._clean_head == head:
            return []
        found = integrity.authority_problems(rows)
        if not found:
            self._clean_head = head
        return found

"""The privacy budget ledger: a durable, append-only record of every release of every dataset.

The rows live in an SQLite file (:mod:`.store_sqlite`) or a PostgreSQL schema (:mod:`.store_pg`);
:class:`Ledger` is a thin facade over them: it opens one transaction per write, reads the verified
entries and hands them to the budget arithmetic (:mod:`.budget`), and appends through the
authority (:mod:`.authority`: the chain, signatures and who may write what). The guarantees (one
transaction per write, append-only entry kinds, reservations held before training and closed by
``settle`` / ``cancel`` / ``void``, one data identity per dataset name unless a version is
declared, the hash chain and signatures checked before every budget answer, schema migrations)
are stated in docs/ledger.md ("Reliability", "How the total is composed"); composition itself
is :mod:`.compose`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .. import __version__
from ..accounting.adjacency import Adjacency
from ..accounting.events import Event
from ..errors import DatasetIdentityError, LedgerError, UsageError
from ..records import Release
from ..validation import open_unit, positive_finite
from . import budget, integrity, result_cache
from .signing import LEDGER_SCOPE, OWNER_ENV, PLAN_KIND, KeyRing, SigningKey, load_signing_key
from .signing import owner_key_id, remember_seal
from .authority import Authority

# re-exported: sampler_uncertified_reason, uncertified_reason (used by mechanisms and verify)
from .budget import PlannedSpend, check_name, check_reason  # noqa: F401
from .budget import sampler_uncertified_reason, uncertified_reason  # noqa: F401
from .compose import CLOSING_KINDS, DatasetState, parse_event, release_view, replay
from .fingerprint import is_fingerprint, key_path, keyed_fingerprint

# re-exported: canonical_json, entry_hash (the tests rebuild entries with them)
from .integrity import Snapshot, VerifyReport, canonical_json, entry_hash  # noqa: F401
from .paths import LedgerLocation, require_existing, resolve_ledger
from .plan_rules import recorded_plan_entry
from .rows import ROWS_KIND, SOURCES, PeopleIndex, declare, hash_rows
from .store import ENTRY_COLUMNS
from .store_pg import PostgresStore

# Storage lives in store_sqlite / store_pg; re-exported here (tests patch MIGRATIONS in place).
from .store_sqlite import APPLICATION_ID, MIGRATIONS, SqliteStore, latest_schema_version  # noqa: F401

#: Seconds a writer waits for another process's transaction before giving up.
BUSY_TIMEOUT_S = 60.0
#: Public keys of a release or reservation payload that name the cause of a fingerprint change.
_DATA_INFO = ("split_seed", "profile")
#: Release fields a release entry's payload stores as they are.
_RELEASE_COPIED = tuple(
    "mechanism accountant delta noise_multiplier sample_rate steps clipping_norm "
    "dpaudit_version".split()
)


def _sweep_tag(config: object) -> dict | None:
    """``{"name", "task"}`` from a release's ``config["sweep"]`` (written by dpaudit.sweeps), else None."""
    tag = config.get("sweep") if isinstance(config, dict) else None
    if not isinstance(tag, dict) or not isinstance(tag.get("name"), str):
        return None
    return {"name": tag["name"], "task": tag.get("task")}


def _of_sweep(entries: list, sweep: str) -> list:
    """Only that sweep's releases and reservations and what closes them (caps, partitions and
    versions stay)."""
    spends = ("release", "reservation")
    kept = [
        e
        for e in entries
        if e.kind not in spends or (e.payload.get("sweep") or {}).get("name") == sweep
    ]
    ids = {e.id for e in kept if e.kind in spends}
    return [e for e in kept if e.kind not in CLOSING_KINDS or e.payload.get("target") in ids]


def _identity_hint(recorded: list[dict], data_info: dict | None) -> str:
    """What differs between a refused data identity and the recorded releases, if it is public."""
    info = data_info or {}
    labels = ("the split differs: split_seed", "the preprocessing differs: profile")
    for key, label in zip(_DATA_INFO, labels):
        seen = sorted({str(p.get(key)) for p in recorded if p.get(key) is not None})
        if info.get(key) is not None and seen and str(info[key]) not in seen:
            return f"{label} {info[key]} here, {', '.join(seen)} in the recorded releases"
    return "other records: other data, another public/private division or other preprocessing"


def _matching(entries: list, entry_id: str) -> list:
    """The entry with id ``entry_id``, else those it is a prefix of (at least 6 characters)."""
    prefix = len(entry_id) >= 6
    exact = [e for e in entries if e.id == entry_id]
    return exact or [e for e in entries if prefix and e.id.startswith(entry_id)]


def _without(payload: dict, keys) -> dict:
    return {k: v for k, v in payload.items() if k not in keys}


def _check_split(dataset: str, parent: str, children: tuple, declared_by: object) -> None:
    """Refuse (UsageError) a partition declaration that is not a split of ``parent`` into distinct,
    named children by a named declarer."""
    check_name("dataset", dataset)
    check_name("parent partition", parent)
    if not children:
        raise UsageError(f"children must be at least one partition, got {list(children)!r}.")
    for child in children:
        check_name("child partition", child)
    if len(set(children)) != len(children) or parent in children:
        raise UsageError(
            f"children must be distinct and differ from the parent {parent!r}, "
            f"got {list(children)!r}."
        )
    if not isinstance(declared_by, str) or not declared_by.strip():
        raise UsageError(
            f"declared_by must be a non-empty string naming who made the split, "
            f"got {declared_by!r}."
        )


def _require_open(target: Entry, what: str) -> Entry:
    """``target``, unless it is a reservation already closed (UsageError naming ``what``)."""
    if target.kind == "reservation" and target.closed_by is not None:
        raise UsageError(
            f"{what} must be open, got {target.id} ({target.closed_as} by {target.closed_by})."
        )
    return target


def _spend_payload(spend: PlannedSpend, mechanism: object) -> dict:
    """The keys a reservation's and an audit's payload share: where it spends, what (its event,
    None: unbounded) and by which mechanism."""
    event = spend.event
    payload = dict(dataset_name=spend.dataset, partition=spend.partition, adjacency=spend.adjacency)
    guarantee = None if event is None else event.to_dict()
    payload.update(guarantee=guarantee, non_private=event is None, mechanism=str(mechanism))
    return {**payload, "dpaudit_version": __version__}


def _with(payload: dict, info: dict | None = None, **optional) -> dict:
    """``payload`` with the public data info and every ``optional`` key that is not None."""
    info = info or {}
    payload.update({key: info[key] for key in _DATA_INFO if info.get(key) is not None})
    payload.update({key: value for key, value in optional.items() if value is not None})
    return payload


@dataclass(frozen=True)
class Entry:
    """One row of the ledger, as stored."""

    seq: int
    id: str
    kind: str
    created_at: str
    dataset: str
    payload: dict
    prev_hash: str
    hash: str
    voided_by: str | None = None
    #: key id of the entry's signer (None: unsigned)
    signer: str | None = None
    #: reservations only: the settle / cancel / void entry that closed it (None: still open, spent).
    closed_by: str | None = None
    closed_as: str | None = None  # "settled", "cancelled" or "voided"

    @property
    def status(self) -> str | None:
        """A reservation's state: ``open`` (spent), ``settled``, ``cancelled`` or ``voided``."""
        if self.kind != "reservation":
            return None
        return "open" if self.closed_by is None else self.closed_as

    def to_dict(self) -> dict:
        head = {name: getattr(self, name) for name in ENTRY_COLUMNS[:5]}
        out = {**head, **self.payload, "prev_hash": self.prev_hash, "hash": self.hash}
        if self.signer is not None:
            out["signer"] = self.signer
        if self.kind in ("release", "audit"):
            out["voided_by"] = self.voided_by
        if self.kind == "reservation":
            out.update(closed_by=self.closed_by, status=self.status)
        return out

    def closed(self, closer: "Entry | None") -> "Entry":
        """This entry with the void of a release or audit, or what closed a reservation, filled
        in."""
        if closer is None:
            return self
        if self.kind in ("release", "audit") and closer.kind == "void":
            return dataclasses.replace(self, voided_by=closer.id)
        if self.kind == "reservation":
            closed_as = {"settle": "settled", "cancel": "cancelled", "void": "voided"}[closer.kind]
            return dataclasses.replace(self, closed_by=closer.id, closed_as=closed_as)
        return self


def open_ledger(path: str | os.PathLike | None = None, **options) -> "Ledger":
    """Open (creating if absent) the ledger at ``path``: a file (SQLite) or a ``postgresql://`` URL
    (see :func:`~dpaudit.ledger.paths.resolve_ledger`; any other scheme is refused).
    ``create=False`` (every reading command): a ledger file that does not exist is a LedgerError
    naming it, and nothing is created (on PostgreSQL: a schema without a ledger, left uncreated).

    Args:
        path: a file path or a ``postgresql://`` URL (None: the default ledger).
        **options: :class:`Ledger`'s keywords: ``busy_timeout`` (seconds to wait for another
            writer's lock), ``signing_key`` (the analyst's key, its name or path; default: the
            configured key, if any), ``create`` (create a missing ledger; False: refuse it) and
            ``owner`` (the owner's key id or public key, pinned from outside).

    Returns:
        The open Ledger (a context manager).

    Raises:
        UsageError: an unsupported location or signing key.
        LedgerError: the ledger cannot be opened or created, or does not exist with create=False.
    """
    return Ledger(path, **options)


class Ledger:
    """An open ledger on a path (SQLite), a ``postgresql://`` URL or a :class:`LedgerLocation`
    (:func:`~dpaudit.ledger.paths.resolve_ledger`; ``create=False``: a missing ledger file is a
    LedgerError and nothing is created). Use as a context manager; every method is safe across
    processes (and, on PostgreSQL, machines).
    ``signing_key``: the analyst's Ed25519 key (a :class:`~dpaudit.ledger.signing.SigningKey`, name
    or path; default: :func:`~dpaudit.ledger.signing.load_signing_key`), used once registered
    (:meth:`register_key`). ``owner``: the owner's key id (or public key), pinned from outside
    (default ``$DPAUDIT_LEDGER_OWNER``): every budget answer and :meth:`verify` then require its
    signed registration, so a ledger stripped of it fails closed."""

    def __init__(
        self,
        path: "str | os.PathLike | LedgerLocation | None" = None,
        *,
        busy_timeout: float = BUSY_TIMEOUT_S,
        signing_key: "SigningKey | str | None" = None,
        owner: str | None = None,
        create: bool = True,
    ) -> None:
        owner = owner_key_id(owner if owner is not None else os.environ.get(OWNER_ENV))
        # the key before the store: a refused key leaves nothing open
        key = signing_key if isinstance(signing_key, SigningKey) else load_signing_key(signing_key)
        self._key_bytes: bytes | None = None
        loc = resolve_ledger(path) if create else require_existing(resolve_ledger(path))
        if loc.backend == "postgresql":
            self._store = PostgresStore(loc, busy_timeout=float(busy_timeout), initialise=create)
            self.path = loc.display
        else:
            self.path = loc.path
            self._store = SqliteStore(self.path, busy_timeout=float(busy_timeout))
        self.backend = self._store.backend
        self._authority = Authority(self._store, self.path, key, owner)
        # appends one entry inside the caller's write transaction (the chain, signatures, rules)
        self._append = self._authority.append

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._store.close()

    @property
    def store(self):
        """The storage layer (SqliteStore or PostgresStore)."""
        return self._store

    @property
    def schema_version(self) -> int:
        return self._store.schema_version()

    # -- signatures and seals (the rules: .authority and .signing)
    def key_ring(self) -> KeyRing:
        """Registered keys and the signature policy (from the entries; signatures not re-checked).

        Returns:
            The KeyRing: registered keys, owner, signature policy and seal state.
        """
        return self._authority.ring()

    def register_key(self, public_key: str | None = None, name: str = "") -> str:
        """Register a public key (``ed25519:BASE64`` or a .pub file) so entries it signs verify.

        The first registration makes the ledger's *owner*: it registers this ledger's own signing
        key and is signed by it (``public_key`` None or that key). Every later one is signed by
        the owner's key (:class:`LedgerAuthorityError` otherwise: a member cannot add signers).
        Registering a known key returns its entry.

        Args:
            public_key: ``ed25519:BASE64``, a PEM block or a .pub file (None: this ledger's own key).
            name: a label recorded with the key.

        Returns:
            The key entry's id (the existing one for a known key).

        Raises:
            UsageError: an unreadable public key, no signing key, or a first key that is not
                this ledger's own.
            LedgerAuthorityError: a registration not signed by the owner's key.
        """
        raw = self._authority.public_raw(public_key)
        with self._store.write():
            return self._authority.register_key(raw, name)

    def require_signatures(self) -> str:
        """Record that every entry must be signed by a registered key (a signed ``policy`` entry).
        Since the owner's registration is itself the policy (see :mod:`~dpaudit.ledger.signing`),
        this adds a statement, not a rule. Returns the policy entry's id (the existing one if set).

        Returns:
            The policy entry's id.

        Raises:
            LedgerAuthorityError: on a signed ledger, a key other than the owner's.
            LedgerError: signatures are required and this ledger's key is not registered.
        """
        with self._store.write():
            return self._authority.require_signatures()

    def seal(self) -> dict:
        """Append an owner-signed ``seal`` of the current head: its signature covers every entry
        before it, so rewriting any of them (even re-signed by a registered member key) fails
        :meth:`verify` and every budget answer without an external anchor. The seal is also
        remembered on this machine (:func:`~.signing.remember_seal`), so removing it later (a
        truncation) is named here too. Owner only (:class:`LedgerAuthorityError`); a ledger with
        no owner is refused (UsageError). Returns the seal's id, seq and hash (publish it).

        Returns:
            ``{"id", "seq", "hash", "sealed_through"}`` of the seal.

        Raises:
            UsageError: the ledger has no owner.
            LedgerAuthorityError: a key other than the owner's.
            LedgerVerificationError: the ledger fails verification (nothing sealed).
        """
        with self._store.write():
            # a seal vouches for the chain before it: never for a failing one
            eid, sealed_through, owner_entry = self._authority.seal(self._intact_rows())
            head = self._store.head()
        out = dict(id=eid, seq=int(head[0]), hash=head[2], sealed_through=int(sealed_through))
        remember_seal(owner_entry, out["seq"], out["hash"])
        return out

    def seal_status(self) -> dict:
        """How far the owner has sealed this ledger (see :class:`~.signing.KeyRing`): ``owner``,
        ``sealed_through`` (seq of the last owner-signed entry), ``last_seal`` and ``unsealed``
        (entries after it), from the verified rows.

        Returns:
            ``{"owner", "sealed_through", "last_seal", "unsealed"}``.

        Raises:
            LedgerVerificationError: the ledger fails verification.
        """
        ring = self._authority.ring(self._intact_rows()).to_dict()
        return {k: ring[k] for k in ("owner", "sealed_through", "last_seal", "unsealed")}

    def record_plan(self, payload: dict) -> str:
        """Append a signed ``plan`` entry (:mod:`dpaudit.audit_plans`): a plan's registration, one run
        under it (written before the run computes anything, so that no run can be hidden) or that
        run's result. A plan is registered once, before its runs; a stage already recorded for the
        same run (a resumed audit) returns its entry; the rules are :mod:`dpaudit.ledger.plan_rules`
        (after any audit of its target, no registration; one result per run). Returns the entry id.

        Args:
            payload: the plan entry's payload (:mod:`dpaudit.audit_plans`).

        Returns:
            The plan entry's id (the existing one for a stage already recorded).

        Raises:
            UsageError: a malformed payload or a stage the plan rules refuse (a registration
                after an audit of its target, a run of an unregistered plan).
        """
        with self._store.write():
            rows = [r for r in self._store.rows() if r[2] in (PLAN_KIND, "audit")]
            seen = [(r[0], r[1], r[2], json.loads(r[5])) for r in rows]
            recorded = recorded_plan_entry(payload, seen, self.path)
            return recorded or self._append(PLAN_KIND, LEDGER_SCOPE, payload)

    def head(self) -> dict:
        """The current head to publish (``ledger verify --anchor HASH`` checks it later).

        Returns:
            ``{"ledger", "hash", "seq", "entries"}`` of the newest entry (the genesis hash when
            empty).

        Raises:
            LedgerError: the ledger cannot be read.
        """
        with self._store.read():
            h = self._store.head()
        return {"ledger": str(self.path), "hash": h[2], "seq": int(h[0]), "entries": int(h[1])}

    # -- reading
    def _entries_from_rows(self, rows) -> list[Entry]:
        out = [self._entry(*row) for row in rows]
        closers = {e.payload.get("target"): e for e in out if e.kind in CLOSING_KINDS}
        return [e.closed(closers.get(e.id)) for e in out]

    def _entry(self, seq, eid, kind, created_at, dataset, text, prev, h, *sig) -> Entry:
        try:
            payload = json.loads(text)
            if not isinstance(payload, dict):
                raise ValueError("payload is not an object")
        except ValueError as e:
            raise LedgerError(
                f"ledger entry #{seq} ({eid}) is unreadable ({e}); run `dpaudit ledger verify`."
            ) from None
        if kind == ROWS_KIND:  # keyed row hashes: for set tests only, never listed
            payload = _without(payload, ("hashes",))
        signer = sig[0] if sig else None
        payload = self._public_payload(payload)
        return Entry(seq, eid, kind, created_at, dataset, payload, prev, h, signer=signer)

    def _public_payload(self, payload: dict) -> dict:
        """The payload as shown and composed: the plain ``dataset_sha256`` of entries written
        before keyed fingerprints becomes its keyed ``dataset_fingerprint`` (the stored text, which
        the hash chain covers, is unchanged), so no listing or report shows a raw digest."""
        if "dataset_sha256" not in payload:
            return payload
        sha = payload["dataset_sha256"]
        out = _without(payload, ("dataset_sha256",))
        if isinstance(sha, str) and sha and not payload.get("dataset_fingerprint"):
            out["dataset_fingerprint"] = self.fingerprint(sha)
        else:
            out.setdefault("dataset_fingerprint", None)
        return out

    # -- dataset identity
    @property
    def key_path(self) -> Path | None:
        """The secret beside an SQLite ledger (``<ledger>.key``) that keys the dataset fingerprints
        (None on PostgreSQL, where the key is kept in the database, shared by the team)."""
        return key_path(self.path) if self.backend == "sqlite" else None

    def _key(self) -> bytes:
        if self._key_bytes is None:
            # A missing key with keyed entries present means it was lost or not copied along:
            # a fresh key would silently make every known dataset look like new data.
            lost = (
                self.backend == "sqlite"
                and not self.key_path.exists()
                and self._store.count_keyed() > 0
            )
            self._key_bytes = self._store.fingerprint_key(create=not lost)
        return self._key_bytes

    def fingerprint(self, digest: str) -> str:
        """The keyed fingerprint (HMAC-SHA256 under this ledger's key) of a plain data digest.

        Args:
            digest: the plain data digest (sha256 hex).

        Returns:
            The keyed fingerprint (64 hex).

        Raises:
            LedgerError: the fingerprint key is lost while keyed entries exist.
        """
        return keyed_fingerprint(self._key(), digest)

    def _check_identity(
        self,
        name: str,
        state: DatasetState | None,
        fp: str,
        data_info: dict | None,
        *,
        planned: bool,
    ) -> None:
        """Refuse (:class:`DatasetIdentityError`) data ``fp`` that is not a recorded or declared
        version of ``name`` (the hint says what public setting differs, if one does)."""
        if not fp or state is None or state.known_identity(fp):
            return
        shown = ", ".join(k[:12] for k in sorted(state.fingerprints))
        recorded = [
            e.payload for e in self.entries(dataset=name) if e.kind in ("release", "reservation")
        ]
        hint = _identity_hint(recorded, data_info)
        when = "before training" if planned else "not recorded"
        raise DatasetIdentityError(
            f"dataset {name!r} must name one set of records, got data fingerprint {fp[:12]} but "
            f"its releases used {shown} ({hint}); refused {when}. If this is a new version of "
            f"{name}, declare it: dpaudit ledger declare-version {name} --fingerprint {fp} "
            "--reason TEXT (the versions then compose sequentially)."
        )

    def entries(self, *, dataset: str | None = None, kind: str | None = None) -> list[Entry]:
        """All entries in append order (optionally of one dataset and/or kind); voided releases carry ``voided_by``.

        Args:
            dataset: only this dataset's entries (None: all).
            kind: only entries of this kind (None: all).

        Returns:
            The entries, with ``voided_by`` / ``closed_by`` filled in.

        Raises:
            LedgerError: an unreadable stored entry.
        """
        es = self._entries_from_rows(self._store.rows(dataset=dataset or None))
        return [e for e in es if kind is None or e.kind == kind]

    def get(self, entry_id: str) -> Entry:
        """The entry with this id (or a unique prefix of at least 6 characters).

        Args:
            entry_id: an entry id, or a unique prefix of at least 6 characters.

        Returns:
            The entry.

        Raises:
            UsageError: no entry, or several, match.
        """
        if not isinstance(entry_id, str) or not entry_id:
            raise UsageError(f"entry id must be a non-empty string, got {entry_id!r}.")
        matches = _matching(self.entries(), entry_id)
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise UsageError(
                f"entry id must identify one entry, got {entry_id!r} (matches {len(matches)})."
            )
        raise UsageError(f"entry id must be an id in ledger {self.path}, got {entry_id!r}.")

    def _intact_rows(self) -> list:
        """Every row, after the authority's checks (:meth:`.authority.Authority.intact`: fail
        closed)."""
        return self._authority.intact(self._snapshot())

    def _replayed(self) -> tuple[list, list[Entry], dict[str, DatasetState]]:
        """The verified rows, their entries and every dataset's replayed state (one read)."""
        rows = self._intact_rows()
        entries = self._entries_from_rows(rows)
        return rows, entries, replay(entries)

    def _states(
        self, dataset: str | None = None, sweep: str | None = None
    ) -> dict[str, DatasetState]:
        # Voids reference releases of the same dataset, so a per-dataset read is complete.
        rows = [r for r in self._intact_rows() if dataset is None or r[4] == dataset]
        es = self._entries_from_rows(rows)
        return replay(es if sweep is None else _of_sweep(es, sweep))

    def _state(self, dataset: str) -> DatasetState:
        return self._states(dataset).get(dataset) or DatasetState(dataset)

    def require_sweep(self, sweep: str) -> None:
        """Raise a UsageError naming the known sweeps unless ``sweep`` has releases here.

        Args:
            sweep: the sweep name.

        Raises:
            UsageError: no release is recorded under ``sweep``.
        """
        known = self.sweeps()
        if sweep not in known:
            allowed = ", ".join(sorted(known)) or "none recorded"
            raise UsageError(
                f"sweep must be one recorded in ledger {self.path} ({allowed}), got {sweep!r}."
            )

    def sweeps(self) -> dict[str, int]:
        """Sweep name -> number of releases recorded under it (see :func:`_sweep_tag`).

        Returns:
            ``{sweep name: releases recorded under it}``.
        """
        names = ((e.payload.get("sweep") or {}).get("name") for e in self.entries(kind="release"))
        return dict(Counter(name for name in names if name is not None))

    # -- writing
    def record(self, release: Release, *, artefact_path: str | None = None) -> str:
        """Append ``release`` (one transaction); returns its entry id (= ``release.id``); recording
        the identical release twice is a no-op. Refused: an unparsable guarantee, another adjacency
        or data fingerprint than the dataset's (see :meth:`declare_version`). An uncertified release
        is recorded as such (unbounded until voided). The cap is *not* enforced here: the model
        exists, and an unrecorded release is worse than an over-cap one (:meth:`reserve` refuses).

        Args:
            release: the release to record.
            artefact_path: where its artefacts were written (recorded as given).

        Returns:
            The entry id (``release.id``).

        Raises:
            LedgerError: the same id is recorded with other content.
            LedgerAdjacencyError: the dataset's releases use another adjacency.
            DatasetIdentityError: another data fingerprint than the dataset's.
        """
        with self._store.write():
            return self._record(release, artefact_path)

    def _release_payload(
        self, release: Release, artefact_path: str | None, rows: dict | None = None
    ) -> tuple[str, dict]:
        ds = release.dataset if isinstance(release.dataset, dict) else {}
        name = check_name("dataset name", ds.get("name"))
        partition = check_name("partition", release.partition)
        adjacency = Adjacency.parse(release.adjacency).value
        if not release.non_private:
            parse_event(release.guarantee, f"guarantee of release {release.id}")
        digest = getattr(release, "data_digest", None) or ds.get("sha256")
        tail = getattr(release, "noise_tail_delta", None)
        # keyed: the plain digest of the private data is never stored (see fingerprint.py)
        fingerprint = self.fingerprint(digest) if isinstance(digest, str) and digest else None
        payload = {
            "release_id": release.id,
            "dataset_name": name,
            "dataset_fingerprint": fingerprint,
            "partition": partition,
            "adjacency": adjacency,
            "privacy_unit": getattr(release, "privacy_unit", None),
            **{field: getattr(release, field) for field in _RELEASE_COPIED},
            "guarantee": None if release.non_private else release.guarantee,
            "epsilon": math.inf if release.non_private else release.epsilon,
            "non_private": bool(release.non_private),
            "artefact_path": artefact_path,
            "release_created_at": release.created_at,
        }
        # the sweep tag: `ledger list --sweep NAME` shows what a whole sweep spent; the tail:
        # every composed total accounts for it (compose.bounds); rows: the reservation's set ids
        newer = {"sweep": _sweep_tag(release.config), "uncertified": uncertified_reason(release)}
        tail = None if tail is None else float(tail)
        return name, _with(payload, ds, noise_tail_delta=tail, rows=rows, **newer)

    def _record(self, release: Release, artefact_path: str | None, rows: dict | None = None) -> str:
        """:meth:`record` inside the caller's write transaction (``rows``: the reservation's, see ledger.rows)."""
        name, payload = self._release_payload(release, artefact_path, rows)
        existing = self._store.rows(entry_id=release.id)
        if existing:
            if self._same_release(existing[0][5], payload):
                return release.id
            raise LedgerError(
                f"release {release.id} is already in ledger {self.path} with "
                "different content; a release id is recorded once."
            )
        state = self._states(name).get(name)
        budget.require_adjacency(state, payload["adjacency"], f"releases on dataset {name!r}")
        self._check_identity(
            name, state, payload["dataset_fingerprint"] or "", payload, planned=False
        )
        return self._append("release", name, payload, entry_id=release.id)

    def _same_release(self, stored_text: str, payload: dict) -> bool:
        """Whether a stored release payload records the release ``payload`` describes: the same
        text, or one written by an older dpaudit (no sweep tag, plain sha256 instead of the keyed
        fingerprint, no split_seed / profile / uncertified / tail / rows keys)."""
        if stored_text == canonical_json(payload):
            return True
        old = self._public_payload(json.loads(stored_text))
        newer = ("sweep", *_DATA_INFO, "uncertified", "noise_tail_delta", "rows")
        kept = all(
            k not in old or old[k] == payload.get(k) or (k == "rows" and k not in payload)
            for k in newer
        )
        return kept and _without(payload, newer) == _without(old, newer)

    def cap(
        self,
        dataset: str,
        epsilon: float,
        delta: float,
        *,
        include_audits: bool = True,
        data_rows=None,
    ) -> str:
        """Set the budget cap of ``dataset``: its composed epsilon at ``delta`` may not exceed ``epsilon``.

        Privacy contract: the cap counts releases, reservations and the audits that trained on the
        dataset (each :meth:`record_audit` is checked against it before its trials run, so an audit
        with an unbounded no-noise control is refused). ``include_audits=False`` (the recorded
        ``--exclude-audits`` opt-out) counts releases and reservations only; caps written before
        this default, with no ``include_audits`` key, keep reading as releases only. On a signed
        ledger only the owner's key may set a cap (:class:`LedgerAuthorityError`, nothing written).
        ``data_rows``: the rows the dataset reads (dpaudit.data.rows), declared now as keyed row
        sets (ledger.rows): the cap covers every name whose private rows meet them, from this entry
        on, before any release of ``dataset``. Without them a built-in name's cap covers every row
        of its source (fail closed); any other name's, its name and its entries' rows.

        Args:
            dataset: the dataset name.
            epsilon: the cap on the composed epsilon.
            delta: the delta the cap is at.
            include_audits: count the audits on the private data too.
            data_rows: the rows the dataset reads (see above).

        Returns:
            The cap entry's id.

        Raises:
            UsageError: an invalid epsilon, delta or rows.
            LedgerAuthorityError: a key other than the owner's on a signed ledger.
        """
        check_name("dataset", dataset)
        epsilon = positive_finite("epsilon", epsilon)
        delta = open_unit("delta", delta)
        if not isinstance(include_audits, bool):
            raise UsageError(f"include_audits must be True or False, got {include_audits!r}.")
        payload = dict(dataset=dataset, epsilon=epsilon, delta=delta, include_audits=include_audits)
        footprint = None if data_rows is None else self._footprint(data_rows)
        with self._store.write():
            index = self._people_index()[1]
            if footprint is None and dataset not in SOURCES:
                # another name: the rows its entries read, kept when those entries are voided later
                footprint = index.names.get(dataset)
            if footprint is not None:
                index.collisions(dataset, footprint)
                payload["rows"] = declare(self, footprint)
            return self._append("cap", dataset, payload)

    def declare_partition(self, dataset: str, parent: str, children, declared_by: str) -> str:
        """Record that ``parent`` is the disjoint union of ``children`` (as stated by ``declared_by``);
        releases on the children then compose in parallel. Re-declaring the identical split returns
        its entry id. Refused (:class:`~dpaudit.errors.LedgerAuthorityError`) when a child already
        holds a release or an open reservation: parallel composition after the fact would lower what
        was spent.

        Args:
            dataset: the dataset name.
            parent: the partition split.
            children: its disjoint parts.
            declared_by: who states that the parts are disjoint.

        Returns:
            The partition entry's id.

        Raises:
            UsageError: an invalid split.
            LedgerAuthorityError: a child already holds a release or an open reservation.
        """
        children = tuple(children)
        _check_split(dataset, parent, children, declared_by)
        with self._store.write():
            state = self._state(dataset)
            split = self.entries(dataset=dataset, kind="partition")
            same = [e.id for e in split if e.payload.get("parent") == parent]
            if state.check_partition(parent, children) and same:
                return same[0]
            integrity.refuse_held_children(state, parent, children)
            declarer = declared_by.strip()
            payload = dict(
                dataset=dataset, parent=parent, children=list(children), declared_by=declarer
            )
            return self._append("partition", dataset, payload)

    def void(self, entry_id: str, reason: str, *, published: bool | None = None) -> str:
        """Withdraw a release or audit recorded by mistake, or the open reservation of a killed run,
        with a ``void`` entry referencing it (the entry stays). Privacy contract: only a void that
        states never-published artefacts (``published`` False) stops counting; ``published`` None
        (not stated, allowed on an unsigned ledger only) withdraws the entry but its budget stays
        spent, as a published one's. On a signed ledger ``published`` is required and the owner's
        key must sign (:class:`~dpaudit.errors.LedgerAuthorityError`; docs/ledger.md).

        Args:
            entry_id: the release, audit or open reservation to withdraw.
            reason: why (recorded).
            published: whether its artefacts were ever published.

        Returns:
            The void entry's id.

        Raises:
            UsageError: an unknown entry, one already voided or closed, or an invalid ``published``.
            LedgerAuthorityError: on a signed ledger, ``published`` not stated or another key than
                the owner's.
        """
        reason = check_reason(reason)
        if published is not None and not isinstance(published, bool):
            raise UsageError(f"published must be True or False, got {published!r}.")
        with self._store.write():
            self._authority.require_void(published)
            target = self.get(entry_id)
            if target.kind not in ("release", "reservation", "audit"):
                raise UsageError(
                    f"entry to void must be a release, an audit or an open "
                    f"reservation, got a {target.kind} entry ({target.id})."
                )
            if target.voided_by:
                raise UsageError(
                    f"release to void must not be voided already, got {target.id} "
                    f"(voided by {target.voided_by})."
                )
            _require_open(target, "reservation to void")
            payload = _with({"target": target.id, "reason": reason}, artefacts_published=published)
            return self._append("void", target.dataset, payload)

    def record_audit(
        self,
        *,
        audit_id: str,
        dataset: str,
        partition: str,
        adjacency: str,
        event: Event | None,
        trials: int,
        mechanism: str,
        unbounded_reason: str | None = None,
        release_id: str | None = None,
    ) -> str:
        """Record, before its trials run, an audit that trains on ``dataset:partition``'s private
        records: ``event`` is what the trials compose to, None with ``unbounded_reason`` when some
        run without DP noise. In one write transaction, an audit that would push releases + audits
        over a cap that includes audits (its own or one reached through shared people, the rows
        caps declared included) is refused (:class:`BudgetExceededError`), as is one whose rows
        collide with another name's roles (:class:`~dpaudit.errors.RowRoleCollisionError`), and
        nothing is written. Its rows: the audited release's, else every row of a built-in name's
        source (fail closed, ledger.rows). Returns ``audit_id``.

        Args:
            audit_id: the audit's id.
            dataset: the dataset whose private records the trials train on.
            partition: its partition.
            adjacency: the adjacency of ``event``.
            event: what the trials compose to (None: unbounded).
            trials: the number of trials.
            mechanism: the audited mechanism.
            unbounded_reason: why the trials are unbounded (with ``event`` None).
            release_id: the audited release, if any.

        Returns:
            ``audit_id``.

        Raises:
            BudgetExceededError: releases + audits would exceed a cap that counts audits.
            RowRoleCollisionError: the audit's rows collide with another name's roles.
        """
        # the names and the adjacency checked as a planned release's
        payload = _spend_payload(PlannedSpend(dataset, partition, event, adjacency), mechanism)
        payload.update(audit_id=audit_id, trials=int(trials), release_id=release_id)
        if event is None:
            payload["unbounded_reason"] = str(unbounded_reason or "trials without DP noise")
        with self._store.write(), result_cache.recomputed():
            # One verified read serves the audited release's rows, the caps and the people index.
            rows, entries, states = self._replayed()
            audited = next((e.payload.get("rows") for e in entries if e.id == release_id), None)
            if release_id and isinstance(audited, dict):
                payload["rows"] = audited  # the audit trains on the audited release's rows
            view = release_view(audit_id, dataset, payload, kind="audit")
            budget.check_audit(states, PeopleIndex.build(rows, entries, states), view, payload)
            return self._append("audit", dataset, payload, entry_id=audit_id)

    # -- budget (the arithmetic: .budget)
    def check(self, *, exclude_reservations=(), **planned) -> dict:
        """What spending the ``planned`` release (the fields of a :class:`PlannedSpend`) would do to
        the budget (no write). Open reservations count like releases, except ``exclude_reservations``
        (those already holding this release: a sweep's). Raises :class:`DatasetIdentityError` for an
        unknown data digest and :class:`~dpaudit.errors.RowRoleCollisionError` for a role collision;
        every cap of a dataset sharing people with it is checked too (:mod:`.rows`).

        Args:
            exclude_reservations: reservation ids already holding this release.
            **planned: the fields of a PlannedSpend (dataset, epsilon, delta, event, ...).

        Returns:
            The budget check per dataset concerned (composed epsilon, cap, whether it fits).

        Raises:
            UsageError: an invalid planned spend.
            DatasetIdentityError: an unknown data digest.
            RowRoleCollisionError: a role collision with another name's rows.
        """
        return self._check(PlannedSpend(**planned), exclude_reservations)

    @result_cache.recomputed()  # a cap is decided on numbers computed here, never on a file
    def _check(self, plan: PlannedSpend, held) -> dict:
        dataset, adj = plan.dataset, plan.adjacency
        fp = self.fingerprint(plan.data_digest) if plan.data_digest else ""
        state = budget.without_held(self._state(dataset), held)
        what = f"the planned release and the releases on dataset {dataset!r}"
        budget.require_adjacency(state, adj, what)
        self._check_identity(dataset, state, fp, plan.data_info, planned=True)
        view = plan.view(fp)
        result = {"dataset": dataset, "partition": plan.partition, "adjacency": adj, "cap": None}
        result.update(allowed=True, fingerprint=fp or None)
        if plan.data_rows is not None:
            footprint = self._footprint(plan.data_rows)
            states, index = self._people_index(held)
            budget.people_columns(states, index, view, footprint, result)
        if state.cap is not None:
            result.update(budget.cap_columns(state, view, allowed=result["allowed"]))
        return result

    def _footprint(self, data_rows) -> dict:
        """Keyed row hashes of a planned release (computed once; a dict is already hashed)."""
        return data_rows if isinstance(data_rows, dict) else hash_rows(self._key(), data_rows)

    def preflight(self, *, exclude_reservations=(), **planned) -> dict:
        """:meth:`check`, raising its refusals (:class:`BudgetExceededError`) before any training;
        writes nothing (:meth:`reserve` also holds the budget). Returns :meth:`check`'s dict.

        Args:
            exclude_reservations: reservation ids already holding this release.
            **planned: the fields of a PlannedSpend.

        Returns:
            :meth:`check`'s dict.

        Raises:
            BudgetExceededError: the planned release would exceed a cap.
            UsageError: an invalid planned spend.
        """
        return self._preflight(PlannedSpend(**planned), exclude_reservations)

    def _preflight(self, plan: PlannedSpend, held=()) -> dict:
        checked = self._check(plan, held)
        budget.refuse(plan, checked)
        return checked

    def reserve(self, *, mechanism: str = "", **planned) -> str:
        """Hold the budget of a planned release: the :meth:`preflight` check and a ``reservation``
        entry in one write transaction; returns the reservation id.

        Privacy contract: the check and the write happen under SQLite's write lock (``BEGIN
        IMMEDIATE``), so runs started at the same time see each other's reservations and together
        never exceed a cap. The reservation counts like a release until it is closed by
        :meth:`settle` (the run's releases are recorded in the same transaction), :meth:`cancel`
        (the run ended without releasing anything) or :meth:`void` (an operator withdraws the
        reservation of a run that was killed). A run that dies without closing it leaves the
        budget spent: fail closed. ``noise_tail_delta`` (the planned run's sampler tail, computed
        from public sizes at the target epsilon, an upper bound on the release's) is held too.
        ``data_rows``: the rows it reads (see :meth:`check`), stored as keyed row sets (ledger.rows).

        Args:
            mechanism: the planned run's mechanism (recorded).
            **planned: the fields of a PlannedSpend (as :meth:`check`).

        Returns:
            The reservation id.

        Raises:
            BudgetExceededError: the planned release would exceed a cap (nothing written).
            UsageError: an invalid planned spend.
        """
        plan = PlannedSpend(**planned)
        footprint = None if plan.data_rows is None else self._footprint(plan.data_rows)
        plan = dataclasses.replace(plan, data_rows=footprint)
        with self._store.write():
            fp = self._preflight(plan)["fingerprint"]
            payload = _spend_payload(plan, mechanism or "")
            payload.update(dataset_fingerprint=fp, pid=os.getpid(), host=_hostname())
            _with(
                payload,
                plan.data_info,
                uncertified=str(plan.uncertified) if plan.uncertified else None,
                noise_tail_delta=float(plan.noise_tail_delta) if plan.noise_tail_delta else None,
                rows=None if footprint is None else declare(self, footprint),
            )
            return self._append("reservation", plan.dataset, payload)

    def _open_reservation(self, reservation_id: str) -> Entry:
        target = self.get(reservation_id)
        if target.kind != "reservation":
            raise UsageError(
                f"reservation id must name a reservation, got a {target.kind} entry ({target.id})."
            )
        return _require_open(target, "reservation")

    def settle(self, reservation_id: str, releases) -> list[str]:
        """Record the run's ``releases`` (``(Release, artefact_path)`` pairs) and close the
        reservation, in one transaction; returns the release ids. Either all of it is in the
        ledger afterwards, or none of it (and the reservation stays open, spent).

        Args:
            reservation_id: the open reservation.
            releases: ``(Release, artefact_path)`` pairs.

        Returns:
            The recorded release ids.

        Raises:
            UsageError: no open reservation with that id.
            LedgerError: a release id already recorded with other content.
        """
        items = [(r, None) if isinstance(r, Release) else tuple(r) for r in releases]
        with self._store.write():
            target = self._open_reservation(reservation_id)
            ids = [self._record(rel, art, target.payload.get("rows")) for rel, art in items]
            self._append("settle", target.dataset, {"target": target.id, "releases": ids})
        return ids

    def cancel(self, reservation_id: str, reason: str) -> str:
        """Close a reservation whose run released nothing (failed or interrupted before publishing).

        Args:
            reservation_id: the open reservation.
            reason: why the run released nothing (recorded).

        Returns:
            The cancel entry's id.

        Raises:
            UsageError: no open reservation with that id, or an empty reason.
        """
        reason = check_reason(reason)
        with self._store.write():
            target = self._open_reservation(reservation_id)
            return self._append("cancel", target.dataset, {"target": target.id, "reason": reason})

    def open_reservations(self, dataset: str | None = None) -> list[Entry]:
        """Reservations not yet settled, cancelled or voided (their budget is spent).

        Args:
            dataset: only this dataset's reservations (None: all).

        Returns:
            The open reservation entries.
        """
        return [e for e in self.entries(dataset=dataset, kind="reservation") if e.closed_by is None]

    def declare_version(self, dataset: str, fingerprint: str, reason: str) -> str:
        """Accept data with keyed ``fingerprint`` (the 64 hex printed by the refusal) as a new version
        of ``dataset``; an already declared version returns its entry id. Privacy contract: the
        versions may share any records, so they compose *sequentially* in every total
        (:meth:`~.compose.DatasetState.version_groups`).

        Args:
            dataset: the dataset name.
            fingerprint: the keyed fingerprint (64 hex) of the new data.
            reason: why the data changed (recorded).

        Returns:
            The version entry's id.

        Raises:
            UsageError: an invalid name, fingerprint or reason, or a fingerprint the dataset's
                releases already use.
        """
        check_name("dataset", dataset)
        fp = fingerprint.strip().lower() if isinstance(fingerprint, str) else fingerprint
        if not is_fingerprint(fp):
            raise UsageError(
                f"fingerprint must be the 64 hex characters printed by the refusal, got {fingerprint!r}."
            )
        reason = check_reason(reason)
        with self._store.write():
            state = self._state(dataset)
            if fp in state.versions:
                return state.versions[fp]
            if fp in state.fingerprints:
                raise UsageError(
                    f"fingerprint must be new to dataset {dataset!r}, got {fp[:12]}, "
                    "which its releases already use."
                )
            previous = sorted(state.fingerprints)
            payload = dict(dataset=dataset, fingerprint=fp, reason=reason, previous=previous)
            return self._append("version", dataset, payload)

    def summary(
        self,
        dataset: str | None = None,
        *,
        accountants=("rdp", "prv"),
        sweep: str | None = None,
        progress: bool = False,
    ) -> list[dict]:
        """Per dataset: one row for the whole dataset (partition ``"*"``) and one per partition
        (:func:`.budget.summary_rows`; the columns are those of ``ledger summary``, docs/ledger.md).
        ``sweep``: only the releases recorded under that sweep (``remaining`` is then None: it is a
        property of the whole dataset). ``progress``: one step per dataset composed, on stderr.

        Args:
            dataset: only this dataset (None: all).
            accountants: the accountants whose bounds are shown (the smallest is ``epsilon``).
            sweep: only the releases of this sweep.
            progress: show progress on stderr.

        Returns:
            The summary rows.

        Raises:
            UsageError: an unknown dataset or sweep.
        """
        if dataset is not None:
            check_name("dataset", dataset)
        if sweep is not None:
            self.require_sweep(sweep)
        states = self._states(dataset, sweep)
        if sweep is not None:
            states = {k: v for k, v in states.items() if v.releases}
        if dataset is not None and dataset not in states:
            under = "" if sweep is None else f" under sweep {sweep!r}"
            raise UsageError(
                f"dataset must be one recorded in ledger {self.path}{under}, got {dataset!r}."
            )
        people = budget.people_summary(*self._people_index(), accountants) if sweep is None else {}
        return budget.summary_rows(
            states, people, accountants, whole=sweep is None, progress=progress
        )

    def _people_index(self, held=()) -> tuple[dict, "PeopleIndex"]:
        """Every dataset's state (without the open reservations ``held``, see
        :func:`.budget.without_held`) and the index of who shares people with whom (ledger.rows),
        from the verified entries."""
        rows, entries, states = self._replayed()
        states = {n: budget.without_held(st, held) for n, st in states.items()}
        return states, PeopleIndex.build(rows, entries, states)

    # -- integrity
    def verify(self, *, anchor: str | None = None, owner: str | None = None) -> VerifyReport:
        """:func:`.integrity.verify_snapshot` of one read of the store: the chain, the store's own
        checks, every entry and signature, and ``anchor`` (a head hash published earlier with
        ``ledger head``). ``owner``: the key id the ledger's first registered key must have
        (default: the one this ledger was opened with).

        Args:
            anchor: a head hash published earlier.
            owner: the key id the first registered key must have.

        Returns:
            The report: entries, head hash and every problem found (none: intact).

        Raises:
            UsageError: an anchor that is not a 64-hex hash.
        """
        owner = self._authority.owner if owner is None else owner_key_id(owner)
        return integrity.verify_snapshot(self._snapshot(health=True), anchor=anchor, owner=owner)

    def _snapshot(self, *, health: bool = False) -> Snapshot:
        # One read transaction, so the head and the rows are from the same snapshot.
        st = self._store
        with st.read():
            stored = (st.schema_version(), st.head(), st.rows(), st.health() if health else [])
            return Snapshot(str(self.path), self.backend, *stored)

    # -- moving a ledger between backends
    def export_rows(self, *, include_key: bool = False) -> dict:
        """Everything needed to rebuild this ledger elsewhere: every stored row verbatim (hashes
        and signatures included) and, only with ``include_key``, the fingerprint key (whoever holds
        it can test a candidate dataset against the stored fingerprints). Refused if the ledger
        fails verification.

        Args:
            include_key: include the fingerprint key (base64).

        Returns:
            The export: format, schema version, head hash, columns, rows and the key (or None).

        Raises:
            LedgerError: the ledger fails verification (nothing exported).
        """
        rep = self.verify()
        if not rep.ok:
            first = rep.problems[0].message.rstrip(".")
            raise LedgerError(
                f"ledger {self.path} fails verification ({first}); it was not exported."
            )
        return integrity.export_dump(self._snapshot(), self._key() if include_key else None)

    def import_rows(self, dump: dict) -> int:
        """Append the rows of :meth:`export_rows` verbatim into this *empty* ledger (one transaction);
        the chain, hashes and signatures are kept exactly, so verify passes on both sides.

        Args:
            dump: an export of :meth:`export_rows`.

        Returns:
            The number of rows imported.

        Raises:
            UsageError: not an export, its key is not 32 bytes, or this ledger is not empty.
            LedgerError: the export's chain does not verify (nothing imported).
        """
        integrity.require_export(dump)
        key = integrity.export_key(dump)  # refused before any row is written, on every backend
        with self._store.write():
            if present := len(self._store.rows()):
                raise UsageError(
                    f"ledger to import into must be empty, got {self.path} with {present} entries."
                )
            rows = integrity.import_chain(dump)
            for r in rows:
                self._store.insert(*r[1:])
            if key:
                self._store.set_fingerprint_key(key)
        self._key_bytes = None
        return len(rows)


def _hostname() -> str:
    try:
        return socket.gethostname()
    except OSError:
        return ""

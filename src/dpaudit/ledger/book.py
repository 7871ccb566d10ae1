"""The privacy budget ledger: a durable, append-only record of every release of every dataset.

The rows live in an SQLite file (:mod:`.store_sqlite`) or a PostgreSQL schema (:mod:`.store_pg`);
everything here is written once, for both. The guarantees (one transaction per write, append-only
entry kinds, reservations held before training and closed by ``settle`` / ``cancel`` / ``void``,
one data identity per dataset name unless a version is declared, the hash chain and signatures
checked before every budget answer, schema migrations) are stated in docs/ledger.md
("Reliability", "How the total is composed"); composition itself is :mod:`.compose`.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import os
import re
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path

from .. import __version__
from ..accounting.adjacency import Adjacency, require_same
from ..accounting.events import Event
from ..claims import integer, steps_accounted, steps_problem
from ..errors import (BudgetExceededError, DatasetIdentityError, LedgerAdjacencyError, LedgerAuthorityError,
                      LedgerError, LedgerVerificationError, UsageError)
from ..records import Release, public_noise_reason
from ..validation import open_unit, positive_finite
from . import compose as lc
from . import rows as lr
from . import integrity, queries, result_cache
from . import signing as sg
from .fingerprint import is_fingerprint, key_path, keyed_fingerprint
from .integrity import GENESIS_HASH, Problem, Snapshot, VerifyReport, canonical_json, chain_problems, entry_hash  # noqa: F401
from .paths import LedgerLocation, require_existing, resolve_ledger, utc_now
from .plan_rules import PLAN_STAGES, recorded_plan_entry  # noqa: F401  (PLAN_STAGES: re-exported)
from .store_pg import PostgresStore
# Storage lives in store_sqlite / store_pg; re-exported here (tests patch MIGRATIONS in place).
from .store_sqlite import APPLICATION_ID, MIGRATIONS, SqliteStore, latest_schema_version  # noqa: F401

#: Seconds a writer waits for another process's transaction before giving up.
BUSY_TIMEOUT_S = 60.0
_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*$")


def _sweep_tag(config: object) -> dict | None:
    """``{"name", "task"}`` from a release's ``config["sweep"]`` (written by dpaudit.sweeps), else None."""
    tag = config.get("sweep") if isinstance(config, dict) else None
    if not isinstance(tag, dict) or not isinstance(tag.get("name"), str):
        return None
    return {"name": tag["name"], "task": tag.get("task")}


def uncertified_reason(release: Release) -> str | None:
    """Why ``release``'s guarantee is not certified (it then counts as unbounded), else None: its DP
    noise is derived from its published seed (:func:`dpaudit.records.public_noise_reason`); its
    executed steps differ from the steps its guarantee accounts for (rule 2 of :mod:`dpaudit.claims`:
    the stored events do not describe what ran); or its noise sampler records ``certified: false``
    in ``config["sampler_guarantee"]`` (the textbook floating-point Laplace sampler of DP-ELM holds
    its epsilon only in ideal arithmetic, Mironov 2012; :mod:`dpaudit.mechanisms.laplace`)."""
    if getattr(release, "non_private", False):
        return None
    public = public_noise_reason(release.noise_source)
    if public is not None:
        return public
    steps = steps_problem(integer(release.steps_executed), steps_accounted(release))
    if steps is not None:
        return f"uncertified: {steps} (its stored guarantee does not describe what ran)"
    g = release.config.get("sampler_guarantee") if isinstance(release.config, dict) else None
    if isinstance(g, dict) and g.get("certified") is False:
        return sampler_uncertified_reason(str(g.get("sampler") or "unknown"))
    return None


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
    return (f"audit of dataset {dataset!r} refused before any trial ran: {reason}, so its cost is unbounded "
            f"(epsilon=inf) and {cap} counts audits; {fix}, or have the owner set the cap with --exclude-audits.")


def sampler_uncertified_reason(sampler: str) -> str:
    """The one wording of an uncertified sampler, shared by reservations and releases."""
    if sampler == "textbook":
        return "uncertified: textbook floating-point Laplace sampler (ideal-arithmetic guarantee only)"
    return f"uncertified: {sampler} sampler (no finite-precision guarantee)"


def _check_name(what: str, value: object) -> str:
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise UsageError(f"{what} must be a non-empty name of letters, digits, '_', '-', '.' and '/' separators, got {value!r}.")
    return value


def _closed(e: "Entry", closer: "Entry | None") -> "Entry":
    """``e`` with the void of a release or audit, or what closed a reservation, filled in."""
    if closer is None:
        return e
    if e.kind in ("release", "audit") and closer.kind == "void":
        return dataclasses.replace(e, voided_by=closer.id)
    if e.kind == "reservation":
        return dataclasses.replace(e, closed_by=closer.id, closed_as={"settle": "settled", "cancel": "cancelled", "void": "voided"}[closer.kind])
    return e


def _check_reason(reason: object) -> str:
    if not isinstance(reason, str) or not reason.strip():
        raise UsageError(f"reason must be a non-empty explanation, got {reason!r}.")
    return reason.strip()


# ---------------------------------------------------------------- records


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
        d = {
            "seq": self.seq, "id": self.id, "kind": self.kind, "created_at": self.created_at,
            "dataset": self.dataset, **self.payload, "prev_hash": self.prev_hash, "hash": self.hash,
        }
        if self.signer is not None:
            d["signer"] = self.signer
        if self.kind in ("release", "audit"):
            d["voided_by"] = self.voided_by
        if self.kind == "reservation":
            d["closed_by"] = self.closed_by
            d["status"] = self.status
        return d


# ---------------------------------------------------------------- opening


def open_ledger(path: str | os.PathLike | None = None, *, busy_timeout: float = BUSY_TIMEOUT_S,
                signing_key: "sg.SigningKey | str | None" = None, create: bool = True, owner: str | None = None) -> "Ledger":
    """Open (creating if absent) the ledger at ``path``: a file (SQLite) or a ``postgresql://`` URL
    (see :func:`~dpaudit.ledger.paths.resolve_ledger`; any other scheme is refused).
    ``create=False`` (every reading command): a ledger file that does not exist is a LedgerError
    naming it, and nothing is created (on PostgreSQL: a schema without a ledger, left uncreated)."""
    loc = resolve_ledger(path)
    if not create:
        require_existing(loc)
    return Ledger(loc.path if loc.backend == "sqlite" else loc, busy_timeout=busy_timeout, signing_key=signing_key, owner=owner,
                  create=create)


class Ledger:
    """An open ledger on a path (SQLite) or a ``postgresql://`` :class:`LedgerLocation`. Use as a
    context manager; every method is safe across processes (and, on PostgreSQL, machines).
    ``signing_key``: the analyst's Ed25519 key (a :class:`~dpaudit.ledger.signing.SigningKey`, name
    or path; default: :func:`~dpaudit.ledger.signing.load_signing_key`), used once registered
    (:meth:`register_key`). ``owner``: the owner's key id (or public key), pinned from outside
    (default ``$DPAUDIT_LEDGER_OWNER``): every budget answer and :meth:`verify` then require its
    signed registration, so a ledger stripped of it fails closed."""

    def __init__(self, path: "str | os.PathLike | LedgerLocation", *, busy_timeout: float = BUSY_TIMEOUT_S,
                 signing_key: "sg.SigningKey | str | None" = None, owner: str | None = None, create: bool = True) -> None:
        self._owner = sg.owner_key_id(owner if owner is not None else os.environ.get(sg.OWNER_ENV))
        self._busy_timeout = float(busy_timeout)
        self._key_bytes: bytes | None = None
        self._verified: set[tuple[str, str]] = set()  # (id, hash) of entries whose signature checked out
        self._authority_clean: str | None = None  # head hash whose authority check found nothing
        if isinstance(path, LedgerLocation) and path.backend == "postgresql":
            self._store = PostgresStore(path, busy_timeout=self._busy_timeout, initialise=create)
            self.path = path.display
        else:
            p = path.path if isinstance(path, LedgerLocation) else path
            self._store = SqliteStore(Path(p), busy_timeout=self._busy_timeout)
            self.path = Path(p)
        self.backend = self._store.backend
        try:
            self._signing_key = signing_key if isinstance(signing_key, sg.SigningKey) else sg.load_signing_key(signing_key)
        except BaseException:
            self.close()
            raise

    # -- context manager
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

    def _append(self, kind: str, dataset: str, payload: dict, entry_id: str | None = None) -> str:
        """Append one entry inside the caller's write transaction and advance the chain head.

        Signed with this ledger's signing key when that key is registered; refused unsigned when
        the ledger requires signatures (a ``policy`` entry)."""
        st = self._store
        entry_id = entry_id or uuid.uuid4().hex
        head = st.head()
        if head is None:
            raise LedgerError(f"ledger {self.path} has no chain head; run `dpaudit ledger verify`.")
        last = st.last()
        if (last[1] if last else GENESIS_HASH) != head[2]:
            # Appending after a broken chain would bury the break; refuse instead.
            raise LedgerError(f"ledger {self.path} fails its integrity check (last entry does not match the chain head); run `dpaudit ledger verify`.")
        created_at = utc_now()
        text = canonical_json(payload)
        signer = signature = None
        key = self._signer_for(kind, payload)
        if key is not None:
            signer = key.key_id
            signature = key.sign(sg.signing_material(head[2], entry_id, kind, created_at, dataset, text, signer))
        h = entry_hash(head[2], entry_id, kind, created_at, dataset, text, signer, signature)
        st.insert(entry_id, kind, created_at, dataset, text, head[2], h, signer, signature)
        return entry_id

    # -- signatures
    def key_ring(self) -> sg.KeyRing:
        """Registered keys and the signature policy (from the entries; signatures not re-checked)."""
        ring, _ = sg.check_signatures(integrity.signed_rows(self._store.rows()), verify=False)
        return ring

    def _signer_for(self, kind: str, payload: dict) -> "sg.SigningKey | None":
        key = self._signing_key
        ring = self.key_ring()
        if kind == sg.KEY_KIND and not ring.keys and key is not None and payload.get("key_id") == key.key_id:
            return key  # the owner's self-signed registration
        if key is not None and key.key_id in ring.keys:
            self._require_authority(ring, kind, payload, key)
            return key
        if ring.required_since is not None:
            why = "no signing key (create one with `dpaudit ledger keygen`)" if key is None else \
                f"signing key {key.key_id} is not registered in it"
            raise LedgerError(f"ledger {self.path} requires signed entries (since entry #{ring.required_since}), but {why}; "
                              "nothing was written.")
        if kind in sg.LEDGER_KINDS:
            raise UsageError(f"a {kind} entry must be signed by a registered key, got "
                             + ("no signing key." if key is None else f"unregistered key {key.key_id}."))
        return None

    def _require_authority(self, ring: sg.KeyRing, kind: str, payload: dict, key) -> None:
        """Refuse (:class:`LedgerAuthorityError`, nothing written) an entry ``key`` may not sign on
        this ledger (:func:`~.signing.authority_problem`, the rule ``verify`` applies when reading)."""
        kid = None if key is None else key.key_id
        if sg.authority_problem(ring, kind, payload, kid) is None:
            return
        got = "no signing key" if kid is None else f"key {kid}"
        if kind in sg.OWNER_KINDS:
            raise LedgerAuthorityError(f"{kind} on signed ledger {self.path} must be signed by its owner's key "
                                       f"{ring.owner}, got {got}: only the owner may {sg.OWNER_POWERS[kind]}; nothing was written.")
        raise LedgerAuthorityError(f"{kind} of reservation {payload.get('target')} on signed ledger {self.path} must be "
                                   f"signed by the key that opened it or by the owner's key {ring.owner}, got {got}; "
                                   "nothing was written.")

    def register_key(self, public_key: str | None = None, name: str = "") -> str:
        """Register a public key (``ed25519:BASE64`` or a .pub file) so entries it signs verify.

        The first registration makes the ledger's *owner*: it registers this ledger's own signing
        key and is signed by it (``public_key`` None or that key). Every later one is signed by
        the owner's key (:class:`LedgerAuthorityError` otherwise: a member cannot add signers).
        Registering a known key returns its entry."""
        key = self._signing_key
        if key is None:
            raise UsageError("signing key must exist to register keys, got none (create one with `dpaudit ledger keygen`).")
        raw = key.public_raw if public_key is None else sg.parse_public_key(public_key)
        with self._store.write():
            ring = self.key_ring()
            kid = sg.key_id(raw)
            if kid in ring.keys:
                return ring.keys[kid].entry_id
            if not ring.keys and kid != key.key_id:
                raise UsageError(f"the first key registered must be your own (the owner's, {key.key_id}), got {kid}; "
                                 "run `dpaudit ledger register-key` without --public-key first.")
            role = "owner" if not ring.keys else "member"
            label = name or (key.name if kid == key.key_id else kid[:12])
            return self._append(sg.KEY_KIND, sg.LEDGER_SCOPE, sg.key_payload(raw, label, role))

    def require_signatures(self) -> str:
        """Record that every entry must be signed by a registered key (a signed ``policy`` entry).
        Since the owner's registration is itself the policy (see :mod:`~dpaudit.ledger.signing`),
        this adds a statement, not a rule. Returns the policy entry's id (the existing one if set)."""
        with self._store.write():
            for r in self._store.rows():
                if r[2] == sg.POLICY_KIND and r[8] is not None:
                    return r[1]
            return self._append(sg.POLICY_KIND, sg.LEDGER_SCOPE, {"require_signatures": True})

    def seal(self) -> dict:
        """Append an owner-signed ``seal`` of the current head: its signature covers every entry
        before it, so rewriting any of them (even re-signed by a registered member key) fails
        :meth:`verify` and every budget answer without an external anchor. The seal is also
        remembered on this machine (:func:`~.signing.remember_seal`), so removing it later (a
        truncation) is named here too. Owner only (:class:`LedgerAuthorityError`); a ledger with
        no owner is refused (UsageError). Returns the seal's id, seq and hash (publish it)."""
        with self._store.write():
            self._intact_rows()  # a seal vouches for the chain before it: never for a failing one
            ring = self.key_ring()
            if ring.owner is None:
                raise UsageError(f"ledger to seal must have an owner (run `dpaudit ledger register-key` first), "
                                 f"got {self.path} with none.")
            seq, _, prev = self._store.head()
            eid = self._append(sg.SEAL_KIND, sg.LEDGER_SCOPE, sg.seal_payload(seq, prev))
            head = self._store.head()
        out = {"id": eid, "seq": int(head[0]), "hash": head[2], "sealed_through": int(seq)}
        sg.remember_seal(ring.keys[ring.owner].entry_id, out["seq"], out["hash"])
        return out

    def seal_status(self) -> dict:
        """How far the owner has sealed this ledger (see :class:`~.signing.KeyRing`): ``owner``,
        ``sealed_through`` (seq of the last owner-signed entry), ``last_seal`` and ``unsealed``
        (entries after it), from the verified rows."""
        ring, _ = sg.check_signatures(integrity.signed_rows(self._intact_rows()), verify=False)
        keep = ("owner", "sealed_through", "last_seal", "unsealed")
        return {k: v for k, v in ring.to_dict().items() if k in keep}

    def record_plan(self, payload: dict) -> str:
        """Append a signed ``plan`` entry (:mod:`dpaudit.audit_plans`): a plan's registration, one run
        under it (written before the run computes anything, so that no run can be hidden) or that
        run's result. A plan is registered once, before its runs; a stage already recorded for the
        same run (a resumed audit) returns its entry; the rules are :mod:`dpaudit.ledger.plan_rules`
        (after any audit of its target, no registration; one result per run). Returns the entry id."""
        with self._store.write():
            seen = [(r[0], r[1], r[2], json.loads(r[5])) for r in self._store.rows()
                    if r[2] in (sg.PLAN_KIND, "audit")]
            recorded = recorded_plan_entry(payload, seen, self.path)
            return recorded or self._append(sg.PLAN_KIND, sg.LEDGER_SCOPE, payload)

    def head(self) -> dict:
        """The current head to publish (``ledger verify --anchor HASH`` checks it later)."""
        with self._store.read():
            h = self._store.head()
        return {"ledger": str(self.path), "hash": h[2], "seq": int(h[0]), "entries": int(h[1])}

    # -- reading
    def _entries_from_rows(self, rows) -> list[Entry]:
        out = []
        for seq, eid, kind, created_at, dataset, text, prev, h, *sig in rows:
            try:
                payload = json.loads(text)
                if not isinstance(payload, dict):
                    raise ValueError("payload is not an object")
            except ValueError as e:
                raise LedgerError(f"ledger entry #{seq} ({eid}) is unreadable ({e}); run `dpaudit ledger verify`.") from None
            if kind == lr.ROWS_KIND:  # keyed row hashes: for set tests only, never listed
                payload = {k: v for k, v in payload.items() if k != "hashes"}
            out.append(Entry(seq, eid, kind, created_at, dataset, self._public_payload(payload), prev, h,
                             signer=sig[0] if sig else None))
        closers = {e.payload.get("target"): e for e in out if e.kind in lc.CLOSING_KINDS}
        return [_closed(e, closers.get(e.id)) for e in out]

    def _public_payload(self, payload: dict) -> dict:
        """The payload as shown and composed: the plain ``dataset_sha256`` of entries written
        before keyed fingerprints becomes its keyed ``dataset_fingerprint`` (the stored text, which
        the hash chain covers, is unchanged), so no listing or report shows a raw digest."""
        sha = payload.get("dataset_sha256")
        if "dataset_sha256" not in payload:
            return payload
        out = {k: v for k, v in payload.items() if k != "dataset_sha256"}
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
            create = True
            if self.backend == "sqlite" and not self.key_path.exists():
                # A missing key with keyed entries present means it was lost or not copied along:
                # a fresh key would silently make every known dataset look like new data.
                create = self._store.count_keyed() == 0
            self._key_bytes = self._store.fingerprint_key(create=create)
        return self._key_bytes

    def fingerprint(self, digest: str) -> str:
        """The keyed fingerprint (HMAC-SHA256 under this ledger's key) of a plain data digest."""
        return keyed_fingerprint(self._key(), digest)

    def _identity_error(self, name: str, state: lc.DatasetState, fp: str, data_info: dict | None, *, planned: bool) -> DatasetIdentityError:
        known = sorted(state.fingerprints)
        shown = ", ".join(k[:12] for k in known)
        recorded = [e.payload for e in self.entries(dataset=name) if e.kind in ("release", "reservation")]
        hint = "other records: other data, another public/private division or other preprocessing"
        info = data_info or {}
        for key, label in (("split_seed", "the split differs: split_seed"), ("profile", "the preprocessing differs: profile")):
            seen = sorted({str(p.get(key)) for p in recorded if p.get(key) is not None})
            if info.get(key) is not None and seen and str(info[key]) not in seen:
                hint = f"{label} {info[key]} here, {', '.join(seen)} in the recorded releases"
                break
        when = "before training" if planned else "not recorded"
        return DatasetIdentityError(
            f"dataset {name!r} must name one set of records, got data fingerprint {fp[:12]} but its releases used {shown} "
            f"({hint}); refused {when}. If this is a new version of {name}, declare it: "
            f"dpaudit ledger declare-version {name} --fingerprint {fp} --reason TEXT (the versions then compose sequentially)."
        )

    def _check_identity(self, name: str, state: lc.DatasetState | None, fp: str, data_info: dict | None, *, planned: bool) -> None:
        if fp and state is not None and not state.known_identity(fp):
            raise self._identity_error(name, state, fp, data_info, planned=planned)

    def entries(self, *, dataset: str | None = None, kind: str | None = None) -> list[Entry]:
        """All entries in append order (optionally of one dataset and/or kind); voided releases carry ``voided_by``."""
        es = self._entries_from_rows(self._store.rows(dataset=dataset or None))
        return [e for e in es if kind is None or e.kind == kind]

    def get(self, entry_id: str) -> Entry:
        """The entry with this id (or a unique prefix of at least 6 characters)."""
        if not isinstance(entry_id, str) or not entry_id:
            raise UsageError(f"entry id must be a non-empty string, got {entry_id!r}.")
        es = self.entries()
        exact = [e for e in es if e.id == entry_id]
        if exact:
            return exact[0]
        matches = [e for e in es if e.id.startswith(entry_id)] if len(entry_id) >= 6 else []
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise UsageError(f"entry id must identify one entry, got {entry_id!r} (matches {len(matches)}).")
        raise UsageError(f"entry id must be an id in ledger {self.path}, got {entry_id!r}.")

    def _intact_rows(self) -> list:
        """Every row, after checking the whole hash chain and every signature: budgets are never
        computed from a ledger that was edited, truncated, reordered or forged (fail closed)."""
        snap = self._snapshot()
        problems = (chain_problems(snap.head, snap.rows) or self._signature_problems(snap.rows)
                    or self._authority_problems(snap.rows))
        if problems:
            raise LedgerVerificationError(f"ledger {self.path} fails verification ({problems[0].message.rstrip('.')}); run `dpaudit ledger verify`.")
        return snap.rows

    def _intact_entries(self, dataset: str | None = None) -> list[Entry]:
        return self._entries_from_rows([r for r in self._intact_rows() if dataset is None or r[4] == dataset])

    def _states(self, dataset: str | None = None, sweep: str | None = None) -> dict[str, lc.DatasetState]:
        # Voids reference releases of the same dataset, so a per-dataset read is complete.
        es = self._intact_entries(dataset)
        if sweep is not None:  # only that sweep's releases (caps, partitions, versions stay)
            es = [e for e in es if e.kind not in ("release", "reservation") or (e.payload.get("sweep") or {}).get("name") == sweep]
            kept = {e.id for e in es if e.kind in ("release", "reservation")}
            es = [e for e in es if e.kind not in lc.CLOSING_KINDS or e.payload.get("target") in kept]
        return lc.replay(es)

    def require_sweep(self, sweep: str) -> None:
        """Raise a UsageError naming the known sweeps unless ``sweep`` has releases here."""
        known = self.sweeps()
        if sweep not in known:
            allowed = ", ".join(sorted(known)) or "none recorded"
            raise UsageError(f"sweep must be one recorded in ledger {self.path} ({allowed}), got {sweep!r}.")

    def sweeps(self) -> dict[str, int]:
        """Sweep name -> number of releases recorded under it (see :func:`_sweep_tag`)."""
        out: dict[str, int] = {}
        for e in self.entries(kind="release"):
            name = (e.payload.get("sweep") or {}).get("name")
            if name is not None:
                out[name] = out.get(name, 0) + 1
        return out

    # -- writing
    def record(self, release: Release, *, artefact_path: str | None = None) -> str:
        """Append ``release`` (one transaction); returns its entry id (= ``release.id``); recording
        the identical release twice is a no-op. Refused: an unparsable guarantee, another adjacency
        or data fingerprint than the dataset's (see :meth:`declare_version`). An uncertified release
        is recorded as such (unbounded until voided). The cap is *not* enforced here: the model
        exists, and an unrecorded release is worse than an over-cap one (:meth:`reserve` refuses)."""
        with self._store.write():
            return self._record(release, artefact_path)

    def _release_payload(self, release: Release, artefact_path: str | None, rows: dict | None = None) -> tuple[str, dict]:
        ds = release.dataset if isinstance(release.dataset, dict) else {}
        name = _check_name("dataset name", ds.get("name"))
        partition = _check_name("partition", release.partition)
        adjacency = Adjacency.parse(release.adjacency).value
        if not release.non_private:
            lc.parse_event(release.guarantee, f"guarantee of release {release.id}")
        digest = getattr(release, "data_digest", None) or ds.get("sha256")
        payload = {
            "release_id": release.id, "mechanism": release.mechanism, "dataset_name": name,
            # keyed: the plain digest of the private data is never stored (see fingerprint.py)
            "dataset_fingerprint": self.fingerprint(digest) if isinstance(digest, str) and digest else None,
            "partition": partition, "adjacency": adjacency, "privacy_unit": getattr(release, "privacy_unit", None),
            "accountant": release.accountant, "guarantee": None if release.non_private else release.guarantee,
            "epsilon": math.inf if release.non_private else release.epsilon, "delta": release.delta,
            "noise_multiplier": release.noise_multiplier, "sample_rate": release.sample_rate, "steps": release.steps,
            "clipping_norm": release.clipping_norm, "non_private": bool(release.non_private), "artefact_path": artefact_path,
            "release_created_at": release.created_at, "dpaudit_version": release.dpaudit_version,
        }
        sweep = _sweep_tag(release.config)
        if sweep is not None:  # so `ledger list --sweep NAME` shows what a whole sweep spent
            payload["sweep"] = sweep
        for key in ("split_seed", "profile"):  # public; they name the cause of a fingerprint change
            if ds.get(key) is not None:
                payload[key] = ds[key]
        why = uncertified_reason(release)
        if why is not None:
            payload["uncertified"] = why
        tail = getattr(release, "noise_tail_delta", None)
        if tail is not None:  # every composed total accounts for it (compose.bounds)
            payload["noise_tail_delta"] = float(tail)
        if rows is not None:  # set ids of the rows read (ledger.rows); from the run's reservation
            payload["rows"] = rows
        return name, payload

    def _record(self, release: Release, artefact_path: str | None, rows: dict | None = None) -> str:
        """:meth:`record` inside the caller's write transaction (``rows``: the reservation's, see ledger.rows)."""
        name, payload = self._release_payload(release, artefact_path, rows)
        adjacency = payload["adjacency"]
        existing = self._store.rows(entry_id=release.id)
        if existing:
            if self._same_release(existing[0][5], payload):
                return release.id
            raise LedgerError(f"release {release.id} is already in ledger {self.path} with different content; a release id is recorded once.")
        state = self._states(name).get(name)
        current = state.adjacency() if state else None
        if current is not None:
            require_same(current, adjacency, f"releases on dataset {name!r}", LedgerAdjacencyError)
        self._check_identity(name, state, payload["dataset_fingerprint"] or "", payload, planned=False)
        return self._append("release", name, payload, entry_id=release.id)

    def _same_release(self, stored_text: str, payload: dict) -> bool:
        """Whether a stored release payload records the release ``payload`` describes: the same
        text, or one written by an older dpaudit (no sweep tag, plain sha256 instead of the keyed
        fingerprint, no split_seed / profile / uncertified / tail / rows keys)."""
        if stored_text == canonical_json(payload):
            return True
        old = self._public_payload(json.loads(stored_text))
        newer = ("sweep", "split_seed", "profile", "uncertified", "noise_tail_delta", "rows")
        return {k: v for k, v in payload.items() if k not in newer} == {k: v for k, v in old.items() if k not in newer} \
            and all(k not in old or old[k] == payload.get(k) or (k == "rows" and k not in payload) for k in newer)

    def cap(self, dataset: str, epsilon: float, delta: float, *, include_audits: bool = True,
            data_rows=None) -> str:
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
        of its source (fail closed); any other name's, its name and its entries' rows."""
        _check_name("dataset", dataset)
        epsilon = positive_finite("epsilon", epsilon)
        delta = open_unit("delta", delta)
        if not isinstance(include_audits, bool):
            raise UsageError(f"include_audits must be True or False, got {include_audits!r}.")
        payload = {"dataset": dataset, "epsilon": epsilon, "delta": delta, "include_audits": include_audits}
        footprint = None if data_rows is None else self._footprint(data_rows)
        with self._store.write():
            index = self._people_index()[1]
            if footprint is None and dataset not in lr.SOURCES:
                # another name: the rows its entries read, kept when those entries are voided later
                footprint = index.names.get(dataset)
            if footprint is not None:
                index.collisions(dataset, footprint)
                payload["rows"] = lr.declare(self, footprint)
            return self._append("cap", dataset, payload)

    def declare_partition(self, dataset: str, parent: str, children, declared_by: str) -> str:
        """Record that ``parent`` is the disjoint union of ``children`` (as stated by ``declared_by``);
        releases on the children then compose in parallel. Re-declaring the identical split returns
        its entry id. Refused (:class:`~dpaudit.errors.LedgerAuthorityError`) when a child already
        holds a release or an open reservation: parallel composition after the fact would lower what
        was spent."""
        _check_name("dataset", dataset)
        _check_name("parent partition", parent)
        children = tuple(children)
        if not children:
            raise UsageError(f"children must be at least one partition, got {list(children)!r}.")
        for c in children:
            _check_name("child partition", c)
        if len(set(children)) != len(children) or parent in children:
            raise UsageError(f"children must be distinct and differ from the parent {parent!r}, got {list(children)!r}.")
        if not isinstance(declared_by, str) or not declared_by.strip():
            raise UsageError(f"declared_by must be a non-empty string naming who made the split, got {declared_by!r}.")
        with self._store.write():
            state = self._states(dataset).get(dataset) or lc.DatasetState(dataset)
            if state.check_partition(parent, children):
                for e in self.entries(dataset=dataset, kind="partition"):
                    if e.payload.get("parent") == parent:
                        return e.id
            _refuse_held_children(state, parent, children)
            payload = {"dataset": dataset, "parent": parent, "children": list(children), "declared_by": declared_by.strip()}
            return self._append("partition", dataset, payload)

    def void(self, entry_id: str, reason: str, *, published: bool | None = None) -> str:
        """Withdraw a release or audit recorded by mistake, or the open reservation of a killed run,
        with a ``void`` entry referencing it (the entry stays). Privacy contract: only a void that
        states never-published artefacts (``published`` False) stops counting; ``published`` None
        (not stated, allowed on an unsigned ledger only) withdraws the entry but its budget stays
        spent, as a published one's. On a signed ledger ``published`` is required and the owner's
        key must sign (:class:`~dpaudit.errors.LedgerAuthorityError`; docs/ledger.md)."""
        reason = _check_reason(reason)
        if published is not None and not isinstance(published, bool):
            raise UsageError(f"published must be True or False, got {published!r}.")
        with self._store.write():
            self._check_void_authority(published)
            target = self.get(entry_id)
            if target.kind not in ("release", "reservation", "audit"):
                raise UsageError(f"entry to void must be a release, an audit or an open reservation, got a {target.kind} entry ({target.id}).")
            if target.voided_by:
                raise UsageError(f"release to void must not be voided already, got {target.id} (voided by {target.voided_by}).")
            if target.kind == "reservation" and target.closed_by:
                raise UsageError(f"reservation to void must be open, got {target.id} ({target.closed_as} by {target.closed_by}).")
            payload = {"target": target.id, "reason": reason}
            if published is not None:
                payload["artefacts_published"] = published
            return self._append("void", target.dataset, payload)

    def _check_void_authority(self, published: bool | None) -> None:
        ring = self.key_ring()
        if ring.owner is None:
            return
        self._require_authority(ring, "void", {}, self._signing_key)
        if published is None:
            raise LedgerAuthorityError("void on a signed ledger must state whether the artefacts were ever published "
                                       "(--published / --never-published), got neither.")

    def record_audit(self, *, audit_id: str, dataset: str, partition: str, adjacency: str, event: Event | None, trials: int,
                     mechanism: str, unbounded_reason: str | None = None, release_id: str | None = None) -> str:
        """Record, before its trials run, an audit that trains on ``dataset:partition``'s private
        records: ``event`` is what the trials compose to, None with ``unbounded_reason`` when some
        run without DP noise. In one write transaction, an audit that would push releases + audits
        over a cap that includes audits (its own or one reached through shared people, the rows
        caps declared included) is refused (:class:`BudgetExceededError`), as is one whose rows
        collide with another name's roles (:class:`~dpaudit.errors.RowRoleCollisionError`), and
        nothing is written. Its rows: the audited release's, else every row of a built-in name's
        source (fail closed, ledger.rows). Returns ``audit_id``."""
        _check_name("dataset", dataset)
        _check_name("partition", partition)
        adj = Adjacency.parse(adjacency).value
        non_private = event is None
        payload = {"audit_id": audit_id, "mechanism": str(mechanism), "dataset_name": dataset, "partition": partition, "adjacency": adj,
                   "guarantee": None if non_private else event.to_dict(), "non_private": non_private, "trials": int(trials),
                   "release_id": release_id, "dpaudit_version": __version__}
        if non_private:
            payload["unbounded_reason"] = str(unbounded_reason or "trials without DP noise")
        with self._store.write(), result_cache.recomputed():
            # One verified read serves the audited release's rows, the caps and the people index.
            rows = self._intact_rows()
            entries = self._entries_from_rows(rows)
            audited = [e for e in entries if release_id and e.id == release_id]
            if audited and isinstance(audited[0].payload.get("rows"), dict):
                payload["rows"] = audited[0].payload["rows"]  # the audit trains on the audited release's rows
            states = lc.replay(entries)
            state = states.get(dataset) or lc.DatasetState(dataset)
            current = state.with_audits().adjacency()
            if current is not None:
                require_same(current, adj, f"the audit and the releases and audits on dataset {dataset!r}",
                             LedgerAdjacencyError)
            view = lc.release_view(audit_id, dataset, payload, kind="audit")
            if state.cap is not None and state.cap_includes_audits:
                self._check_audit_cap(state, view, payload)
            _check_audit_people(lr.PeopleIndex.build(rows, entries, states), states, view, payload)
            return self._append("audit", dataset, payload, entry_id=audit_id)

    def _check_audit_cap(self, state: lc.DatasetState, planned: lc.ReleaseView, payload: dict) -> None:
        cap_eps, cap_delta = state.cap
        adj = payload["adjacency"]
        # RDP only (AUDIT_ACCOUNTANTS): an upper bound, so the check is sound, and fast.
        spent = queries.total_epsilon(state.with_audits(), cap_delta, adj, queries.AUDIT_ACCOUNTANTS)
        total = queries.total_epsilon(dataclasses.replace(state, audits=state.audits + [planned]).with_audits(), cap_delta, adj, queries.AUDIT_ACCOUNTANTS)
        if total > cap_eps and payload.get("non_private"):
            cap = f"its cap (epsilon {cap_eps:g} at delta {cap_delta:g})"
            raise BudgetExceededError(unbounded_audit_refusal(state.name, payload, cap))
        if total > cap_eps:
            raise BudgetExceededError(
                f"budget of dataset {state.name!r} exceeded: its releases and {len(state.audits)} audit(s) already spent "
                f"epsilon={lc.fmt_epsilon(spent)}, this audit's {payload['trials']} trials on {state.name}:{payload['partition']} would make "
                f"it epsilon={lc.fmt_epsilon(total)} (rdp) > cap epsilon={lc.fmt_epsilon(cap_eps)} at delta={cap_delta:g} (the cap includes audits); "
                "refused before any trial ran.")

    # -- budget
    def check(self, *, exclude_reservations=(), **planned) -> dict:
        """What spending the ``planned`` release (the fields of a :class:`PlannedSpend`) would do to
        the budget (no write). Open reservations count like releases, except ``exclude_reservations``
        (those already holding this release: a sweep's). Raises :class:`DatasetIdentityError` for an
        unknown data digest and :class:`~dpaudit.errors.RowRoleCollisionError` for a role collision;
        every cap of a dataset sharing people with it is checked too (:mod:`.rows`)."""
        with result_cache.recomputed():  # a cap is decided on numbers computed here, never on a file
            return self._check(PlannedSpend(**planned), exclude_reservations)

    def _check(self, plan: "PlannedSpend", exclude_reservations) -> dict:
        dataset, adj = plan.dataset, Adjacency.parse(plan.adjacency).value
        fp = self.fingerprint(plan.data_digest) if plan.data_digest else ""
        state = _without_held(self._states(dataset).get(dataset) or lc.DatasetState(dataset), exclude_reservations)
        current = state.adjacency()
        if current is not None:
            require_same(current, adj, f"the planned release and the releases on dataset {dataset!r}",
                         LedgerAdjacencyError)
        self._check_identity(dataset, state, fp, plan.data_info, planned=True)
        # the audits too when the cap includes them (then with the audit totals' fast RDP bound)
        acc = queries.AUDIT_ACCOUNTANTS if state.cap_includes_audits and state.audits else ("rdp", "prv")
        state = state.budgeted()
        tail = float(plan.noise_tail_delta)
        if not tail >= 0.0:
            raise UsageError(f"noise_tail_delta must be a number >= 0, got {plan.noise_tail_delta!r}.")
        view = lc.ReleaseView("planned", dataset, plan.partition, adj, None, None, plan.event, plan.event is None, fingerprint=fp,
                              uncertified=plan.uncertified, noise_tail_delta=tail)
        result = {"dataset": dataset, "partition": plan.partition, "adjacency": adj, "cap": None, "allowed": True, "fingerprint": fp or None}
        if plan.data_rows is not None:
            self._people_check(dataset, view, plan.data_rows, exclude_reservations, result)
        if state.cap is not None:
            result.update(_cap_check(state, view, adj, acc, allowed=result["allowed"]))
        return result

    def _footprint(self, data_rows) -> dict:
        """Keyed row hashes of a planned release (computed once; a dict is already hashed)."""
        return data_rows if isinstance(data_rows, dict) else lr.hash_rows(self._key(), data_rows)

    def _people_check(self, dataset: str, planned: lc.ReleaseView, data_rows, held, result: dict) -> None:
        """Role collisions (raise) and every cap reached through shared people (``result``: ``people``,
        and ``allowed`` False with ``people_refusal`` when one would be exceeded); see ledger.rows."""
        footprint = self._footprint(data_rows)
        states, index = self._people_index((lambda st: _without_held(st, held)) if held else None)
        index.collisions(dataset, footprint)
        before = dict(states)
        states[dataset] = (states.get(dataset) or lc.DatasetState(dataset)).with_release(planned)
        index = index.with_planned(dataset, footprint)
        result["people"], refusal = lr.check_caps(index, before, states, dataset, planned.partition, footprint)
        if refusal is not None and result["allowed"]:
            result.update(allowed=False, people_refusal=refusal)

    def preflight(self, *, exclude_reservations=(), **planned) -> dict:
        """:meth:`check`, raising its refusals (:class:`BudgetExceededError`) before any training;
        writes nothing (:meth:`reserve` also holds the budget). Returns :meth:`check`'s dict."""
        plan = PlannedSpend(**planned)
        r = self.check(exclude_reservations=exclude_reservations, **planned)
        if r["allowed"]:
            return r
        if r.get("people_refusal") and (r["cap"] is None or r["total"] <= r["cap"]["epsilon"]):
            raise BudgetExceededError(r["people_refusal"])
        c = r["cap"]
        held = f" and {r['reservations']} open reservation(s)" if r.get("reservations") else ""
        why = f" ({plan.uncertified})" if plan.uncertified else ""
        raise BudgetExceededError(
            f"budget of dataset {plan.dataset!r} exceeded: {r['releases']} release(s){held} already spent epsilon={lc.fmt_epsilon(r['spent'])}, "
            f"this release on {plan.dataset}:{plan.partition} needs epsilon={lc.fmt_epsilon(r['needs'])}{why} alone, composed total would be "
            f"epsilon={lc.fmt_epsilon(r['total'])} > cap epsilon={lc.fmt_epsilon(c['epsilon'])} at delta={c['delta']:g}; refused before training."
        )

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
        ``data_rows``: the rows it reads (see :meth:`check`), stored as keyed row sets (ledger.rows)."""
        plan = PlannedSpend(**planned)
        footprint = None if plan.data_rows is None else self._footprint(plan.data_rows)
        with self._store.write():
            self.preflight(**{**planned, "data_rows": footprint})
            info = plan.data_info or {}
            payload = {
                "dataset_name": plan.dataset, "partition": plan.partition, "adjacency": Adjacency.parse(plan.adjacency).value,
                "guarantee": None if plan.event is None else plan.event.to_dict(), "non_private": plan.event is None,
                "dataset_fingerprint": self.fingerprint(plan.data_digest) if plan.data_digest else None,
                "mechanism": str(mechanism or ""), "pid": os.getpid(), "host": _hostname(), "dpaudit_version": __version__,
                **{key: info[key] for key in ("split_seed", "profile") if info.get(key) is not None},
            }
            if plan.uncertified:
                payload["uncertified"] = str(plan.uncertified)
            if plan.noise_tail_delta:
                payload["noise_tail_delta"] = float(plan.noise_tail_delta)
            if footprint is not None:
                payload["rows"] = lr.declare(self, footprint)
            return self._append("reservation", plan.dataset, payload)

    def _open_reservation(self, reservation_id: str) -> Entry:
        target = self.get(reservation_id)
        if target.kind != "reservation":
            raise UsageError(f"reservation id must name a reservation, got a {target.kind} entry ({target.id}).")
        if target.closed_by is not None:
            raise UsageError(f"reservation must be open, got {target.id} ({target.closed_as} by {target.closed_by}).")
        return target

    def settle(self, reservation_id: str, releases) -> list[str]:
        """Record the run's ``releases`` (``(Release, artefact_path)`` pairs) and close the
        reservation, in one transaction; returns the release ids. Either all of it is in the
        ledger afterwards, or none of it (and the reservation stays open, spent)."""
        items = [(r, None) if isinstance(r, Release) else tuple(r) for r in releases]
        with self._store.write():
            target = self._open_reservation(reservation_id)
            ids = [self._record(rel, art, target.payload.get("rows")) for rel, art in items]
            self._append("settle", target.dataset, {"target": target.id, "releases": ids})
        return ids

    def cancel(self, reservation_id: str, reason: str) -> str:
        """Close a reservation whose run released nothing (failed or interrupted before publishing)."""
        reason = _check_reason(reason)
        with self._store.write():
            target = self._open_reservation(reservation_id)
            return self._append("cancel", target.dataset, {"target": target.id, "reason": reason})

    def open_reservations(self, dataset: str | None = None) -> list[Entry]:
        """Reservations not yet settled, cancelled or voided (their budget is spent)."""
        return [e for e in self.entries(dataset=dataset, kind="reservation") if e.closed_by is None]

    def declare_version(self, dataset: str, fingerprint: str, reason: str) -> str:
        """Accept data with keyed ``fingerprint`` (the 64 hex printed by the refusal) as a new version
        of ``dataset``; an already declared version returns its entry id. Privacy contract: the
        versions may share any records, so they compose *sequentially* in every total
        (:meth:`~.compose.DatasetState.version_groups`)."""
        _check_name("dataset", dataset)
        fp = fingerprint.strip().lower() if isinstance(fingerprint, str) else fingerprint
        if not is_fingerprint(fp):
            raise UsageError(f"fingerprint must be the 64 hex characters printed by the refusal, got {fingerprint!r}.")
        reason = _check_reason(reason)
        with self._store.write():
            state = self._states(dataset).get(dataset) or lc.DatasetState(dataset)
            if fp in state.versions:
                return state.versions[fp]
            if fp in state.fingerprints:
                raise UsageError(f"fingerprint must be new to dataset {dataset!r}, got {fp[:12]}, which its releases already use.")
            payload = {"dataset": dataset, "fingerprint": fp, "reason": reason, "previous": sorted(state.fingerprints)}
            return self._append("version", dataset, payload)

    def summary(self, dataset: str | None = None, *, accountants=("rdp", "prv"), sweep: str | None = None,
                progress: bool = False) -> list[dict]:
        """Per dataset: one row for the whole dataset (partition ``"*"``) and one per partition
        (:func:`.queries.summary_rows`; the columns are those of ``ledger summary``, docs/ledger.md).
        ``sweep``: only the releases recorded under that sweep (``remaining`` is then None: it is a
        property of the whole dataset). ``progress``: one step per dataset composed, on stderr."""
        if dataset is not None:
            _check_name("dataset", dataset)
        if sweep is not None:
            self.require_sweep(sweep)
        states = self._states(dataset, sweep)
        if sweep is not None:
            states = {k: v for k, v in states.items() if v.releases}
        if dataset is not None and dataset not in states:
            raise UsageError(f"dataset must be one recorded in ledger {self.path}{'' if sweep is None else f' under sweep {sweep!r}'}, got {dataset!r}.")
        people = queries.people_summary(*self._people_index(), accountants) if sweep is None else {}
        return queries.summary_rows(states, people, accountants, whole=sweep is None, progress=progress)

    def _people_index(self, adjust=None) -> tuple[dict, "lr.PeopleIndex"]:
        """Every dataset's state (each passed through ``adjust`` if given) and the index of who
        shares people with whom (ledger.rows), from the verified entries."""
        rows = self._intact_rows()
        entries = self._entries_from_rows(rows)
        states = lc.replay(entries)
        if adjust is not None:
            states = {n: adjust(st) for n, st in states.items()}
        return states, lr.PeopleIndex.build(rows, entries, states)

    # -- integrity
    def verify(self, *, anchor: str | None = None, owner: str | None = None) -> VerifyReport:
        """:func:`.integrity.verify_snapshot` of one read of the store: the chain, the store's own
        checks, every entry and signature, and ``anchor`` (a head hash published earlier with
        ``ledger head``). ``owner``: the key id the ledger's first registered key must have
        (default: the one this ledger was opened with)."""
        snap = self._snapshot(health=True)
        return integrity.verify_snapshot(snap, anchor=anchor, owner=self._owner if owner is None else sg.owner_key_id(owner))

    def _signature_problems(self, rows) -> list[Problem]:
        """Signature findings; rows already verified by this object are trusted (an Ed25519
        check per entry per write would make large ledgers slow)."""
        done = {r[1] for r in rows if (r[1], r[7]) in self._verified}
        _, found = sg.check_signatures(integrity.signed_rows(rows), verified=done, owner=self._owner)  # Ed25519 only for rows not yet checked
        if not found:
            self._verified.update((r[1], r[7]) for r in rows if r[8] is not None)
        return integrity.signature_problems(found)

    def _authority_problems(self, rows) -> list[Problem]:
        """Partition declarations that would lower recorded spend and a remembered seal that is
        gone (:func:`.integrity.authority_problems`); a clean answer is kept per head hash."""
        head = rows[-1][7] if rows else GENESIS_HASH
        if self._authority_clean == head:
            return []
        found = integrity.authority_problems(rows)
        if not found:
            self._authority_clean = head
        return found

    def _snapshot(self, *, health: bool = False) -> Snapshot:
        # One read transaction, so the head and the rows are from the same snapshot.
        with self._store.read():
            return Snapshot(str(self.path), self.backend, self._store.schema_version(), self._store.head(), self._store.rows(),
                            self._store.health() if health else [])

    # -- moving a ledger between backends
    def export_rows(self, *, include_key: bool = False) -> dict:
        """Everything needed to rebuild this ledger elsewhere: every stored row verbatim (hashes
        and signatures included) and, only with ``include_key``, the fingerprint key (whoever holds
        it can test a candidate dataset against the stored fingerprints). Refused if the ledger
        fails verification."""
        rep = self.verify()
        if not rep.ok:
            raise LedgerError(f"ledger {self.path} fails verification ({rep.problems[0].message.rstrip('.')}); it was not exported.")
        return integrity.export_dump(self._snapshot(), self._key() if include_key else None)

    def import_rows(self, dump: dict) -> int:
        """Append the rows of :meth:`export_rows` verbatim into this *empty* ledger (one transaction);
        the chain, hashes and signatures are kept exactly, so verify passes on both sides."""
        integrity.require_export(dump)
        key = base64.b64decode(dump.get("fingerprint_key") or "")  # b"": exported without the key (kept as is here)
        with self._store.write():
            if self._store.rows():
                raise UsageError(f"ledger to import into must be empty, got {self.path} with {len(self._store.rows())} entries.")
            rows = integrity.import_chain(dump)
            for r in rows:
                self._store.insert(*r[1:])
            if key:
                self._store.set_fingerprint_key(key)
        self._key_bytes = None
        return len(rows)


@dataclass(frozen=True)
class PlannedSpend:
    """A release about to be made, as the budget checks see it (:meth:`Ledger.check`)."""

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
    data_rows: object = None  # the source rows it reads (dpaudit.data.rows.RowSet s, or their keyed hashes)

    def __post_init__(self) -> None:
        _check_name("dataset", self.dataset)
        _check_name("partition", self.partition)


def _check_audit_people(index: "lr.PeopleIndex", states: dict, view: lc.ReleaseView, payload: dict) -> None:
    """The people check of a planned audit, as a release's (:meth:`Ledger._people_check`): its rows' role
    collisions, then every cap that includes audits and is reached through shared people, with it."""
    dataset, partition = view.dataset, payload["partition"]
    footprint = index.footprint(dataset, payload)
    index.collisions(dataset, footprint)
    state = states.get(dataset) or lc.DatasetState(dataset)
    after = {**states, dataset: dataclasses.replace(state, audits=state.audits + [view])}
    planned = index.with_planned(dataset, footprint)
    _, refusal = lr.check_caps(planned, states, after, dataset, partition, footprint, what="audit")
    if refusal is not None and payload["non_private"]:
        refusal = unbounded_audit_refusal(dataset, payload, "a cap that counts audits and shares its people")
    if refusal is not None:
        raise BudgetExceededError(refusal)


def _without_held(state: lc.DatasetState, held) -> lc.DatasetState:
    """``state`` without the open reservations ``held`` (those that already hold the planned release)."""
    if not held:
        return state
    held = set(held)
    return dataclasses.replace(state, releases=[r for r in state.releases if not (r.kind == "reservation" and r.id in held)])


def _cap_check(state: lc.DatasetState, planned: lc.ReleaseView, adj: str, acc, *, allowed: bool) -> dict:
    """The cap columns of :meth:`Ledger.check`: spent so far, what the planned release needs alone
    and the total with it, at the cap's delta."""
    cap_eps, cap_delta = state.cap
    before = lc.dataset_total(state)
    after = lc.dataset_total(state.with_release(planned))
    b_spent = lc.total_bounds(before, delta=cap_delta, adjacency=adj, accountants=acc)
    alone = lc.dataset_total(lc.DatasetState(state.name, releases=[planned]))
    b_alone = lc.total_bounds(alone, delta=cap_delta, adjacency=adj)
    b_after = lc.total_bounds(after, delta=cap_delta, adjacency=adj, accountants=acc)
    return {"cap": {"epsilon": cap_eps, "delta": cap_delta}, "spent": b_spent["epsilon"], "needs": b_alone["epsilon"],
            "total": b_after["epsilon"], "releases": before.releases_subtree, "reservations": before.reservations,
            "allowed": allowed and b_after["epsilon"] <= cap_eps}


def _refuse_held_children(state: lc.DatasetState, parent: str, children) -> None:
    """Raise LedgerAuthorityError if a release or open reservation lies in one of ``children``."""
    held = integrity.held_children(state, children)
    if held:
        raise LedgerAuthorityError(
            f"partition {state.name}:{parent} must be declared before its children hold releases, got {', '.join(held)}: "
            "they were composed sequentially with the rest of the dataset and keep composing so; declare a split "
            "before releasing on it.")


def _hostname() -> str:
    try:
        return socket.gethostname()
    except OSError:
        return ""

"""Signed ledger entries (Ed25519): who wrote each entry, and proof that nobody changed it since.

The hash chain detects careless edits only: whoever can write the database can drop the triggers,
edit a release and recompute every hash. A signature cannot be recomputed without the signer's
private key. Each entry is signed over its content *and the previous hash*
(:func:`signing_material`), so editing, deleting or reordering any earlier entry breaks it.

Policy (:func:`check_signatures`): the first ``key`` entry registers the ledger's *owner* and is
signed by that key; every later key is registered by an already registered one. From the owner's
registration on, every entry must be signed by a registered key (a separate marker could be
deleted with everything after it and the entries re-inserted unsigned); entries before it may be
unsigned, and rewriting them breaks the registration's signature. Pinning the owner from outside
(``--owner KEY_ID``, ``$DPAUDIT_LEDGER_OWNER``) makes a missing registration a problem.

Authority (docs/ledger.md, "Who may write what"): on a signed ledger the entries that raise a cap
or lower a spent budget, or change who may sign, are the owner's alone (:data:`OWNER_KINDS`:
``cap``, ``void``, ``key``, ``policy``, ``seal``); a ``void`` also states ``artefacts_published``;
a reservation is closed (``settle`` / ``cancel``) only by the key that opened it or by the owner.
Any other signer is a finding here, so :meth:`~dpaudit.ledger.book.Ledger.verify` and every
budget answer refuse it. Each owner-signed entry covers the whole chain before it: a member key
that rewrites and re-signs history cannot re-sign it, so the ring records how far the owner has
sealed (``sealed_through``) and what tail is unsealed. Not detected: a truncated tail (seals
included) or, with no pinned owner, a complete rewrite under a new key; publish ``dpaudit ledger
head`` (or the hash ``ledger seal`` prints) and check ``verify --anchor HASH``.

Keys: ``dpaudit ledger keygen`` writes ``NAME.key`` (PKCS#8 PEM, unencrypted, 0600) and ``NAME.pub``
to :func:`key_dir`; ``$DPAUDIT_SIGNING_KEY`` (a path or name) picks the signing key, else ``default``.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, NamedTuple

from ..errors import LedgerError, UsageError
from ..lazy import lazy_import
from ..paths import write_atomically
from .fingerprint import write_secret

# ~25 ms: bound when a key is read or a signature checked
crypto_exceptions = lazy_import("cryptography.exceptions")
serialization = lazy_import("cryptography.hazmat.primitives.serialization")
ed25519 = lazy_import("cryptography.hazmat.primitives.asymmetric.ed25519")

SIGNING_KEY_ENV = "DPAUDIT_SIGNING_KEY"
#: The key id every budget answer expects as the ledger's owner (pinned outside the ledger).
OWNER_ENV = "DPAUDIT_LEDGER_OWNER"
DEFAULT_KEY_NAME = "default"
#: Prefix of the public-key text that analysts exchange (``ed25519:`` + base64 of the 32 raw bytes).
PUBLIC_PREFIX = "ed25519:"
SIG_DOMAIN = "dpaudit-ledger-sig-v1"
KEY_KIND = "key"
POLICY_KIND = "policy"
#: An owner-signed checkpoint of the chain head (:meth:`~dpaudit.ledger.book.Ledger.seal`).
SEAL_KIND = "seal"
#: A pre-registered audit plan, a run under it, or that run's result (:meth:`~dpaudit.ledger.book.Ledger.record_plan`).
PLAN_KIND = "plan"
#: Entry kinds that belong to the ledger as a whole, not to a dataset (each must be signed by a registered key).
LEDGER_KINDS = (KEY_KIND, POLICY_KIND, PLAN_KIND, SEAL_KIND)
#: Entry kinds only the owner's key may sign on a signed ledger: each raises a cap, lowers a spent
#: budget, changes who may sign, or vouches for the whole chain before it.
OWNER_KINDS = ("cap", "void", KEY_KIND, POLICY_KIND, SEAL_KIND)
#: Entries that close a reservation: only its own signer or the owner may write one.
CLOSE_KINDS = ("settle", "cancel")
#: What each owner-only entry would let another key do (the wording of the findings and refusals).
OWNER_POWERS = {
    "cap": "set or raise a cap",
    "void": "lower a spent budget",
    KEY_KIND: "register keys",
    POLICY_KIND: "set the signature policy",
    SEAL_KIND: "seal the ledger",
}
#: The ``dataset`` column of ledger-wide entries (no dataset name can be empty).
LEDGER_SCOPE = ""
_KEY_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_KEY_ID_RE = re.compile(r"^[0-9a-f]{32}$")


def key_dir() -> Path:
    """``$XDG_CONFIG_HOME/dpaudit/keys`` (default ``~/.config/dpaudit/keys``)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "dpaudit" / "keys"


def key_id(public_raw: bytes) -> str:
    """The id a key is known by in the ledger: the first 128 bits of SHA-256 of the raw public key, hex."""
    return hashlib.sha256(bytes(public_raw)).hexdigest()[:32]


def public_text(public_raw: bytes) -> str:
    return PUBLIC_PREFIX + base64.b64encode(bytes(public_raw)).decode("ascii")


def parse_public_key(text: str) -> bytes:
    """The 32 raw bytes of an Ed25519 public key given as ``ed25519:BASE64`` (what keygen prints)
    or as a PEM ``PUBLIC KEY`` block, or the path of a ``.pub`` file holding either."""
    if not isinstance(text, str) or not text.strip():
        raise UsageError(
            f"public key must be 'ed25519:BASE64' (as printed by `dpaudit ledger keygen`) or a .pub file, got {text!r}."
        )
    s = text.strip()
    if not s.startswith(PUBLIC_PREFIX) and "BEGIN" not in s:
        with contextlib.suppress(OSError, ValueError):
            if Path(s).expanduser().is_file():
                s = Path(s).expanduser().read_text().strip()
    try:
        if s.startswith(PUBLIC_PREFIX):
            raw = base64.b64decode(s[len(PUBLIC_PREFIX) :], validate=True)
            ed25519.Ed25519PublicKey.from_public_bytes(raw)
            return raw
        if "BEGIN PUBLIC KEY" in s:
            pk = serialization.load_pem_public_key(s.encode("ascii"))
            if isinstance(pk, ed25519.Ed25519PublicKey):
                return pk.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    except (ValueError, binascii.Error, TypeError):
        pass
    raise UsageError(
        f"public key must be an Ed25519 key as 'ed25519:BASE64' (as printed by `dpaudit ledger keygen`) or a .pub file, got {text[:80]!r}."
    )


def owner_key_id(text: str | None) -> str | None:
    """The owner's key id from ``text``: a key id (32 hex), a public key or a ``.pub`` file; None if empty."""
    if text is None or not str(text).strip():
        return None
    s = str(text).strip().lower()
    if _KEY_ID_RE.match(s):
        return s
    try:
        return key_id(parse_public_key(str(text)))
    except UsageError:
        raise UsageError(
            f"owner must be a key id (32 hex, as printed by `dpaudit ledger keygen`) or a public key, got {str(text)[:80]!r}."
        ) from None


@dataclass(frozen=True)
class SigningKey:
    """An analyst's private key, loaded from its file (``path``)."""

    name: str
    path: Path
    private: ed25519.Ed25519PrivateKey = field(repr=False)

    @property
    def public_raw(self) -> bytes:
        return self.private.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    @property
    def key_id(self) -> str:
        return key_id(self.public_raw)

    @property
    def public_text(self) -> str:
        return public_text(self.public_raw)

    def sign(self, material: bytes) -> str:
        return self.private.sign(material).hex()


def _check_key_name(name: str) -> str:
    if not isinstance(name, str) or not _KEY_NAME_RE.match(name):
        raise UsageError(f"key name must be 1-64 letters, digits, '_', '-' or '.', got {name!r}.")
    return name


def keygen(
    name: str = DEFAULT_KEY_NAME, *, directory: str | os.PathLike | None = None
) -> SigningKey:
    """Create a new key pair ``NAME.key`` (0600) / ``NAME.pub`` in ``directory`` (default :func:`key_dir`).

    Never overwrites: an existing key may already be registered in a ledger, and replacing it
    would make every entry it signed unverifiable by its owner's machine."""
    _check_key_name(name)
    d = Path(directory).expanduser() if directory is not None else key_dir()
    path = d / f"{name}.key"
    taken = UsageError(
        f"key name must be new, got {name!r}: {path} exists (never overwritten; "
        "choose another --name)."
    )
    if path.exists():
        raise taken
    try:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        with contextlib.suppress(OSError):
            d.chmod(0o700)
        private = ed25519.Ed25519PrivateKey.generate()
        formats = (serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8)
        pem = private.private_bytes(*formats, serialization.NoEncryption())
        write_secret(path, pem)
        key = SigningKey(name, path, private)
        (d / f"{name}.pub").write_text(key.public_text + "\n")
    except FileExistsError:
        raise taken from None
    except OSError as e:
        raise LedgerError(f"cannot write signing key {path}: {e.strerror or e}.") from None
    return key


def load_signing_key(
    which: str | os.PathLike | None = None, *, required: bool = False
) -> SigningKey | None:
    """The private key named or located by ``which``, else ``$DPAUDIT_SIGNING_KEY``, else the
    ``default`` key in :func:`key_dir` if it exists (None otherwise, unless ``required``).

    A key file readable by other users is refused: whoever can read it can sign as its owner."""
    explicit = which is not None or bool(os.environ.get(SIGNING_KEY_ENV))
    which = which if which is not None else (os.environ.get(SIGNING_KEY_ENV) or DEFAULT_KEY_NAME)
    name, path = _key_location(os.fspath(which))
    if path.exists():
        return SigningKey(name, path, _read_private_key(path))
    if explicit or required:
        raise UsageError(
            f"signing key must be an existing key file or name, got {os.fspath(which)!r} ({path} "
            "does not exist; create one with `dpaudit ledger keygen`)."
        )
    return None


def _key_location(text: str) -> tuple[str, Path]:
    """``(name, path)`` of a key given by its file (a path, ``*.key`` or ``~...``) or its name."""
    if os.sep in text or text.endswith(".key") or text.startswith("~"):
        return Path(text).expanduser().stem, Path(text).expanduser()
    name = _check_key_name(text)
    return name, key_dir() / f"{name}.key"


def _read_private_key(path: Path) -> ed25519.Ed25519PrivateKey:
    """The Ed25519 private key in ``path``; refused (LedgerError) when other users can read it."""
    try:
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            raise LedgerError(
                f"signing key {path} is readable by other users (mode {mode:o}); run `chmod 600 {path}`."
            )
        private = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except OSError as e:
        raise LedgerError(f"cannot read signing key {path}: {e.strerror or e}.") from None
    except (ValueError, TypeError) as e:
        raise LedgerError(
            f"signing key {path} is not an unencrypted PEM private key ({e})."
        ) from None
    if not isinstance(private, ed25519.Ed25519PrivateKey):
        raise LedgerError(
            f"signing key {path} must be an Ed25519 key, got {type(private).__name__}."
        )
    return private


def signing_material(
    prev_hash: str,
    entry_id: str,
    kind: str,
    created_at: str,
    dataset: str,
    payload_text: str,
    signer: str,
) -> bytes:
    """The bytes an entry's signature covers: its canonical content, the previous hash and the signer."""
    return json.dumps(
        [SIG_DOMAIN, prev_hash, entry_id, kind, created_at, dataset, payload_text, signer],
        separators=(",", ":"),
        ensure_ascii=True,
    ).encode("utf-8")


def _signature_ok(public_raw: bytes, signature_hex: str, material: bytes) -> bool:
    try:
        ed25519.Ed25519PublicKey.from_public_bytes(bytes(public_raw)).verify(
            bytes.fromhex(signature_hex), material
        )
        return True
    except (crypto_exceptions.InvalidSignature, ValueError, TypeError):
        return False


def signature_ok(public_key: str, signature_hex: str, material: bytes) -> bool:
    """Whether ``signature_hex`` is the signature of ``material`` by ``public_key`` (``ed25519:BASE64``,
    already readable: the caller checks it first); False for a malformed or wrong signature (a signed
    document outside the ledger, e.g. an audit plan). Raises UsageError for an unreadable key."""
    return _signature_ok(parse_public_key(public_key), str(signature_hex), material)


def key_payload(public_raw: bytes, name: str, role: str) -> dict:
    """The payload of a ``key`` (registration) entry."""
    return {
        "key_id": key_id(public_raw),
        "public_key": public_text(public_raw),
        "name": str(name),
        "role": role,
    }


class SignedRow(NamedTuple):
    """The stored columns of one entry that signature checking needs."""

    seq: int
    id: str
    kind: str
    created_at: str
    dataset: str
    payload_text: str
    prev_hash: str
    signer: str | None
    signature: str | None


@dataclass(frozen=True)
class RegisteredKey:
    key_id: str
    public_raw: bytes = field(repr=False)
    name: str
    role: str  # owner | member
    entry_id: str
    seq: int
    registered_by: str  # key id of the signer (the owner's own id for the first key)


@dataclass(frozen=True)
class Problem:
    """One integrity finding of :meth:`~dpaudit.ledger.book.Ledger.verify` (signature findings
    are made here, the others by :mod:`.integrity`), naming the entry when there is one."""

    # edited | deleted | reordered | unreadable | schema | integrity | signature | authority | seal
    # | anchor
    kind: str
    message: str
    seq: int | None = None
    id: str | None = None

    def to_dict(self) -> dict:
        return {"kind": self.kind, "seq": self.seq, "id": self.id, "message": self.message}


@dataclass
class KeyRing:
    """Registered keys and the signature policy, replayed from the entries in append order."""

    keys: dict[str, RegisteredKey] = field(default_factory=dict)
    owner: str | None = None
    #: seq of the owner's registration, from which every entry must be signed (None: no owner yet).
    required_since: int | None = None
    signed: int = 0
    unsigned: int = 0
    #: seq of the last entry the owner signed: its signature covers every entry up to it
    sealed_through: int | None = None
    #: seq of the last explicit ``seal`` entry (None: never sealed)
    last_seal: int | None = None
    #: entries stored after ``sealed_through`` (a member key could still rewrite them)
    unsealed: int = 0
    #: reservation id -> key id that signed it (None: unsigned), so closers can be checked
    reserved_by: dict = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict:
        counts = ("owner", "required_since", "signed", "unsigned", "sealed_through", "last_seal")
        out = {name: getattr(self, name) for name in (*counts, "unsealed")}
        shown = ("key_id", "name", "role", "entry_id", "seq", "registered_by")
        keys = [
            {n.replace("entry_id", "entry"): getattr(k, n) for n in shown}
            for k in self.keys.values()
        ]
        return {**out, "keys": keys}

    def note(self, r: "SignedRow") -> None:
        """Count ``r`` towards the sealed / unsealed tail and remember who opened a reservation."""
        if r.kind == "reservation":
            self.reserved_by[r.id] = r.signer
        if self.owner is not None and r.signer == self.owner:
            self.sealed_through, self.unsealed = r.seq, 0
            if r.kind == SEAL_KIND:
                self.last_seal = r.seq
        elif self.owner is not None:
            self.unsealed += 1


#: Entries whose payload the signature rules read (a void lowers a spent budget: see module doc).
VOID_KIND = "void"


def label(row) -> str:
    """``entry #SEQ (KIND ID)`` of a stored row (a :class:`SignedRow` or a store's row tuple)."""
    return f"entry #{row[0]} ({row[2]} {row[1]})"


def payload_of(text) -> dict | None:
    """A stored payload text as the JSON object it must be, else None (unreadable)."""
    try:
        payload = json.loads(text)
    except (TypeError, ValueError):
        return None
    return payload if isinstance(payload, dict) else None


def _unsigned_problem(ring: KeyRing, r: SignedRow) -> str | None:
    if r.signature:
        return "has a signature but no signer."
    if ring.required_since is not None:
        return (
            f"is unsigned, but the ledger requires signatures since entry #{ring.required_since} (its owner's key "
            "registration): every later entry must be signed by a registered key."
        )
    if r.kind in LEDGER_KINDS:
        return f"is unsigned: a {r.kind} entry must be signed by a registered key."
    return None


def _registered_key(r: SignedRow, payload: dict, role: str) -> tuple[RegisteredKey | None, str]:
    """(the key, with ``role``, or None; problem) that the ``key`` entry ``r`` registers."""
    try:
        raw = parse_public_key(str(payload.get("public_key")))
    except UsageError:
        return None, "registers a public key that cannot be read."
    kid = key_id(raw)
    if payload.get("key_id") != kid:
        return None, f"registers key {payload.get('key_id')!r} but its public key has id {kid}."
    return RegisteredKey(kid, raw, str(payload.get("name", "")), role, r.id, r.seq, r.signer), ""


def _owner_problem(ring: KeyRing, r: SignedRow, payload: dict, owner: str | None, ok) -> str | None:
    """Check the first registration (the owner's key signs its own entry) and adopt it."""
    key, why = _registered_key(r, payload, "owner")
    if key is None:
        return why
    if key.key_id != r.signer:
        return f"registers the first key but is signed by another key ({r.signer}); the owner's key must sign its own registration."
    if not ok(key.public_raw, r.signature or "", r):
        return f"has an invalid signature by key {r.signer}: its content or the previous hash changed since it was signed."
    if owner is not None and r.signer != owner:
        return f"registers owner key {r.signer}, not the expected owner {owner}: the ledger was re-created or rewritten."
    ring.keys[r.signer] = key
    ring.owner, ring.required_since = r.signer, r.seq
    return None


def authority_problem(
    ring: KeyRing, kind: str, payload: dict | None, signer: str | None
) -> str | None:
    """Why ``signer`` may not write a ``kind`` entry with ``payload`` on a ledger whose keys are
    ``ring`` (None: it may). The one rule for writing (:meth:`~dpaudit.ledger.book.Ledger._append`
    refuses) and reading (:func:`check_signatures` names the entry): the owner's kinds are the
    owner's; a reservation is closed by its own signer or the owner. Ledgers with no owner yet
    (unsigned) have no authority to check."""
    if ring.owner is None or signer == ring.owner:
        return None
    who = f"key {signer} ({ring.keys[signer].name})" if signer in ring.keys else f"key {signer}"
    if kind in OWNER_KINDS:
        return (
            f"is a {kind} entry signed by {who}, not by the ledger's owner {ring.owner}: "
            f"only the owner may {OWNER_POWERS[kind]}."
        )
    if kind in CLOSE_KINDS:
        target = (payload or {}).get("target")
        opener = ring.reserved_by.get(target)
        if opener is None or opener != signer:
            return (
                f"is a {kind} of reservation {target} signed by {who}, which did not open it: only the key that "
                f"reserved a budget (or the owner) may release it."
            )
    return None


def _void_problem(payload: dict | None) -> str | None:
    """A void on a signed ledger (the owner's, checked before) says whether the artefacts were published."""
    if payload is None or not isinstance(payload.get("artefacts_published"), bool):
        return "is a void that does not state whether the artefacts were ever published (artefacts_published)."
    return None


def _signed_problem(
    ring: KeyRing, r: SignedRow, payload: dict | None, owner: str | None, ok
) -> str | None:
    signer = ring.keys.get(r.signer)
    if signer is None:
        if r.kind == KEY_KIND and not ring.keys:
            return _owner_problem(ring, r, payload, owner, ok)
        return f"is signed by key {r.signer}, which is not registered before it."
    if not ok(signer.public_raw, r.signature or "", r):
        return f"has an invalid signature by key {r.signer} ({signer.name}): its content or the previous hash changed since it was signed."
    why = authority_problem(ring, r.kind, payload, r.signer)
    if why is not None:
        return why
    if r.kind == VOID_KIND:
        return _void_problem(payload)
    if r.kind == SEAL_KIND:
        return _seal_problem(r, payload)
    return _register_member(ring, r, payload) if r.kind == KEY_KIND else None


def _register_member(ring: KeyRing, r: SignedRow, payload: dict) -> str | None:
    """Adopt the member key a key entry registers (its problem when the payload holds none)."""
    key, why = _registered_key(r, payload, "member")
    if key is not None:
        ring.keys.setdefault(key.key_id, key)
    return why or None


def _seal_file(ledger_identity: str) -> Path:
    return key_dir().parent / "seals" / f"{ledger_identity}.json"


def remember_seal(ledger_identity: str, seq: int, seal_hash: str) -> None:
    """Keep the last seal made on this machine for the ledger whose owner registration is
    ``ledger_identity`` (its entry id): a later truncation that removes it is then named by
    :func:`remembered_seal`'s callers (a local anchor; it is public, not a secret)."""
    path = _seal_file(ledger_identity)
    try:
        write_atomically(path, json.dumps({"seq": int(seq), "hash": str(seal_hash)}))
    except OSError as e:
        raise LedgerError(
            f"cannot remember the seal in {path}: {e.strerror or e}; publish its hash {seal_hash} instead."
        ) from None


def remembered_seal(ledger_identity: str) -> dict | None:
    """The seal remembered for that ledger on this machine (``seq``, ``hash``), else None."""
    path = _seal_file(ledger_identity)
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) and isinstance(d.get("hash"), str) else None


def seal_payload(seq: int, head_hash: str) -> dict:
    """The payload of a ``seal`` entry: the entry it seals through and that entry's hash."""
    return {"sealed_seq": int(seq), "sealed_hash": str(head_hash)}


def _seal_problem(r: SignedRow, payload: dict | None) -> str | None:
    """A seal names the entry right before it (its signature covers that entry's hash)."""
    if payload != seal_payload(r.seq - 1, r.prev_hash):
        return f"is a seal that does not name the entry before it (#{r.seq - 1}, hash {r.prev_hash[:16]})."
    return None


#: Entries whose payload the rules above read.
_READ_PAYLOAD = set(LEDGER_KINDS) | {VOID_KIND, *CLOSE_KINDS}


def check_signatures(
    rows: Iterable[SignedRow],
    *,
    owner: str | None = None,
    verify: bool = True,
    verified: "set[str] | frozenset[str]" = frozenset(),
) -> tuple[KeyRing, list[Problem]]:
    """Replay ``rows`` (append order): register keys, apply the policy and the authority rules
    (:func:`authority_problem`), check every signature; returns the key ring and the findings.
    ``owner``: the pinned owner's key id (another first key, or none, is a finding). ``verify=False``
    skips the Ed25519 checks, ``verified`` skips them for those row ids (already verified by the
    caller); who signed what, the policy and the authority rules are checked either way."""
    ring = KeyRing()
    out: list[Problem] = []

    def ok(raw: bytes, sig: str, r: SignedRow) -> bool:
        if not verify or r.id in verified:
            return True
        # the row's id, kind, created_at, dataset and payload text: r[1:6]
        return _signature_ok(raw, sig, signing_material(r.prev_hash, *r[1:6], r.signer))

    for r in rows:
        payload = payload_of(r.payload_text) if r.kind in _READ_PAYLOAD else None
        if payload is None and r.kind in LEDGER_KINDS:
            why = "is unreadable: its payload is not a JSON object."
        elif not r.signer:
            ring.unsigned += 1
            why = _unsigned_problem(ring, r)
        else:
            ring.signed += 1
            why = _signed_problem(ring, r, payload, owner, ok)
        ring.note(r)
        if why:
            out.append(Problem("signature", f"{label(r)} {why}", r.seq, r.id))
    if owner is not None and ring.owner is None:
        missing = (
            f"the ledger registers no owner key, but owner {owner} was expected: its "
            "registration and the entries after it may have been removed."
        )
        out.append(Problem("signature", missing))
    return ring, out

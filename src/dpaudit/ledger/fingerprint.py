"""Keyed dataset fingerprints: how the ledger names a dataset's records without publishing a hash of them.

Why keyed. A plain SHA-256 of the private data tells neighbouring datasets apart exactly, which
no DP guarantee allows; the ledger still needs to know whether two releases used the same records.
It stores ``HMAC-SHA256(key, digest)`` (``digest``: the plain SHA-256, never stored; ``key``: 32
random bytes in ``<ledger>.key``, mode 0600). Without the key it reveals nothing about the data;
with it, the same data always map to the same fingerprint.

The key never enters a release. Losing it does not lose budget: the ledger keeps every entry,
and new releases simply cannot be matched to old fingerprints (they are refused until the
operator declares the new version).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import re
from pathlib import Path

from ..errors import LedgerError, UsageError

#: Length of the secret in bytes.
KEY_BYTES = 32
#: Suffix of the key file next to the ledger file.
KEY_SUFFIX = ".key"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def keyed_fingerprint(key: bytes, digest: str) -> str:
    """``HMAC-SHA256(key, digest)`` as 64 lower-case hex characters (``digest``: the plain identity
    of the data, e.g. the SHA-256 hex of the prepared arrays, hashed as its text; ``key``: the
    ledger's 32-byte key, whose size both stores check when they read it)."""
    if not isinstance(digest, str) or not digest:
        raise UsageError(f"digest must be a non-empty string, got {digest!r}.")
    return hmac.new(bytes(key), digest.encode("utf-8"), hashlib.sha256).hexdigest()


def is_fingerprint(value: object) -> bool:
    """True for 64 lower-case hex characters (the form of a keyed fingerprint and of a SHA-256)."""
    return isinstance(value, str) and bool(_HEX64.match(value))


def key_path(ledger_path: str | os.PathLike) -> Path:
    """Where the secret of the ledger at ``ledger_path`` lives: ``<ledger>.key``."""
    p = Path(ledger_path)
    return p.with_name(p.name + KEY_SUFFIX)


def ledger_key(ledger_path: str | os.PathLike, *, create: bool = True) -> bytes:
    """The 32-byte secret of the ledger at ``ledger_path``, created on first use if ``create``: race-free
    (written privately, then hard-linked into place; another process's key wins and is read). A key
    file of the wrong size is an error, never replaced (that would change every fingerprint)."""
    path = key_path(ledger_path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        if not create:
            raise LedgerError(
                f"ledger key {path} is missing; restore it from a backup (fingerprints of new releases "
                "cannot be matched to the recorded ones without it)."
            ) from None
        data = _create_key(path)
    except OSError as e:
        raise LedgerError(f"cannot read ledger key {path}: {e.strerror or e}.") from None
    if len(data) != KEY_BYTES:
        raise LedgerError(
            f"ledger key {path} must hold exactly {KEY_BYTES} bytes, got {len(data)}; restore it from a backup."
        )
    return data


def write_secret(path: str | os.PathLike, data: bytes) -> None:
    """Create ``path`` holding ``data``, mode 0600 from its creation (never readable by others, not
    even briefly), synced to disk; FileExistsError if it exists (a secret is never overwritten)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(bytes(data))
        f.flush()
        os.fsync(f.fileno())


def _create_key(path: Path) -> bytes:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        write_secret(tmp, os.urandom(KEY_BYTES))
        try:
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)  # atomic, and fails if another process created the key first
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return path.read_bytes()
    except OSError as e:
        raise LedgerError(f"cannot create ledger key {path}: {e.strerror or e}.") from None

"""Where the ledger lives: ``--ledger PATH|URL``, else ``$DPAUDIT_LEDGER``, else ./.dpaudit/ledger.sqlite.

A file path selects the embedded SQLite ledger (the default). ``postgresql://USER@HOST[:PORT]/DB``
(or ``postgres://``) selects a PostgreSQL team ledger (:mod:`dpaudit.ledger.store_pg`); an
optional ``?schema=NAME`` query parameter keeps several ledgers in one database (default schema
``dpaudit``). Any other ``scheme://`` is refused (:class:`~dpaudit.errors.UsageError`, exit 2),
never taken for a file path (a private ledger no teammate's cap could see).
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from ..errors import LedgerError, UsageError

#: Hash that precedes the first entry of every ledger (both stores, the integrity checker).
GENESIS_HASH = "0" * 64


def utc_now() -> str:
    """The ledger's timestamps: UTC, ISO 8601, microseconds."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


LEDGER_ENV = "DPAUDIT_LEDGER"
DEFAULT_LEDGER = Path(".dpaudit") / "ledger.sqlite"
POSTGRES_SCHEMES = ("postgresql", "postgres")
#: Default PostgreSQL schema that holds the ledger's tables.
DEFAULT_PG_SCHEMA = "dpaudit"
# "scheme://..." as typed, or "scheme:/..." once pathlib collapsed the double slash (the CLI's
# --ledger option is a Path). A Windows drive ("C:\\x", "C:/x") has a one-letter scheme: a path.
_URL_RE = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]+):/(?P<rest>.*)$", re.S)
_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


@dataclass(frozen=True)
class LedgerLocation:
    """A resolved ledger: ``backend`` is ``"sqlite"`` (``path`` set) or ``"postgresql"`` (``url`` set).

    ``url`` is the libpq connection URL (dpaudit's own ``schema`` parameter removed) and may
    hold a password: show :attr:`display`, never ``url``."""

    backend: str
    path: Path | None = None
    url: str | None = None
    schema: str | None = None

    @property
    def display(self) -> str:
        """The location as shown in messages and JSON output: a path, or the URL without its password."""
        if self.backend == "sqlite":
            return str(self.path)
        return redact_url(self.url or "") + (
            "" if self.schema == DEFAULT_PG_SCHEMA else f"?schema={self.schema}"
        )

    @property
    def target(self) -> str:
        """What to pass to another process so that it opens the same ledger (absolute path or full URL)."""
        if self.backend == "sqlite":
            return str(Path(self.path).expanduser().resolve())
        return with_schema(self.url or "", self.schema)

    def __str__(self) -> str:
        return self.display


def _unsplit(parts: urllib.parse.SplitResult) -> str:
    """``urlunsplit`` that keeps the ``//`` of an empty host (``postgresql:///db``: the local
    server's default socket), which ``urlunsplit`` drops (giving ``postgresql:/db``)."""
    url = urllib.parse.urlunsplit(parts)
    if not parts.netloc and parts.scheme and not url.startswith(f"{parts.scheme}://"):
        url = f"{parts.scheme}://" + url[len(parts.scheme) + 1 :]
    return url


def redact_url(url: str) -> str:
    """``url`` with the password (if any) replaced by ``***``."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = (parts.username or "") + ":***"
    return _unsplit(parts._replace(netloc=f"{user}@{netloc[-1]}"))


def with_schema(url: str, schema: str | None) -> str:
    if not schema or schema == DEFAULT_PG_SCHEMA:
        return url
    parts = urllib.parse.urlsplit(url)
    q = urllib.parse.parse_qsl(parts.query, keep_blank_values=True) + [("schema", schema)]
    return _unsplit(parts._replace(query=urllib.parse.urlencode(q)))


def _slashes(text: str) -> str:
    """``text`` as typed: the "//" after a scheme that pathlib collapsed restored (for messages)."""
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.\-]+):/(?!/)", r"\1://", text)


def _from_url(text: str, scheme: str, rest: str) -> LedgerLocation:
    if scheme.lower() not in POSTGRES_SCHEMES:
        raise UsageError(
            f"ledger must be a file path (SQLite) or a postgresql://USER@HOST[:PORT]/DB URL, got {_slashes(text)!r} "
            f"(unknown scheme {scheme!r})."
        )
    # Restore the "//" that pathlib collapses (Path("postgresql://u@h/db") == "postgresql:/u@h/db").
    url = f"postgresql://{rest[1:] if rest.startswith('/') else rest}"
    parts = urllib.parse.urlsplit(url)
    params = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    # ``schema`` is dpaudit's own parameter (libpq would reject it); the last one given counts.
    schema = next((v for k, v in reversed(params) if k == "schema"), DEFAULT_PG_SCHEMA)
    kept = [(k, v) for k, v in params if k != "schema"]
    if not _SCHEMA_RE.match(schema):
        raise UsageError(
            f"ledger schema must be a lower-case SQL name (letters, digits, '_', at most 63), got {schema!r}."
        )
    if not parts.path.strip("/"):
        raise UsageError(
            f"ledger URL must name a database (postgresql://USER@HOST[:PORT]/DB), got {redact_url(text)!r}."
        )
    url = _unsplit(parts._replace(query=urllib.parse.urlencode(kept)))
    return LedgerLocation("postgresql", url=url, schema=schema)


def resolve_ledger(value: str | os.PathLike | None = None) -> LedgerLocation:
    """The ledger named by ``value`` (a path or URL), else ``$DPAUDIT_LEDGER``, else the default file."""
    if value is None:
        value = os.environ.get(LEDGER_ENV) or None
    if value is None:
        return LedgerLocation("sqlite", path=DEFAULT_LEDGER)
    if isinstance(value, LedgerLocation):
        return value
    text = os.fspath(value)
    m = _URL_RE.match(text)
    if m is not None:
        return _from_url(text, m.group("scheme"), m.group("rest"))
    return LedgerLocation("sqlite", path=Path(text).expanduser())


def ledger_missing(loc: LedgerLocation) -> bool:
    """Whether ``loc`` is a ledger file that does not exist (a PostgreSQL ledger never is: its
    server answers for it)."""
    return loc.backend == "sqlite" and not loc.path.exists()


def require_existing(loc: LedgerLocation) -> LedgerLocation:
    """Refuse (one-line LedgerError) a ledger file that does not exist: reading or verifying a
    ledger never creates one (a mistyped ``--ledger`` must not read as an empty, intact ledger)."""
    if ledger_missing(loc):
        raise LedgerError(
            f"ledger must be an existing ledger file, got {str(loc.path)!r} (no such file; only commands that "
            f"write to a ledger create one)."
        )
    return loc

"""Named exception types. The CLI turns every :class:`DPAuditError` into one line and exit code 2."""

from __future__ import annotations


#: The way out of a refusal that comes from what the ledger holds of a dataset (its cap, adjacency,
#: rows) when the refused run belongs to another study: the CLI adds it to such a refusal's line.
OTHER_LEDGER_HINT = "Not the same study? use another --ledger for an unrelated experiment."


class DPAuditError(Exception):
    """Base class of every error dpaudit raises on purpose (bad input, refused request). ``hint``: a
    way out the CLI appends to the error's line (None: none)."""

    hint: str | None = None


class UsageError(DPAuditError, ValueError):
    """A value given by the user is outside what is allowed."""


class AdjacencyMismatchError(DPAuditError):
    """Two guarantees declared under different adjacency relations were combined."""


class UnsupportedEventError(DPAuditError):
    """An accountant was asked about an event it cannot account for (never treated as epsilon 0)."""


class CalibrationError(DPAuditError):
    """No noise level reaches the requested privacy target."""


class BudgetExceededError(DPAuditError):
    """A planned release would push a dataset's composed budget over its cap."""

    hint = OTHER_LEDGER_HINT


class DatasetIdentityError(DPAuditError):
    """A release's data differ from what its dataset name meant in the ledger (undeclared version)."""

    hint = OTHER_LEDGER_HINT


class LedgerAdjacencyError(AdjacencyMismatchError):
    """A release or audit under another adjacency than the ledger's earlier ones on its dataset."""

    hint = OTHER_LEDGER_HINT


class RowRoleCollisionError(DatasetIdentityError):
    """A release would read as public source rows the ledger holds as private (or the reverse)."""


class DataError(DPAuditError):
    """A dataset file is missing, corrupt or malformed."""


class LedgerError(DPAuditError):
    """The ledger database is unreadable, corrupt, read-only or of an unknown schema."""


class AccountingMismatchError(DPAuditError):
    """Executed steps differ from accounted steps, or the achieved epsilon exceeds the target."""


class LedgerVerificationError(LedgerError):
    """The ledger fails verification (chain or signatures): no budget is computed from it (fail closed)."""


class LedgerAuthorityError(DPAuditError):
    """A write that would lower a spent budget lacks the authority it needs (a void not signed by the owner, a partition declared
    over children that already hold releases)."""

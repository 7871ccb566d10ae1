"""The privacy budget ledger: a budget book over a store (SQLite or PostgreSQL), above accounting.

Modules: :mod:`.book` (the ledger API: :func:`~.book.open_ledger`), :mod:`.compose` (exact
recomposition of the stored events), :mod:`.rows` (the row sets the ledger budgets people by),
:mod:`.paths`, :mod:`.store_sqlite`, :mod:`.store_pg`, :mod:`.signing`, :mod:`.fingerprint`,
:mod:`.result_cache`. Nothing is imported here, so ``dpaudit.ledger.paths`` loads alone.
"""

"""The privacy budget ledger, above accounting: the budget book is :mod:`.book` (``open_ledger``), the
other modules are listed in docs/architecture.md. Nothing is imported here, so ``dpaudit.ledger.paths`` loads alone.
"""

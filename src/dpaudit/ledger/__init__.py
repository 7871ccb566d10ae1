"""The privacy budget ledger, above accounting: :mod:`.book` (``open_ledger``) is the facade over
the budget arithmetic (:mod:`.budget`), who may write what (:mod:`.authority`) and the stores
(:mod:`.store`); the other modules are listed in docs/architecture.md. Nothing is imported here,
so ``dpaudit.ledger.paths`` loads alone.
"""

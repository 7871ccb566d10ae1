"""The privacy budget ledger, above accounting: the budget book (:mod:`.book`, ``open_ledger``),
its integrity checker (:mod:`.integrity`), queries and their wording (:mod:`.queries`,
:mod:`.text`), composition (:mod:`.compose`), row sets (:mod:`.rows`), paths and the two stores
(:mod:`.store_sqlite`, :mod:`.store_pg`). Nothing is imported here, so ``dpaudit.ledger.paths`` loads alone.
"""

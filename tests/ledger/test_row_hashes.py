"""Keyed row hashes (ledger.rows): the copied keyed state gives exactly the digests of the
definition, blake2b(source | id, key), so ledgers written before keep matching."""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from dpaudit.data.rows import RowSet
from dpaudit.ledger import rows


@settings(max_examples=50, deadline=None)
@given(
    key=st.binary(min_size=1, max_size=64),
    source=st.text(min_size=1, max_size=20),
    ids=st.lists(st.integers(min_value=-(10**12), max_value=10**12), max_size=30),
)
def test_row_hashes_equal_the_definition(key, source, ids):
    want = {
        hashlib.blake2b(
            source.encode("utf-8") + b"|" + str(i).encode("ascii"),
            key=key,
            digest_size=rows._HASH_BYTES,
        ).digest()
        for i in ids
    }
    got = (
        rows.hash_rows(key, [RowSet(source, "private", tuple(ids))])["private"][source].hashes
        if ids
        else set()
    )
    assert got == want

"""An export whose fingerprint key has the wrong size is refused before anything is written, on both
backends (SQLite used to write the rows and the bad key file and fail only when the key was next read;
PostgreSQL refused through its CHECK constraint with a database message)."""

from __future__ import annotations

import base64

import pytest

from dpaudit.errors import UsageError
from dpaudit.ledger import signing as sg
from dpaudit.ledger.book import open_ledger
from dpaudit.ledger.fingerprint import key_path


@pytest.fixture(autouse=True)
def _no_default_key(tmp_path, monkeypatch):
    """No signing key of this machine's user is picked up."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.delenv(sg.SIGNING_KEY_ENV, raising=False)


def _dump_with_key(tmp_path, key: bytes) -> dict:
    with open_ledger(tmp_path / "a.sqlite") as led:
        led.cap("toy", 1.0, 1e-5)
        dump = led.export_rows(include_key=True)
    return {**dump, "fingerprint_key": base64.b64encode(key).decode("ascii")}


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
@pytest.mark.parametrize("size", [16, 33])
def test_an_export_with_a_key_of_the_wrong_size_imports_nothing(tmp_path, request, backend, size):
    dump = _dump_with_key(tmp_path, bytes(range(size)))
    target = tmp_path / "b.sqlite"
    if backend == "postgresql":
        target = request.getfixturevalue("pg_ledger_url")
    with open_ledger(target) as led:
        with pytest.raises(UsageError, match=f"must hold exactly 32 bytes, got {size}; nothing"):
            led.import_rows(dump)
        assert led.entries() == []
    if backend == "sqlite":
        assert not key_path(target).exists()


def test_an_export_with_a_key_of_the_right_size_still_imports(tmp_path):
    dump = _dump_with_key(tmp_path, bytes(range(32)))
    with open_ledger(tmp_path / "b.sqlite") as led:
        assert led.import_rows(dump) == 1
    assert key_path(tmp_path / "b.sqlite").read_bytes() == bytes(range(32))

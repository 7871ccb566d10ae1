"""Opening a ledger through the class itself follows the same rules as ``open_ledger``: the location
is resolved once (a URL never becomes a file), a reading open never creates a file, and a refused
signing key leaves nothing behind."""

from __future__ import annotations

import pytest

from dpaudit.errors import LedgerError, UsageError
from dpaudit.ledger.book import Ledger, open_ledger


def test_a_reading_open_of_the_class_creates_no_file(tmp_path):
    path = tmp_path / "missing.sqlite"
    with pytest.raises(LedgerError, match="must be an existing ledger file"):
        Ledger(path, create=False)
    assert not path.exists()


def test_the_class_refuses_an_unknown_scheme_instead_of_making_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match="unknown scheme 'mysql'"):
        Ledger("mysql://user@host/db")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("opener", [Ledger, open_ledger])
def test_a_refused_signing_key_creates_no_ledger(tmp_path, monkeypatch, opener):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    path = tmp_path / "new.sqlite"
    with pytest.raises(UsageError, match="signing key must be an existing key file or name"):
        opener(path, signing_key="nobody")
    assert not path.exists()

"""A sweep store belongs to one sweep and one schema version: another sweep's name or another
version is refused in one line, naming both values; a new store records both."""

import sqlite3

import pytest

from dpaudit.errors import DataError
from dpaudit.sweeps import open_store


def test_store_records_and_refuses_another_sweep(tmp_path):
    with open_store(tmp_path, name="alpha") as store:
        assert store.name == "alpha" and store.meta()["schema_version"] == "1"
    with pytest.raises(DataError) as e:
        open_store(tmp_path, name="beta")
    assert (
        str(e.value)
        == f"sweep store {tmp_path / 'sweep.sqlite'} belongs to sweep 'alpha', not 'beta'."
    )
    with open_store(tmp_path, name="alpha") as store:  # the same sweep reopens it
        assert store.name == "alpha"


def test_store_refuses_another_schema_version(tmp_path):
    open_store(tmp_path, name="alpha").close()
    db = sqlite3.connect(tmp_path / "sweep.sqlite")
    db.execute("UPDATE meta SET value = '9' WHERE key = 'schema_version'")
    db.commit()
    db.close()
    with pytest.raises(DataError) as e:
        open_store(tmp_path)
    path = tmp_path / "sweep.sqlite"
    assert str(e.value) == f"sweep store {path} schema_version must be 1, got 9."

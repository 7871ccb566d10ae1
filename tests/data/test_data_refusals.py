"""Refusals of data files and splits that no other test reaches: each is one line."""

from __future__ import annotations

import numpy as np
import pytest

from dpaudit.data.files import read_sha256sums
from dpaudit.data.rows import RowSet
from dpaudit.data.tabular import read_table
from dpaudit.data.users import split_by_users
from dpaudit.errors import DataError, UsageError

COLUMNS = ("a", "b")


@pytest.mark.parametrize(
    "raw, fragment",
    [
        (b"a,b\n\xff\xfe,1\n", "cannot read"),
        (b"", "is empty; expected a header a,b."),
        (b"a,b\n\n  \n", "must contain at least one data row, got none."),
    ],
)
def test_unreadable_or_empty_tables_are_data_errors(tmp_path, raw, fragment):
    path = tmp_path / "t.csv"
    path.write_bytes(raw)
    with pytest.raises(DataError, match=fragment.replace(".", r"\.")):
        read_table(path, ",", COLUMNS, header=True)


def test_blank_lines_between_rows_are_skipped(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("a,b\n1,?\n\n3,4\n")
    np.testing.assert_array_equal(read_table(path, ",", COLUMNS, header=True)["a"], [1.0, 3.0])


def test_an_undecodable_checksum_file_is_a_data_error(tmp_path):
    (tmp_path / "SHA256SUMS").write_bytes(b"\xff\xfe  x.csv\n")
    with pytest.raises(DataError, match="cannot read .*SHA256SUMS"):
        read_sha256sums(tmp_path)


def test_bad_roles_and_user_split_percentages_are_refused():
    with pytest.raises(ValueError, match="role must be one of private, public, got 'secret'."):
        RowSet("x", "secret", None)
    with pytest.raises(UsageError, match="train_percent and val_percent must be integers"):
        split_by_users(np.arange(10), split_seed=1, train_percent=80, val_percent=30)

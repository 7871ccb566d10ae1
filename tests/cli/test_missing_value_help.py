"""An option given without its value names the help of the command being run: click raises that
error without a context, and the line used to send every such user to `dpaudit --help`, which does not
list the sub-command's options."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dpaudit.cli import app


@pytest.mark.parametrize(
    "args, help_of",
    [
        (["ledger", "summary", "--dataset"], "dpaudit ledger summary"),
        (["train", "dp-rvfl", "--eps"], "dpaudit train dp-rvfl"),
        (["ledger", "cap", "--eps"], "dpaudit ledger cap"),
    ],
)
def test_an_option_without_its_value_names_its_commands_help(tmp_path, args, help_of):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    flag = args[-1]
    line = f"error: {flag} must be given a value (see `{help_of} --help`), got none."
    assert result.output.strip().splitlines() == [line]


def test_a_root_option_without_a_command_still_names_the_root_help():
    result = CliRunner().invoke(app, ["--bogus"])
    assert result.exit_code == 2
    assert "an option of `dpaudit --help`" in result.output

"""Refusals of sweep specs, stores and statistics that no other test reaches (each is one line),
and the no-budget answer for a selftest task."""

from __future__ import annotations

import math
import re

import pytest

from dpaudit.errors import DataError, UsageError
from dpaudit.sweeps import builtin_spec, load_spec, open_store, parse_spec
from dpaudit.sweeps.stats import MAX_EXACT_N, sign_flip_pvalue, summarize
from dpaudit.sweeps.tasks import planned_event

GRID = 'name = "s"\nmodels = ["dp-rvfl"]\ndatasets = ["heart"]\neps = [1]\nseeds = [1]\n'


@pytest.mark.parametrize(
    "text, fragment",
    [
        (GRID + "settings = 3\n", "spec settings must be a table of name = value, got 3."),
        (GRID + "[settings]\ndelta = nan\n", "spec setting delta must be finite, got nan."),
        (GRID + "[settings]\n[settings.delta]\n", "setting delta must be a number, string"),
        (GRID + "[settings]\n[fixed]\n", "fixed settings once, got both"),
        (GRID.replace("seeds = [1]", "seeds = []"), "seeds must not be empty, got []."),
        ('name = "s"\ngrid = [1]\n', "grid must be a non-empty array of tables"),
    ],
)
def test_malformed_specs_are_refused_with_one_line(text, fragment):
    with pytest.raises(UsageError, match=re.escape(fragment)):
        parse_spec(text)


def test_an_unreadable_spec_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="cannot read sweep spec"):
        load_spec(tmp_path)  # a folder: read_bytes fails with IsADirectoryError


def test_summaries_and_sign_flips_refuse_bad_input():
    with pytest.raises(UsageError, match=r"values must be non-empty, got \[\]\."):
        summarize([])
    with pytest.raises(UsageError, match=r"confidence must be in \(0, 1\), got 1\.0\."):
        summarize([1.0, 2.0], confidence=1.0)
    with pytest.raises(UsageError, match=f"at most {MAX_EXACT_N} for the exact test"):
        sign_flip_pvalue([1.0] * (MAX_EXACT_N + 1))
    assert math.isnan(summarize([3.0]).sd)


def test_finishing_a_task_the_store_lacks_is_a_data_error(tmp_path):
    with open_store(tmp_path / "s") as store, pytest.raises(DataError, match="task key must be"):
        store.mark_done("0" * 16, {"accuracy": 1.0})


def test_a_selftest_task_plans_no_release():
    task = builtin_spec("selftest").tasks()[0]
    assert task.runner == "selftest" and planned_event(task.config()) is None

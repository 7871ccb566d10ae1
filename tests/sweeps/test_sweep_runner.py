"""The results store and the runner: resume, failed tasks, retry on request, store integrity."""

from __future__ import annotations

import sqlite3

import pytest

from dpaudit.errors import DataError
from dpaudit.sweeps import load_records, open_store, parse_spec, run_sweep

SPEC = """
name = "st"
runner = "selftest"
models = ["mean", "median"]
datasets = ["synthetic"]
epsilons = [1.0, 2.0]
seeds = [1, 2, 3]
[settings]
reproducible_noise = true
n = 200
"""


def _rows(store_dir):
    with open_store(store_dir, create=False) as s:
        return {r.key: r for r in s.rows()}


def test_resume_after_interruption_runs_only_unfinished_tasks(tmp_path):
    spec = parse_spec(SPEC)
    first = run_sweep(spec, out=tmp_path, max_tasks=5)
    assert (first.ran, first.done, first.pending) == (5, 5, 7)
    before = {k: r for k, r in _rows(tmp_path / "st").items() if r.status == "done"}
    assert len(before) == 5
    seen = []
    second = run_sweep(spec, out=tmp_path, on_outcome=lambda t, o: seen.append(t.key))
    assert (second.ran, second.done, second.pending, second.skipped_finished) == (7, 12, 0, 5)
    assert not set(seen) & set(before)  # finished tasks were not run again
    after = _rows(tmp_path / "st")
    for k, r in before.items():  # and their stored results are untouched
        assert (
            after[k].result == r.result
            and after[k].attempts == 1
            and after[k].finished_at == r.finished_at
        )
    third = run_sweep(spec, out=tmp_path)
    assert third.ran == 0 and third.done == 12


def test_a_growing_grid_keeps_finished_tasks(tmp_path):
    run_sweep(parse_spec(SPEC), out=tmp_path)
    bigger = parse_spec(SPEC.replace("seeds = [1, 2, 3]", "seeds = [1, 2, 3, 4]"))
    s = run_sweep(bigger, out=tmp_path)
    assert (s.tasks, s.ran, s.done) == (16, 4, 16)


def test_failed_tasks_are_recorded_and_retried_only_on_request(tmp_path):
    failing = parse_spec(SPEC.replace("n = 200", "n = 200\nfail_seeds = [2]"))
    s = run_sweep(failing, out=tmp_path)
    assert (s.ran, s.ran_failed, s.done, s.failed) == (12, 4, 8, 4)
    assert all(f["seed"] == 2 and "failed on purpose" in f["error"] for f in s.failures)
    rows = _rows(tmp_path / "st")
    failed = [r for r in rows.values() if r.status == "failed"]
    assert len(failed) == 4 and all(
        "RuntimeError: selftest task failed on purpose" in r.error for r in failed
    )
    again = run_sweep(failing, out=tmp_path)
    assert again.ran == 0 and again.failed == 4  # not retried without asking
    retried = run_sweep(failing, out=tmp_path, retry_failed=True)
    assert retried.ran == 4 and retried.failed == 4
    assert all(r.attempts == 2 for r in _rows(tmp_path / "st").values() if r.status == "failed")
    name, records = load_records(tmp_path / "st")
    assert name == "st" and len(records) == 8


def test_store_refuses_another_sweep_and_garbage(tmp_path):
    run_sweep(parse_spec(SPEC), out=tmp_path, max_tasks=1)
    with pytest.raises(DataError, match="belongs to sweep 'st'"):
        open_store(tmp_path / "st", name="other")
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"not a database at all" * 100)
    with pytest.raises(DataError, match="unreadable or not a sweep store"):
        open_store(bad)
    with pytest.raises(DataError, match="not found"):
        open_store(tmp_path / "nothing", create=False)
    con = sqlite3.connect(tmp_path / "st" / "sweep.sqlite")
    con.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    con.commit()
    con.close()
    with pytest.raises(DataError, match="schema_version must be 1"):
        open_store(tmp_path / "st")


def test_no_available_dataset_is_an_error(tmp_path):
    spec = parse_spec(
        'name = "h"\nmodels = ["dp-rvfl"]\ndatasets = ["heart"]\neps = [2]\nseeds = [1]\n'
    )
    with pytest.raises(DataError, match="no task to run.*heart"):
        run_sweep(spec, out=tmp_path, data_dir=tmp_path)


def test_two_coordinators_cannot_run_the_same_sweep_at_once(tmp_path):
    from dpaudit.errors import UsageError

    spec = parse_spec(SPEC)
    with pytest.raises(UsageError, match="in use by another running sweep"):
        run_sweep(
            spec, out=tmp_path, max_tasks=1, on_outcome=lambda t, o: run_sweep(spec, out=tmp_path)
        )
    s = run_sweep(spec, out=tmp_path)  # the lock is released afterwards
    assert s.done == 12

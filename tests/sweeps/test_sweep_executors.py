"""Local executor: process pool equals in-process, survives a dying worker; map_chunks for audits."""

from __future__ import annotations

import pytest

from dpaudit.errors import UsageError
from dpaudit.sweeps import (
    DaskExecutor,
    ChunkFailedError,
    LocalExecutor,
    load_records,
    make_executor,
    parse_spec,
    run_sweep,
)

SPEC = """
name = "ex"
runner = "selftest"
models = ["mean", "median"]
datasets = ["synthetic"]
epsilons = [0.5, 2.0]
seeds = [42, 43]
[settings]
reproducible_noise = true
n = 300
"""


def _results(folder):
    _, recs = load_records(folder)
    return {(r["model"], r["epsilon"], r["seed"]): r["metrics"] for r in recs}


def test_process_pool_gives_the_in_process_results(tmp_path):
    spec = parse_spec(SPEC)
    run_sweep(spec, out=tmp_path / "a")
    with LocalExecutor(2) as ex:
        s = run_sweep(spec, out=tmp_path / "b", executor=ex)
    assert s.done == 8 and s.executor["workers"] == 2
    a, b = _results(tmp_path / "a" / "ex"), _results(tmp_path / "b" / "ex")
    assert len(a) == 8 and a == b  # reproducible noise: bit-identical, whatever ran it


def test_a_worker_dying_mid_task_is_survived(tmp_path):
    marker = tmp_path / "died-once"
    spec = parse_spec(SPEC.replace("n = 300", f"n = 300\nexit_once_marker = {str(marker)!r}"))
    with LocalExecutor(2) as ex:
        s = run_sweep(spec, out=tmp_path, executor=ex)
    assert marker.exists()  # one worker process really exited mid-task
    assert (s.done, s.failed, s.pending) == (8, 0, 0)


def test_map_chunks_keeps_order_and_reports_failures():
    with LocalExecutor(1) as ex:
        assert ex.map_chunks(abs, [-3, 1, -2]) == [3, 1, 2]
        with pytest.raises(ChunkFailedError, match="1 of 3 chunks failed; chunk 1: TypeError"):
            ex.map_chunks(abs, [-3, "x", -2])


def test_executor_arguments_are_checked():
    with pytest.raises(UsageError, match="executor must be one of"):
        make_executor("ray")
    with pytest.raises(UsageError, match="executor must be dask"):
        make_executor("local", scheduler="tcp://127.0.0.1:1")
    with pytest.raises(UsageError, match="workers must be an integer >= 1"):
        make_executor("local", workers=0)


def test_interrupting_the_coordinator_keeps_finished_tasks(tmp_path):
    spec = parse_spec(SPEC)

    def stop_after_three(task, outcome, seen=[]):
        seen.append(task.key)
        if len(seen) == 3:
            raise KeyboardInterrupt

    s = run_sweep(spec, out=tmp_path, on_outcome=stop_after_three)
    assert s.interrupted and (s.done, s.pending) == (3, 5)
    s2 = run_sweep(spec, out=tmp_path)
    assert (s2.ran, s2.done) == (5, 8)


def test_map_chunks_sends_shared_data_once_per_worker():
    import operator

    table = {f"k{i}": i * i for i in range(6)}
    keys = [f"k{i}" for i in (5, 0, 3)]
    with LocalExecutor(1) as ex:
        assert ex.map_chunks(operator.getitem, keys, shared=table) == [25, 0, 9]
    with LocalExecutor(2) as ex:
        assert ex.map_chunks(operator.getitem, keys, shared=table) == [25, 0, 9]
        with pytest.raises(ChunkFailedError, match="chunk 1: KeyError"):
            ex.map_chunks(operator.getitem, ["k1", "nope"], shared=table)


def test_a_workers_warnings_are_raised_in_the_caller_each_distinct_one_once():
    import warnings

    texts = ["worker warning", "worker warning", "another", "worker warning"]
    with LocalExecutor(2) as ex, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = list(ex.imap_unordered(warnings.warn, texts))
    assert all(o.ok for o in outs)
    assert sorted(str(w.message) for w in caught) == ["another", "worker warning"]
    assert {(w.category, w.filename.rsplit("/", 1)[-1]) for w in caught} == {
        (UserWarning, "executors.py")  # where the worker called the task, as shown there
    }


def test_dask_executor_refuses_workers_with_a_scheduler_before_connecting():
    # the same rule as make_executor's, checked before any connection is tried
    with pytest.raises(UsageError, match="workers must be omitted when --scheduler is given"):
        DaskExecutor(scheduler="tcp://127.0.0.1:9", workers=2)

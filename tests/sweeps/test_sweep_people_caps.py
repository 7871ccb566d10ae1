"""A sweep reserves with the rows its tasks read: no combination of its tasks exceeds a cap reached
through shared people (heart's tasks against a cap on heart-mix, the same Cleveland patients).

Real UCI Heart data (skipped, visibly, without it); DP-RVFL, two epochs.
"""

from __future__ import annotations

import pytest

from dpaudit.errors import BudgetExceededError
from dpaudit.ledger.book import open_ledger
from dpaudit.sweeps import open_store, parse_spec, run_sweep
from dpaudit.sweeps.executors import LocalExecutor

SPEC = """
name = "heart-people"
models = ["dp-rvfl"]
datasets = ["heart"]
epsilons = [1.0]
seeds = [42, 43]
[settings]
delta = 1e-5
epochs = 2
"""


def _cap_heart_mix(ledger_path, data_dir, eps, *, declared=True):
    """heart-mix's cap, with its rows declared (as `ledger cap` does) or not (then every Cleveland
    row is assumed)."""
    from dpaudit.mechanisms.mixmin.tasks import load_task

    with open_ledger(ledger_path) as led:
        if declared:
            led.cap(
                "heart-mix", eps, 1e-5, data_rows=load_task("heart-mix", data_dir=data_dir).rows
            )
        else:
            led.cap("heart-mix", eps, 1e-5)


def test_a_sweep_is_refused_when_its_tasks_together_exceed_a_cap_through_shared_people(
    data_dir, tmp_path
):
    """Two heart tasks at epsilon 1 would take heart-mix's cap 1.2 below zero: refused before any
    task runs, with nothing held."""
    ledger_path = tmp_path / "ledger.sqlite"
    _cap_heart_mix(ledger_path, data_dir, 1.2, declared=False)
    with pytest.raises(BudgetExceededError, match="'heart-mix' exceeded through shared people"):
        run_sweep(
            parse_spec(SPEC),
            out=tmp_path,
            ledger_path=ledger_path,
            data_dir=str(data_dir),
            executor=LocalExecutor(2),
        )
    with open_store(tmp_path / "heart-people", create=False) as st:
        assert st.counts()["done"] == 0
    with open_ledger(ledger_path) as led:
        assert led.entries(kind="release") == [] and led.open_reservations() == []


def test_a_sweep_within_the_cap_reserves_with_rows_and_runs(data_dir, tmp_path):
    ledger_path = tmp_path / "ledger.sqlite"
    _cap_heart_mix(ledger_path, data_dir, 2.5)
    s = run_sweep(parse_spec(SPEC), out=tmp_path, ledger_path=ledger_path, data_dir=str(data_dir))
    assert (s.done, s.failed) == (2, 0), s.failures
    with open_ledger(ledger_path) as led:
        assert all(isinstance(e.payload.get("rows"), dict) for e in led.entries(kind="reservation"))
        row = next(r for r in led.summary("heart-mix") if r["partition"] == "*")
        assert row["shares_people_with"] == ["heart"] and 0 <= row["remaining"] < 2.5


def test_each_task_check_counts_the_other_tasks_reservations(data_dir, tmp_path):
    """A task's own pre-check leaves out only its own reservation: after the cap is lowered, the
    sweep's other reservation still counts and the task is refused."""
    from dpaudit.releasing import held_by_caller
    from dpaudit.releasing import preflight
    from dpaudit.sweeps.runner import budget_reserve, plan
    from dpaudit.sweeps.tasks import RunContext, held_for, planned_release
    from dpaudit.mechanisms.mixmin.tasks import declared_rows

    ledger_path = tmp_path / "ledger.sqlite"
    _cap_heart_mix(ledger_path, data_dir, 2.5)
    tasks, _ = plan(parse_spec(SPEC), data_dir=str(data_dir))
    held = budget_reserve(tasks, ledger_path, "heart-people", data_dir=str(data_dir))
    assert len(held) == 2
    _cap_heart_mix(ledger_path, data_dir, 1.2)
    context = RunContext(
        sweep="heart-people", out_dir=str(tmp_path), reservations=tuple(held.items())
    )
    ds, part, adj, event, tail = planned_release(tasks[0].config())
    with held_by_caller(held_for(context, tasks[0].key)):
        with pytest.raises(BudgetExceededError, match="exceeded"):
            preflight(
                ledger_path=ledger_path,
                dataset=ds,
                partition=part,
                event=event,
                adjacency=adj,
                noise_tail_delta=tail,
                data_rows=declared_rows("heart", data_dir=str(data_dir)),
            )

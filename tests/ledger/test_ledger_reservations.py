"""Budget reservations: a cap holds when runs start at the same time.

The budget of a planned release is reserved atomically before training (check + reservation
entry in one write transaction) and settled (release recorded, reservation closed, one
transaction) or cancelled (nothing released) when the run ends; a killed run's reservation stays
spent until voided.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpaudit.accounting import PureEpsilon
from dpaudit.ledger.book import open_ledger
from dpaudit.errors import BudgetExceededError, UsageError
from dpaudit.records import Release

RACER = Path(__file__).with_name("budget_racer.py")
SHA = "ab" * 32
E1 = PureEpsilon(1.0)


def fake_release(partition="train", dataset="toy", digest=SHA, event=E1) -> Release:
    return Release(
        mechanism="fake",
        dataset={"name": dataset, "sha256": digest},
        adjacency="add-remove-record",
        accountant="pure",
        epsilon=event.epsilon,
        delta=0.0,
        guarantee=event.to_dict(),
        seed=0,
        noise_source={"kind": "test"},
        partition=partition,
        git_commit=None,
    )


def reserve_args(**kw):
    return {
        "dataset": "toy",
        "partition": "train",
        "event": E1,
        "adjacency": "add-remove-record",
        "data_digest": SHA,
        **kw,
    }


@pytest.fixture(params=["sqlite", "postgresql"])
def path(request, tmp_path):
    """A capped ledger on each backend (the PostgreSQL one: see conftest.py)."""
    p = (
        tmp_path / "ledger.sqlite"
        if request.param == "sqlite"
        else request.getfixturevalue("pg_ledger_url")
    )
    with open_ledger(p) as led:
        led.cap("toy", 2.5, 1e-5)  # admits two PureEpsilon(1) releases, not three
    return p


def test_an_open_reservation_counts_like_a_release_until_settled_cancelled_or_voided(path):
    with open_ledger(path) as led:
        r1 = led.reserve(**reserve_args())
        r2 = led.reserve(**reserve_args())
        with pytest.raises(BudgetExceededError, match="2 open reservation"):
            led.reserve(**reserve_args())
        assert [e.id for e in led.open_reservations()] == [r1, r2]
        # Settling records the release and closes the reservation in one transaction: the total
        # is unchanged (the release replaces the reservation), so a third run is still refused.
        rel = fake_release()
        assert led.settle(r1, [(rel, "/runs/a")]) == [rel.id]
        with pytest.raises(BudgetExceededError):
            led.preflight(**reserve_args())
        led.cancel(r2, "training failed")
        r3 = led.reserve(**reserve_args())  # the cancelled reservation freed its budget
        with pytest.raises(UsageError, match="must be open"):
            led.cancel(r2, "again")
        with pytest.raises(UsageError, match="must be open"):
            led.settle(r1, [])
        # A killed run's reservation stays spent until an operator voids it.
        led.void(r3, "run killed (SIGKILL); nothing was released", published=False)
        led.preflight(**reserve_args())
        by_id = {e.id: e for e in led.entries()}
        assert (by_id[r1].status, by_id[r2].status, by_id[r3].status) == (
            "settled",
            "cancelled",
            "voided",
        )
        # (the refused reservation wrote nothing)
        assert [e.kind for e in led.entries()] == [
            "cap",
            "reservation",
            "reservation",
            "release",
            "settle",
            "cancel",
            "reservation",
            "void",
        ]
        row = [r for r in led.summary("toy") if r["partition"] == "*"][0]
        assert (
            row["releases_subtree"] == 1
            and row["open_reservations"] == 0
            and row["epsilon"] == pytest.approx(1.0)
        )
        assert led.verify().ok


def test_release_session_cancels_on_failure_and_settles_what_was_published(path, tmp_path):
    from dpaudit.releasing import budget_session, publish, release_session, reserve

    @budget_session
    def run(fail_with=None, publish_first=False):
        reserve(ledger_path=path, **reserve_args())
        if publish_first:
            publish(fake_release(), tmp_path / "pub", ledger_path=path)
        if fail_with is not None:
            raise fail_with
        return publish(fake_release(), tmp_path / "ok", ledger_path=path)

    with pytest.raises(RuntimeError, match="boom"):
        run(RuntimeError("boom"))
    with pytest.raises(KeyboardInterrupt):
        run(KeyboardInterrupt())
    with open_ledger(path) as led:
        cancels = led.entries(kind="cancel")
        assert [c.payload["reason"].split(" (")[0] for c in cancels] == [
            "the run failed before releasing anything"
        ] * 2
        assert (
            "RuntimeError: boom" in cancels[0].payload["reason"]
            and "KeyboardInterrupt" in cancels[1].payload["reason"]
        )
        assert led.open_reservations() == [] and led.entries(kind="release") == []
    # A release written to disk before a later failure is recorded (it exists), and the
    # reservation is closed with it.
    with pytest.raises(RuntimeError):
        run(RuntimeError("after publishing"), publish_first=True)
    run()
    with open_ledger(path) as led:
        assert (
            len(led.entries(kind="release")) == 2
            and len(led.entries(kind="settle")) == 2
            and led.open_reservations() == []
        )
        with pytest.raises(BudgetExceededError):
            led.preflight(**reserve_args())
    with pytest.raises(RuntimeError, match="release_session"):
        reserve(ledger_path=path, **reserve_args())  # outside a session nothing could close it
    with release_session():
        reserve(
            ledger_path=path, record=False, **reserve_args(event=PureEpsilon(0.1))
        )  # record=False: a check only
    with open_ledger(path) as led:
        assert len(led.entries(kind="reservation")) == 4


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX processes")
def test_four_concurrent_runs_against_a_cap_that_admits_two(tmp_path):
    """Four real DP-ELM runs released at the same instant: exactly two complete; the other two
    are refused before their training step starts."""
    ledger = tmp_path / "ledger.sqlite"
    with open_ledger(ledger) as led:
        led.cap("race", 2.5, 1e-5)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(RACER), str(ledger), str(tmp_path / f"run{i}")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(4)
    ]
    try:
        for p in procs:
            line = p.stdout.readline()
            assert line.strip() == "ready", (
                f"racer did not start: {line!r} {p.stderr.read() if p.poll() is not None else ''}"
            )
        for p in procs:  # the barrier: all four go at once
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    codes = [p.returncode for p in procs]
    released = [o for (o, _), c in zip(outs, codes) if c == 0]
    refused = [o for (o, _), c in zip(outs, codes) if c == 3]
    assert sorted(codes) == [0, 0, 3, 3], [(c, o, e[-400:]) for (o, e), c in zip(outs, codes)]
    assert all("BudgetExceededError" in o and "training" not in o.splitlines() for o in refused), (
        refused
    )
    assert all("training" in o.splitlines() for o in released)
    with open_ledger(ledger) as led:
        assert len(led.entries(kind="release")) == 2 and led.open_reservations() == []
        total = [r for r in led.summary("race") if r["partition"] == "*"][0]
        assert total["epsilon"] == pytest.approx(2.0)  # two of the four, under the cap 2.5
        assert led.verify().ok


def test_a_train_command_that_fails_mid_training_leaves_no_reservation_open(tmp_path, monkeypatch):
    from dpaudit.cli import app
    from dpaudit.mechanisms.elm import mechanism as dp_elm

    def broken(*args, **kwargs):
        raise RuntimeError("out of memory in the middle of training")

    monkeypatch.setattr(dp_elm, "elm_sufficient_statistics", broken)
    ledger = tmp_path / "ledger.sqlite"
    with open_ledger(ledger) as led:
        led.cap("digits", 1.5, 1e-5)
    args = [
        "train",
        "dp-elm",
        "--dataset",
        "digits",
        "--width",
        "3",
        "--eps",
        "1",
        "--ledger",
        str(ledger),
    ]
    r = CliRunner().invoke(app, args + ["--out", str(tmp_path / "a")])
    assert r.exit_code != 0 and isinstance(r.exception, RuntimeError)
    with open_ledger(ledger) as led:
        (cancel,) = led.entries(kind="cancel")
        (res,) = led.entries(kind="reservation")
        assert (
            cancel.payload["target"] == res.id
            and res.status == "cancelled"
            and "out of memory" in cancel.payload["reason"]
        )
        assert led.open_reservations() == [] and led.entries(kind="release") == []
    # The failed run spent nothing: the next run fits the cap.
    monkeypatch.undo()
    r = CliRunner().invoke(app, args + ["--out", str(tmp_path / "b"), "--json"])
    assert r.exit_code == 0, r.output
    with open_ledger(ledger) as led:
        assert len(led.entries(kind="release")) == 1 and led.open_reservations() == []

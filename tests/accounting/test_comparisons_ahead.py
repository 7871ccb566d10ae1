"""Comparison epsilons computed ahead in a forked child (accountants.comparisons_ahead): the same
numbers as in-process, the child reaped whatever happens, and an in-process fallback."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from dpaudit.accounting import accountants
from dpaudit.accounting.accountants import _AHEAD, _comparisons, comparison_epsilons, comparisons_ahead
from dpaudit.accounting.events import SubsampledGaussian

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

EVENT = SubsampledGaussian(1.1, 0.01, 300)
#: prv and rdp answer; "nope" is no accountant: an "unavailable: ..." value, as any failing accountant gives.
JOB = (EVENT, 1e-5, "add-remove-record", ("prv", "rdp", "nope"))


def _gone(pid: int) -> bool:
    """True when ``pid`` is neither running nor a zombie (reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_child_answers_equal_in_process_values():
    here = _comparisons(*JOB)
    assert here["nope"].startswith("unavailable: ") and isinstance(here["prv"], float)
    with comparisons_ahead([JOB]):
        ahead = _AHEAD.get()
        pid = ahead.pid
        assert pid is not None and pid != os.getpid()
        assert comparison_epsilons(*JOB) == here  # the child's: the exact same floats
        assert ahead.answers  # answered by the child, not recomputed
    assert _gone(pid)


def test_other_arguments_are_computed_in_process():
    other = (EVENT, 1e-6, "add-remove-record", ("rdp",))
    with comparisons_ahead([JOB]):
        assert comparison_epsilons(*other) == _comparisons(*other)


def test_child_is_killed_and_reaped_on_error():
    with pytest.raises(RuntimeError, match="boom"):
        with comparisons_ahead([JOB]):
            pid = _AHEAD.get().pid
            raise RuntimeError("boom")
    assert _gone(pid)
    assert _AHEAD.get() is None


def test_a_child_that_dies_without_answering_is_recomputed_in_process():
    with comparisons_ahead([JOB]):
        ahead = _AHEAD.get()
        os.kill(ahead.pid, signal.SIGKILL)
        assert comparison_epsilons(*JOB) == _comparisons(*JOB)
        assert ahead.answers == {} and ahead.pid is None  # reaped while reading


def test_no_fork_while_another_thread_runs(monkeypatch):
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        with comparisons_ahead([JOB]):
            assert _AHEAD.get().pid is None
            assert comparison_epsilons(*JOB) == _comparisons(*JOB)
    finally:
        stop.set()
        t.join()
    monkeypatch.delattr(accountants.os, "fork")
    with comparisons_ahead([JOB]):
        assert _AHEAD.get().pid is None

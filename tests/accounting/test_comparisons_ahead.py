"""Comparison epsilons computed ahead in a forked child (accountants.comparisons_ahead): the same
numbers as in-process, the child reaped whatever happens, and an in-process fallback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from dpaudit.accounting import comparisons as accountants
from dpaudit.accounting.comparisons import (
    _AHEAD,
    _comparisons,
    comparison_epsilons,
    comparisons_ahead,
)
from dpaudit.accounting.events import SubsampledGaussian, event_from_dict
from dpaudit.data.base import PreparedDataset
from dpaudit.releasing import release
from dpaudit.requests import DPSGDRequest

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

EVENT = SubsampledGaussian(1.1, 0.01, 300)
#: prv and rdp answer; "nope" is no accountant: an "unavailable: ..." value, as any failing accountant gives.
JOB = (EVENT, 1e-5, "add-remove-record", ("prv", "rdp", "nope"))


@pytest.fixture
def one_thread(monkeypatch):
    """The fork path even where the test runner keeps a thread of its own (pytest-xdist's)."""
    monkeypatch.setattr(accountants, "threading", SimpleNamespace(active_count=lambda: 1))


def _gone(pid: int) -> bool:
    """True when ``pid`` is neither running nor a zombie (reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_child_answers_equal_in_process_values(one_thread):
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


def test_child_is_killed_and_reaped_on_error(one_thread):
    with pytest.raises(RuntimeError, match="boom"):
        with comparisons_ahead([JOB]):
            pid = _AHEAD.get().pid
            raise RuntimeError("boom")
    assert _gone(pid)
    assert _AHEAD.get() is None


def test_a_child_that_dies_without_answering_is_recomputed_in_process(one_thread):
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


def _data(n=300, d=8):
    rng = np.random.default_rng(0)
    parts = []
    for m in (n, 60, 100):
        y = rng.integers(0, 2, m)
        parts += [(rng.normal(size=(m, d)) + y[:, None]).astype(np.float32), y.astype(np.int64)]
    return PreparedDataset(
        "synthetic", "tabular", *parts, n_classes=2, split_seed=0, reference_size=n
    )


def test_a_release_publishes_the_in_process_comparison_values(one_thread, monkeypatch, tmp_path):
    forks = []
    fork = os.fork
    monkeypatch.setattr(accountants.os, "fork", lambda: forks.append(1) or fork())
    request = DPSGDRequest(
        model="dp-rvfl",
        dataset="synthetic",
        epsilon=4.0,
        epochs=2,
        batch_size=64,
        reproducible_noise=True,
    )
    ahead = release(
        "dp-rvfl", request, prepared=_data(), out_dir=tmp_path / "a", record=False, progress=False
    )
    assert len(forks) == 1  # the prv comparison ran in the child
    monkeypatch.delattr(accountants.os, "fork")
    here = release(
        "dp-rvfl", request, prepared=_data(), out_dir=tmp_path / "b", record=False, progress=False
    )
    assert ahead.epsilons == here.epsilons and isinstance(here.epsilons["prv"], float)
    assert (
        ahead.epsilons["prv"]
        == _comparisons(event_from_dict(here.guarantee), here.delta, here.adjacency, ("prv",))[
            "prv"
        ]
    )


def _dead(pid: int) -> bool:
    """Not running: gone, or a zombie waiting for whoever adopted it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc (Linux)")
def test_child_dies_with_a_parent_killed_outright():
    # A parent killed by SIGKILL runs no cleanup: the kernel must end the child (PR_SET_PDEATHSIG).
    code = (
        "import time\nfrom dpaudit.accounting import comparisons as a\nfrom dpaudit.accounting.events import SubsampledGaussian\n"
        "a._comparisons = lambda *args: time.sleep(600)  # a child that would run for 10 minutes\n"
        "with a.comparisons_ahead([(SubsampledGaussian(1.1, 0.01, 300), 1e-5, 'add-remove-record', ('prv',))]):\n"
        "    print(a._AHEAD.get().pid, flush=True)\n    time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        time.sleep(0.5)  # let the child reach prctl
    finally:
        parent.kill()
        parent.wait()
    for _ in range(300):  # polled, not timed: the kernel's kill is prompt, a loaded machine is slow
        if _dead(child):
            break
        time.sleep(0.1)
    survived = not _dead(child)
    if survived:
        os.kill(child, signal.SIGKILL)  # leave no orphan behind a failing test
    assert not survived


def test_remembered_answers_spare_the_child(one_thread, monkeypatch, tmp_path):
    """With the on-disk memory on (as ``dpaudit train`` turns it on), the child's answers are kept,
    and a later block with the same computations forks nothing and gives the same floats."""
    from dpaudit.ledger import result_cache

    monkeypatch.setenv("DPAUDIT_CACHE_DIR", str(tmp_path / "cache"))
    job = (EVENT, 1e-5, "add-remove-record", ("prv", "rdp"))
    here = _comparisons(*job)
    with result_cache.enabled():
        with comparisons_ahead([job], memory=result_cache):
            first = _AHEAD.get()
            assert first.pid is not None
            assert comparison_epsilons(*job) == here
        with comparisons_ahead([job], memory=result_cache):
            again = _AHEAD.get()
            assert again.pid is None and again.answers  # answered from memory, nothing forked
            assert comparison_epsilons(*job) == here
    with comparisons_ahead(
        [job], memory=result_cache
    ):  # memory off outside a command: the child again
        assert _AHEAD.get().pid is not None


def test_train_command_remembers_the_comparison_never_the_claim(one_thread, monkeypatch, tmp_path):
    """Two identical ``dpaudit train`` runs: the second forks no child, publishes the same prv
    comparison, and its claimed epsilon is recomputed (an edited memory cannot change it)."""
    import json as _json

    from typer.testing import CliRunner

    from dpaudit.accounting.accountants import compute_epsilon
    from dpaudit.cli import app

    monkeypatch.setenv("DPAUDIT_CACHE_DIR", str(tmp_path / "cache"))
    forks = []
    fork = os.fork
    monkeypatch.setattr(accountants.os, "fork", lambda: forks.append(1) or fork())
    outs = []
    for i in range(2):
        r = CliRunner().invoke(
            app,
            [
                "train",
                "dp-rvfl",
                "--eps",
                "2",
                "--epochs",
                "1",
                "--out",
                str(tmp_path / f"r{i}"),
                "--ledger",
                str(tmp_path / "l.sqlite"),
                "--json",
            ],
        )
        assert r.exit_code == 0, r.output
        outs.append(_json.loads(r.stdout[r.stdout.index("{") :]))
    assert len(forks) == 1  # the first run's child only
    a, b = outs
    assert a["epsilons"]["prv"] == b["epsilons"]["prv"] and isinstance(b["epsilons"]["prv"], float)
    # the claim is the accountant's, computed in this run
    event = SubsampledGaussian(b["noise_multiplier"], b["sample_rate"], b["steps"])
    assert (
        b["epsilon"]
        == compute_epsilon(
            event, delta=b["delta"], accountant="rdp", adjacency="add-remove-record"
        ).epsilon
    )

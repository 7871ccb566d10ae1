"""Comparison epsilons: other accountants' values recorded beside a claim, never the claim,
computed ahead in a forked child while the caller works (:func:`comparisons_ahead`)."""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import json
import os
import pickle
import signal
import threading
from typing import Iterator

from .accountants import compute_epsilon
from .adjacency import Adjacency, AdjacencyLike
from .events import Event


def comparison_epsilons(event: Event, delta: float, adjacency: AdjacencyLike, accountants) -> dict:
    """``{accountant: epsilon, or "unavailable: ErrorType"}``: values recorded beside a claim, never
    the claim; the child's answer inside :func:`comparisons_ahead` of exactly these arguments."""
    ahead = _AHEAD.get()
    if ahead is None:
        return _comparisons(event, delta, adjacency, accountants)
    answer = ahead.answer(_ahead_key(event, delta, adjacency, accountants))
    if answer is None:  # the child died: computed here
        answer = _comparisons(event, delta, adjacency, accountants, ahead.memory)
    return answer


def _comparisons(event, delta, adjacency, accountants, memory=None, *, remembered_only=False):
    """``{accountant: epsilon or "unavailable: ErrorType"}``. ``memory``: remembered answers of
    these exact computations (``kept`` / ``lookup`` / ``store`` of
    :mod:`dpaudit.ledger.result_cache`),
    read first and written with each new answer; None computes every value. ``remembered_only``:
    None as soon as an accountant the memory keeps has no answer there (the others, e.g. rdp, take
    milliseconds and are computed)."""
    out = {}
    adj = Adjacency.parse(adjacency).value
    for name in accountants:
        res = memory.lookup(event, delta, name, adj) if memory is not None else None
        if res is None and remembered_only and memory.kept(name):
            return None
        if res is None:
            try:
                res = compute_epsilon(event, delta=delta, accountant=name, adjacency=adjacency)
            except Exception as e:  # noqa: BLE001 -- a comparison value only
                res = e
            if memory is not None:
                memory.store(event, delta, name, adj, res)
        failed = isinstance(res, Exception)
        out[name] = f"unavailable: {type(res).__name__}" if failed else res.epsilon
    return out


def _remembered(memory, jobs: dict) -> dict | None:
    """Every job's comparison values when ``memory`` holds the answer of every accountant it keeps
    (then no child is needed), else None; each answer is looked up once."""
    names = [name for *_, accountants in jobs.values() for name in accountants]
    if memory is None or not any(memory.kept(name) for name in names):
        return None
    answers = {}
    for key, args in jobs.items():
        answers[key] = _comparisons(*args, memory, remembered_only=True)
        if answers[key] is None:
            return None
    return answers


def _ahead_key(event, delta, adjacency, accountants) -> str:
    return json.dumps(
        [event.to_dict(), repr(float(delta)), str(adjacency), list(accountants)], sort_keys=True
    )


class _Ahead:
    """A child process, forked at construction, writing :func:`_comparisons` of ``jobs`` (``{key:
    args}``) to a pipe; none (``pid`` None) without fork or while another thread runs (a fork
    would copy that thread's locks held), or when ``memory`` answers every job (read here)."""

    def __init__(self, jobs: dict, memory=None):
        self.answers, self.pid, self.memory = _remembered(memory, jobs), None, memory
        if self.answers is None and hasattr(os, "fork") and threading.active_count() == 1:
            r, w = os.pipe()
            self.pipe, parent, self.pid = os.fdopen(r, "rb"), os.getpid(), os.fork()
            if self.pid == 0:
                _child(self.pipe, w, parent, jobs, memory)
            os.close(w)

    def answer(self, key: str):
        if self.answers is None:
            data = self.pipe.read() if self.pid else b""
            self.close()
            try:
                self.answers = pickle.loads(data)  # from our own child, over a private pipe
            except Exception:  # noqa: BLE001 -- no answer (the child died): computed in-process
                self.answers = {}
        return self.answers.get(key)

    def close(self) -> None:
        """Stop (after an error, or when never asked) and reap the child; close the pipe."""
        if self.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.pid = None
            self.pipe.close()


def _child(pipe, w: int, parent: int, jobs: dict, memory) -> None:
    """The forked child's life: answers, then ``os._exit`` (no parent cleanup, no output flushed
    twice)."""
    code = 1
    try:
        pipe.close()  # so that its write fails once the parent is gone
        with contextlib.suppress(OSError, AttributeError):
            # Linux PR_SET_PDEATHSIG: killed when its parent dies
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)
        with contextlib.suppress(OSError, AttributeError):
            os.nice(10)  # beside the parent's multi-threaded work (features), the parent goes first
        if os.getppid() == parent:  # else the parent died before prctl took effect
            with os.fdopen(w, "wb") as f:
                answers = {key: _comparisons(*args, memory) for key, args in jobs.items()}
                f.write(pickle.dumps(answers))
            code = 0
    finally:
        os._exit(code)


_AHEAD: contextvars.ContextVar[_Ahead | None] = contextvars.ContextVar(
    "dpaudit_comparisons_ahead", default=None
)


@contextlib.contextmanager
def comparisons_ahead(jobs, memory=None) -> Iterator[None]:
    """Within this block, :func:`comparison_epsilons` of each ``(event, delta, adjacency,
    accountants)`` of ``jobs`` (public parameters only) is computed by a child forked now, beside
    the caller's work (prv's import and composition take ~1.5 s): the same code in a copy of this
    process, so the same numbers. The child is killed and reaped when the block ends, on an error
    too; without fork, while another thread runs, or without an answer, they are computed here.

    ``memory`` (``lookup`` / ``store``, e.g. :mod:`dpaudit.ledger.result_cache`): answers of these
    exact computations remembered by earlier runs; when it holds them all, nothing is forked.
    Comparison values only: a claim is always computed afresh."""
    jobs = {_ahead_key(*job): job for job in jobs if job[3]}
    ahead = _Ahead(jobs, memory) if jobs else None
    token = _AHEAD.set(ahead)
    try:
        yield
    finally:
        _AHEAD.reset(token)
        if ahead is not None:
            ahead.close()

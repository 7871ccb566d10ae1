"""Executors: run many independent pieces of work (sweep tasks, audit trial chunks) somewhere.

:class:`LocalExecutor` (``local``, default; ``forkserver`` with torch preloaded, else ``spawn``) and :class:`DaskExecutor`
(``dask``) share one interface (docs/sweeps.md, "Executors"): ``imap_unordered(fn, items)`` yields an :class:`Outcome` per item as
it finishes, ``map_chunks(fn, chunks)`` returns the values in order. ``fn`` must be a module-level function (importable on remote
workers); an exception it raises comes back as ``Outcome(ok=False, error=...)`` and never kills the loop.

Worker death: the local pool is rebuilt and the items that were in flight are resubmitted; Dask reschedules them itself. An item
in flight during ``max_worker_deaths`` deaths is reported as failed (``"worker died ..."``). Results already yielded are never
affected.

Privacy: the executor changes where work runs, never what it computes (docs/architecture.md, rule 4). With reproducible noise the
results are identical across executors; with secret noise (the default) every task draws fresh OS entropy on whichever worker runs
it."""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import logging
import multiprocessing as mp
import os
import socket
import sys
import time
import traceback
import uuid
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from ..errors import DPAuditError, UsageError
from ..threads import limited_threads, set_threads
from ..validation import one_of, positive_int

EXECUTORS = ("local", "dask")


class ChunkFailedError(DPAuditError):
    """A chunk of work submitted through :meth:`Executor.map_chunks` raised or lost its worker."""


@dataclass(frozen=True)
class Outcome:
    """The result of one item: ``value`` when ``ok``, else ``error`` (one line + traceback tail)."""

    index: int
    ok: bool
    value: Any = None
    error: str | None = None
    seconds: float = 0.0
    worker: str = ""
    #: (text, category, file, line) of each warning raised on a worker, raised again by the caller
    warned: tuple = ()


def _worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


_NO_SHARED = object()
_WORKER_SHARED: Any = _NO_SHARED  # set by the local pool's initializer when a call has shared data


def _outcome(fn: Callable, index: int, item: Any, shared: Any = _NO_SHARED) -> Outcome:
    """``fn(item)`` (or ``fn(shared, item)``); an exception becomes a failed Outcome."""
    t0 = time.perf_counter()
    try:
        value = fn(item) if shared is _NO_SHARED else fn(shared, item)
    except Exception as e:  # noqa: BLE001 - a failed task is data, recorded with its error
        tail = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-3:]).strip()
        msg = f"{type(e).__name__}: {e}".splitlines()[0] if str(e) else type(e).__name__
        return Outcome(index, False, None, f"{msg}\n{tail}", time.perf_counter() - t0, _worker_id())
    return Outcome(index, True, value, None, time.perf_counter() - t0, _worker_id())


def _guarded(
    fn: Callable, index: int, item: Any, threads: int, shared: Any = _NO_SHARED
) -> Outcome:
    """:func:`_outcome` on a worker. The warnings its filters let through are not shown there: each
    distinct one travels back in ``Outcome.warned`` for the coordinator to raise (:func:`_rewarned`)."""
    set_threads(threads)
    with warnings.catch_warnings(record=True) as caught:
        out = _outcome(fn, index, item, shared)
    said = ((str(w.message), _portable(w.category), w.filename, w.lineno) for w in caught)
    return dataclasses.replace(out, warned=tuple(dict.fromkeys(said)))


def _portable(category: type) -> type:
    """``category`` where the coordinator can unpickle it (a module-level class), else UserWarning."""
    module = sys.modules.get(category.__module__)
    return category if getattr(module, category.__qualname__, None) is category else UserWarning


def _rewarned(out: Outcome, seen: set) -> Outcome:
    """``out``, its worker's warnings raised again here, each distinct one once per call (``seen``):
    a worker's own stderr would bypass this process's filters and display (the CLI's one line a
    warning, expected ones dropped). The warning keeps its category, text and source line."""
    for said in [w for w in out.warned if w not in seen]:
        seen.add(said)
        warnings.warn_explicit(*said)
    return out


_PRELOAD = ["dpaudit.sweeps.tasks", "dpaudit.noise", "numpy", "torch"]


def _mp_context():
    """``forkserver`` where available: workers fork from a server that has imported torch and dpaudit once (a pool rebuilt after a
    worker death starts in milliseconds), without forking the coordinator's own threads; ``spawn`` elsewhere."""
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)
        return ctx
    return mp.get_context("spawn")


def _init_local_worker(threads: int, shared: Any = _NO_SHARED) -> None:
    global _WORKER_SHARED
    set_threads(threads)
    _WORKER_SHARED = shared


def _broke(fut: cf.Future) -> bool:
    """Whether ``fut`` failed because its pool broke (a worker died)."""
    return isinstance(fut.exception(), cf.process.BrokenProcessPool)


def _error_outcome(index: int, exc: BaseException) -> Outcome:
    """A failed Outcome for an item whose call never returned (its error's first line)."""
    return Outcome(index, False, None, f"{type(exc).__name__}: {exc}".splitlines()[0], 0.0, "")


def _guarded_pool_shared(fn: Callable, index: int, item: Any, threads: int) -> Outcome:
    return _guarded(fn, index, item, threads, _WORKER_SHARED)


def _workers(workers: int | None) -> int:
    """``workers``, checked; None: one per CPU."""
    return positive_int("workers", workers if workers is not None else (os.cpu_count() or 1))


class Executor:
    """Base class: subclasses implement :meth:`imap_unordered`, ``describe`` and ``close``."""

    max_worker_deaths = 3

    def imap_unordered(
        self, fn: Callable, items: Sequence, *, shared: Any = _NO_SHARED
    ) -> Iterator[Outcome]:  # pragma: no cover
        """Yield one :class:`Outcome` per item as items finish (``Outcome.index`` = item position).

        ``shared``: an object every call needs (e.g. an audit target with its data), sent once per worker instead of once per
        item; then ``fn(shared, item)`` is called."""
        raise NotImplementedError

    def map_chunks(
        self,
        fn: Callable,
        chunks: Sequence,
        *,
        shared: Any = _NO_SHARED,
        on_done: Callable[[Outcome], None] | None = None,
    ) -> list:
        """The values of ``fn`` on every chunk, in chunk order (``shared``: as in :meth:`imap_unordered`); ``on_done`` sees each
        Outcome as it finishes. Raises :class:`ChunkFailedError` naming the first failed chunk once all have finished."""
        chunks = list(chunks)
        values: list = [None] * len(chunks)
        failed: list[Outcome] = []
        for out in self.imap_unordered(fn, chunks, shared=shared):
            if on_done is not None:
                on_done(out)
            if out.ok:
                values[out.index] = out.value
            else:
                failed.append(out)
        if failed:
            first = min(failed, key=lambda o: o.index)
            raise ChunkFailedError(
                f"{len(failed)} of {len(chunks)} chunks failed; chunk {first.index}: {(first.error or '').splitlines()[0]}"
            )
        return values

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LocalExecutor(Executor):
    """Process pool on this machine. ``workers=None`` uses ``os.cpu_count()``; 1 runs in-process."""

    def __init__(self, workers: int | None = None, *, threads_per_worker: int = 1):
        self.workers = _workers(workers)
        self.threads_per_worker = positive_int("threads_per_worker", threads_per_worker)
        self._pool: cf.ProcessPoolExecutor | None = None
        self._shared: Any = _NO_SHARED  # handed to every worker of the pool by its initializer

    def _new_pool(self) -> cf.ProcessPoolExecutor:
        return cf.ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=_mp_context(),
            initializer=_init_local_worker,
            initargs=(self.threads_per_worker, self._shared),
        )

    def imap_unordered(
        self, fn: Callable, items: Sequence, *, shared: Any = _NO_SHARED
    ) -> Iterator[Outcome]:
        items = list(items)
        if self.workers == 1:
            # Embedded path: no pool, no pickling; a crash here is a crash of the caller.
            with limited_threads(self.threads_per_worker):
                for i, item in enumerate(items):
                    yield _outcome(fn, i, item, shared)
            return
        if shared is not _NO_SHARED:
            # A pool of its own whose workers receive `shared` once, in their initializer.
            sub = LocalExecutor(self.workers, threads_per_worker=self.threads_per_worker)
            sub._shared, sub.max_worker_deaths = shared, self.max_worker_deaths
            with sub:
                yield from sub._run(fn, items, _guarded_pool_shared)
            return
        yield from self._run(fn, items, _guarded)

    def _run(self, fn: Callable, items: list, call: Callable) -> Iterator[Outcome]:
        # At most `workers` items are submitted at a time, so the items hit by a pool break are exactly the ones that were running
        # (queued items would otherwise be blamed too).
        deaths = [0] * len(items)
        queue = deque(range(len(items)))
        inflight: dict[cf.Future, int] = {}
        seen: set = set()  # the workers' warnings raised so far
        while queue or inflight:
            if self._pool is None:
                self._pool = self._new_pool()
            while queue and len(inflight) < self.workers:
                i = queue.popleft()
                inflight[self._pool.submit(call, fn, i, items[i], self.threads_per_worker)] = i
            done, _ = cf.wait(list(inflight), return_when=cf.FIRST_COMPLETED)
            broken = any(_broke(f) for f in done)
            if broken:
                done, _ = cf.wait(list(inflight))  # the others fail (or finish) promptly
            for fut in sorted(done, key=lambda f: inflight[f]):
                yield from self._finished(fut, inflight.pop(fut), deaths, queue, seen)
            if broken:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None

    def _finished(self, fut: cf.Future, i: int, deaths: list[int], queue: deque, seen: set):
        """The Outcome of item ``i``'s finished future (its warnings raised: :func:`_rewarned`), as a
        tuple; empty when its worker died and it is queued again."""
        exc = fut.exception()
        if not _broke(fut):  # exc: e.g. an unpicklable item or result
            return (_rewarned(fut.result(), seen) if exc is None else _error_outcome(i, exc),)
        deaths[i] += 1
        if deaths[i] < self.max_worker_deaths:
            queue.append(i)  # to the back, so it runs next to other items
            return ()
        return (
            Outcome(
                i,
                False,
                None,
                f"worker died {deaths[i]} times while running this item (killed, out of memory or crashed).",
            ),
        )

    def describe(self) -> dict:
        return {
            "executor": "local",
            "workers": self.workers,
            "threads_per_worker": self.threads_per_worker,
        }

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


class DaskExecutor(Executor):
    """``dask.distributed``: an existing scheduler, or a loopback-only ``LocalCluster``.

    ``scheduler``: address of a running scheduler (``tcp://HOST:8786``); the cluster's workers must have dpaudit installed and see
    the same data directory (and ``--out``/ledger paths if the task writes there). ``workers``: start a ``LocalCluster`` with that
    many worker processes on 127.0.0.1 (no dashboard), torn down on :meth:`close`."""

    kind = "dask"

    def __init__(
        self,
        *,
        scheduler: str | None = None,
        workers: int | None = None,
        threads_per_worker: int = 1,
    ):
        check_executor_args(self.kind, scheduler, workers)
        self.threads_per_worker = positive_int("threads_per_worker", threads_per_worker)
        from distributed import Client, LocalCluster

        self._cluster = None
        self.scheduler = scheduler
        if scheduler is None:
            self.workers = _workers(workers)
            # Bound to loopback only: a LocalCluster is never reachable from another machine. The scheduler always runs a small
            # HTTP server (health/metrics routes); pin it to loopback on a free port too (the default, 8787, collides with a
            # second cluster).
            self._cluster = LocalCluster(
                n_workers=self.workers,
                threads_per_worker=self.threads_per_worker,
                processes=True,
                host="127.0.0.1",
                dashboard_address="127.0.0.1:0",
                silence_logs=logging.ERROR,
            )
            self.client = Client(self._cluster)
        else:
            try:
                self.client = Client(scheduler, timeout="20s")
            except (OSError, TimeoutError) as e:
                raise UsageError(
                    f"scheduler must be a reachable dask scheduler address, got {scheduler!r} ({e})."
                ) from None
            self.workers = len(self.client.scheduler_info().get("workers", {}))

    def imap_unordered(
        self, fn: Callable, items: Sequence, *, shared: Any = _NO_SHARED
    ) -> Iterator[Outcome]:
        from distributed import as_completed

        items = list(items)
        tag = uuid.uuid4().hex[:8]
        extra: tuple = ()
        if shared is not _NO_SHARED:
            # Sent to every worker once; the future is replaced by the object on the worker.
            extra = (self.client.scatter(shared, broadcast=True, hash=False),)
        futures = [
            self.client.submit(
                _guarded,
                fn,
                i,
                item,
                self.threads_per_worker,
                *extra,
                key=f"dpaudit-{tag}-{i}",
                pure=False,
            )
            for i, item in enumerate(items)
        ]
        index = {f.key: i for i, f in enumerate(futures)}
        seen: set = set()  # the workers' warnings raised so far
        try:
            for fut, value in as_completed(futures, with_results=True, raise_errors=False):
                i = index[fut.key]
                if fut.status == "error":
                    # e.g. KilledWorker once the task's workers died too often, or an item that could not be unpickled on the
                    # worker; `value` is (type, exception, traceback).
                    yield _error_outcome(
                        i, value[1] if isinstance(value, tuple) and len(value) == 3 else value
                    )
                else:  # _guarded always returns an Outcome
                    yield _rewarned(value, seen)
                fut.release()
        finally:
            for f in futures:
                if not f.done():
                    f.cancel()

    def describe(self) -> dict:
        return {
            "executor": "dask",
            "scheduler": self.scheduler or self.client.scheduler.address,
            "local_cluster": self._cluster is not None,
            "workers": self.workers,
            "threads_per_worker": self.threads_per_worker,
        }

    def close(self) -> None:
        try:
            self.client.close()
        finally:
            if self._cluster is not None:
                self._cluster.close()
                self._cluster = None


def check_executor_args(kind: str, scheduler: str | None, workers: int | None) -> None:
    """The executor choice is consistent (checked before any data is loaded or cluster started): a known kind, ``scheduler`` only
    with dask, and not both a scheduler and ``workers``."""
    one_of("executor", kind, EXECUTORS)
    if workers is not None:
        positive_int("workers", workers)
    if scheduler is not None and kind != "dask":
        raise UsageError(f"executor must be dask when --scheduler is given, got {kind!r}.")
    if scheduler is not None and workers is not None:
        raise UsageError(
            f"workers must be omitted when --scheduler is given (the cluster has its own), got --workers {workers}."
        )


def make_executor(
    kind: str = "local",
    *,
    scheduler: str | None = None,
    workers: int | None = None,
    threads_per_worker: int = 1,
) -> Executor:
    """Build an executor from CLI-style arguments (see the module docstring)."""
    check_executor_args(kind, scheduler, workers)
    if kind == "local":
        return LocalExecutor(workers, threads_per_worker=threads_per_worker)
    return DaskExecutor(scheduler=scheduler, workers=workers, threads_per_worker=threads_per_worker)

"""Run a sweep: expand the grid, skip what is finished, execute the rest, store every outcome.

The coordinating process is the only writer of the sweep store; each outcome is committed the moment it arrives, so killing the
sweep (or losing a worker) never loses a finished task, and re-running the same command resumes. Failed tasks keep their error and
are retried only with ``retry_failed=True``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from ..accounting import Composed
from ..ledger.book import open_ledger
from ..ledger.paths import resolve_ledger
from ..data import DATASETS, profile_files
from ..data.base import DATA_DIR_ENV
from ..errors import DataError, UsageError
from ..paths import write_atomically
from ..progress import JobProgress
from ..records import Release, existing_release, write_json_atomic
from ..releasing import public_seed_reason
from .executors import Executor, LocalExecutor, Outcome, make_executor
from .request import DEFAULT_OUT, SweepRequest
from .spec import SweepSpec, Task, TaskFilter
from .stats import records_from_rows
from .store import STORE_FILE, SweepStore, open_store
from .tables import render_markdown, sweep_tables
from .tasks import RunContext, execute_task, planned_release, planned_rows, task_dir

#: Synthetic data of the selftest runner (no files).
SYNTHETIC_DATASETS = ("synthetic",)


def resolve_optional_data_dir(data_dir: str | os.PathLike | None) -> Path | None:
    if data_dir is None:
        data_dir = os.environ.get(DATA_DIR_ENV) or None
    return Path(data_dir).expanduser().resolve() if data_dir else None


def dataset_available(name: str, data_dir: Path | None, profile: str | None = None) -> bool:
    """Whether a dataset's files (under ``profile``) are present, per the data registry (embedded datasets always are; unknown
    names count as present so the trainer, not the sweep, reports what is wrong)."""
    info = None if name in SYNTHETIC_DATASETS else DATASETS.get(name)
    if info is None or not info.needs_files:
        return True
    return data_dir is not None and all(
        (data_dir / f).exists() for f in profile_files(name, profile)
    )


def sweep_dir(out: str | os.PathLike, name: str) -> Path:
    return Path(out) / name


@dataclass(frozen=True)
class SweepOptions:
    """How to run a sweep (none of it is part of a task's key).

    ``out``: parent folder; the sweep lives in ``out/<name>/`` (``sweep.sqlite`` + releases).
    ``record``: record the releases in the ledger at ``ledger_path``. ``retry_failed``: also re-run tasks stored as failed.
    ``task_filter``: run only a slice. ``max_tasks``: run at most this many of the unfinished tasks (the rest stay pending).
    ``progress``: a bar on stderr."""

    out: str | os.PathLike = DEFAULT_OUT
    data_dir: str | os.PathLike | None = None
    ledger_path: str | os.PathLike | None = None
    record: bool = True
    retry_failed: bool = False
    task_filter: TaskFilter | None = None
    max_tasks: int | None = None
    progress: bool = False


@dataclass
class SweepSummary:
    name: str
    store: str
    executor: dict
    tasks: int
    done: int = 0
    failed: int = 0
    pending: int = 0
    ran: int = 0
    ran_ok: int = 0
    ran_failed: int = 0
    skipped_finished: int = 0
    skipped_datasets: dict = field(default_factory=dict)
    seconds: float = 0.0
    interrupted: bool = False
    failures: list = field(default_factory=list)
    #: releases written but not recorded in the ledger: ``{key, release_dir, reservation}``; each reservation stays open (its
    #: budget spent) until an operator records the release or voids it
    unrecorded: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    def add_failure(self, task: Task, error: str) -> None:
        self.failures.append(
            {"key": task.key, **task.config(), "error": error.splitlines()[0] if error else ""}
        )


def _label(t: Task) -> str:
    """A task's dataset as availability is checked: a non-default profile may need other files (authors' Heart)."""
    prof = dict(t.settings).get("profile")
    return t.dataset if prof is None else f"{t.dataset} (profile {prof})"


def plan(
    spec: SweepSpec, *, data_dir=None, task_filter: TaskFilter | None = None
) -> tuple[list[Task], dict]:
    """The tasks to consider (after availability and filters) and the skipped datasets with why."""
    dd = resolve_optional_data_dir(data_dir)
    all_tasks = spec.tasks()
    # grid order; tasks of one label share dataset and profile
    labels = {_label(t): t for t in all_tasks}
    why = (
        f"files not found under {dd}"
        if dd
        else "no data directory (--data-dir or $DPAUDIT_DATA_DIR)"
    )
    skipped = {
        lab: why
        for lab, t in labels.items()
        if not dataset_available(t.dataset, dd, dict(t.settings).get("profile"))
    }
    tasks = [
        t for t in all_tasks if _label(t) not in skipped and (task_filter is None or task_filter(t))
    ]
    return tasks, skipped


def run_sweep(
    spec: SweepSpec,
    options: SweepOptions | None = None,
    *,
    executor: Executor | None = None,
    on_outcome: Callable[[Task, Outcome], None] | None = None,
    **option_values,
) -> SweepSummary:
    """Run every unfinished task of ``spec`` (see the module docstring).

    ``options`` (or its fields as keywords, e.g. ``out=``, ``ledger_path=``): :class:`SweepOptions`.
    ``executor``: where tasks run (default: in-process, one task at a time).
    ``on_outcome``: called in the coordinating process after each outcome has been stored."""
    opts = options if options is not None else SweepOptions(**option_values)
    t0 = time.perf_counter()
    tasks, skipped = plan(spec, data_dir=opts.data_dir, task_filter=opts.task_filter)
    if not tasks:
        raise DataError(
            f"sweep {spec.name} has no task to run ({'; '.join(f'{k}: {v}' for k, v in skipped.items()) or 'the filters select none'})."
        )
    root = sweep_dir(opts.out, spec.name)
    root.mkdir(parents=True, exist_ok=True)
    executor = executor or LocalExecutor(1)
    with _exclusive(root), open_store(root / STORE_FILE, name=spec.name) as store:
        summary = SweepSummary(
            name=spec.name,
            store=str((root / STORE_FILE).resolve()),
            executor=executor.describe(),
            tasks=len(tasks),
            skipped_datasets=skipped,
        )
        run = _Run(_context(spec.name, root, opts), store, summary)
        run_tasks = run.skip_written(run.unfinished(spec, tasks, opts))
        run.reserve(run_tasks, opts.record)
        after = _after_each(on_outcome, opts.progress, len(run_tasks), spec.name)
        try:
            run.execute(run_tasks, executor, after)
        except KeyboardInterrupt:
            summary.interrupted = True
        finally:
            summary.unrecorded = run.close_reservations(run_tasks)
            c = store.counts([t.key for t in tasks])
            summary.done, summary.failed, summary.pending = c["done"], c["failed"], c["pending"]
            summary.seconds = time.perf_counter() - t0
    return summary


def _context(name: str, root: Path, opts: SweepOptions) -> RunContext:
    dd = resolve_optional_data_dir(opts.data_dir)
    return RunContext(
        sweep=name,
        out_dir=str(root.resolve()),
        data_dir=str(dd) if dd else None,
        ledger_path=resolve_ledger(opts.ledger_path).target,  # absolute path or full URL
        record=opts.record,
    )


@dataclass
class _Run:
    """One run of a sweep: where its tasks write and read (``context``), its store and summary."""

    context: RunContext
    store: SweepStore
    summary: SweepSummary
    #: task key -> the open reservation holding its budget (:func:`budget_reserve`)
    held: dict = field(default_factory=dict)

    def unfinished(self, spec: SweepSpec, tasks: list[Task], opts: SweepOptions) -> list[Task]:
        """Store the spec and its tasks; the tasks still to run (pending, failed ones too on request, at most ``max_tasks``);
        the others count as finished in the summary."""
        self.store.set_spec(spec.to_dict())
        self.store.add_tasks(tasks)
        todo = self.store.to_run([t.key for t in tasks], retry_failed=opts.retry_failed)
        if opts.max_tasks is not None:
            todo = todo[: max(0, int(opts.max_tasks))]
        self.summary.skipped_finished = len(tasks) - len(todo)
        by_key = {t.key: t for t in tasks}
        return [by_key[k] for k in todo]

    def skip_written(self, tasks: list[Task]) -> list[Task]:
        """Leave out (as failed) the tasks whose folder already holds a release: it was written by an earlier run and not
        recorded (its budget is still held by that run's open reservation); training the task again would spend the budget
        twice."""
        keep = []
        for t in tasks:
            hit = existing_release(task_dir(self.context.out_dir, t.config(), t.key))
            if hit is None:
                keep.append(t)
                continue
            error = (
                f"release {hit[1]} already written to {hit[0].parent} by an earlier run; not trained again (a release folder is "
                f"never overwritten). If it is not in the ledger, that run's open reservation still holds its budget: record it "
                f"(`dpaudit ledger record {hit[0].parent}`) and void the reservation, or void it if the release is withdrawn."
            )
            self.store.mark_failed(t.key, error)
            self.summary.add_failure(t, error)
        return keep

    def reserve(self, tasks: list[Task], record: bool) -> None:
        """Reserve the budget of the ``train`` tasks before any runs (when releases are recorded)
        and hand the reservations to the tasks' context."""
        c = self.context
        if record:
            self.held = budget_reserve(tasks, c.ledger_path, c.sweep, data_dir=c.data_dir)
            self.context = dataclasses.replace(c, reservations=tuple(self.held.items()))

    def close_reservations(self, tasks: list[Task]) -> list[dict]:
        """:func:`_close_reservations` of the reservations still held when the sweep ends, with the
        folders of ``tasks`` that hold anything (a release, or artefacts written just before it)."""
        c = self.context
        folders = {
            t.key: task_dir(c.out_dir, t.config(), t.key) for t in tasks if t.key in self.held
        }
        written = {k: str(d) for k, d in folders.items() if d.is_dir() and any(d.iterdir())}
        return _close_reservations(self.held, c.ledger_path, c.sweep, written=written)

    def execute(self, run_tasks: list[Task], executor: Executor, after) -> None:
        """Run the tasks and store each outcome the moment it arrives (a release is recorded in the ledger first, settling
        its reservation: the task leaves ``held``, the reservations still open)."""
        store, summary, context, held = self.store, self.summary, self.context, self.held
        with after as each:
            for out_ in executor.imap_unordered(
                execute_task, [(t.config(), context.to_dict()) for t in run_tasks]
            ):
                task = run_tasks[out_.index]
                value = None
                if out_.ok:
                    value, out_ = _recorded(out_, context, held.get(task.key))
                if out_.ok:
                    held.pop(task.key, None)
                    store.mark_done(task.key, value, seconds=out_.seconds, worker=out_.worker)
                    summary.ran_ok += 1
                else:
                    store.mark_failed(
                        task.key,
                        out_.error or "unknown error",
                        seconds=out_.seconds,
                        worker=out_.worker,
                    )
                    summary.ran_failed += 1
                    summary.add_failure(task, out_.error or "")
                summary.ran += 1
                each(task, out_)


def _recorded(
    out_: Outcome, context: RunContext, reservation: str | None
) -> tuple[dict | None, Outcome]:
    """(stored value, outcome) of a finished task after recording its release; a failure to record makes the outcome a failure
    (the model exists on disk but is not in the ledger) and leaves its reservation open (spent), as a single run's does
    (:func:`_close_reservations`)."""
    try:
        return _record_release(out_.value, context, reservation), out_
    except Exception as e:  # noqa: BLE001 - any failure to record leaves the budget held
        kept = (
            f"; its budget stays held by open reservation {reservation} (record the release, then void the reservation)"
            if reservation
            else ""
        )
        error = (
            f"release written to {out_.value.get('release_dir')} but not recorded in the "
            f"ledger: {type(e).__name__}: {e}{kept}"
        )
        return None, dataclasses.replace(out_, ok=False, value=None, error=error, warned=())


@contextlib.contextmanager
def _after_each(on_outcome, progress: bool, total: int, name: str):
    """``each(task, outcome)``, called after every stored outcome: advances the progress bar (stopped on exit) and calls
    ``on_outcome``."""
    with JobProgress("tasks", enabled=progress and total > 0) as bar:
        task_id = bar.add(name, total)

        def each(task: Task, out_: Outcome) -> None:
            bar.update(
                task_id,
                advance=1,
                info=f"(last: {task.model} {task.dataset} eps={task.epsilon} seed={task.seed})",
            )
            if on_outcome is not None:
                on_outcome(task, out_)

        yield each


@contextlib.contextmanager
def _exclusive(root: Path):
    """One coordinator per sweep folder: a second one would run the same pending tasks twice (two releases, twice the budget).
    POSIX advisory lock, released when the process ends."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX: no lock
        yield
        return
    with open(root / "sweep.lock", "a+") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(
                f"sweep folder must not be in use by another running sweep, got {root} (locked by {root / 'sweep.lock'})."
            ) from None
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _record_release(value: dict, context: RunContext, reservation: str | None = None) -> dict:
    """Record a task's release in the ledger (coordinator side) and settle its ``reservation`` with it (one transaction); return
    the result to store."""
    if not isinstance(value, dict) or "release" not in value:
        return value
    value = dict(value)
    release_dict = value.pop("release")
    if context.record:
        with open_ledger(context.ledger_path) as ledger:
            item = (Release.from_dict(release_dict), value.get("release_dir"))
            if reservation is not None:
                ledger.settle(reservation, [item])
            else:
                ledger.record(item[0], artefact_path=item[1])
            value["ledger"] = str(ledger.path)  # a URL without its password
    return value


def budget_reserve(
    tasks: list[Task],
    ledger_path: str | os.PathLike | None,
    sweep: str,
    *,
    data_dir: str | None = None,
) -> dict[str, str]:
    """Reserve, before anything runs, one reservation per ``train`` task (``{task key: reservation id}``) of its planned release
    (:func:`~dpaudit.sweeps.tasks.planned_release`; docs/sweeps.md, "Privacy budget") with the rows
    it reads (:func:`~dpaudit.sweeps.tasks.planned_rows`): the whole sweep is checked against every
    cap at once (nothing written), then each reservation is appended with its own check of every
    cap, those reached through shared people included, counting the reservations before it (a
    refusal cancels those already made). So no combination of the sweep's tasks exceeds a cap; each
    task's own check, when it runs, counts the other tasks' reservations too
    (:func:`~dpaudit.sweeps.tasks.held_for`)."""
    rows = _RowsOf(data_dir, ledger_path)
    unique = {t.key: t for t in tasks}.values()  # a task runs (and is reserved) once
    planned = [(t.key, _reservation(t, sweep, rows)) for t in unique if t.runner == "train"]
    if not planned:
        return {}
    held: dict[str, str] = {}
    with open_ledger(ledger_path) as ledger:
        _check_sweep(ledger, [p for _, p in planned])
        try:
            for key, p in planned:
                held[key] = ledger.reserve(**p)
        except BaseException:
            for rid in held.values():  # all or nothing: a refused sweep holds no budget
                ledger.cancel(rid, f"sweep {sweep} refused before running")
            raise
    return held


def _reservation(task: Task, sweep: str, rows) -> dict:
    """The ledger reservation of a ``train`` task's planned release, with the rows it reads."""
    ds, part, adj, event, tail = planned_release(task.config())
    return dict(
        dataset=ds,
        partition=part,
        event=event,
        adjacency=adj,
        mechanism=f"sweep:{sweep}",
        noise_tail_delta=tail,
        uncertified=public_seed_reason(
            task.seed, event, dict(task.settings).get("reproducible_noise")
        ),
        data_rows=rows(task.config()),
    )


class _RowsOf:
    """:func:`~dpaudit.sweeps.tasks.planned_rows` of each task, loaded once per configuration apart
    from its epsilon (the rows a run reads do not depend on its budget)."""

    def __init__(self, data_dir: str | None, ledger_path) -> None:
        self.data_dir, self.ledger_path = data_dir, ledger_path
        self.known: dict = {}

    def __call__(self, config: dict):
        key = json.dumps(
            {k: v for k, v in config.items() if k != "epsilon"}, sort_keys=True, default=str
        )
        if key not in self.known:
            self.known[key] = planned_rows(config, self.data_dir, self.ledger_path)
        return self.known[key]


def _check_sweep(ledger, planned: list[dict]) -> None:
    """Refuse a sweep whose planned releases together exceed a cap (writes nothing): one composed event per (dataset, partition,
    adjacency), with the rows its tasks read, once the ledger holds any cap (a cap on another
    name reaches a dataset through shared people)."""
    if not ledger.entries(kind="cap"):
        return
    groups: dict[tuple, list[dict]] = {}
    for p in planned:
        groups.setdefault((p["dataset"], p["partition"], p["adjacency"]), []).append(p)
    for (ds, part, adj), ps in groups.items():
        ledger.preflight(dataset=ds, partition=part, adjacency=adj, **_combined(ps))


def _combined(ps: list[dict]) -> dict:
    """The event, uncertified reason, tail and rows of a group of planned releases, as one."""
    # A non-private task makes its partition unbounded: checked as such (event None).
    events = [p["event"] for p in ps]
    rows = [r for p in ps for r in (p["data_rows"] or ())]
    return {
        "event": None if None in events else Composed(tuple(events)),
        "uncertified": next(filter(None, (p["uncertified"] for p in ps)), None),
        "noise_tail_delta": sum(p["noise_tail_delta"] for p in ps),
        "data_rows": tuple(rows) or None,
    }


def _close_reservations(
    held: dict[str, str],
    ledger_path: str | os.PathLike | None,
    sweep: str,
    *,
    written: dict[str, str] | None = None,
) -> list[dict]:
    """Close the sweep's task reservations still open when it ends (``held``: task key -> reservation id): cancel those of tasks
    that released nothing; return, left open (spent, voidable), those whose release folder holds anything (``written``: task key
    -> that folder), since the model may exist although it is not in the ledger (see :attr:`SweepSummary.unrecorded`)."""
    left: list[dict] = []
    if not held:
        return left
    with open_ledger(ledger_path) as ledger:
        for key, rid in held.items():
            if ledger.get(rid).closed_by is not None:  # settled before an interrupt reached us
                continue
            folder = (written or {}).get(key)
            if folder is not None:
                left.append({"key": key, "release_dir": folder, "reservation": rid})
                continue
            ledger.cancel(rid, f"sweep {sweep}: task {key[:12]} released nothing")
    return left


def load_records(store_path: str | os.PathLike) -> tuple[str | None, list[dict]]:
    """(sweep name, records of finished tasks) from a sweep store file or folder."""
    with open_store(store_path, create=False) as store:
        return store.name, records_from_rows(store.rows(status="done"))


# ---------------------------------------------------------------- the `dpaudit sweep` request


def stored_tables(request: SweepRequest) -> dict:
    """``--table``: the tables of ``--store`` (default: the spec's sweep folder)."""
    store = request.store
    if store is None:
        store = sweep_dir(request.out, request.sweep_spec().name)
    name, records = load_records(store)
    return sweep_tables(records, name=name)


def plan_counts(request: SweepRequest) -> dict:
    """``--plan``: the tasks that would be considered, by status in the sweep's store, and the skipped datasets."""
    spec = request.checked()
    tasks, skipped = plan(spec, data_dir=request.data_dir, task_filter=request.task_filter())
    folder = sweep_dir(request.out, spec.name)
    known: dict[str, str] = {}
    if (folder / STORE_FILE).exists():
        with open_store(folder, name=spec.name) as st:
            known = st.statuses([t.key for t in tasks])
    counts = {
        k: sum(1 for t in tasks if known.get(t.key, "pending") == k)
        for k in ("pending", "done", "failed")
    }
    return {
        "name": spec.name,
        "source": spec.source,
        "tasks": len(tasks),
        **counts,
        "skipped_datasets": skipped,
        "store": str((folder / STORE_FILE).resolve()),
    }


def run_request(
    request: SweepRequest, spec: SweepSpec | None = None, *, progress: bool = False
) -> tuple[SweepSummary, dict]:
    """Run the sweep and write its tables; (summary, its dict with ``tables_json``, ``tables_md``, ``table3``)."""
    spec = spec if spec is not None else request.checked()
    options = SweepOptions(
        out=request.out,
        data_dir=request.data_dir,
        ledger_path=request.ledger,
        retry_failed=request.retry_failed,
        task_filter=request.task_filter(),
        max_tasks=request.max_tasks,
        progress=progress,
    )
    with make_executor(
        request.executor, scheduler=request.scheduler, workers=request.workers
    ) as ex:
        summary = run_sweep(spec, options, executor=ex)
    name, records = load_records(summary.store)
    tables, jp, mp = write_tables(Path(summary.store).parent, name, records)
    return summary, {
        **summary.to_dict(),
        "tables_json": str(jp),
        "tables_md": str(mp),
        "table3": tables["table3"],
    }


def write_tables(
    sweep_folder: Path, name: str | None, records: list[dict]
) -> tuple[dict, Path, Path]:
    """Write tables.json and tables.md into the sweep's folder; return (tables, json path, md path)."""
    tables = sweep_tables(records, name=name)
    jp = write_json_atomic(sweep_folder / "tables.json", tables)
    mp = sweep_folder / "tables.md"
    write_atomically(mp, render_markdown(tables))
    return tables, jp, mp

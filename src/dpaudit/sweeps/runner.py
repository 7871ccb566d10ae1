"""Run a sweep: expand the grid, skip what is finished, execute the rest, store every outcome.

The coordinating process is the only writer of the sweep store; each outcome is committed the
moment it arrives, so killing the sweep (or losing a worker) never loses a finished task, and
re-running the same command resumes. Failed tasks keep their error and are retried only with
``retry_failed=True``.

Every ``train`` task is its own private release, recorded in the ledger with the sweep's name in
its configuration; the ledger composes them (a sweep of 30 runs at eps = 2 on one training
partition spends far more than eps = 2 of that partition's budget).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import DataError, UsageError
from .executors import Executor, LocalExecutor, Outcome
from .spec import SweepSpec, Task, TaskFilter
from .store import STORE_FILE, open_store
from .tasks import RunContext, execute_task

DEFAULT_OUT = Path("runs") / "sweeps"

#: Synthetic data of the selftest runner (no files).
SYNTHETIC_DATASETS = ("synthetic",)


def resolve_optional_data_dir(data_dir: str | os.PathLike | None) -> Path | None:
    from ..data.base import DATA_DIR_ENV

    if data_dir is None:
        data_dir = os.environ.get(DATA_DIR_ENV) or None
    return Path(data_dir).expanduser().resolve() if data_dir else None


def dataset_available(name: str, data_dir: Path | None, profile: str | None = None) -> bool:
    """Whether a dataset's files (under ``profile``) are present, per the data registry (embedded
    datasets always are; unknown names count as present so the trainer, not the sweep, reports
    what is wrong)."""
    if name in SYNTHETIC_DATASETS:
        return True
    from ..data import DATASETS, profile_files

    info = DATASETS.get(name)
    if info is None or not info.needs_files:
        return True
    if data_dir is None:
        return False
    return all((data_dir / f).exists() for f in profile_files(name, profile))


def sweep_dir(out: str | os.PathLike, name: str) -> Path:
    return Path(out) / name


@dataclass
class SweepSummary:
    name: str
    store: str
    executor: dict
    tasks: int
    done: int
    failed: int
    pending: int
    ran: int = 0
    ran_ok: int = 0
    ran_failed: int = 0
    skipped_finished: int = 0
    skipped_datasets: dict = field(default_factory=dict)
    seconds: float = 0.0
    interrupted: bool = False
    failures: list = field(default_factory=list)
    #: releases written but not recorded in the ledger: ``{key, release_dir, reservation}``; each
    #: reservation stays open (its budget spent) until an operator records the release or voids it
    unrecorded: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def plan(spec: SweepSpec, *, data_dir=None, task_filter: TaskFilter | None = None) -> tuple[list[Task], dict]:
    """The tasks to consider (after availability and filters) and the skipped datasets with why."""
    dd = resolve_optional_data_dir(data_dir)
    skipped = {}
    all_tasks = spec.tasks()

    def label(t: Task) -> str:  # a non-default profile may need other files (authors' Heart)
        prof = dict(t.settings).get("profile")
        return t.dataset if prof is None else f"{t.dataset} (profile {prof})"

    checked: set[str] = set()
    for t in all_tasks:
        lab = label(t)
        if lab in checked:
            continue
        checked.add(lab)
        if not dataset_available(t.dataset, dd, dict(t.settings).get("profile")):
            skipped[lab] = f"files not found under {dd}" if dd else "no data directory (--data-dir or $DPAUDIT_DATA_DIR)"
    tasks = [t for t in all_tasks if label(t) not in skipped and (task_filter is None or task_filter(t))]
    return tasks, skipped


def run_sweep(
    spec: SweepSpec,
    *,
    out: str | os.PathLike = DEFAULT_OUT,
    executor: Executor | None = None,
    data_dir: str | os.PathLike | None = None,
    ledger_path: str | os.PathLike | None = None,
    record: bool = True,
    retry_failed: bool = False,
    task_filter: TaskFilter | None = None,
    max_tasks: int | None = None,
    on_outcome: Callable[[Task, Outcome], None] | None = None,
    progress: bool = False,
) -> SweepSummary:
    """Run every unfinished task of ``spec`` (see the module docstring).

    ``out``: parent folder; the sweep lives in ``out/<name>/`` (``sweep.sqlite`` + releases).
    ``executor``: where tasks run (default: in-process, one task at a time).
    ``max_tasks``: run at most this many of the unfinished tasks (the rest stay pending).
    ``on_outcome``: called in the coordinating process after each outcome has been stored.
    """
    from ..ledger.paths import resolve_ledger

    t0 = time.perf_counter()
    tasks, skipped = plan(spec, data_dir=data_dir, task_filter=task_filter)
    if not tasks:
        why = "; ".join(f"{k}: {v}" for k, v in skipped.items()) or "the filters select none"
        raise DataError(f"sweep {spec.name} has no task to run ({why}).")
    root = sweep_dir(out, spec.name)
    root.mkdir(parents=True, exist_ok=True)
    dd = resolve_optional_data_dir(data_dir)
    context = RunContext(
        sweep=spec.name, out_dir=str(root.resolve()), data_dir=str(dd) if dd else None,
        ledger_path=resolve_ledger(ledger_path).target, record=record,  # absolute path or full URL
    )
    executor = executor or LocalExecutor(1)
    with _exclusive(root), open_store(root / STORE_FILE, name=spec.name) as store:
        store.set_spec(spec.to_dict())
        store.add_tasks(tasks)
        keys = [t.key for t in tasks]
        todo = store.to_run(keys, retry_failed=retry_failed)
        if max_tasks is not None:
            todo = todo[: max(0, int(max_tasks))]
        by_key = {t.key: t for t in tasks}
        run_tasks = [by_key[k] for k in todo]
        summary = SweepSummary(
            name=spec.name, store=str((root / STORE_FILE).resolve()), executor=executor.describe(),
            tasks=len(tasks), done=0, failed=0, pending=0, skipped_finished=len(tasks) - len(todo),
            skipped_datasets=skipped,
        )
        run_tasks = _skip_written(run_tasks, context, store, summary)
        held: dict[str, str] = {}
        if record:
            held = budget_reserve(run_tasks, context.ledger_path, spec.name)
            context = dataclasses.replace(context, reservations=tuple(held.values()))
        closed: set[str] = set()  # tasks whose reservation was settled with their release
        bar = _progress(progress, len(run_tasks), spec.name)
        try:
            payloads = [(t.config(), context.to_dict()) for t in run_tasks]
            for out_ in executor.imap_unordered(execute_task, payloads):
                task = run_tasks[out_.index]
                if out_.ok:
                    try:
                        value = _record_release(out_.value, context, held.get(task.key))
                        closed.add(task.key)
                    except Exception as e:  # noqa: BLE001 - any failure to record leaves the budget held
                        # The model exists on disk but is not in the ledger: a failure, loudly; its
                        # reservation stays open (spent), as a single run's does (_close_reservations).
                        rid = held.get(task.key)
                        kept = f"; its budget stays held by open reservation {rid} (record the release, then void the reservation)" if rid else ""
                        out_ = Outcome(out_.index, False, None, f"release written to {out_.value.get('release_dir')} but not recorded in the "
                                       f"ledger: {type(e).__name__}: {e}{kept}", out_.seconds, out_.worker)
                if out_.ok:
                    store.mark_done(task.key, value, seconds=out_.seconds, worker=out_.worker)
                    summary.ran_ok += 1
                else:
                    store.mark_failed(task.key, out_.error or "unknown error", seconds=out_.seconds, worker=out_.worker)
                    summary.ran_failed += 1
                    summary.failures.append({"key": task.key, **task.config(), "error": (out_.error or "").splitlines()[0]})
                summary.ran += 1
                if bar is not None:
                    bar[0].update(bar[1], advance=1, description=f"{spec.name}: {task.model} {task.dataset} eps={task.epsilon} seed={task.seed}")
                if on_outcome is not None:
                    on_outcome(task, out_)
        except KeyboardInterrupt:
            summary.interrupted = True
        finally:
            if bar is not None:
                bar[0].stop()
            summary.unrecorded = _close_reservations({k: r for k, r in held.items() if k not in closed}, context.ledger_path,
                                                     spec.name, written=_written_folder(context, run_tasks))
            c = store.counts(keys)
            summary.done, summary.failed, summary.pending = c["done"], c["failed"], c["pending"]
            summary.seconds = time.perf_counter() - t0
    return summary


@contextlib.contextmanager
def _exclusive(root: Path):
    """One coordinator per sweep folder: a second one would run the same pending tasks twice
    (two releases, twice the budget). POSIX advisory lock, released when the process ends."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX: no lock
        yield
        return
    with open(root / "sweep.lock", "a+") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(f"sweep folder must not be in use by another running sweep, got {root} (locked by {root / 'sweep.lock'}).") from None
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _record_release(value: dict, context: RunContext, reservation: str | None = None) -> dict:
    """Record a task's release in the ledger (coordinator side) and settle its ``reservation``
    with it (one transaction); return the result to store."""
    if not isinstance(value, dict) or "release" not in value:
        return value
    value = dict(value)
    release_dict = value.pop("release")
    if context.record:
        from ..ledger.book import open_ledger
        from ..records import Release

        with open_ledger(context.ledger_path) as ledger:
            item = (Release.from_dict(release_dict), value.get("release_dir"))
            if reservation is not None:
                ledger.settle(reservation, [item])
            else:
                ledger.record(item[0], artefact_path=item[1])
            value["ledger"] = str(ledger.path)  # a URL without its password
    return value


def _skip_written(tasks: list[Task], context: RunContext, store, summary: SweepSummary) -> list[Task]:
    """Leave out (as failed) the tasks whose folder already holds a release: it was written by an
    earlier run and not recorded (its budget is still held by that run's open reservation);
    training the task again would spend the budget twice."""
    from ..records import existing_release
    from .tasks import task_dir

    keep = []
    for t in tasks:
        hit = existing_release(task_dir(context.out_dir, t.config(), t.key))
        if hit is None:
            keep.append(t)
            continue
        error = (f"release {hit[1]} already written to {hit[0].parent} by an earlier run; not trained again (a release folder is "
                 f"never overwritten). If it is not in the ledger, that run's open reservation still holds its budget: record it "
                 f"(`dpaudit ledger record {hit[0].parent}`) and void the reservation, or void it if the release is withdrawn.")
        store.mark_failed(t.key, error)
        summary.failures.append({"key": t.key, **t.config(), "error": error})
    return keep


def budget_reserve(tasks: list[Task], ledger_path: str | os.PathLike | None, sweep: str) -> dict[str, str]:
    """Reserve, before anything runs, the budget of every release the sweep will make: one
    reservation per ``train`` task (``{task key: reservation id}``), as a single ``dpaudit train``
    holds its own; refuse the sweep if they would together exceed a cap.

    Tasks running in parallel cannot see each other's not-yet-recorded releases, and neither can
    a ``dpaudit train`` started by someone else meanwhile: the whole sweep is first checked against
    every cap at once (the composition of its planned releases per partition; nothing written), then
    each task's reservation is appended with its own cap check, so a run started meanwhile is seen
    (a refusal cancels the reservations already made). The tasks' own pre-checks leave these
    reservations out (:func:`dpaudit.releasing.held_by_caller`). Each reservation is settled with
    its task's release; it is cancelled when the task released nothing, and left open (spent,
    voidable) when the release was written but not recorded (:func:`_close_reservations`). A killed
    sweep leaves them all open until an operator voids them. A task whose noise is derived from its
    published seed is reserved as not private (unbounded).
    """
    from ..ledger.book import open_ledger
    from .tasks import planned_release

    planned = []
    for t in {t.key: t for t in tasks}.values():  # a task runs (and is reserved) once
        if t.runner == "train":
            ds, part, adj, event, tail = planned_release(t.config())
            planned.append((t.key, dict(dataset=ds, partition=part, event=event, adjacency=adj, mechanism=f"sweep:{sweep}",
                                        noise_tail_delta=tail, uncertified=_noise_reason(t, event))))
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


def _noise_reason(task: Task, event) -> str | None:
    """Why ``task``'s release will not be private because of its noise (derived from its
    published seed), else None."""
    if event is None or not dict(task.settings).get("reproducible_noise"):
        return None
    from ..releasing import public_seed_reason

    return public_seed_reason(task.seed)


def _check_sweep(ledger, planned: list[dict]) -> None:
    """Refuse a sweep whose planned releases together exceed a cap (writes nothing): one
    composed event per (dataset, partition, adjacency) of a capped dataset."""
    from ..accounting import Composed

    groups: dict[tuple, list[dict]] = {}
    for p in planned:
        if ledger.entries(dataset=p["dataset"], kind="cap"):
            groups.setdefault((p["dataset"], p["partition"], p["adjacency"]), []).append(p)
    for (ds, part, adj), ps in groups.items():
        # A non-private task makes its partition unbounded: checked as such (event None).
        events = [p["event"] for p in ps]
        event = None if any(e is None for e in events) else Composed(tuple(events))
        why = next((p["uncertified"] for p in ps if p["uncertified"]), None)
        ledger.preflight(dataset=ds, partition=part, event=event, adjacency=adj, uncertified=why,
                         noise_tail_delta=sum(p["noise_tail_delta"] for p in ps))


def _close_reservations(held: dict[str, str], ledger_path: str | os.PathLike | None, sweep: str, *,
                        written: Callable[[str], str | None] = lambda key: None) -> list[dict]:
    """Close the sweep's task reservations still open when it ends (``held``: task key ->
    reservation id): cancel those of tasks that released nothing; leave open (spent, voidable)
    those whose release folder holds anything (``written(key)``: the folder, else None), since
    the model may exist although it is not in the ledger (a failed record, an interrupt).
    Returns the ones left open, as ``{key, release_dir, reservation}``."""
    left: list[dict] = []
    if not held:
        return left
    from ..ledger.book import open_ledger

    with open_ledger(ledger_path) as ledger:
        for key, rid in held.items():
            if ledger.get(rid).closed_by is not None:  # settled before an interrupt reached us
                continue
            folder = written(key)
            if folder is not None:
                left.append({"key": key, "release_dir": folder, "reservation": rid})
                continue
            ledger.cancel(rid, f"sweep {sweep}: task {key[:12]} released nothing")
    return left


def _written_folder(context: RunContext, tasks: list[Task]) -> Callable[[str], str | None]:
    """``written(key)`` for :func:`_close_reservations`: the task's release folder when it holds
    anything (a release, or artefacts written just before it), else None."""
    from .tasks import task_dir

    by_key = {t.key: t for t in tasks}

    def written(key: str) -> str | None:
        t = by_key.get(key)
        d = None if t is None else task_dir(context.out_dir, t.config(), t.key)
        return str(d) if d is not None and d.is_dir() and any(d.iterdir()) else None

    return written


def _progress(enabled: bool, total: int, name: str):
    if not enabled or total == 0:
        return None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from ..console import err_console

    p = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                 TimeRemainingColumn(), console=err_console, transient=False)
    p.start()
    return p, p.add_task(name, total=total)


def load_records(store_path: str | os.PathLike) -> tuple[str | None, list[dict]]:
    """(sweep name, records of finished tasks) from a sweep store file or folder."""
    from .stats import records_from_rows

    with open_store(store_path, create=False) as store:
        return store.name, records_from_rows(store.rows(status="done"))

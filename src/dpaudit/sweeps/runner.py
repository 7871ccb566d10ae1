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

from ..errors import DataError, DPAuditError, UsageError
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
    from ..accounting.ledger_paths import resolve_ledger

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
        held: list[str] = []
        if record:
            held = budget_reserve(run_tasks, context.ledger_path, spec.name)
            context = dataclasses.replace(context, reservations=tuple(held))
        summary = SweepSummary(
            name=spec.name, store=str((root / STORE_FILE).resolve()), executor=executor.describe(),
            tasks=len(tasks), done=0, failed=0, pending=0, skipped_finished=len(tasks) - len(todo),
            skipped_datasets=skipped,
        )
        bar = _progress(progress, len(run_tasks), spec.name)
        try:
            payloads = [(t.config(), context.to_dict()) for t in run_tasks]
            for out_ in executor.imap_unordered(execute_task, payloads):
                task = run_tasks[out_.index]
                if out_.ok:
                    try:
                        value = _record_release(out_.value, context)
                    except DPAuditError as e:
                        # The model exists on disk but is not in the ledger: a failure, loudly.
                        out_ = Outcome(out_.index, False, None, f"release written to {out_.value.get('release_dir')} but not recorded in the ledger: {e}",
                                       out_.seconds, out_.worker)
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
            _close_reservations(held, context.ledger_path, spec.name)
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


def _record_release(value: dict, context: RunContext) -> dict:
    """Record a task's release in the ledger (coordinator side); return the result to store."""
    if not isinstance(value, dict) or "release" not in value:
        return value
    value = dict(value)
    release_dict = value.pop("release")
    if context.record:
        from ..accounting.ledger import open_ledger
        from ..records import Release

        with open_ledger(context.ledger_path) as ledger:
            ledger.record(Release.from_dict(release_dict), artefact_path=value.get("release_dir"))
            value["ledger"] = str(ledger.path)  # a URL without its password
    return value


def budget_reserve(tasks: list[Task], ledger_path: str | os.PathLike | None, sweep: str) -> list[str]:
    """Reserve, before anything runs, the budget of every release the sweep will make on a capped
    dataset; refuse the sweep (nothing reserved) if they would together exceed a cap.

    Tasks running in parallel cannot see each other's not-yet-recorded releases, and neither can
    a ``dpaudit train`` started by someone else meanwhile: one reservation per (dataset, partition)
    holding the composition of all the sweep's planned releases closes both gaps (each
    reservation is the cap check and its entry in one ledger transaction). The tasks' own
    pre-checks leave these reservations out (:func:`dpaudit.releasing.held_by_caller`). While the
    sweep runs, its recorded releases *and* its reservations count (conservative); the
    reservations are cancelled when the sweep ends (:func:`_close_reservations`), and a killed
    sweep leaves them spent until an operator voids them. Only datasets with a cap are reserved.
    """
    from ..accounting import Composed
    from ..accounting.ledger import open_ledger
    from .tasks import planned_release

    train = [t for t in tasks if t.runner == "train"]
    if not train:
        return []
    held: list[str] = []
    with open_ledger(ledger_path) as ledger:
        capped = {t.dataset for t in train if ledger.entries(dataset=t.dataset, kind="cap")}
        if not capped:
            return []
        groups: dict[tuple, list] = {}
        for t in train:
            if t.dataset not in capped:
                continue
            ds, part, adj, event, tail = planned_release(t.config())
            groups.setdefault((ds, part, adj), []).append((event, tail))
        try:
            for (ds, part, adj), planned in groups.items():
                # A non-private task makes its partition unbounded: reserve it as such (event None).
                events = [e for e, _ in planned]
                event = None if any(e is None for e in events) else Composed(tuple(events))
                tail = sum(t for _, t in planned)  # the tasks' sampler tails, held with their events
                held.append(ledger.reserve(dataset=ds, partition=part, event=event, adjacency=adj, mechanism=f"sweep:{sweep}",
                                           noise_tail_delta=tail))
        except BaseException:
            for rid in held:  # all or nothing: a refused sweep holds no budget
                ledger.cancel(rid, f"sweep {sweep} refused before running")
            raise
    return held


def _close_reservations(held: list[str], ledger_path: str | os.PathLike | None, sweep: str) -> None:
    """Cancel the sweep's reservations: its releases are in the ledger individually by now."""
    if not held:
        return
    from ..accounting.ledger import open_ledger

    with open_ledger(ledger_path) as ledger:
        for rid in held:
            ledger.cancel(rid, f"sweep {sweep} ended; its releases are recorded individually")


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

"""The results store of a sweep: one SQLite file, one row per task, keyed by the task's hash.

Only the coordinating process writes (workers return results; they never touch this file), so one connection with immediate
commits suffices: every finished task is durable the moment its row is written, and a sweep killed at any point resumes from what
is on disk. Rows are never deleted. Status is ``pending`` (not yet finished), ``done`` (result stored) or ``failed`` (error
stored; retried only on request, which increments ``attempts``)."""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from ..errors import DataError
from ..records import _json_safe, now_utc
from .spec import Task, canonical_json

SCHEMA_VERSION = 1
STORE_FILE = "sweep.sqlite"
STATUSES = ("pending", "done", "failed")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tasks (
    key         TEXT PRIMARY KEY,
    config      TEXT NOT NULL,
    runner      TEXT NOT NULL,
    model       TEXT NOT NULL,
    dataset     TEXT NOT NULL,
    epsilon     REAL,
    seed        INTEGER NOT NULL,
    status      TEXT NOT NULL CHECK (status IN ('pending', 'done', 'failed')),
    result      TEXT,
    error       TEXT,
    attempts    INTEGER NOT NULL DEFAULT 0,
    seconds     REAL,
    worker      TEXT,
    added_at    TEXT NOT NULL,
    finished_at TEXT
);
CREATE INDEX IF NOT EXISTS tasks_status ON tasks (status);
"""


@dataclass(frozen=True)
class TaskRow:
    key: str
    config: dict
    status: str
    result: dict | None
    error: str | None
    attempts: int
    seconds: float | None
    worker: str | None
    finished_at: str | None


class SweepStore:
    """A sweep's SQLite results file. Use :func:`open_store` (a context manager)."""

    def __init__(self, path: str | os.PathLike, *, name: str | None = None, create: bool = True):
        self.path = Path(path)
        if not create and not self.path.exists():
            raise DataError(f"sweep store not found: {self.path}.")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(str(self.path), timeout=30.0, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            meta = self.meta()
        except sqlite3.DatabaseError as e:
            raise DataError(
                f"sweep store {self.path} is unreadable or not a sweep store: {e}."
            ) from None
        self._meta_once(
            meta, "schema_version", str(SCHEMA_VERSION), "schema_version must be {new}, got {old}"
        )
        if name is not None:
            self._meta_once(meta, "name", name, "belongs to sweep {old!r}, not {new!r}")

    def _meta_once(self, meta: dict, key: str, value: str, refusal: str) -> None:
        """Write ``key`` of a new store; an existing store's must be ``value`` (else ``refusal``)."""
        stored = meta.get(key)
        if stored is None:
            self._set_meta(key, value)
        elif stored != value:
            raise DataError(f"sweep store {self.path} {refusal.format(old=stored, new=value)}.")

    # -- meta ---------------------------------------------------------------------------------
    def _set_meta(self, key: str, value: str) -> None:
        self._db.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    def meta(self) -> dict:
        return dict(self._db.execute("SELECT key, value FROM meta").fetchall())

    def set_spec(self, spec_dict: dict) -> None:
        self._set_meta("spec", json.dumps(spec_dict, sort_keys=True))

    @property
    def name(self) -> str | None:
        return self.meta().get("name")

    # -- tasks --------------------------------------------------------------------------------
    def add_tasks(self, tasks: Iterable[Task]) -> None:
        """Insert the tasks not yet known (by key), in one transaction."""
        now = now_utc()
        rows = [
            (
                t.key,
                canonical_json(t.config()),
                t.runner,
                t.model,
                t.dataset,
                t.epsilon,
                t.seed,
                now,
            )
            for t in tasks
        ]
        cur = self._db.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            cur.executemany(
                "INSERT OR IGNORE INTO tasks (key, config, runner, model, dataset, epsilon, seed, status, added_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, 'pending', ?)",
                rows,
            )
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise

    def statuses(self, keys: Iterable[str] | None = None) -> dict[str, str]:
        d = dict(self._db.execute("SELECT key, status FROM tasks").fetchall())
        return d if keys is None else {k: d[k] for k in keys if k in d}

    def to_run(self, keys: Iterable[str], *, retry_failed: bool = False) -> list[str]:
        """Keys among ``keys`` that still need running: pending, plus failed when asked."""
        wanted = {"pending", "failed"} if retry_failed else {"pending"}
        st = self.statuses()
        return [k for k in keys if st.get(k) in wanted]

    def mark_done(
        self, key: str, result: dict, *, seconds: float | None = None, worker: str | None = None
    ) -> None:
        self._finish(
            key, "done", json.dumps(_json_safe(result), sort_keys=True), None, seconds, worker
        )

    def mark_failed(
        self, key: str, error: str, *, seconds: float | None = None, worker: str | None = None
    ) -> None:
        self._finish(key, "failed", None, error, seconds, worker)

    def _finish(self, key, status, result, error, seconds, worker) -> None:
        cur = self._db.execute(
            "UPDATE tasks SET status = ?, result = ?, error = ?, attempts = attempts + 1, seconds = ?, worker = ?, "
            "finished_at = ? WHERE key = ? AND status != 'done'",
            (status, result, error, seconds, worker, now_utc(), key),
        )
        if (
            cur.rowcount == 0
            and not self._db.execute("SELECT 1 FROM tasks WHERE key = ?", (key,)).fetchone()
        ):
            raise DataError(f"task key must be in the sweep store {self.path}, got {key}.")

    def rows(self, *, status: str | None = None) -> list[TaskRow]:
        q = "SELECT key, config, status, result, error, attempts, seconds, worker, finished_at FROM tasks"
        args: tuple = () if status is None else (status,)
        q += ("" if status is None else " WHERE status = ?") + " ORDER BY rowid"
        return [
            TaskRow(k, json.loads(c), s, json.loads(r) if r else None, e, a, sec, w, f)
            for k, c, s, r, e, a, sec, w, f in self._db.execute(q, args).fetchall()
        ]

    def counts(self, keys: Iterable[str] | None = None) -> dict[str, int]:
        st = self.statuses(keys)
        return {s: sum(1 for v in st.values() if v == s) for s in STATUSES}

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "SweepStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_store(
    path: str | os.PathLike, *, name: str | None = None, create: bool = True
) -> SweepStore:
    """Open (or create) a sweep store; ``path`` may be the file or the sweep's folder."""
    p = Path(path)
    if p.is_dir() or (not p.suffix and not p.exists()):
        p = p / STORE_FILE
    return SweepStore(p, name=name, create=create)

"""``dpaudit sweep`` as a request: what to run (or show) and how.

:class:`SweepRequest` is the command's parsed form (``dpaudit.cli.sweep`` is generated from its fields); the work is done by
:mod:`dpaudit.sweeps.runner`, so the same request gives the same result from Python. This module loads no numerical library."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from ..requests import option
from ..validation import positive_int
from .executors import EXECUTORS, check_executor_args
from .spec import SweepSpec, TaskFilter, builtin_spec, load_spec, with_profile

#: Parent folder of the sweeps' folders (``OUT/NAME/``).
DEFAULT_OUT = Path("runs") / "sweeps"


@dataclass(frozen=True)
class SweepRequest:
    """``dpaudit sweep [SPEC.toml | --builtin NAME]`` (speed and location only: no field changes a task's key).

    Fields carry their command-line spelling (:func:`dpaudit.requests.option`); the tuple fields are repeatable options.
    """

    spec: str | None = option(
        None, positional=True, help="TOML sweep spec (grid of models x datasets x eps x seeds)."
    )
    builtin: str | None = option(
        None,
        help="A built-in spec: dp-rvfl-primary (the issue's 650-task grid), dp-rvfl-primary-full (the paper's "
        "1,540-task primary suite, for a cluster), selftest.",
    )
    executor: str = option("local", choices=EXECUTORS, help="local (process pool here) or dask.")
    scheduler: str | None = option(
        None,
        help="Address of a running Dask scheduler, e.g. tcp://HOST:8786 (with --executor dask).",
    )
    workers: int | None = option(
        None,
        help="Worker processes (local pool, or a Dask LocalCluster on 127.0.0.1). Default: CPU count.",
    )
    out: str = option(
        str(DEFAULT_OUT),
        help="Parent folder; the sweep lives in OUT/NAME/ (sweep.sqlite, releases, tables).",
    )
    data_dir: str | None = option(
        None, help="Directory with real data (default: $DPAUDIT_DATA_DIR)."
    )
    profile: str | None = option(
        None,
        help="Preprocessing profile for the whole grid, e.g. authors (the DP-RVFL authors' pipeline): "
        "the sweep becomes NAME-PROFILE. default or absent: the spec as written.",
    )
    ledger: str | None = option(
        None, help="Ledger database (default: $DPAUDIT_LEDGER or ./.dpaudit/ledger.sqlite)."
    )
    retry_failed: bool = option(False, help="Also re-run tasks recorded as failed.")
    model: tuple[str, ...] = option((), help="Only this model (repeatable).")
    dataset: tuple[str, ...] = option((), help="Only this dataset (repeatable).")
    eps: tuple[float, ...] = option((), help="Only this target epsilon (repeatable).")
    seed: tuple[int, ...] = option((), help="Only this seed (repeatable).")
    max_tasks: int | None = option(
        None, help="Run at most N unfinished tasks, then stop (resume later)."
    )
    plan_only: bool = option(False, flag="--plan", help="Show what would run; run nothing.")
    table: bool = option(False, help="Print the tables of a sweep store; run nothing.")
    store: str | None = option(None, help="Sweep store (sweep.sqlite or its folder) for --table.")
    format: str = option("md", choices=("md", "json"), help="--table output: md or json.")
    json_out: bool = option(False, flag="--json", help="Print one JSON object on stdout.")

    def sweep_spec(self) -> SweepSpec:
        """The spec named by SPEC or ``--builtin`` (exactly one), moved to ``--profile`` when given."""
        if self.spec is not None and self.builtin is not None:
            raise UsageError(
                f"a sweep must come from SPEC or --builtin, not both, got {self.spec!r} and {self.builtin!r}."
            )
        if self.spec is None and self.builtin is None:
            raise UsageError("a sweep must be given as SPEC.toml or --builtin NAME, got neither.")
        return with_profile(
            builtin_spec(self.builtin) if self.builtin is not None else load_spec(self.spec),
            self.profile,
        )

    def task_filter(self) -> TaskFilter:
        return TaskFilter(
            models=self.model, datasets=self.dataset, epsilons=self.eps, seeds=self.seed
        )

    def checked(self) -> SweepSpec:
        """The spec, after the checks made before any data is loaded or cluster started."""
        spec = self.sweep_spec()
        if self.max_tasks is not None:
            positive_int("max_tasks", self.max_tasks)
        check_executor_args(self.executor, self.scheduler, self.workers)
        return spec

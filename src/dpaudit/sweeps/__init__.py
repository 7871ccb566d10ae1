"""Experiment sweeps: TOML grids, a resumable SQLite results store, local and Dask executors,
and the paired seed-level statistics of the DP-RVFL paper (section 4.2).

Python use::

    from dpaudit.sweeps import builtin_spec, load_spec, run_sweep, make_executor, TaskFilter
    spec = builtin_spec("dp-rvfl-primary")
    with make_executor("dask", workers=2) as ex:
        summary = run_sweep(spec, executor=ex, task_filter=TaskFilter(datasets=("heart",), epsilons=(2.0,)))

Audits reuse the executors: ``make_executor(...).map_chunks(fn, chunks)`` returns the chunk
results in order (see :mod:`dpaudit.sweeps.executors`).
"""

from .executors import EXECUTORS, ChunkFailedError, DaskExecutor, Executor, LocalExecutor, Outcome, make_executor
from .runner import DEFAULT_OUT, SweepSummary, load_records, plan, run_sweep, sweep_dir
from .spec import BUILTIN_SPECS, SweepSpec, Task, TaskFilter, builtin_spec, config_key, load_spec, parse_spec
from .stats import (
    PRIMARY_METRICS, Cell, CellSummary, Contrast, cells, holm_adjust, paired_contrasts, sign_flip_pvalue,
    summarize, win_tie_loss,
)
from .store import SweepStore, open_store
from .tables import render_html, render_markdown, sweep_tables, table3_slice

__all__ = [
    "EXECUTORS", "ChunkFailedError", "DaskExecutor", "Executor", "LocalExecutor", "Outcome", "make_executor",
    "DEFAULT_OUT", "SweepSummary", "load_records", "plan", "run_sweep", "sweep_dir",
    "BUILTIN_SPECS", "SweepSpec", "Task", "TaskFilter", "builtin_spec", "config_key", "load_spec", "parse_spec",
    "PRIMARY_METRICS", "Cell", "CellSummary", "Contrast", "cells", "holm_adjust", "paired_contrasts",
    "sign_flip_pvalue", "summarize", "win_tie_loss", "SweepStore", "open_store",
    "render_html", "render_markdown", "sweep_tables", "table3_slice",
]

"""Experiment sweeps: TOML grids, a resumable SQLite results store, local and Dask executors, and the paired seed-level statistics
of the DP-RVFL paper (section 4.2). Python use, and audits' use of the executors: docs/sweeps.md."""

from .executors import EXECUTORS, ChunkFailedError, DaskExecutor, Executor, LocalExecutor, Outcome, make_executor
from .request import DEFAULT_OUT, SweepRequest
from .runner import (SweepOptions, SweepSummary, load_records, plan, plan_counts, run_request, run_sweep, stored_tables, sweep_dir,
                     write_tables)
from .spec import BUILTIN_SPECS, SweepSpec, Task, TaskFilter, builtin_spec, config_key, load_spec, parse_spec
from .stats import (PRIMARY_METRICS, Cell, CellSummary, Contrast, cells, holm_adjust, paired_contrasts, sign_flip_pvalue, summarize,
                    win_tie_loss)
from .store import SweepStore, open_store
from .tables import render_html, render_markdown, sweep_tables, table3_markdown, table3_slice

__all__ = ["BUILTIN_SPECS", "Cell", "CellSummary", "ChunkFailedError", "Contrast", "DEFAULT_OUT", "DaskExecutor", "EXECUTORS", "Executor",
           "LocalExecutor", "Outcome", "PRIMARY_METRICS", "SweepOptions", "SweepRequest", "SweepSpec", "SweepStore", "SweepSummary", "Task",
           "TaskFilter", "builtin_spec", "cells", "config_key", "holm_adjust", "load_records", "load_spec", "make_executor", "open_store",
           "paired_contrasts", "parse_spec", "plan", "plan_counts", "render_html", "render_markdown", "run_request", "run_sweep",
           "sign_flip_pvalue", "stored_tables", "summarize", "sweep_dir", "sweep_tables", "table3_markdown", "table3_slice", "win_tie_loss",
           "write_tables"]

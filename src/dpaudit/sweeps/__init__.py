"""Experiment sweeps: TOML grids, a resumable SQLite results store, local and Dask executors, and the paired seed-level statistics
of the DP-RVFL paper (section 4.2). Python use, and audits' use of the executors: docs/sweeps.md.

The imports below are the package's public API (one list: no ``__all__`` repeating it)."""

# ruff: noqa: F401

from .executors import EXECUTORS, ChunkFailedError, DaskExecutor, Executor, LocalExecutor
from .executors import Outcome, make_executor
from .request import DEFAULT_OUT, SweepRequest
from .runner import SweepOptions, SweepSummary, load_records, plan, plan_counts, run_request
from .runner import run_sweep, stored_tables, sweep_dir, write_tables
from .spec import BUILTIN_SPECS, SweepSpec, Task, TaskFilter, builtin_spec, config_key, load_spec
from .spec import parse_spec
from .stats import PRIMARY_METRICS, Cell, CellSummary, Contrast, cells, holm_adjust
from .stats import paired_contrasts, sign_flip_pvalue, summarize, win_tie_loss
from .store import SweepStore, open_store
from .tables import render_html, render_markdown, sweep_tables, table3_markdown, table3_slice

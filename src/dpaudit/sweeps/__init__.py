"""Experiment sweeps: TOML grids, a resumable SQLite results store, local and Dask executors, and the paired seed-level statistics
of the DP-RVFL paper (section 4.2).

Python use::

    from dpaudit.sweeps import builtin_spec, load_spec, run_sweep, make_executor, TaskFilter
    spec = builtin_spec("dp-rvfl-primary")
    with make_executor("dask", workers=2) as ex:
        summary = run_sweep(spec, executor=ex, task_filter=TaskFilter(datasets=("heart",), epsilons=(2.0,)))

Audits reuse the executors: ``make_executor(...).map_chunks(fn, chunks)`` returns the chunk results in order (see
:mod:`dpaudit.sweeps.executors`). Names load from their submodule on first use (PEP 562): the runner imports the release path
(torch), the CLI starts without it."""

from ..lazy import lazy_exports

_SOURCES = {
    "executors": ("EXECUTORS", "ChunkFailedError", "DaskExecutor", "Executor", "LocalExecutor", "Outcome", "make_executor"),
    "request": ("DEFAULT_OUT", "SweepRequest"),
    "runner": ("SweepOptions", "SweepSummary", "load_records", "plan", "plan_counts", "run_request", "run_sweep", "stored_tables",
               "sweep_dir", "write_tables"),
    "spec": ("BUILTIN_SPECS", "SweepSpec", "Task", "TaskFilter", "builtin_spec", "config_key", "load_spec", "parse_spec"),
    "stats": ("PRIMARY_METRICS", "Cell", "CellSummary", "Contrast", "cells", "holm_adjust", "paired_contrasts", "sign_flip_pvalue",
              "summarize", "win_tie_loss"),
    "store": ("SweepStore", "open_store"),
    "tables": ("render_html", "render_markdown", "sweep_tables", "table3_markdown", "table3_slice"),
}
_WHERE = {name: module for module, names in _SOURCES.items() for name in names}

__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())

__all__ = sorted(_WHERE)

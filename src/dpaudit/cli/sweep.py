"""`dpaudit sweep [SPEC.toml | --builtin NAME]`: run a resumable grid; `--table` prints its tables.

One top-level command (so ``dpaudit sweep SPEC.toml`` works as the issue's contract says):

- run (default): expand the grid, skip finished tasks, run the rest on the chosen executor,
  write ``tables.md`` / ``tables.json`` beside ``sweep.sqlite`` and print the eps = 2 slice next
  to the published Table 3;
- ``--plan``: show what would run (counts by status), run nothing;
- ``--table``: print the tables of the sweep store (``--store PATH`` or the spec's folder), run
  nothing.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from ..errors import UsageError
from . import options
from .common import console, emit_json, note


class ExecutorChoice(str, Enum):
    local = "local"
    dask = "dask"


class TableFormat(str, Enum):
    md = "md"
    json = "json"


def _spec_from_args(spec_path: Optional[Path], builtin: Optional[str], profile: Optional[str] = None):
    from ..sweeps import builtin_spec, load_spec
    from ..sweeps.spec import with_profile

    if spec_path is not None and builtin is not None:
        raise UsageError(f"a sweep must come from SPEC or --builtin, not both, got {str(spec_path)!r} and {builtin!r}.")
    if spec_path is None and builtin is None:
        raise UsageError("a sweep must be given as SPEC.toml or --builtin NAME, got neither.")
    # --profile P (not default) moves every block to P and names the sweep NAME-P.
    return with_profile(builtin_spec(builtin) if builtin is not None else load_spec(spec_path), profile)


def write_tables(sweep_folder: Path, name: str | None, records: list[dict]) -> tuple[dict, Path, Path]:
    """Write tables.json and tables.md into the sweep's folder; return (tables, json path, md path)."""
    from ..records import write_json_atomic
    from ..sweeps.tables import render_markdown, sweep_tables

    tables = sweep_tables(records, name=name)
    jp = write_json_atomic(sweep_folder / "tables.json", tables)
    mp = sweep_folder / "tables.md"
    tmp = mp.with_suffix(".md.tmp")
    tmp.write_text(render_markdown(tables))
    tmp.replace(mp)
    return tables, jp, mp


def register(app: typer.Typer) -> None:
    @app.command()
    def sweep(
        spec: Optional[Path] = typer.Argument(None, help="TOML sweep spec (grid of models x datasets x eps x seeds).", show_default=False),
        builtin: Optional[str] = typer.Option(None, "--builtin", help="A built-in spec: dp-rvfl-primary (the issue's 650-task grid), dp-rvfl-primary-full (the paper's 1,540-task primary suite, for a cluster), selftest.", show_default=False),
        executor: ExecutorChoice = typer.Option(ExecutorChoice.local, "--executor", help="local (process pool here) or dask."),
        scheduler: Optional[str] = typer.Option(None, "--scheduler", help="Address of a running Dask scheduler, e.g. tcp://HOST:8786 (with --executor dask).", show_default=False),
        workers: Optional[int] = typer.Option(None, "--workers", help="Worker processes (local pool, or a Dask LocalCluster on 127.0.0.1). Default: CPU count.", show_default=False),
        out: Path = typer.Option(Path("runs/sweeps"), "--out", help="Parent folder; the sweep lives in OUT/NAME/ (sweep.sqlite, releases, tables)."),
        data_dir: Optional[Path] = options.data_dir(),
        profile: Optional[str] = typer.Option(None, "--profile", help="Preprocessing profile for the whole grid, e.g. authors (the DP-RVFL "
                                              "authors' pipeline): the sweep becomes NAME-PROFILE. default or absent: the spec as written.",
                                              show_default=False),
        ledger: Optional[Path] = options.ledger(),
        retry_failed: bool = typer.Option(False, "--retry-failed", help="Also re-run tasks recorded as failed."),
        model: Optional[List[str]] = typer.Option(None, "--model", help="Only this model (repeatable).", show_default=False),
        dataset: Optional[List[str]] = typer.Option(None, "--dataset", help="Only this dataset (repeatable).", show_default=False),
        eps: Optional[List[float]] = typer.Option(None, "--eps", help="Only this target epsilon (repeatable).", show_default=False),
        seed: Optional[List[int]] = typer.Option(None, "--seed", help="Only this seed (repeatable).", show_default=False),
        max_tasks: Optional[int] = typer.Option(None, "--max-tasks", help="Run at most N unfinished tasks, then stop (resume later).", show_default=False),
        plan_only: bool = typer.Option(False, "--plan", help="Show what would run; run nothing."),
        table: bool = typer.Option(False, "--table", help="Print the tables of a sweep store; run nothing."),
        store: Optional[Path] = typer.Option(None, "--store", help="Sweep store (sweep.sqlite or its folder) for --table.", show_default=False),
        fmt: TableFormat = typer.Option(TableFormat.md, "--format", help="--table output: md or json."),
        json_out: bool = options.json_out(),
    ):
        """Run a resumable sweep (finished tasks are skipped), or print its tables with --table."""
        from ..sweeps import TaskFilter, load_records, make_executor, plan, run_sweep, sweep_dir
        from ..sweeps.executors import check_executor_args
        from ..sweeps.store import open_store
        from ..sweeps.tables import render_markdown, sweep_tables, table3_markdown
        from ..validation import positive_int

        if table:
            if store is None:
                s = _spec_from_args(spec, builtin, profile)
                store = sweep_dir(out, s.name)
            name, records = load_records(store)
            tables = sweep_tables(records, name=name)
            if json_out or fmt is TableFormat.json:
                emit_json(tables)
            else:
                typer.echo(render_markdown(tables), nl=False)  # plain text: Markdown must not be re-wrapped
            return

        s = _spec_from_args(spec, builtin, profile)
        if max_tasks is not None:
            positive_int("max_tasks", max_tasks)
        check_executor_args(executor.value, scheduler, workers)
        filt = TaskFilter(models=tuple(model or ()), datasets=tuple(dataset or ()), epsilons=tuple(eps or ()), seeds=tuple(seed or ()))

        if plan_only:
            tasks, skipped = plan(s, data_dir=data_dir, task_filter=filt)
            folder = sweep_dir(out, s.name)
            counts = {"pending": len(tasks), "done": 0, "failed": 0}
            if (folder / "sweep.sqlite").exists():
                with open_store(folder, name=s.name) as st:
                    known = st.statuses([t.key for t in tasks])
                counts = {k: sum(1 for t in tasks if known.get(t.key, "pending") == k) for k in ("pending", "done", "failed")}
            result = {"name": s.name, "source": s.source, "tasks": len(tasks), **counts, "skipped_datasets": skipped,
                      "store": str((folder / "sweep.sqlite").resolve())}
            if json_out:
                emit_json(result)
            else:
                for k, v in skipped.items():
                    note(f"skipping dataset {k}: {v}")
                console.print(f"sweep {s.name}: {len(tasks)} tasks ({counts['done']} done, {counts['failed']} failed, {counts['pending']} pending)")
            return

        if not json_out:
            note(f"sweep {s.name}: executor {executor.value}" + (f" at {scheduler}" if scheduler else "") + f", output {sweep_dir(out, s.name)}")
        with make_executor(executor.value, scheduler=scheduler, workers=workers) as ex:
            summary = run_sweep(
                s, out=out, executor=ex, data_dir=data_dir, ledger_path=ledger, retry_failed=retry_failed,
                task_filter=None if filt.is_empty() else filt, max_tasks=max_tasks, progress=not json_out,
            )
        for k, v in summary.skipped_datasets.items():
            note(f"skipped dataset {k}: {v}")
        name, records = load_records(summary.store)
        tables, jp, mp = write_tables(Path(summary.store).parent, name, records)
        result = summary.to_dict()
        result.update(tables_json=str(jp), tables_md=str(mp), table3=tables["table3"])
        if json_out:
            emit_json(result)
        else:
            t = Table(title=f"sweep {s.name}")
            for col in ("tasks", "done", "failed", "pending", "ran now", "failed now", "skipped (finished)", "seconds"):
                t.add_column(col)
            t.add_row(str(summary.tasks), str(summary.done), str(summary.failed), str(summary.pending), str(summary.ran),
                      str(summary.ran_failed), str(summary.skipped_finished), f"{summary.seconds:.1f}")
            console.print(t)
            for f in summary.failures[:10]:
                note(f"failed: {f['model']} {f['dataset']} eps={f['epsilon']} seed={f['seed']}: {f['error']}")
            if tables["table3"]["rows"]:
                typer.echo(table3_markdown(tables["table3"]))
            note(f"tables: {mp} and {jp}")
            for u in summary.unrecorded:  # the model exists but is not in the ledger: its budget stays held
                note(f"release written but not recorded: {u['release_dir']}; reservation {u['reservation']} stays open (spent): "
                     f"record the release (`dpaudit ledger record DIR`), then void the reservation.")
            if summary.interrupted:
                note("interrupted: finished tasks are stored; run the same command again to resume.")
        if summary.ran_failed or summary.interrupted:
            raise typer.Exit(1)

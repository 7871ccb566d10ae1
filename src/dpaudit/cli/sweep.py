"""`dpaudit sweep [SPEC.toml | --builtin NAME]`: run a resumable grid; `--plan` and `--table` show it.

The command is generated from :class:`dpaudit.sweeps.request.SweepRequest` (one option per field); the work is done by
:mod:`dpaudit.sweeps.request`. Only printing happens here."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import List, Optional

import typer
from rich.table import Table
from rich.text import Text

from .. import sweeps
from ..console import wrap_width, wrap_words
from ..requests import flag_of
from ..sweeps.request import SweepRequest
from . import options
from .common import console, emit_json, keyword, note, plain, print_table
from .generic import make_command, typer_option


def _parameter(f: dataclasses.Field, tp) -> inspect.Parameter:
    """The typer parameter of one SweepRequest field: SPEC an argument, tuples repeatable options,
    the others as a request's (:func:`dpaudit.cli.generic.typer_option`)."""
    scalar = next(a for a in (*typing.get_args(tp), tp) if a is not type(None))
    help_text = f.metadata.get("help") or ""
    if f.metadata.get("positional"):
        argument = typer.Argument(None, help=help_text, show_default=False)
        return keyword(f.name, Optional[scalar], argument)
    if typing.get_origin(tp) is tuple:
        return keyword(f.name, Optional[List[scalar]], options.optional(flag_of(f), help_text))
    return keyword(f.name, *typer_option("Sweep", f, scalar))


def _request(values: dict) -> SweepRequest:
    """Parsed options as a SweepRequest: choices as strings, repeated options as tuples (none: ())."""
    fields = SweepRequest.__dataclass_fields__
    repeated = {k for k, f in fields.items() if isinstance(f.default, tuple)}
    return SweepRequest(
        **{k: tuple(v or ()) if k in repeated else plain(v) for k, v in values.items()}
    )


def _print_tables(tables: dict, json_out: bool) -> None:
    if json_out:
        return emit_json(tables)
    _echo_markdown(sweeps.render_markdown(tables))


def _echo_markdown(text: str) -> None:
    """Markdown as plain text: a table row stays one line (wrapped it is no table); prose wraps
    as messages do (:func:`dpaudit.console.wrap_words`)."""
    width = wrap_width(console)
    typer.echo(
        "\n".join(
            line if line.startswith("|") else wrap_words(Text(line), width).plain
            for line in text.split("\n")
        ),
        nl=False,
    )


def _print_plan(result: dict, json_out: bool) -> None:
    if json_out:
        return emit_json(result)
    for k, v in result["skipped_datasets"].items():
        note(f"skipping dataset {k}: {v}")
    console.print(
        f"sweep {result['name']}: {result['tasks']} tasks ({result['done']} done, {result['failed']} failed, {result['pending']} pending)"
    )


def _print_run(summary, result: dict) -> None:
    heads = "tasks,done,failed,pending,ran now,failed now,skipped (finished),seconds".split(",")
    t = Table(*heads, title=f"sweep {summary.name}")
    counts = ("tasks", "done", "failed", "pending", "ran", "ran_failed", "skipped_finished")
    t.add_row(*(str(getattr(summary, k)) for k in counts), f"{summary.seconds:.1f}")
    print_table(t)
    for f in summary.failures[:10]:
        note(
            f"failed: {f['model']} {f['dataset']} eps={f['epsilon']} seed={f['seed']}: {f['error']}"
        )
    if result["table3"]["rows"]:
        _echo_markdown(sweeps.table3_markdown(result["table3"]) + "\n")
    note(f"tables: {result['tables_md']} and {result['tables_json']}")
    for u in summary.unrecorded:  # the model exists but is not in the ledger: its budget stays held
        note(
            f"release written but not recorded: {u['release_dir']}; reservation {u['reservation']} stays open (spent): "
            f"record the release (`dpaudit ledger record DIR`), then void the reservation."
        )
    if summary.interrupted:
        note("interrupted: finished tasks are stored; run the same command again to resume.")


def sweep(**values) -> None:
    """Run a resumable sweep (finished tasks are skipped), or print its tables with --table."""
    r = _request(values)
    if r.table:
        _print_tables(sweeps.stored_tables(r), r.json_out or r.format == "json")
        return
    if r.plan_only:
        _print_plan(sweeps.plan_counts(r), r.json_out)
        return
    spec = r.checked()
    if not r.json_out:
        at = f" at {r.scheduler}" if r.scheduler else ""
        note(
            f"sweep {spec.name}: executor {r.executor}{at}, output {sweeps.sweep_dir(r.out, spec.name)}"
        )
    summary, result = sweeps.run_request(r, spec, progress=not r.json_out)
    for k, v in summary.skipped_datasets.items():
        note(f"skipped dataset {k}: {v}")
    if r.json_out:
        emit_json(result)
    else:
        _print_run(summary, result)
    if summary.ran_failed or summary.interrupted:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    hints = typing.get_type_hints(SweepRequest)
    params = [_parameter(f, hints[f.name]) for f in dataclasses.fields(SweepRequest)]
    app.command()(make_command(sweep, params, "sweep", sweep.__doc__))

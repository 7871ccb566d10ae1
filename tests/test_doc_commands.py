"""Every ``dpaudit ...`` command in README.md and docs/*.md works as pasted.

Each one is parsed by the real command line (command path, flags, value types and choices) without
running; one that names a dataset on real files must say where they are (``--data-dir``); the
cheap ones on the embedded data (accounting, train, audit, report, ledger) also run, in document
order in one folder, at small sizes (``--epochs 1``, ``--runs 40``: the last value of a flag wins).
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest
import typer
from typer._click.exceptions import UsageError as ClickUsageError
from typer.testing import CliRunner

from dpaudit.cli import app

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
REAL_DATA = {"mnist", "cifar10", "cardio", "heart", "mnist-mix", "heart-mix"}
#: Placeholders a reader replaces: such a command is parsed, never run.
PLACEHOLDER = re.compile(
    r"\b(ID|HASH|OWNER_KEY_ID|TEXT|NAME|SPEC\.toml|spec\.toml|HOST|PATH|FILE)\b|\.\.\.|tcp://|users\.npy"
)
RUNS = {
    ("account",),
    ("calibrate",),
    ("schedule",),
    ("train",),
    ("audit",),
    ("report",),
    ("ledger", "summary"),
    ("ledger", "list"),
    ("ledger", "verify"),
    ("ledger", "cap"),
    ("ledger", "keygen"),
    ("ledger", "register-key"),
    ("bundle",),
    ("verify",),
}
SMALL = {"train": ["--epochs", "1"], "audit": ["--runs", "40", "--no-controls"]}
#: Parsed, never run: `audit opacus` trains the user's own script (minutes, real data).
NOT_RUN = {("audit", "opacus")}


def _commands(path: Path) -> list[tuple[str, int, list[str]]]:
    """(file, line, argv) of each command in a fenced code block (``$ `` prompts, ``\\`` joins, ``&&`` splits)."""
    out, fenced, pending = [], False, ""
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        text = pending + re.sub(r"^\s*\$ ", "", line)
        if not fenced or not text.lstrip().startswith("dpaudit "):
            pending = ""
            continue
        if text.rstrip().endswith("\\"):
            pending = text.rstrip()[:-1] + " "
            continue
        pending = ""
        text = re.split(r"\s#\s|\s\|\s", text)[0]
        for part in text.split("&&"):
            out.append((path.name, n, shlex.split(part)))
    return out


CASES = [c for doc in DOCS for c in _commands(doc)]


def _parse(argv: list[str]):
    """The leaf command and its parsed parameters (click's own parsing and conversion; nothing runs)."""
    cmd, ctx, name, args = typer.main.get_command(app), None, "dpaudit", argv[1:]
    while True:
        ctx = cmd.make_context(name, args, parent=ctx)
        if not isinstance(cmd, typer.core.TyperGroup):
            return cmd, ctx.params
        name, cmd, args = cmd.resolve_command(ctx, [*ctx._protected_args, *ctx.args])


def test_the_docs_hold_commands():
    assert len(CASES) > 40 and {f for f, _, _ in CASES} >= {
        "README.md",
        "ledger.md",
        "review-walkthrough.md",
    }


@pytest.mark.parametrize("doc,line,argv", CASES, ids=[f"{d}:{n}" for d, n, _ in CASES])
def test_each_command_parses_and_names_its_data(doc, line, argv):
    try:
        _, params = _parse(argv)
    except ClickUsageError as e:
        pytest.fail(f"{doc}:{line}: {shlex.join(argv)}: {e.format_message()}")
    named = {
        str(getattr(params[k], "value", params[k]))
        for k in ("dataset", "task")
        if params.get(k) is not None
    }
    if named & REAL_DATA and "data_dir" in params:
        assert params.get("data_dir") is not None, (
            f"{doc}:{line}: {shlex.join(argv)} needs --data-dir (exits 2 as pasted)"
        )


def test_the_cheap_commands_run_as_pasted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(
        "XDG_CONFIG_HOME", str(tmp_path / "config")
    )  # the walk-through's own signing key
    runner = CliRunner()
    ran = set()
    for doc, line, argv in CASES:
        words = tuple(a for a in argv[1:3] if not a.startswith("-"))
        if (
            tuple(argv) in ran
            or PLACEHOLDER.search(" ".join(argv))
            or not ({words[:1], words[:2]} & RUNS)
            or words[:2] in NOT_RUN
            or {
                "--data-dir",
                "--profile",
                "--threat-model",
                "--one-run",
                "--task",
                "--privacy-unit",
                "--dataset",
                "--sweep",
                "--ledger",
            }
            & set(argv)
        ):
            continue
        # a pre-registered plan runs exactly as planned: nothing may be added to `audit --plan`
        r = runner.invoke(app, argv[1:] + ([] if "--plan" in argv else SMALL.get(words[0], [])))
        assert r.exit_code == 0, f"{doc}:{line}: {shlex.join(argv)}\n{r.output}"
        ran.add(tuple(argv))
    assert len(ran) >= 10
    assert (
        "dpaudit",
        "verify",
        "bundle",
    ) in ran  # README's review: plan -> audit -> bundle -> verify, as pasted


#: Long commands at reduced size (marked "(reduced)" in a failure; the pasted command is the one parsed above).
#: An option the command lacks is left out; the last value of a flag wins.
REDUCED = {
    ("train",): ["--epochs", "1"],
    ("audit",): ["--runs", "40", "--control-runs", "8"],
    ("sweep",): ["--max-tasks", "1"],
}
ONE_RUN_REDUCED = ["--canaries", "50", "--epochs", "1"]
#: Never run here, and why: each is still parsed by test_each_command_parses_and_names_its_data.
NOT_RUN_HERE = {("audit", "opacus"): "trains the user's own script (its data, minutes)"}
#: Pages whose transcripts start from files a step outside dpaudit made (the page's Python example, a
#: tampered copy): (page, command words) -> why.
NEEDS_OUTSIDE_STEP = {
    ("ledger.md", ("ledger", "record")): "records the releases of the page's Python example",
    (
        "ledger.md",
        ("ledger", "verify", "--ledger"),
    ): "reads the copy the page tampers with in Python",
    (
        "ledger.md",
        ("ledger", "summary", "--ledger"),
    ): "reads the copy the page tampers with in Python",
}


def _team_ledger_lines(path: Path) -> set[int]:
    """Lines of the fenced blocks that run against a PostgreSQL team ledger (``export DPAUDIT_LEDGER=postgresql://``):
    they need a database server."""
    lines, block, team = set(), [], False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            lines |= set(block) if team else set()
            block, team = [], False
            continue
        block.append(n)
        team = team or "DPAUDIT_LEDGER=postgresql://" in line
    return lines


def _reduced(argv: list[str]) -> list[str]:
    """``argv`` with the reductions of its command that it parses with (a pre-registered plan takes none)."""
    words = tuple(a for a in argv[1:3] if not a.startswith("-"))
    if "--plan" in argv and words[:1] == ("audit",):
        return argv
    extra = next((v for k, v in REDUCED.items() if words[: len(k)] == k), []) + (
        ONE_RUN_REDUCED if "--one-run" in argv else []
    )
    out = list(argv)
    for flag, value in zip(extra[::2], extra[1::2]):
        try:
            _parse(out + [flag, value])
        except (ClickUsageError, Exception):  # noqa: BLE001 - an option this command lacks is left out
            continue
        out += [flag, value]
    return out


def _skipped(doc: str, line: int, argv: list[str], team: dict) -> bool:
    """A command this run leaves out: a placeholder, :data:`NOT_RUN_HERE`, a team-ledger block, :data:`NEEDS_OUTSIDE_STEP`."""
    words = tuple(a for a in argv[1:3] if not a.startswith("-"))
    outside = any(doc == page and all(w in argv for w in ws) for page, ws in NEEDS_OUTSIDE_STEP)
    return (
        bool(PLACEHOLDER.search(" ".join(argv)))
        or words[:2] in NOT_RUN_HERE
        or line in team[doc]
        or outside
    )


@pytest.mark.slow
def test_every_command_runs_as_pasted_in_document_order(tmp_path, monkeypatch):
    """README then docs/*.md, every command, in one fresh folder (``../shared/data`` is the real data, as in the
    set-up), long ones reduced (:data:`REDUCED`); a command repeated word for word (the walk-through repeats the
    README's review) runs once, as a reader who did it already skips it. Every failure is listed."""
    data = os.environ.get("DPAUDIT_DATA_DIR")
    if not data or not Path(data).is_dir():
        pytest.skip("DPAUDIT_DATA_DIR (the real data) is not here")
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "data").symlink_to(Path(data).resolve())
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("DPAUDIT_LEDGER", raising=False)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    team = {p.name: _team_ledger_lines(p) for p in DOCS}
    runner, failed, ran = CliRunner(), [], set()
    for doc, line, argv in CASES:
        if tuple(argv) in ran or _skipped(doc, line, argv, team):
            continue
        run = _reduced(argv)
        r = runner.invoke(app, run[1:])
        ran.add(tuple(argv))
        if r.exit_code != 0:
            failed.append(
                f"{doc}:{line}: {shlex.join(argv)}{' (reduced)' if run != argv else ''}: exit {r.exit_code}: "
                + " ".join((r.output or repr(r.exception)).split())[-400:]
            )
    assert not failed, "\n".join(failed)
    assert len(ran) >= 35

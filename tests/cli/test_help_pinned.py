"""Every command's ``--help`` (100 columns) and its parameters (names, flags, defaults, types) are
pinned by digest: a change to how the commands are declared or generated must leave what users see
identical. The golden was written by the code before such a change; regenerate it (run this file
with DPAUDIT_WRITE_HELP_GOLDEN=1) only for a deliberate change of help text or options. The help is
rendered by typer and rich, so it is compared only under the versions that wrote it."""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from importlib.metadata import version
from pathlib import Path

import typer.testing
from typer.main import get_command
from typer.testing import CliRunner

from dpaudit.cli import app
from dpaudit.cli.common import ROUTES

GOLDEN = Path(__file__).with_name("help_golden.json")
RENDERERS = ("typer", "rich", "click")


def _param(p) -> list:
    default = "<callable>" if callable(p.default) else repr(p.default)
    return [p.name, list(p.opts), list(p.secondary_opts), default, p.required, p.hidden]


def _digests(monkeypatch) -> dict[str, str]:
    """command path -> sha256 of its help text and parameters."""
    root, runner, out = get_command(app), CliRunner(), {}
    # the whole app converted once, not once per command
    monkeypatch.setattr(typer.testing, "_get_command", lambda _: root)

    def walk(command, path: list[str]) -> None:
        res = runner.invoke(app, [*path, "--help"], terminal_width=100, prog_name="dpaudit")
        seen = {
            "code": res.exit_code,
            "help": res.output,
            "params": [_param(p) for p in command.params],
        }
        blob = json.dumps(seen, sort_keys=True).encode()
        out[" ".join(path) or "dpaudit"] = hashlib.sha256(blob).hexdigest()
        for name in getattr(command, "commands", {}):
            walk(command.commands[name], [*path, name])

    walk(root, [])
    for path, make in sorted(ROUTES.items()):
        walk(make(), list(path))
    return out


def test_help_and_parameters_of_every_command_are_unchanged(monkeypatch):
    for name in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)  # plain text, whatever the CI's console says
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("TERM", "dumb")
    versions = {name: version(name) for name in RENDERERS}
    if os.environ.get("DPAUDIT_WRITE_HELP_GOLDEN"):
        golden = {"versions": versions, "help": _digests(monkeypatch)}
        GOLDEN.write_text(json.dumps(golden, indent=1) + "\n")
    golden = json.loads(GOLDEN.read_text())
    if golden["versions"] != versions:
        warnings.warn(f"help not compared: written under {golden['versions']}, now {versions}")
        return
    got = _digests(monkeypatch)
    # a command another test registers for itself may be present too: the pinned ones must be
    missing = sorted(set(golden["help"]) - set(got))
    assert len(golden["help"]) >= 45 and not missing, f"commands missing: {missing}"
    changed = [name for name, digest in golden["help"].items() if got[name] != digest]
    assert not changed, f"--help or parameters changed: {changed}"

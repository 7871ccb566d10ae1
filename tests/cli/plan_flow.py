"""The set-up the pre-registered audit flows share: a ledger with a registered signing key."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from dpaudit.cli import app
from dpaudit.ledger import signing as sg
from dpaudit.ledger.book import open_ledger


def signed_auditor(mp, root, *, ledger=None):
    """Point ``mp`` (a MonkeyPatch) at the ledger ``ledger`` (default ``root / "ledger.sqlite"``), a key
    folder under ``root`` and the working folder ``root``; make an Ed25519 key, register it; returns it."""
    mp.setenv("DPAUDIT_LEDGER", str(ledger or root / "ledger.sqlite"))
    mp.setenv("XDG_CONFIG_HOME", str(root / "cfg"))
    mp.setenv("MPLBACKEND", "Agg")
    mp.chdir(root)
    key = sg.keygen("auditor")
    mp.setenv(sg.SIGNING_KEY_ENV, str(key.path))
    with open_ledger(None) as led:
        led.register_key()
    return key


def ok(args):
    """``dpaudit ARGS``, which must succeed; returns the result."""
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    return r


def verify_checks(bundle, *extra) -> tuple[bool, list[dict]]:
    """(ok, checks) of ``dpaudit verify BUNDLE --json EXTRA...``, after checking its exit code (1 on any FAIL)."""
    r = CliRunner().invoke(app, ["verify", str(bundle), "--json", *extra])
    d = json.loads(r.stdout)
    assert r.exit_code == (0 if d["ok"] else 1)
    return d["ok"], d["checks"]


def failed_checks(bundle, *extra) -> list[tuple[str, str]]:
    """(check, detail) of every failed check of ``dpaudit verify BUNDLE``."""
    return [
        (c["name"], c["detail"]) for c in verify_checks(bundle, *extra)[1] if c["status"] == "FAIL"
    ]

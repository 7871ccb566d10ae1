"""Where the ledger lives: ``--ledger PATH``, else ``$DPAUDIT_LEDGER``, else ./.dpaudit/ledger.sqlite."""

from __future__ import annotations

import os
from pathlib import Path

LEDGER_ENV = "DPAUDIT_LEDGER"
DEFAULT_LEDGER = Path(".dpaudit") / "ledger.sqlite"


def resolve_ledger_path(path: str | os.PathLike | None = None) -> Path:
    if path is not None:
        return Path(path).expanduser()
    env = os.environ.get(LEDGER_ENV)
    return Path(env).expanduser() if env else DEFAULT_LEDGER

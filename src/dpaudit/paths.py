"""Where dpaudit keeps its caches (calibrations, accountant results, verified data copies)."""

from __future__ import annotations

import os
from pathlib import Path

#: Environment variable naming the cache directory (default ``~/.cache/dpaudit``).
CACHE_ENV = "DPAUDIT_CACHE_DIR"


def cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "dpaudit"

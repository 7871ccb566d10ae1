"""Where dpaudit keeps its caches (calibrations, accountant results, verified data copies)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

#: Environment variable naming the cache directory (default ``~/.cache/dpaudit``).
CACHE_ENV = "DPAUDIT_CACHE_DIR"


def cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "dpaudit"


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename: a reader (or a crash) sees
    the old file or the complete new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)

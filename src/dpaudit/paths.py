"""Where dpaudit keeps its caches (calibrations, accountant results, verified data copies)."""

from __future__ import annotations

import itertools
import os
import tempfile
from pathlib import Path

from .errors import UsageError

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


#: The files that make a folder hold results: a release, a canary audit, a one-run audit. A folder
#: with none of them (absent, empty, or an interrupted audit's checkpoint only) may be written to.
RESULT_FILES = ("release.json", "audit.json", "one_run.json")


def results_in(folder: str | os.PathLike, names=RESULT_FILES) -> list[Path]:
    """The result files (``names``) in ``folder`` or one folder below it (the parts of a multi-release
    run, an audit's final-model companion), the folder's own first; [] when it is no folder."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        return []
    own = [root / n for n in names if (root / n).is_file()]
    return own + sorted(p for n in names for p in root.glob(f"*/{n}") if p.is_file())


def check_new_folder(folder: str | os.PathLike, *, name: str = "out", names=RESULT_FILES) -> Path:
    """Refuse (one-line UsageError) a folder that already holds results: nothing a user produced is
    ever overwritten, so an earlier run's files and the ledger entries that point at them agree."""
    found = results_in(folder, names)
    if found:
        raise UsageError(
            f"{name} must be a folder without results, got {str(folder)!r} (it holds {str(found[0])!r}); give a new "
            f"--{name.replace('_', '-')}, or leave it out for a fresh folder: results are never overwritten."
        )
    return Path(folder)


def fresh_folder(default: str | os.PathLike, names=RESULT_FILES) -> Path:
    """``default`` when it holds no results, else the first ``default-2``, ``default-3``, ... that holds none
    (an earlier run's folder is never reused; a folder with an interrupted run's checkpoint only is resumed)."""
    base = Path(default)
    numbered = (base.with_name(f"{base.name}-{n}") for n in itertools.count(2))
    return next(path for path in itertools.chain([base], numbered) if not results_in(path, names))


def check_new_file(path: str | os.PathLike, *, name: str = "out") -> Path:
    """Refuse (one-line UsageError) an output file that exists (a folder, or an earlier result) or whose folder
    cannot hold it: a file a user produced is never replaced."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise UsageError(
            f"{name} must be a file path, got {str(path)!r} (a folder); give a file name such as {str(p / 'report.html')!r}."
        )
    if p.exists():
        raise UsageError(
            f"{name} must be a new file, got {str(path)!r} (it exists); give another --{name.replace('_', '-')}: "
            "files are never overwritten."
        )
    return p


def fresh_file(default: str | os.PathLike) -> Path:
    """``default`` when absent, else the first ``STEM-2.SUFFIX``, ``STEM-3.SUFFIX``, ... that is."""
    base = Path(default)
    numbered = (base.with_name(f"{base.stem}-{n}{base.suffix}") for n in itertools.count(2))
    return next(path for path in itertools.chain([base], numbered) if not path.exists())

"""Release records: the guarantee and everything needed to check or re-create a release.

A :class:`Release` is frozen and written as ``release.json``. Readers get a one-line
:class:`~dpaudit.errors.DataError` for a missing, truncated or malformed file.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import subprocess
import tempfile
import uuid
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from . import __version__
from .errors import AccountingMismatchError, DataError

RELEASE_FILE = "release.json"


def git_commit() -> str | None:
    """The commit of the dpaudit source tree, when it is a git checkout."""
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Release:
    """One released model (or statistic) and the privacy guarantee it carries.

    ``guarantee`` is the event tree as data (see :mod:`dpaudit.accounting.events`), so any
    accountant can recompute it. ``epsilon`` is the claim made with ``accountant`` under
    ``adjacency`` at ``delta``; ``epsilons`` holds other accountants' values for comparison.
    """

    mechanism: str
    dataset: dict
    adjacency: str
    accountant: str
    epsilon: float
    delta: float
    guarantee: dict
    seed: int
    noise_source: dict
    target_epsilon: float | None = None
    noise_multiplier: float | None = None
    sample_rate: float | None = None
    steps: int | None = None
    steps_executed: int | None = None
    clipping_norm: float | None = None
    normalizer: int | None = None
    partition: str = "train"
    privacy_unit: str = "record"
    non_private: bool = False
    epsilons: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    artefacts: dict = field(default_factory=dict)
    command: str | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created_at: str = field(default_factory=now_utc)
    dpaudit_version: str = __version__
    git_commit: str | None = field(default_factory=git_commit)

    def to_dict(self) -> dict:
        return _json_safe(asdict(self))

    @classmethod
    def from_dict(cls, data: dict) -> "Release":
        known = {f.name for f in fields(cls)}
        required = ["mechanism", "dataset", "adjacency", "accountant", "epsilon", "delta", "guarantee", "seed", "noise_source"]
        absent = [k for k in required if k not in data]
        if absent:
            raise DataError(f"release is missing required keys: {', '.join(absent)}.")
        return cls(**{k: v for k, v in data.items() if k in known})


def _json_safe(obj):
    """Replace non-finite floats by strings so the JSON stays standard."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy / torch scalars
        return _json_safe(obj.item())
    return obj


def write_json_atomic(path: str | os.PathLike, data: dict) -> Path:
    """Write JSON so that a crash leaves either the old file or the complete new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(_json_safe(data), f, indent=2, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)
    return path


def read_json(path: str | os.PathLike, what: str = "file") -> dict:
    path = Path(path)
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise DataError(f"{what} not found: {path}.") from None
    except json.JSONDecodeError as e:
        raise DataError(f"{what} {path} is not valid JSON (truncated or corrupt): {e.msg} at line {e.lineno}.") from None
    except OSError as e:
        raise DataError(f"cannot read {what} {path}: {e.strerror}.") from None
    if not isinstance(data, dict):
        raise DataError(f"{what} {path} must hold a JSON object, got {type(data).__name__}.")
    return data


def write_release(release: Release, out_dir: str | os.PathLike) -> Path:
    return write_json_atomic(Path(out_dir) / RELEASE_FILE, release.to_dict())


def read_release(path: str | os.PathLike) -> Release:
    """Read a release from ``path`` (a ``release.json`` or a directory holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / RELEASE_FILE
    return Release.from_dict(read_json(p, "release"))


def check_accounting(*, steps_executed: int, steps_accounted: int, epsilon: float, target_epsilon: float | None) -> None:
    """Fail loudly when a run did not do what was accounted for."""
    if steps_executed != steps_accounted:
        raise AccountingMismatchError(
            f"steps executed ({steps_executed}) differ from steps accounted ({steps_accounted}); the release is withheld."
        )
    if target_epsilon is not None and epsilon > target_epsilon:
        raise AccountingMismatchError(
            f"achieved epsilon {epsilon} exceeds the target {target_epsilon}; the release is withheld."
        )

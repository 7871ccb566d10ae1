"""Finding and reading the inputs of a report: releases, audits (their shareable part only), sweeps.

The loader layer of :mod:`dpaudit.reports` (layers: ``tests/reports/test_report_layering.py``):
every file a report reads is read here (never audit_local.json or scores.npz, which are not for
publication); an audit record becomes a typed :class:`~.audit_view.AuditView`; the releases below
a sweep folder become its sweep's (:func:`discover_inputs`). Every reader is tolerant: a truncated
or malformed file becomes a *note* in the report (never a traceback, never silently dropped), and
an audit record that lacks a key the verdict needs makes the verdict INCONCLUSIVE, not a guess.
"""

from __future__ import annotations

import json
import math
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..audit_outputs import shareable_audit, shareable_one_run
from ..audits.engine import AUDIT_FILE
from ..claims import integer, number as num
from ..errors import DataError, DPAuditError, UsageError
from ..records import RELEASE_FILE, Release, read_json
from ..sweeps import load_records
from ..sweeps.spec import spec_from_dict
from ..sweeps.store import STORE_FILE, open_store
from .audit_view import AuditView

#: File name of a one-run audit record (the one-run analysis writes it where audit.json would go).
ONE_RUN_FILE = "one_run.json"
#: File name of a white-box or crafted-final audit record (dpaudit.mechanisms.dpsgd.white_box_target),
#: and the keys of its runs derived from the private data (never in it; dropped if an edited file
#: has them).
WHITE_BOX_FILE = "white_box.json"
WHITE_BOX_LOCAL_KEYS = ("coordinates", "quiet_coordinates")


@dataclass
class Note:
    """Something the reader of the report must know: ``level`` is error, warning or info."""

    level: str
    section: str
    message: str

    def to_dict(self) -> dict:
        return {"level": self.level, "section": self.section, "message": self.message}


@dataclass
class LoadedRelease:
    path: Path  # the release directory
    release: Release


@dataclass
class LoadedAudit:
    path: Path  # the audit directory
    record: dict  # in today's layout (AuditView.read): what the verdict functions take
    view: AuditView  # the typed fields a report reads


@dataclass
class Inputs:
    releases: list[LoadedRelease] = field(default_factory=list)
    audits: list[LoadedAudit] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    sweeps: list["LoadedSweep"] = field(default_factory=list)
    one_runs: list["LoadedOneRun"] = field(default_factory=list)
    white_boxes: list["LoadedOneRun"] = field(default_factory=list)


@dataclass
class LoadedOneRun:
    path: Path  # the file one_run.json (or white_box.json: the same shape of input)
    record: dict


# ``num`` (a float from a JSON value, else None) and ``integer`` are dpaudit.claims' readers, so
# the report and the claim check read recorded numbers the same way.


def dataset_name(ds: Any) -> str:
    """The name of a release's dataset (its ``dataset`` object or a bare name)."""
    return str((ds.get("name") if isinstance(ds, dict) else ds) or "unknown")


def command_str(cmd: Any) -> str | None:
    """A recorded command as one shell line (a list is quoted and joined)."""
    if cmd is None:
        return None
    return shlex.join(str(c) for c in cmd) if isinstance(cmd, (list, tuple)) else str(cmd)


def fixed(x: float | None, digits: int = 3) -> str:
    """An epsilon in a verdict line or a note: n/a, inf, or ``digits`` decimals."""
    return "n/a" if x is None else "inf" if math.isinf(x) else f"{x:.{digits}f}"


def canonical_mechanism(name: Any) -> str:
    """Key used to match releases and audits of one mechanism: case, '_' and a 'dp-' prefix ignored."""
    s = str(name or "unknown").strip().lower().replace("_", "-").replace(" ", "-")
    return s[3:] if s.startswith("dp-") and len(s) > 3 else s


def _visible(f: Path, root: Path) -> bool:
    return not any(part.startswith(".") for part in f.relative_to(root).parts[:-1])


def _found(path: Path, name: str) -> list[Path]:
    """The files called ``name`` at ``path`` (a file given itself) or below it (hidden folders skipped)."""
    if path.is_file():
        return [path] if path.name == name else []
    return sorted({f for f in path.rglob(name) if f.is_file() and _visible(f, path)}, key=str)


def _given(paths: Iterable[str | os.PathLike]) -> list[Path]:
    given = [Path(raw).expanduser() for raw in paths]
    for raw, p in zip(paths, given):
        if not p.exists():
            raise UsageError(
                f"report input must be an existing release/audit/sweep directory or file, got {str(raw)!r}."
            )
    return given


def _kind(f: Path) -> str:
    """What a JSON input is by its name: audit.json, or any other name holding "audit", is an audit."""
    audit = f.name == AUDIT_FILE or (f.name != RELEASE_FILE and "audit" in f.name)
    return "audit" if audit else "release"


def _candidates(p: Path) -> list[Path]:
    """The release and audit files at ``p`` (a file given explicitly, or those below a folder)."""
    if p.is_file():
        records = (STORE_FILE, ONE_RUN_FILE, WHITE_BOX_FILE)  # the last two: find_records
        return [p] if p.name not in records else []
    return sorted(
        f for f in p.rglob("*.json") if f.name in (RELEASE_FILE, AUDIT_FILE) and _visible(f, p)
    )


def _innermost(sweeps: dict[Path, "LoadedSweep"]):
    """f -> the root of the innermost sweep folder holding ``f`` (None: no sweep's)."""
    roots = sorted(sweeps, key=lambda r: len(r.parts), reverse=True)
    return lambda f: next((root for root in roots if f.resolve().is_relative_to(root)), None)


def _rest_of_sweeps(sweeps: dict[Path, "LoadedSweep"], sweep_of, seen: set[Path]) -> None:
    """Every release below a sweep's folder, also when the sweep was given as its store file."""
    for root, sw in sweeps.items():
        for f in sorted(sw.path.rglob(RELEASE_FILE)):
            if _visible(f, sw.path) and sweep_of(f) == root and f.resolve() not in seen:
                seen.add(f.resolve())
                sw.release_files.append(f)


def discover_inputs(
    paths: Iterable[str | os.PathLike],
) -> tuple[list[Path], list[Path], list[Path], list]:
    """(release files, audit files, given paths, sweeps) found under ``paths``; ``sweeps``: one
    :class:`LoadedSweep` (not yet loaded) per sweep store at or below a given path, holding the release
    files below its folder, which are not returned as ordinary releases (a reviewer reads a sweep's
    summary, not hundreds of claim cards), even when also given explicitly."""
    given = _given(list(paths))
    # sweeps first: every release below a sweep folder belongs to that sweep (the innermost one)
    sweeps: dict[Path, LoadedSweep] = {}
    for store in (store for p in given for store in _found(p, STORE_FILE)):
        sweeps.setdefault(store.parent.resolve(), LoadedSweep(path=store.parent, store=store))
    sweep_of = _innermost(sweeps)
    found: dict[str, list[Path]] = {"release": [], "audit": []}
    seen: set[Path] = set()
    for f in (f for p in given for f in _candidates(p)):
        if f.resolve() not in seen:
            seen.add(f.resolve())
            root = sweep_of(f) if _kind(f) == "release" else None
            (sweeps[root].release_files if root is not None else found[_kind(f)]).append(f)
    _rest_of_sweeps(sweeps, sweep_of, seen)
    return found["release"], found["audit"], given, list(sweeps.values())


@dataclass
class LoadedSweep:
    """A sweep input: its folder, its store, and the releases found below it."""

    path: Path  # the sweep folder
    store: Path  # its sweep.sqlite
    release_files: list[Path] = field(default_factory=list)
    name: str | None = None
    records: list[dict] = field(default_factory=list)
    counts: dict = field(default_factory=dict)
    failures: list[dict] = field(default_factory=list)
    # done rows' results (release ids, parameters)
    results: list[dict] = field(default_factory=list)
    spec: dict | None = None
    releases: list[LoadedRelease] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    error: str | None = None  # the store could not be read
    unreadable: int = 0  # release files that could not be read (error notes)


def _failure(r) -> dict:
    """A failed task of the store, with the last line of its error (at most 300 characters)."""
    last = ((r.error or "").strip().splitlines()[-1:] or [""])[0][:300]
    task = {k: r.config.get(k) for k in ("model", "dataset", "epsilon", "seed")}
    return {"key": r.key, **task, "error": last}


def _spec_of(meta: dict) -> dict | None:
    try:
        return json.loads(meta["spec"]) if "spec" in meta else None
    except ValueError:
        return None


def _read_store(sweep: LoadedSweep) -> None:
    sweep.name, sweep.records = load_records(sweep.store)
    with open_store(sweep.store, create=False) as st:
        sweep.counts = st.counts()
        meta = st.meta()
        sweep.failures = [_failure(r) for r in st.rows(status="failed")]
        sweep.results = [
            dict(r.result, _key=r.key) for r in st.rows(status="done") if isinstance(r.result, dict)
        ]
    sweep.spec = _spec_of(meta)
    _mark_stale_failures(sweep)


def load_sweep(sweep: LoadedSweep) -> LoadedSweep:
    """Read the store and the release files of ``sweep`` in place (problems: notes; an unreadable store sets ``error``)."""
    where = str(sweep.path)
    try:
        _read_store(sweep)
    except DPAuditError as e:
        sweep.error = str(e)
        text = f"sweep {where}: no tables: {e} Its releases are still checked and composed."
        sweep.notes.append(Note("error", "sweep", text))
    except Exception as e:  # sqlite / json errors of a damaged store: a note, never a traceback
        sweep.error = f"{type(e).__name__}: {e}"
        text = (
            f"sweep {where}: no tables: its store {sweep.store} is unreadable ({sweep.error}); "
            "its releases are still checked and composed."
        )
        sweep.notes.append(Note("error", "sweep", text))
    # the releases are read even when the store is not: a release that exists spent budget
    for f in sweep.release_files:
        lr = _read_release(f, "sweep", f"sweep {sweep.name or where}: ", sweep.notes)
        sweep.unreadable += lr is None
        sweep.releases += [lr] if lr is not None else []
    return sweep


def _mark_stale_failures(sweep: LoadedSweep) -> None:
    """Tag each failed task with whether the sweep's current spec (the one last run, kept in the
    store) still contains it: a failure left from an earlier version of the spec is reported as
    such instead of looking like a hole in the grid. Unknown (None) when the spec cannot be read."""
    keys = None
    if isinstance(sweep.spec, dict):
        try:
            spec = spec_from_dict({k: v for k, v in sweep.spec.items() if k != "source"})
            keys = {t.key for t in spec.tasks()}
        except Exception:  # noqa: BLE001 - an old or foreign spec: say nothing rather than guess
            keys = None
    for fl in sweep.failures:
        fl["in_current_spec"] = None if keys is None else fl["key"] in keys


def _text(v: Any) -> bool:
    return isinstance(v, str) and bool(v)


def _integer(v: Any) -> bool:
    return integer(v) is not None


def _number(v: Any) -> bool:
    return num(v) is not None and not isinstance(v, bool)


def _is(*types: type):
    return lambda v: isinstance(v, types)


def _optional(ok):
    return lambda v: v is None or ok(v)


#: (fields, what a writer produces, the check) in the order a release is checked; "dataset.name"
#: is the name inside a dataset object.
RELEASE_TYPES = (
    ("mechanism id adjacency accountant partition privacy_unit", "a non-empty string", _text),
    ("dataset", "an object", _is(dict, str)),
    ("dataset.name", "a string", _is(str)),
    ("epsilon delta", "a number", _number),
    (
        "target_epsilon noise_multiplier sample_rate clipping_norm",
        "a number or null",
        _optional(_number),
    ),
    ("steps steps_executed normalizer", "an integer or null", _optional(_integer)),
    ("guarantee noise_source epsilons config metrics timings artefacts", "an object", _is(dict)),
    ("non_private", "true or false", _is(bool)),
    ("seed", "an integer", lambda v: not isinstance(v, (dict, list))),
    ("command", "a string or a list", _optional(_is(str, list))),
    ("created_at dpaudit_version git_commit", "a string or null", _optional(_is(str))),
)


def _field(rel: Release, name: str) -> Any:
    if name == "dataset.name":
        return rel.dataset.get("name", "") if isinstance(rel.dataset, dict) else ""
    return getattr(rel, name)


def check_release_types(rel: Release, where: Path) -> None:
    """Raise a one-line DataError when a release field has a type no writer produces (a report never
    guesses around a malformed claim: such a release is skipped with an error note, not half-rendered)."""
    for names, rule, ok in RELEASE_TYPES:
        bad = next((n for n in names.split() if not ok(_field(rel, n))), None)
        if bad is not None:
            raise DataError(f"release {where}: {bad} must be {rule}, got {_field(rel, bad)!r:.60}.")


def _read_release(f: Path, section: str, prefix: str, notes: list[Note]) -> LoadedRelease | None:
    """The release at ``f``, or None with an error note (``prefix`` names where it was found)."""
    try:
        rel = Release.from_dict(read_json(f, "release"))
        check_release_types(rel, f)
    except DPAuditError as e:
        notes.append(Note("error", section, f"{prefix}release skipped: {e}"))
        return None
    except (TypeError, ValueError) as e:
        text = f"{prefix}release {f} skipped: malformed fields ({e})."
        notes.append(Note("error", section, text))
        return None
    return LoadedRelease(f.parent, rel)


def find_records(paths: Iterable[Path], name: str = ONE_RUN_FILE) -> list[Path]:
    """Every file called ``name`` at or below ``paths`` (files or folders; hidden folders
    skipped), each once."""
    found: dict[Path, Path] = {}
    for f in (f for p in paths for f in sorted(_found(p, name))):  # Path order, not str order
        found.setdefault(f.resolve(), f)
    return list(found.values())


def shareable_white_box(record: dict) -> dict:
    """A white_box.json without the data-derived keys of its runs (an edited file may hold them)."""
    runs = record.get("runs")
    if not isinstance(runs, dict):
        return record
    return {
        **record,
        "runs": {
            role: {k: v for k, v in run.items() if k not in WHITE_BOX_LOCAL_KEYS}
            if isinstance(run, dict)
            else run
            for role, run in runs.items()
        },
    }


def _records(files: list[Path], what: str, shareable, loaded, notes: list[Note]) -> list:
    """``loaded(file, shareable part)`` of each readable record (keys an old file still publishes — scores in
    score units, data-derived canary choices, reference optima — dropped); an unreadable one is an error note."""
    out = []
    for f in files:
        try:
            out.append(loaded(f, shareable(read_json(f, what))))
        except DPAuditError as e:
            notes.append(Note("error", "inputs", f"{what} skipped: {e}"))
    return out


def _loaded_audit(f: Path, record: dict) -> LoadedAudit:
    return LoadedAudit(f.parent, *AuditView.read(record))


def _loaded(files: list[Path], read) -> list:
    return [x for x in map(read, files) if x is not None]


def _nothing_readable(files_found: bool, notes: list[Note], given: list[Path]) -> DataError:
    if files_found:
        return DataError(
            f"no readable release or audit under the given paths ({'; '.join(n.message for n in notes[:3])})."
        )
    return DataError(
        f"no {RELEASE_FILE} or {AUDIT_FILE} found under {', '.join(str(p) for p in given)}."
    )


def load_inputs(paths: Iterable[str | os.PathLike]) -> Inputs:
    """Read every release, audit and sweep under ``paths``; unreadable files become error notes."""
    paths = list(paths)
    if not paths:
        raise UsageError(
            "report inputs must be at least one release, audit or sweep path, got none."
        )
    release_files, audit_files, given, sweeps = discover_inputs(paths)
    out = Inputs(paths=[str(p) for p in given])
    out.sweeps = [load_sweep(sw) for sw in sweeps]
    out.releases = _loaded(release_files, lambda f: _read_release(f, "inputs", "", out.notes))
    one_run_files, white_box_files = find_records(given), find_records(given, WHITE_BOX_FILE)
    out.audits = _records(audit_files, "audit", shareable_audit, _loaded_audit, out.notes)
    out.one_runs = _records(
        one_run_files, "one-run record", shareable_one_run, LoadedOneRun, out.notes
    )
    out.white_boxes = _records(
        white_box_files, "white-box record", shareable_white_box, LoadedOneRun, out.notes
    )
    loaded = (out.releases, out.audits, out.sweeps, out.one_runs, out.white_boxes)
    if not any(loaded):
        found = (release_files, audit_files, one_run_files, white_box_files)
        raise _nothing_readable(any(found), out.notes, given)
    return out

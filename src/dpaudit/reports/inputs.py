"""Finding and reading the inputs of a report: releases, audits (their shareable part only), sweeps.

The loader layer of :mod:`dpaudit.reports`: every file a report reads is read here (release.json,
audit.json, a sweep's store and the releases below it; never audit_local.json or scores.npz, which
are not for publication), and nothing here imports another module of the package. Imports run one way: loaders (this module) -> the shared
recomputation (:mod:`.recompute`) -> sections (:mod:`.claim`, :mod:`.provenance`, :mod:`.budget`,
:mod:`.utility`, :mod:`.audit`, :mod:`.verdict`, :mod:`.reproduce`, :mod:`.sweep`) -> the model
(:mod:`.model`) -> renderers (:mod:`.blocks`, :mod:`.plots`, :mod:`.html`, :mod:`.markdown`);
``tests/reports/test_report_layering.py`` keeps that graph acyclic.

A sweep folder (one holding ``sweep.sqlite``) or a ``sweep.sqlite`` file is a *sweep input*:
the releases below it are summarised by the report's sweep section (:mod:`.sweep`) instead of
becoming one claim card each, and are never also read as ordinary releases. A folder searched
recursively may hold sweep folders next to ordinary releases; each is treated as what it is.

Every reader here is tolerant by design: a truncated or malformed file becomes a *note* in the
report (never a traceback, never silently dropped), and an audit record that lacks a key the
verdict needs is marked incomplete so that the verdict says INCONCLUSIVE rather than guessing.
Only an input list that yields nothing readable at all is an error (one line).
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable


from ..claims import integer, number as num
from ..errors import DataError, DPAuditError, UsageError
from ..records import RELEASE_FILE, Release, read_json
from .audit_view import AuditView

#: File name of an audit record (the audit module writes it; kept here so reports do not
#: depend on the audit module being importable).
AUDIT_FILE = "audit.json"

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
    record: dict
    view: AuditView  # the typed fields a report reads


@dataclass
class Inputs:
    releases: list[LoadedRelease] = field(default_factory=list)
    audits: list[LoadedAudit] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    sweeps: list["LoadedSweep"] = field(default_factory=list)
    one_runs: list["LoadedOneRun"] = field(default_factory=list)


@dataclass
class LoadedOneRun:
    path: Path  # the file one_run.json
    record: dict


# ``num`` (a float from a JSON value, else None) and ``integer`` are dpaudit.claims' readers, so
# the report and the claim check read recorded numbers the same way.


def dataset_name(ds: Any) -> str:
    """The name of a release's dataset (its ``dataset`` object or a bare name)."""
    if isinstance(ds, dict):
        return str(ds.get("name") or "unknown")
    return str(ds or "unknown")


def command_str(cmd: Any) -> str | None:
    """A recorded command as one shell line (a list is quoted and joined)."""
    if cmd is None:
        return None
    if isinstance(cmd, (list, tuple)):
        return shlex.join(str(c) for c in cmd)
    return str(cmd)


def canonical_mechanism(name: Any) -> str:
    """Key used to match releases and audits of one mechanism: case, '_' and a 'dp-' prefix ignored."""
    s = str(name or "unknown").strip().lower().replace("_", "-").replace(" ", "-")
    return s[3:] if s.startswith("dp-") and len(s) > 3 else s


# ------------------------------------------------------------------ discovery


def _audit_file_name() -> str:
    try:  # prefer the audit module's constant once it exists
        from .. import audits as _audits

        return str(getattr(_audits, "AUDIT_FILE", AUDIT_FILE))
    except Exception:  # pragma: no cover - the audit package failing to import must not stop a report
        return AUDIT_FILE


def discover(paths: Iterable[str | os.PathLike]) -> tuple[list[Path], list[Path], list[Path]]:
    """(release files, audit files, given paths) found under ``paths`` (files or folders, recursive).

    Releases below a sweep folder are left out (see :func:`discover_inputs`, which returns them
    with their sweep). A path that does not exist is a :class:`UsageError` (the user mistyped
    it); a folder with nothing in it is reported by the caller.
    """
    releases, audits, given, _sweeps = discover_inputs(paths)
    return releases, audits, given


def _under(f: Path, root: Path) -> bool:
    try:
        f.relative_to(root)
        return True
    except ValueError:
        return False


def discover_inputs(paths: Iterable[str | os.PathLike]) -> tuple[list[Path], list[Path], list[Path], list]:
    """(release files, audit files, given paths, sweeps) found under ``paths``.

    ``sweeps``: one :class:`LoadedSweep` (not yet loaded) per sweep store
    at or below a given path, holding the release files below its folder; those release files
    are not returned as ordinary releases (a reviewer reads a sweep's summary, not hundreds of
    claim cards), even when one of them is also given explicitly.
    """
    audit_name = _audit_file_name()
    names = {RELEASE_FILE, audit_name, AUDIT_FILE}
    paths = list(paths)
    given: list[Path] = []
    for raw in paths:
        p = Path(raw).expanduser()
        if not p.exists():
            raise UsageError(f"report input must be an existing release/audit/sweep directory or file, got {str(raw)!r}.")
        given.append(p)
    # sweeps first: every release below a sweep folder belongs to that sweep (the innermost one)
    sweeps: dict[Path, LoadedSweep] = {}
    for p in given:
        for store in find_sweeps(p):
            root = store.parent.resolve()
            if root not in sweeps:
                sweeps[root] = LoadedSweep(path=store.parent, store=store)
    roots = sorted(sweeps, key=lambda r: len(r.parts), reverse=True)

    def sweep_of(f: Path) -> Path | None:
        r = f.resolve()
        return next((root for root in roots if _under(r, root)), None)

    releases: list[Path] = []
    audits: list[Path] = []
    seen: set[Path] = set()
    for p in given:
        if p.is_file():
            files = [p] if p.name not in (sweep_store_name(), ONE_RUN_FILE) else []  # one-run records: find_one_runs
        else:
            files = sorted(f for f in p.rglob("*.json") if f.name in names and not any(part.startswith(".") for part in f.relative_to(p).parts[:-1]))
        for f in files:
            r = f.resolve()
            if r in seen:
                continue
            seen.add(r)
            is_release = f.name == RELEASE_FILE or (f.name not in (audit_name, AUDIT_FILE) and "audit" not in f.name)
            root = sweep_of(f) if is_release else None
            if root is not None:
                sweeps[root].release_files.append(f)
            elif f.name == RELEASE_FILE:
                releases.append(f)
            elif f.name in (audit_name, AUDIT_FILE):
                audits.append(f)
            else:
                # a file given explicitly under another name: its name says what it is
                (audits if "audit" in f.name else releases).append(f)
    # every release below a sweep's folder, also when the sweep was given as its store file
    for root, sw in sweeps.items():
        for f in sorted(sw.path.rglob(RELEASE_FILE)):
            if _visible(f, sw.path) and sweep_of(f) == root and f.resolve() not in seen:
                seen.add(f.resolve())
                sw.release_files.append(f)
    return releases, audits, given, list(sweeps.values())


def sweep_store_name() -> str:
    return _store_file_name()


def _visible(f: Path, root: Path) -> bool:
    return not any(part.startswith(".") for part in f.relative_to(root).parts[:-1])


# ------------------------------------------------------------------ sweeps

#: File name of a sweep's results store (kept in sync with :data:`dpaudit.sweeps.store.STORE_FILE`).
STORE_FILE = "sweep.sqlite"


def _store_file_name() -> str:
    try:
        from ..sweeps.store import STORE_FILE as name

        return str(name)
    except Exception:  # pragma: no cover - the sweeps package failing to import must not stop a report
        return STORE_FILE


def sweep_store_of(path: Path) -> Path | None:
    """The store file when ``path`` is a sweep input (a folder holding sweep.sqlite, or that file)."""
    name = _store_file_name()
    if path.is_file():
        return path if path.name == name else None
    if path.is_dir() and (path / name).is_file():
        return path / name
    return None


def find_sweeps(path: Path) -> list[Path]:
    """Store files of every sweep at or below ``path`` (hidden folders skipped)."""
    own = sweep_store_of(path)
    if path.is_file():
        return [own] if own is not None else []
    found = [f for f in path.rglob(_store_file_name()) if f.is_file() and _visible(f, path)]
    return sorted(set(found), key=lambda f: str(f))


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
    results: list[dict] = field(default_factory=list)  # done rows' results (release ids, parameters)
    spec: dict | None = None
    releases: list[LoadedRelease] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    error: str | None = None  # the store could not be read
    unreadable: int = 0  # release files that could not be read (error notes)


def load_sweep(sweep: LoadedSweep) -> LoadedSweep:
    """Read the store (records, counts, failures) and the release files of ``sweep`` in place.

    Problems become notes (section ``sweep``); an unreadable store sets ``error``.
    """
    from ..sweeps import load_records
    from ..sweeps.store import open_store

    where = str(sweep.path)
    try:
        sweep.name, sweep.records = load_records(sweep.store)
        with open_store(sweep.store, create=False) as st:
            sweep.counts = st.counts()
            meta = st.meta()
            sweep.failures = [{"key": r.key, "model": r.config.get("model"), "dataset": r.config.get("dataset"),
                               "epsilon": r.config.get("epsilon"), "seed": r.config.get("seed"),
                               "error": (r.error or "").strip().splitlines()[-1:] or [""]}
                              for r in st.rows(status="failed")]
            sweep.results = [dict(r.result, _key=r.key) for r in st.rows(status="done") if isinstance(r.result, dict)]
        for fl in sweep.failures:
            fl["error"] = fl["error"][0][:300]
        try:
            sweep.spec = json.loads(meta["spec"]) if "spec" in meta else None
        except ValueError:
            sweep.spec = None
        _mark_stale_failures(sweep)
    except DPAuditError as e:
        sweep.error = str(e)
        sweep.notes.append(Note("error", "sweep", f"sweep {where}: no tables: {e} Its releases are still checked and composed."))
    except Exception as e:  # sqlite / json errors of a damaged store: a note, never a traceback
        sweep.error = f"{type(e).__name__}: {e}"
        sweep.notes.append(Note("error", "sweep", f"sweep {where}: no tables: its store {sweep.store} is unreadable ({sweep.error}); "
                                                  "its releases are still checked and composed."))
    # the releases are read even when the store is not: a release that exists spent budget
    for f in sweep.release_files:
        try:
            rel = Release.from_dict(read_json(f, "release"))
            check_release_types(rel, f)
        except DPAuditError as e:
            sweep.unreadable += 1
            sweep.notes.append(Note("error", "sweep", f"sweep {sweep.name or where}: release skipped: {e}"))
            continue
        except (TypeError, ValueError) as e:
            sweep.unreadable += 1
            sweep.notes.append(Note("error", "sweep", f"sweep {sweep.name or where}: release {f} skipped: malformed fields ({e})."))
            continue
        sweep.releases.append(LoadedRelease(f.parent, rel))
    return sweep


def _mark_stale_failures(sweep: LoadedSweep) -> None:
    """Tag each failed task with whether the sweep's current spec (the one last run, kept in the
    store) still contains it: a failure left from an earlier version of the spec is reported as
    such instead of looking like a hole in the grid. Unknown (None) when the spec cannot be read."""
    keys = None
    if isinstance(sweep.spec, dict):
        try:
            from ..sweeps.spec import spec_from_dict

            keys = {t.key for t in spec_from_dict({k: v for k, v in sweep.spec.items() if k != "source"}).tasks()}
        except Exception:  # noqa: BLE001 - an old or foreign spec: say nothing rather than guess
            keys = None
    for fl in sweep.failures:
        fl["in_current_spec"] = None if keys is None else fl["key"] in keys


# ------------------------------------------------------------------ release field types

_STR = (str,)
_NUM_OR_NONE = ("target_epsilon", "noise_multiplier", "sample_rate", "clipping_norm")
_INT_OR_NONE = ("steps", "steps_executed", "normalizer")
_DICT = ("guarantee", "noise_source", "epsilons", "config", "metrics", "timings", "artefacts")


def check_release_types(rel: Release, where: Path) -> None:
    """Raise a one-line DataError when a release field has a type no writer produces.

    A report must never guess around a malformed claim: such a release is skipped with an
    error note rather than half-rendered.
    """

    def bad(name: str, rule: str, value: Any) -> DataError:
        return DataError(f"release {where}: {name} must be {rule}, got {value!r:.60}.")

    for name in ("mechanism", "id", "adjacency", "accountant", "partition", "privacy_unit"):
        v = getattr(rel, name)
        if not isinstance(v, str) or not v:
            raise bad(name, "a non-empty string", v)
    if not isinstance(rel.dataset, (dict, str)):
        raise bad("dataset", "an object", rel.dataset)
    if isinstance(rel.dataset, dict) and not isinstance(rel.dataset.get("name", ""), str):
        raise bad("dataset.name", "a string", rel.dataset.get("name"))
    for name in ("epsilon", "delta"):
        v = getattr(rel, name)
        if num(v) is None or isinstance(v, bool):
            raise bad(name, "a number", v)
    for name in _NUM_OR_NONE:
        v = getattr(rel, name)
        if v is not None and (num(v) is None or isinstance(v, bool)):
            raise bad(name, "a number or null", v)
    for name in _INT_OR_NONE:
        v = getattr(rel, name)
        if v is not None and integer(v) is None:
            raise bad(name, "an integer or null", v)
    for name in _DICT:
        v = getattr(rel, name)
        if not isinstance(v, dict):
            raise bad(name, "an object", v)
    if not isinstance(rel.non_private, bool):
        raise bad("non_private", "true or false", rel.non_private)
    if isinstance(rel.seed, (dict, list)):
        raise bad("seed", "an integer", rel.seed)
    if rel.command is not None and not isinstance(rel.command, (str, list)):
        raise bad("command", "a string or a list", rel.command)
    for name in ("created_at", "dpaudit_version", "git_commit"):
        v = getattr(rel, name)
        if v is not None and not isinstance(v, str):
            raise bad(name, "a string or null", v)


# ------------------------------------------------------------------ loading


#: File name of a one-run audit record (the one-run analysis writes it where audit.json would go).
ONE_RUN_FILE = "one_run.json"


def find_one_runs(paths: Iterable[Path]) -> list[Path]:
    """Every ``one_run.json`` at or below ``paths`` (files or folders; hidden folders skipped)."""
    out: list[Path] = []
    seen: set[Path] = set()
    for p in paths:
        if p.is_file():
            found = [p] if p.name == ONE_RUN_FILE else []
        else:
            found = sorted(f for f in p.rglob(ONE_RUN_FILE) if f.is_file() and _visible(f, p))
        for f in found:
            if f.resolve() not in seen:
                seen.add(f.resolve())
                out.append(f)
    return out


def load_inputs(paths: Iterable[str | os.PathLike]) -> Inputs:
    """Read every release, audit and sweep under ``paths``; unreadable files become error notes."""
    paths = list(paths)
    if not paths:
        raise UsageError("report inputs must be at least one release, audit or sweep path, got none.")
    release_files, audit_files, given, sweeps = discover_inputs(paths)
    out = Inputs(paths=[str(p) for p in given])
    out.sweeps = [load_sweep(sw) for sw in sweeps]
    for f in release_files:
        try:
            rel = Release.from_dict(read_json(f, "release"))
            check_release_types(rel, f)
        except DPAuditError as e:
            out.notes.append(Note("error", "inputs", f"release skipped: {e}"))
            continue
        except (TypeError, ValueError) as e:
            out.notes.append(Note("error", "inputs", f"release {f} skipped: malformed fields ({e})."))
            continue
        out.releases.append(LoadedRelease(f.parent, rel))
    one_run_files = find_one_runs(given)
    from ..audit_outputs import shareable_audit, shareable_one_run

    # Only the shareable part of an audit is ever read: keys an old file still publishes (scores
    # in score units, data-derived canary choices, reference optima) are dropped here.
    for what, files, add in (("audit", audit_files, lambda f, rec: out.audits.append(LoadedAudit(f.parent, (r := shareable_audit(rec)),
                                                                                                  AuditView.from_dict(r)))),
                             ("one-run record", one_run_files, lambda f, rec: out.one_runs.append(LoadedOneRun(f, shareable_one_run(rec))))):
        for f in files:
            try:
                rec = read_json(f, what)
            except DPAuditError as e:
                out.notes.append(Note("error", "inputs", f"{what} skipped: {e}"))
                continue
            add(f, rec)
    if not out.releases and not out.audits and not out.sweeps and not out.one_runs:
        if release_files or audit_files or one_run_files:
            msgs = "; ".join(n.message for n in out.notes[:3])
            raise DataError(f"no readable release or audit under the given paths ({msgs}).")
        raise DataError(
            f"no {RELEASE_FILE} or {_audit_file_name()} found under {', '.join(str(p) for p in given)}."
        )
    return out

"""Neighbour-diff harness: nothing a shareable file says depends on the private data beyond the mechanism's output.

Every command that writes a shareable file (``train`` for each catalogue entry it releases, ``audit``, one-run ``audit``,
``audit plan``, ``bundle``, ``report``, ``ledger export --shareable``) runs three times with the same public seeds and the
noise fixed (``--reproducible-noise``): twice on D and once on a neighbour D' (D minus one training record, or minus one
user for the user-level unit). A field may differ between D and D' only when

- it is declared mechanism output next to its writer (:data:`dpaudit.audit_outputs.MECHANISM_OUTPUT`), or
- it also differs between the two runs on D (ids, timestamps, keys drawn fresh per run: they carry no data).

Every shareable file is diffed (fail closed: only the files named as local in
:data:`dpaudit.audit_outputs.LOCAL_FILES` are skipped). D' is made here, in the test only: the dataset loaders are wrapped
so that the first training record (or every record of the first user) is gone, the split of every other record unchanged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from dpaudit import audit_outputs as ao
from dpaudit.catalogue import CATALOGUE, names
from dpaudit.cli import app
from dpaudit.data import registry, users
from dpaudit.data.rows import RowSet
from dpaudit.ledger import signing as sg
from dpaudit.ledger.book import open_ledger
from dpaudit.mechanisms.mixmin import tasks as mixmin_tasks
from dpaudit.requests import MixMinRequest

runner = CliRunner()
WORLDS = ("D", "D-again", "D-minus-one")
#: The first training record (or user) is the one the neighbour lacks.
DROPPED = 0
RECORDS_PER_USER = 4

# ------------------------------------------------------------------------------ the neighbour (test only)


def _without_private(rows: tuple, gone: set) -> tuple:
    return tuple(
        RowSet(r.source, r.role, tuple(i for i in r.ids if i not in gone))
        if r.role == "private" and r.ids
        else r
        for r in rows
    )


def _drop_train(data, keep: np.ndarray):
    """``data`` (a PreparedDataset) without the training records ``~keep``; every other partition unchanged."""
    gone_ids = set()
    private = next((r for r in data.rows if r.role == "private" and r.ids), None)
    if private is not None:
        gone_ids = {private.ids[i] for i in np.flatnonzero(~keep)}
    return dataclasses.replace(
        data,
        x_train=data.x_train[keep],
        y_train=data.y_train[keep],
        rows=_without_private(data.rows, gone_ids),
    )


def _drop_task_record(task):
    """A MixMin task without its first private training record (public rows, val and test unchanged)."""
    gone = int(task.train_idx[DROPPED])
    keep = np.ones(len(task.private_x), dtype=bool)
    keep[gone] = False
    remap = np.cumsum(keep) - 1

    def reindex(idx):
        idx = np.asarray(idx)
        return remap[idx[idx != gone]]

    ids = None if task.record_ids is None else np.asarray(task.record_ids)[keep]
    gone_ids = set() if task.record_ids is None else {int(task.record_ids[gone])}
    return dataclasses.replace(
        task,
        private_x=task.private_x[keep],
        private_records=task.private_records[keep],
        targets={k: np.asarray(v)[keep] for k, v in task.targets.items()},
        train_idx=reindex(task.train_idx),
        val_idx=reindex(task.val_idx),
        test_idx=reindex(task.test_idx),
        record_ids=ids,
        rows=_without_private(task.rows, gone_ids),
    )


def _replace_everywhere(mp: pytest.MonkeyPatch, real, fake) -> None:
    """Set ``fake`` in place of ``real`` on every loaded dpaudit module that holds it by name."""
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] == "dpaudit":
            for attr, value in list(vars(module).items()):
                if value is real:
                    mp.setattr(module, attr, fake)


@contextlib.contextmanager
def neighbour(mp: pytest.MonkeyPatch, world: str, unit: str):
    """Within: the loaders return D (``world`` D / D-again) or D' (D-minus-one; ``unit`` record or user)."""
    if world != "D-minus-one":
        yield
        return
    real_load, real_task, real_users = (
        registry._load,
        mixmin_tasks.load_task,
        users.split_prepared_by_users,
    )

    def load(*a, **k):
        data = real_load(*a, **k)
        if unit == "user":
            return data  # the user is dropped after the split by users below
        keep = np.ones(len(data.y_train), dtype=bool)
        keep[DROPPED] = False
        return _drop_train(data, keep)

    def split_by_users(*a, **k):
        """The split by users of D, then every training record of its first training user removed."""
        data = real_users(*a, **k)
        train_users = data.user_ids["train"]
        keep = train_users != train_users[DROPPED]
        return dataclasses.replace(
            _drop_train(data, keep), user_ids={**data.user_ids, "train": train_users[keep]}
        )

    mixmin_tasks._TASK_CACHE.clear()
    mp.setattr(registry, "_load", load)
    # Every module that bound a loader by name gets the neighbour's, so a path added later is covered too.
    _replace_everywhere(mp, real_users, split_by_users)
    _replace_everywhere(mp, real_task, lambda *a, **k: _drop_task_record(real_task(*a, **k)))
    try:
        yield
    finally:
        mixmin_tasks._TASK_CACHE.clear()


# ------------------------------------------------------------------------------ running the commands


def _ok(args: list[str]) -> str:
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == 0, f"{' '.join(map(str, args))}: {r.output}"
    return r.stdout


def _user_ids(root: Path) -> Path:
    """G rows per user, one id per row of the dataset before splitting (a user-supplied FILE.npy, the same in every world)."""
    f = root / "users.npy"
    if not f.exists():
        n = sum(registry.dataset_info("digits").split_sizes.values())
        np.save(f, np.arange(n) // RECORDS_PER_USER)
    return f


#: Small sizes per family (about a second each); a family not named here trains with its defaults.
FAMILY_ARGS = {
    "dp-sgd-head": ["--epochs", "1"],
    "dp-sgd-module": ["--epochs", "1"],
    "dp-mixmin": ["--steps", "10"],
}


def _train_command(name: str) -> str:
    """The ``dpaudit train`` sub-command of a catalogue entry (its first alias where the CLI uses one)."""
    entry = CATALOGUE[name]
    return entry.aliases[0] if entry.aliases else entry.name


@contextlib.contextmanager
def _world(root: Path, world: str, unit: str = "record"):
    """A fresh ledger and folder per run; D' through the loaders."""
    d = root / world
    d.mkdir(parents=True, exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DPAUDIT_LEDGER", str(d / "ledger.sqlite"))
        mp.setenv("MPLBACKEND", "Agg")
        mp.setenv("XDG_CONFIG_HOME", str(d / "cfg"))
        mp.chdir(d)
        with neighbour(mp, world, unit):
            yield d


def train(root: Path, world: str, name: str, unit: str = "record") -> Path:
    with _world(root, world, unit) as d:
        args = ["train", _train_command(name), "--reproducible-noise", "--out", d / "rel"]
        args += FAMILY_ARGS.get(CATALOGUE[name].family, [])
        if unit == "user":
            args += [
                "--privacy-unit",
                "user",
                "--records-per-user",
                RECORDS_PER_USER,
                "--user-ids",
                _user_ids(root),
                "--reference-size",
                300,
            ]  # the public number of users the schedule is built from
        _ok(args)
        return d


# ------------------------------------------------------------------------------ reading and diffing shareable files


def shareable_files(folder: Path) -> dict[str, object]:
    """Relative path -> parsed JSON (or the bytes' digest) of every file under ``folder`` that is not local."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if (
            not p.is_file()
            or p.name in ao.LOCAL_FILES
            or p.suffix in (".sqlite", ".npy")
            or ".sqlite" in p.name
        ):
            continue
        rel = _ID_DIR.sub(
            "<id>", p.relative_to(folder).as_posix()
        )  # a bundle files each record under its run's id
        out[rel] = (
            _inner(json.loads(p.read_text()))
            if p.suffix == ".json"
            else hashlib.sha256(p.read_bytes()).hexdigest()
        )
    return out


_ID_DIR = re.compile(r"(?<=/)[0-9a-f]{32}(?=/)")


def _inner(doc):
    """JSON with JSON-encoded strings (a ledger entry's payload text) parsed, so their fields are diffed one by one."""
    if isinstance(doc, dict):
        return {k: _inner(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_inner(v) for v in doc]
    if isinstance(doc, str) and doc[:1] in "{[" and doc[-1:] in "}]":
        try:
            return _inner(json.loads(doc))
        except ValueError:
            return doc
    return doc


def diff(a, b, path=()) -> list[tuple[tuple, object, object]]:
    """``(path, a value, b value)`` of every leaf where ``a`` and ``b`` differ (lists of unequal length: the list)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [
            d
            for k in sorted(set(a) | set(b), key=str)
            for d in diff(a.get(k, "<absent>"), b.get(k, "<absent>"), path + (k,))
        ]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff(x, y, path + (i,))]
    if a == b:
        return []
    if (
        isinstance(a, str) and isinstance(b, str) and len(a) != len(b)
    ):  # keyed or random strings: their length may still tell
        return [(path, a, b), (path + ("<length>",), len(a), len(b))]
    return [(path, a, b)]


def _generic(path: tuple) -> tuple:
    """A path with list positions and ids as ``*`` (so one run's ids match another's)."""
    return tuple("*" if isinstance(k, int) else k for k in path)


_STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(\+00:00|Z)$")


def _clock_readings(va, vb) -> bool:
    """Both values are UTC timestamps (two runs in the same second may share one, so run-to-run alone cannot tell)."""
    return all(isinstance(v, str) and _STAMP.match(v) for v in (va, vb))


def document_kind(rel: str, artefacts: set) -> str:
    """The declared kind of a shareable file; a file a release lists under ``artefacts`` is the published model."""
    return "artefact" if rel.rsplit("/", 1)[-1] in artefacts else ao.document_kind(rel)


def _artefacts(files: dict) -> set:
    return {
        str(v)
        for rel, doc in files.items()
        if ao.document_kind(rel) == "release" and isinstance(doc, dict)
        for v in (doc.get("artefacts") or {}).values()
    }


def undeclared(files: dict[str, dict], run_to_run: set) -> list[str]:
    """Differences D vs D' neither declared as mechanism output nor seen between two runs on D."""
    a, b = files["D"], files["D-minus-one"]
    bad, artefacts = [], _artefacts(a) | _artefacts(b)
    for rel in sorted(set(a) | set(b)):
        kind = document_kind(rel, artefacts)
        for path, va, vb in diff(a.get(rel, "<absent>"), b.get(rel, "<absent>")):
            if (
                ao.is_mechanism_output(kind, path)
                or (rel, _generic(path)) in run_to_run
                or _clock_readings(va, vb)
            ):
                continue
            bad.append(
                f"{rel} [{kind}] {'/'.join(map(str, path)) or '<file>'}: D {repr(va)[:80]} vs D' {repr(vb)[:80]}"
            )
    return bad


def changes_between_d_runs(files: dict) -> set:
    a, b = files["D"], files["D-again"]
    return {
        (rel, _generic(path))
        for rel in set(a) | set(b)
        for path, _, _ in diff(a.get(rel, "<absent>"), b.get(rel, "<absent>"))
    }


def assert_only_outputs_differ(folders: dict[str, Path], must_differ: bool = True) -> None:
    files = {w: shareable_files(f) for w, f in folders.items()}
    assert files["D"], "no shareable file was written"
    bad = undeclared(files, changes_between_d_runs(files))
    if must_differ:  # the neighbour took effect: the mechanism's output moved
        assert diff(files["D"], files["D-minus-one"]), (
            "D and D' gave identical files: the neighbour was not used"
        )
    assert not bad, (
        "fields that depend on the private data but are not declared mechanism output:\n"
        + "\n".join(bad)
    )


# ------------------------------------------------------------------------------ the tests

TRAINABLE = names(trainable=True)
_FAST = ("dp-rvfl", "dp-elm", "dp-mixmin", "noisy-sum")


@pytest.mark.parametrize(
    "name", [n if n in _FAST else pytest.param(n, marks=pytest.mark.slow) for n in TRAINABLE]
)
def test_train_neighbour_diff(tmp_path, name):
    """``dpaudit train NAME``: release.json and the published artefacts differ only in declared output."""
    assert_only_outputs_differ({w: train(tmp_path, w, name) / "rel" for w in WORLDS})


def test_train_user_level_neighbour_diff(tmp_path):
    """User-level DP-SGD head: D minus one user (its G records, and its line of the user-ids file)."""
    assert_only_outputs_differ(
        {w: train(tmp_path, w, "dp-rvfl", unit="user") / "rel" for w in WORLDS}
    )


def _user_level_audit(root: Path, world: str, of_release: bool) -> Path:
    """A user-level audit on D minus one user: of a user-level release (its recorded N0), or fresh
    (``--reference-size``)."""
    with _world(root, world, "user") as d:
        users = ["--records-per-user", RECORDS_PER_USER, "--user-ids", _user_ids(root)]
        run = [
            "--runs",
            "8",
            "--no-controls",
            "--reproducible-noise",
            "--seed",
            "3",
            "--out",
            "aud",
        ]
        if of_release:
            _ok(
                [
                    "train",
                    "dp-rvfl",
                    "--reproducible-noise",
                    "--epochs",
                    "1",
                    "--privacy-unit",
                    "user",
                    *users,
                    "--reference-size",
                    300,
                    "--out",
                    "rel",
                ]
            )
            _ok(["audit", "dp-rvfl", "--release", "rel", *run])
        else:
            _ok(
                [
                    "audit",
                    "dp-rvfl",
                    "--privacy-unit",
                    "user",
                    *users,
                    "--reference-size",
                    300,
                    "--epochs",
                    "1",
                    *run,
                ]
            )
        return d


@pytest.mark.parametrize("of_release", [True, False], ids=["of-release", "fresh"])
def test_user_level_audit_neighbour_diff(tmp_path, of_release):
    """User-level audits: the schedule comes from the public N0 and no count of users or records is
    published; only the audit's results differ on D minus one user."""
    assert_only_outputs_differ(
        {w: _user_level_audit(tmp_path, w, of_release) / "aud" for w in WORLDS}
    )


def _first_mixture_record(seed: int) -> int:
    """Position (training order) of the first private training record in the audit's D_mix (public split)."""
    task = mixmin_tasks.load_task("digits-mix", seed=seed)
    rho = mixmin_tasks.resolved_rho(MixMinRequest(seed=seed))
    mix = mixmin_tasks.mixture_split(task.train_record_ids, rho, seed)[0]
    return int(min(mix))


def _mixmin_audit(root: Path, world: str, dropped: int) -> Path:
    """A DP-MixMin trial audit of the embedded task (small sizes) on D and on D minus one record of D_mix."""
    with _world(root, world) as d, pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            sys.modules[__name__], "DROPPED", dropped
        )  # a record of D_mix: the neighbour changes it
        _ok(
            [
                "audit",
                "dp-mixmin",
                "--runs",
                "8",
                "--no-controls",
                "--reproducible-noise",
                "--seed",
                "3",
                "--out",
                "aud",
            ]
        )
        return d


def test_mixmin_audit_neighbour_diff(tmp_path):
    """DP-MixMin audits publish neither D_mix's size nor data-derived canary choices."""
    dropped = _first_mixture_record(3)
    folders = {w: _mixmin_audit(tmp_path, w, dropped) / "aud" for w in WORLDS}
    n_mix = {
        w: json.loads((f / ao.AUDIT_LOCAL_FILE).read_text())["config"]["n_mix"]
        for w, f in folders.items()
    }
    assert (
        n_mix["D"] == n_mix["D-again"] == n_mix["D-minus-one"] + 1
    )  # the neighbour took effect on D_mix
    assert_only_outputs_differ(folders)


def _flow(root: Path, world: str) -> Path:
    """One release, a trial audit, a one-run audit, a plan, a bundle, a report and a shareable ledger export."""
    with _world(root, world) as d, pytest.MonkeyPatch.context() as mp:
        key = sg.keygen(
            "auditor"
        )  # a plan is signed: an auditor's key, registered in this run's ledger
        mp.setenv(sg.SIGNING_KEY_ENV, str(key.path))
        with open_ledger(str(d / "ledger.sqlite")) as ledger:
            ledger.register_key()
        _ok(["train", "dp-rvfl", "--reproducible-noise", "--epochs", "1", "--out", "rel"])
        # a plan is registered before any audit of its target (verify's rule)
        _ok(
            [
                "audit",
                "plan",
                "dp-rvfl",
                "--release",
                "rel",
                "--runs",
                "8",
                "--no-controls",
                "--seed",
                "3",
                "--out",
                "plan",
            ]
        )
        _ok(
            [
                "audit",
                "dp-rvfl",
                "--release",
                "rel",
                "--runs",
                "8",
                "--no-controls",
                "--reproducible-noise",
                "--seed",
                "3",
                "--out",
                "aud",
            ]
        )
        _ok(
            [
                "audit",
                "dp-rvfl",
                "--release",
                "rel",
                "--one-run",
                "--canaries",
                "20",
                "--reproducible-noise",
                "--seed",
                "3",
                "--out",
                "one",
            ]
        )
        _ok(["bundle", "rel", "aud", "one", "plan", "--out", "bundle"])
        (d / "report").mkdir()
        (d / "export").mkdir()
        _ok(["report", "aud", "--format", "json", "--out", "report/report.json"])
        _ok(["ledger", "export", "--shareable", "--out", "export/ledger.json"])
        for local in ("ledger.sqlite",):
            assert (d / local).exists()
        return d


@pytest.fixture(scope="module")
def flows(tmp_path_factory):
    root = tmp_path_factory.mktemp("flows")
    return {w: _flow(root, w) for w in WORLDS}


@pytest.mark.parametrize("folder", ["rel", "aud", "one", "plan", "bundle", "report", "export"])
def test_command_neighbour_diff(flows, folder):
    """audit, one-run audit, audit plan, bundle, report and ledger export: only declared output differs."""
    assert_only_outputs_differ({w: d / folder for w, d in flows.items()})


def test_harness_catches_an_undeclared_difference():
    """The diff itself: a field that differs between D and D' only, and is not declared, is named with both values."""
    files = {
        "D": {"audit.json": {"n_train": 212, "id": "a"}},
        "D-again": {"audit.json": {"n_train": 212, "id": "b"}},
        "D-minus-one": {"audit.json": {"n_train": 211, "id": "c"}},
    }
    bad = undeclared(files, changes_between_d_runs(files))
    assert bad == ["audit.json [audit] n_train: D 212 vs D' 211"]


def test_private_counts_are_local_only(tmp_path):
    """Finding: the exact training count was published (audit.json config, one_run.json info, the bundle's ledger rows)."""
    public, local = ao.split_audit(
        {"config": {"n_train": 212, "n_users": 53, "n_mix": 63, "reference_size": 212}}
    )
    assert public == {"config": {"reference_size": 212}} and local["config"] == {
        "n_train": 212,
        "n_users": 53,
        "n_mix": 63,
    }
    public, local = ao.split_one_run(
        {"info": {"n_train": 212, "n_units": 232, "reference_size": 212}}
    )
    assert public == {"info": {"reference_size": 212}} and local["info"] == {
        "n_train": 212,
        "n_units": 232,
    }
    from dpaudit.reports.verify import failed, make_bundle, verify_bundle

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DPAUDIT_LEDGER", str(tmp_path / "l.sqlite"))
        mp.chdir(tmp_path)
        _ok(
            ["train", "noisy-sum", "--out", "rel"]
        )  # private noise: verify fails a non-private release
        make_bundle(["rel"], ledger=str(tmp_path / "l.sqlite"), out=tmp_path / "b")
    rows = json.loads((tmp_path / "b" / "ledger.json").read_text())["rows"]
    payloads = [json.loads(r[5]) for r in rows if r[2] == "rows"]
    assert payloads and all(set(p) == {"withheld", "set"} for p in payloads)
    assert not failed(verify_bundle(tmp_path / "b"))
    # a withheld placeholder cannot stand in for another entry: relabelling the release entry fails verify
    for r in rows:
        if r[2] == "release":
            r[2], r[5] = "rows", json.dumps({"withheld": "rows", "set": payloads[0]["set"]})
    (tmp_path / "b" / "ledger.json").write_text(
        json.dumps({**json.loads((tmp_path / "b" / "ledger.json").read_text()), "rows": rows})
    )
    assert failed(verify_bundle(tmp_path / "b"))

"""Section ``provenance``: per dataset, its public identity, splits and seeds, and which data
version (an opaque label of the ledger's keyed fingerprint) its releases used: never a hash of
the private data, keyed or not, that a reader could test a candidate dataset against."""

from __future__ import annotations

import json
from typing import Any

from .inputs import LoadedAudit, LoadedRelease, Note


def _source_file_names(files: Any) -> list[str]:
    """The names of a dataset's source files: new releases publish a list of names, old ones a
    {name: sha256} dict whose hashes the report does not repeat (they fingerprint the data)."""
    if isinstance(files, dict):
        return sorted(str(k) for k in files)
    return [str(f) for f in files] if isinstance(files, list) else []


def _new_entry(name: Any, ds: dict) -> dict:
    public = {k: ds.get(k) for k in ("kind", "profile", "split_sizes", "n_features", "n_classes")}
    files = _source_file_names(ds.get("source_files"))
    found = {k: [] for k in ("data_versions", "split_seeds", "partitions", "releases", "audits")}
    return {"name": name, **public, "source_files": files, **found}


def _add(e: dict, key: str, v: Any) -> None:
    if v is not None and v not in e[key]:
        e[key].append(v)


def _add_release(
    e: dict, ds: dict, lr: LoadedRelease, fingerprints: dict[str, str], notes: list[Note]
) -> None:
    _add(e, "split_seeds", ds.get("split_seed"))
    _add(e, "partitions", lr.release.partition)
    _add(e, "data_versions", fingerprints.get(lr.release.id))
    for f in _source_file_names(ds.get("source_files")):
        _add(e, "source_files", f)
    e["releases"].append(lr.release.id)
    hashed_files = isinstance(ds.get("source_files"), dict) and ds["source_files"]
    if ds.get("sha256") or ds.get("user_ids_sha256") or hashed_files:
        text = (
            f"release {lr.release.id[:12]} (written by an older dpaudit) publishes unkeyed "
            "hashes of its private data in release.json, which tell neighbouring datasets apart; "
            "this report does not repeat them; do not republish that file."
        )
        notes.append(Note("warning", "provenance", text))


def _add_audit(by: dict[str, dict], la: LoadedAudit) -> None:
    name = la.view.dataset
    if name is None:
        return
    match = next((k for k, v in by.items() if name and v["name"] == name), None)
    if match is None:
        ds = la.view.dataset_info
        match = json.dumps([name, ds.get("profile")], default=str)
        by[match] = _new_entry(name, {**ds, "n_features": None, "n_classes": None})
        _add(by[match], "split_seeds", ds.get("split_seed"))
    by[match]["audits"].append(la.view.id or str(la.path))


def provenance(
    releases: list[LoadedRelease], audits: list[LoadedAudit], notes: list[Note], fingerprints: dict
) -> list[dict]:
    """Per dataset: its public identity, and the data version labels of its releases (``fingerprints``:
    release id -> label of the ledger's keyed fingerprint, only when a ledger was read). Never an unkeyed
    digest of the private data: an old release's ``dataset["sha256"]`` (or its source files' hashes) is
    not repeated here, and such a release gets a warning instead."""
    by: dict[str, dict] = {}
    for lr in releases:
        ds = lr.release.dataset
        ds = ds if isinstance(ds, dict) else {"name": str(ds)}
        key = json.dumps([ds.get("name"), ds.get("profile")], default=str)
        entry = by.setdefault(key, _new_entry(ds.get("name"), ds))
        _add_release(entry, ds, lr, fingerprints, notes)
    for e in by.values():
        if len(e["data_versions"]) > 1:
            text = (
                f"dataset {e['name']}: its releases used {len(e['data_versions'])} different data "
                "versions in the ledger (different private data under one name)."
            )
            notes.append(Note("warning", "provenance", text))
    for la in audits:
        _add_audit(by, la)
    return list(by.values())

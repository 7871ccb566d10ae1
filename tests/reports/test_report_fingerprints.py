"""A report never repeats an unkeyed hash of the private data,
nor the ledger's keyed fingerprint (whoever holds the key could test a candidate dataset against
it); it shows an opaque data version label instead."""

from __future__ import annotations

import json

from report_fixtures import DATASET, OLD_DATASET, make_release

from dpaudit.ledger.book import open_ledger
from dpaudit.reports import build_report, render_html, write_report


def _rendered(rep: dict, tmp_path) -> str:
    md = write_report(rep, tmp_path / "report.md", fmt="md").read_text()
    return json.dumps(rep) + render_html(rep) + md


def test_report_shows_a_data_version_label_never_the_digest_nor_the_keyed_fingerprint(tmp_path):
    digest = "ef" * 32
    rel = make_release(
        tmp_path / "r", data_digest=digest
    )  # the digest stays in memory, off release.json
    assert digest not in (tmp_path / "r" / "release.json").read_text()
    ledger = tmp_path / "l.sqlite"
    with open_ledger(ledger) as led:
        led.record(rel)
        fp = led.fingerprint(digest)
    assert fp != digest
    rep = build_report([tmp_path / "r"], ledger_path=ledger)
    prov = rep["sections"]["provenance"][0]
    assert (
        prov["data_versions"] == ["version 1"]
        and "sha256" not in prov
        and "fingerprints" not in prov
    )
    text = _rendered(rep, tmp_path)
    assert digest not in text and fp not in text and fp[:12] not in text
    assert prov["source_files"] == DATASET["source_files"]


def test_old_release_with_published_hashes_still_reports_without_repeating_them(tmp_path):
    rel = make_release(
        tmp_path / "old", dataset=OLD_DATASET
    )  # as written by dpaudit before this change
    ledger = tmp_path / "l.sqlite"
    with open_ledger(ledger) as led:
        led.record(rel)  # an old release: the ledger keys its published sha256
        fp = led.fingerprint(OLD_DATASET["sha256"])
    rep = build_report([tmp_path / "old"], ledger_path=ledger)
    prov = rep["sections"]["provenance"][0]
    assert prov["data_versions"] == ["version 1"] and fp not in _rendered(rep, tmp_path)
    assert prov["source_files"] == ["digits.csv"]  # names only, the old file hashes are dropped
    assert rep["sections"]["claim"][0]["release_id"] == rel.id  # the old release is still carded
    text = _rendered(rep, tmp_path)
    for raw in (OLD_DATASET["sha256"], OLD_DATASET["source_files"]["digits.csv"]):
        assert raw not in text
    warn = [n for n in rep["notes"] if n["section"] == "provenance"]
    assert len(warn) == 1 and rel.id[:12] in warn[0]["message"] and "unkeyed" in warn[0]["message"]


def test_two_fingerprints_under_one_dataset_name_are_flagged(tmp_path):
    a = make_release(tmp_path / "a", data_digest="01" * 32, seed=1)
    b = make_release(tmp_path / "b", data_digest="02" * 32, seed=2)
    ledger = tmp_path / "l.sqlite"
    with open_ledger(ledger) as led:
        led.record(a)
        led.declare_version(
            "digits", led.fingerprint("02" * 32), "test: a second version of the data"
        )  # else refused
        led.record(b)
        fps = [led.fingerprint("01" * 32), led.fingerprint("02" * 32)]
    rep = build_report([tmp_path], ledger_path=ledger)
    assert sorted(rep["sections"]["provenance"][0]["data_versions"]) == ["version 1", "version 2"]
    assert any("2 different data versions" in n["message"] for n in rep["notes"])
    text = _rendered(rep, tmp_path)
    assert not any(fp in text or fp[:12] in text for fp in fps)


def test_report_shows_voided_budget_apart(tmp_path):
    """What voids took out of the total is shown beside it, not hidden."""
    a = make_release(tmp_path / "a", data_digest="01" * 32, seed=1)
    b = make_release(tmp_path / "b", data_digest="01" * 32, seed=2)
    ledger = tmp_path / "l.sqlite"
    with open_ledger(ledger) as led:
        led.record(a)
        led.record(b)
        led.void(b.id, "recorded by mistake", published=False)
        voided = next(r for r in led.summary() if r["partition"] == "*")["voided_epsilon"]
    rep = build_report([tmp_path / "a"], ledger_path=ledger)
    row = next(r for r in rep["sections"]["budget"]["summary"] if r["partition"] == "*")
    assert row["voided_epsilon"] == voided > 0 and row["voided_releases"] == 1
    md = write_report(rep, tmp_path / "report.md", fmt="md").read_text()
    assert "voided eps (not counted)" in md and f"{voided:.4f}"[:5] in md

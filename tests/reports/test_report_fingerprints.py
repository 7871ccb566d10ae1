"""Issue 13 point 5: a report never repeats an unkeyed hash of the private data; it shows the
ledger's keyed dataset fingerprint instead."""

from __future__ import annotations

import json

from report_fixtures import DATASET, OLD_DATASET, make_release

from dpaudit.accounting.ledger import open_ledger
from dpaudit.reports import build_report, render_html, write_report


def _rendered(rep: dict, tmp_path) -> str:
    md = write_report(rep, tmp_path / "report.md", fmt="md").read_text()
    return json.dumps(rep) + render_html(rep) + md


def test_report_shows_the_keyed_fingerprint_from_the_ledger_never_the_digest(tmp_path):
    digest = "ef" * 32
    rel = make_release(tmp_path / "r", data_digest=digest)  # the digest stays in memory, off release.json
    assert digest not in (tmp_path / "r" / "release.json").read_text()
    ledger = tmp_path / "l.sqlite"
    with open_ledger(ledger) as led:
        led.record(rel)
        fp = led.fingerprint(digest)
    assert fp != digest
    rep = build_report([tmp_path / "r"], ledger_path=ledger)
    prov = rep["sections"]["provenance"][0]
    assert prov["fingerprints"] == [fp] and "sha256" not in prov
    text = _rendered(rep, tmp_path)
    assert digest not in text and fp in render_html(rep)
    assert prov["source_files"] == DATASET["source_files"]


def test_old_release_with_published_hashes_still_reports_without_repeating_them(tmp_path):
    rel = make_release(tmp_path / "old", dataset=OLD_DATASET)  # as written by dpaudit before this change
    ledger = tmp_path / "l.sqlite"
    with open_ledger(ledger) as led:
        led.record(rel)  # an old release: the ledger keys its published sha256
        fp = led.fingerprint(OLD_DATASET["sha256"])
    rep = build_report([tmp_path / "old"], ledger_path=ledger)
    prov = rep["sections"]["provenance"][0]
    assert prov["fingerprints"] == [fp]
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
        led.declare_version("digits", led.fingerprint("02" * 32), "test: a second version of the data")  # else refused
        led.record(b)
        fps = [led.fingerprint("01" * 32), led.fingerprint("02" * 32)]
    rep = build_report([tmp_path], ledger_path=ledger)
    assert sorted(rep["sections"]["provenance"][0]["fingerprints"]) == sorted(fps)
    assert any("different keyed fingerprints" in n["message"] for n in rep["notes"])

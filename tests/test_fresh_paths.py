"""Default output names: the given one when free, else the first free -2, -3, ... (never reused)."""

from __future__ import annotations

from dpaudit.paths import fresh_file, fresh_folder


def test_fresh_folder_skips_folders_holding_results_only(tmp_path):
    base = tmp_path / "audits" / "run"
    assert fresh_folder(base) == base  # absent
    base.mkdir(parents=True)
    assert fresh_folder(base) == base  # empty: may be written to (or resumed)
    (base / "audit.json").write_text("{}")
    (tmp_path / "audits" / "run-2").mkdir()
    (tmp_path / "audits" / "run-2" / "release.json").write_text("{}")
    (tmp_path / "audits" / "run-3").mkdir()  # no results: the first free one
    assert fresh_folder(base) == tmp_path / "audits" / "run-3"
    assert fresh_folder(base, names=("other.json",)) == base


def test_fresh_file_numbers_the_stem(tmp_path):
    base = tmp_path / "report.html"
    assert fresh_file(base) == base
    base.write_text("x")
    assert fresh_file(base) == tmp_path / "report-2.html"
    (tmp_path / "report-2.html").write_text("x")
    (tmp_path / "report-4.html").write_text("x")
    assert fresh_file(base) == tmp_path / "report-3.html"

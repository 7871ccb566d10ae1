"""The report's first table: a "not certified" one-run audit is never green and says so in its row;
an audit that cannot detect a violation (ceiling below its claim) is flagged in its row in words;
the ledger summary fits without breaking words (no table so wide it needs it)."""

from __future__ import annotations

from pathlib import Path

from dpaudit.records import write_json_atomic
from dpaudit.reports import build_report, write_report
from dpaudit.reports.blocks import budget_blocks, layout, summary_rows
from dpaudit.reports.html import render_html


def _one_run(*, claimed: float, ceiling: float, lb: float = 0.5, **extra) -> dict:
    return {
        "schema": "dpaudit.one-run/1",
        "canaries": 1000,
        "kind": "gradient",
        "included": 497,
        "steinke": {
            "epsilon_lower_bound": lb,
            "k_pos": 50,
            "k_neg": 50,
            "guesses": 100,
            "correct": 60,
            "ceiling": ceiling,
            "method": "Steinke, Nasr & Jagielski 2023",
        },
        "fdp": None,
        "claimed_epsilon": claimed,
        "delta": 1e-5,
        "confidence": 0.95,
        "mechanism": "opacus",
        **extra,
    }


def _report(tmp_path: Path, records: dict[str, dict]) -> dict:
    for name, rec in records.items():
        write_json_atomic(tmp_path / name / "one_run.json", rec)
    return build_report([tmp_path], ledger_path=None)


def _first_table_row(rep: dict) -> list[str]:
    (_key, _heading, blocks) = layout(rep)[0]
    (row,) = blocks[0].rows
    return row


def test_not_certified_one_run_is_never_green_and_says_so_in_its_row(tmp_path):
    rec = _one_run(
        claimed=2.0,
        ceiling=6.0,
        findings=[{"code": "noise-scale", "message": "noise below the declared"}],
        certified="not certified: pipeline findings",
    )
    rep = _report(tmp_path, {"run": rec})
    (v,) = rep["sections"]["verdict"]
    assert v["status"] != "no-evidence"
    cell = _first_table_row(rep)[-1]
    assert "not certified" in cell and "noise-scale" in cell
    html = render_html(rep, figures=[])
    first_screen = html.split("<details", 1)[0]
    assert "not certified" in first_screen and 'class="no-evidence"' not in first_screen


def test_underpowered_one_run_is_flagged_in_its_row(tmp_path):
    rep = _report(tmp_path, {"run": _one_run(claimed=7.99, ceiling=5.27)})
    (v,) = rep["sections"]["verdict"]
    assert "underpowered" in v["flags"] and "cannot detect a violation" in v["line"]
    cell = _first_table_row(rep)[-1]
    assert "underpowered" in cell and "5.27" in cell
    (row,) = summary_rows(rep["sections"]["verdict"])
    assert row["ceiling"] == 5.27


def test_one_run_with_a_ceiling_above_the_claim_is_not_flagged(tmp_path):
    rep = _report(tmp_path, {"run": _one_run(claimed=2.0, ceiling=5.27)})
    (v,) = rep["sections"]["verdict"]
    assert v["status"] == "no-evidence" and "underpowered" not in v["line"]


FULL_ROW = {
    "dataset": "heart",
    "partition": "*",
    "adjacency": "add-remove-record",
    "releases_subtree": 3,
    "non_private_releases": 1,
    "epsilon": 2.5,
    "bound_by": "prv",
    "epsilon_rdp": 2.7,
    "epsilon_prv": 2.5,
    "epsilon_pure": None,
    "naive_epsilon": 4.0,
    "delta": 1e-5,
    "cap": {"epsilon": 8.0, "delta": 1e-5},
    "remaining": 5.5,
    "voided_releases": 0,
    "audits": 1,
    "audit_epsilon": 30.0,
    "epsilon_with_audits": 32.5,
    "voided_epsilon": 0.0,
    "voided_published_releases": 0,
}


def test_budget_tables_fit_without_breaking_words(tmp_path):
    rep = {
        "sections": {
            "budget": {
                "available": True,
                "ledger": "ledger.db",
                "summary": [dict(FULL_ROW)],
                "entries": [],
                "verify": {"ok": True},
                "composition": [],
            }
        }
    }
    tables = [b for b in budget_blocks(rep) if b.kind == "table"]
    shown = {h for b in tables for h in b.headers}
    assert all(len(b.headers) <= 12 for b in tables), [len(b.headers) for b in tables]
    # nothing is dropped: every value of the row is in one of the tables
    assert {
        "composed eps",
        "remaining",
        "eps (rdp)",
        "voided eps (not counted)",
        "audits' eps",
    } <= shown
    from dpaudit.reports.html import _table

    assert all('class="many"' not in _table(b) for b in tables)

"""The power line on the report's rows: one-run audits show theirs, and records written before the
power block existed still load and say "power: not recorded"."""

from __future__ import annotations

import shutil
from pathlib import Path

from dpaudit.accounting.events import PureEpsilon
from dpaudit.audits.power_runs import one_run_power
from dpaudit.records import write_json_atomic
from dpaudit.reports import build_report
from dpaudit.reports.audit_blocks import DETAIL_HEADERS, ONE_RUN_HEADERS, audit_blocks

OLD_AUDIT = Path(__file__).parents[1] / "audits" / "old_audits" / "gaussian-broken.json"


def _one_run(**extra) -> dict:
    return {
        "schema": "dpaudit.one-run/1",
        "canaries": 1000,
        "kind": "gradient",
        "included": 497,
        "steinke": {
            "epsilon_lower_bound": 0.5,
            "k_pos": 50,
            "k_neg": 50,
            "guesses": 100,
            "correct": 60,
            "ceiling": 5.27,
            "method": "Steinke, Nasr & Jagielski 2023",
        },
        "fdp": None,
        "claimed_epsilon": 2.0,
        "delta": 1e-5,
        "confidence": 0.95,
        "mechanism": "opacus",
        **extra,
    }


def _cells(rep: dict, headers: list[str]) -> list[list[str]]:
    (block,) = [b for b in audit_blocks(rep) if getattr(b, "headers", None) == headers]
    return [dict(zip(headers, row)) for row in block.rows]


def test_one_run_rows_show_their_power_and_old_ones_say_not_recorded(tmp_path):
    power = one_run_power(1000, delta=1e-5, claim=PureEpsilon(2.0)).to_dict()
    write_json_atomic(tmp_path / "new" / "one_run.json", _one_run(power=power))
    write_json_atomic(tmp_path / "old" / "one_run.json", _one_run())
    rep = build_report([tmp_path], ledger_path=None)
    cells = {
        row["record"]: row["power (what this m can detect)"] for row in _cells(rep, ONE_RUN_HEADERS)
    }
    assert cells["old"] == "power: not recorded"
    assert cells["new"].startswith(
        f"limit {power['ceiling']:.3f}; at claim {power['at_claim']:.3f}; detects noise x "
    )
    assert cells["new"].endswith(f"90 % of claim: {power['trials_for_90']:,} canaries")
    verdicts = {Path(v["audits"][0]).parent.name: v for v in rep["sections"]["verdict"]}
    assert (
        verdicts["new"]["power"] == cells["new"]
        and verdicts["old"]["power"] == "power: not recorded"
    )


def test_an_audit_json_without_power_still_reports(tmp_path):
    shutil.copy(OLD_AUDIT, tmp_path / "audit.json")
    rep = build_report([tmp_path], ledger_path=None)
    (row,) = _cells(rep, DETAIL_HEADERS)
    assert row["power (what this N can detect)"] == "power: not recorded"

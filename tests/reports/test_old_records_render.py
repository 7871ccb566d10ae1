"""Every stored audit record, old or foreign, and its edited variants render to the report model
the previous reader produced (data/old_records_reports.json: a digest per case, written by that
reader with ``python tests/reports/test_old_records_render.py --write`` on its source tree).

data/old_records.json holds records as their writers left them: tests/audits/old_audits'
pre-claimed-curve record, current Clopper-Pearson and claimed-curve records, a claimed-curve record
from before the general bound, and a foreign one (older key names, controls as a list, ROC pairs).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from dpaudit.errors import DPAuditError
from dpaudit.reports import build_report

DATA = Path(__file__).resolve().parent / "data"
RECORDS = json.loads((DATA / "old_records.json").read_text())
GOLDEN = DATA / "old_records_reports.json"
#: Keys whose absence or corruption changes how a record is read (migration, verdict, evidence).
EDITED = ("statistic", "general_bound", "claimed_curve", "clopper_pearson_epsilon", "counts")
EDITED += ("epsilon_lower_bound", "controls", "threat_model", "comparison", "dataset")


def variants(record: dict):
    """(name, record) of ``record`` as stored, without each key of EDITED, and with it malformed."""
    yield "as stored", record
    for key in EDITED:
        yield f"without {key}", {k: v for k, v in record.items() if k != key}
        yield f"{key} malformed", {**record, key: {"a": 1}}
    yield "with a plan", {**record, "plan": {"id": "p1"}, "plan_id": "p2"}


def cases():
    return [(f"{name}: {edit}", rec) for name, r in RECORDS.items() for edit, rec in variants(r)]


def digest(record: dict, folder: Path) -> str:
    """sha256 of the report model of ``record`` (or of its one-line error) with the folder, the
    time and the running version taken out."""
    folder.mkdir(parents=True)
    (folder / "audit.json").write_text(json.dumps(record))
    try:
        model = build_report([folder])
        for key in ("generated_at", "git_commit", "dpaudit_version"):
            model.pop(key)
        text = json.dumps(model)
    except DPAuditError as e:
        text = f"error: {e}"
    return hashlib.sha256(text.replace(str(folder), "<audit>").encode()).hexdigest()


def test_every_stored_record_renders_as_the_previous_reader_rendered_it(tmp_path, monkeypatch):
    monkeypatch.setenv("DPAUDIT_LEDGER", str(tmp_path / "no-ledger.sqlite"))
    golden = json.loads(GOLDEN.read_text())
    got = {name: digest(rec, tmp_path / str(i)) for i, (name, rec) in enumerate(cases())}
    assert set(got) == set(golden)
    assert [name for name in got if got[name] != golden[name]] == []


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        mp.setenv("DPAUDIT_LEDGER", str(Path(tmp, "no-ledger.sqlite")))
        out = {name: digest(rec, Path(tmp, str(i))) for i, (name, rec) in enumerate(cases())}
    GOLDEN.write_text(json.dumps(out, indent=1) + "\n")

"""A shareable export withholds row-set payloads; only a payload that is a JSON object naming the
withheld set stands for one. Any other payload of a row-set entry is checked against its hash, so an
edited entry is named, never skipped (nor a crash of the checker)."""

from __future__ import annotations

from dpaudit.accounting.events import PureEpsilon
from dpaudit.data.rows import RowSet
from dpaudit.ledger.book import open_ledger
from dpaudit.ledger.integrity import Snapshot, verify_snapshot, withhold_row_sets


def _shared_export(tmp_path) -> tuple[dict, dict]:
    with open_ledger(tmp_path / "ledger.sqlite") as led:
        led.reserve(
            dataset="toy",
            partition="train",
            event=PureEpsilon(0.5),
            adjacency="add-remove-record",
            data_rows=(RowSet("s", "private", tuple(range(10))),),
        )
        return withhold_row_sets(led.export_rows()), led.head()


def _verify(dump: dict, head: dict, rows) -> object:
    snap = Snapshot(
        "ledger.json",
        "export",
        dump["schema_version"],
        (head["seq"], head["entries"], head["hash"]),
        [tuple(r) for r in rows],
    )
    return verify_snapshot(snap, anchor=None, owner=None)


def test_a_shareable_export_verifies(tmp_path):
    dump, head = _shared_export(tmp_path)
    assert _verify(dump, head, dump["rows"]).ok


def test_a_row_set_payload_that_is_not_an_object_is_checked_not_taken_as_withheld(tmp_path):
    dump, head = _shared_export(tmp_path)
    rows = [list(r) for r in dump["rows"]]
    row_set = next(r for r in rows if r[2] == "rows")
    row_set[5] = '"withheld"'  # a JSON string that merely contains the marker
    rep = _verify(dump, head, rows)
    assert not rep.ok
    assert any(p.kind == "edited" and p.seq == row_set[0] for p in rep.problems)

"""The ledger in words, pinned to the characters: the one-line description of every entry kind
(``ledger list``) and the summary table and notes of a small ledger (``ledger summary``)
(``ledger_text_golden.json``, written by the code before the ledger's text was restructured).
Random ids are masked."""

from __future__ import annotations

import json
import re
from pathlib import Path

from dpaudit.accounting.events import PureEpsilon
from dpaudit.data.rows import RowSet
from dpaudit.ledger import text
from dpaudit.ledger.book import Entry, open_ledger

GOLDEN = Path(__file__).with_name("ledger_text_golden.json")
GUARANTEE = PureEpsilon(0.5).to_dict()
SPEND = {"partition": "train", "mechanism": "m", "guarantee": GUARANTEE}
ADJ = "add-remove-record"

#: (kind, payload, extra Entry fields): every kind ``ledger list`` describes, in its variants.
ENTRIES = [
    ("release", {**SPEND, "epsilon": 0.5, "delta": 1e-5}, {}),
    ("release", {**SPEND, "epsilon": 0.5, "delta": 0.0, "uncertified": "why"}, {"voided_by": "v"}),
    ("release", {**SPEND, "non_private": True, "sweep": {"name": "sw"}}, {}),
    ("reservation", {**SPEND, "pid": 7}, {}),
    ("reservation", {**SPEND, "pid": 7, "uncertified": "u"}, {"closed_by": "c", "closed_as": "x"}),
    ("audit", {**SPEND, "trials": 3, "release_id": "r" * 20}, {}),
    ("audit", {**SPEND, "trials": 3, "non_private": True, "unbounded_reason": "no noise"}, {}),
    ("void", {"target": "t", "reason": "oops"}, {}),
    ("void", {"target": "t", "reason": "oops", "artefacts_published": True}, {}),
    ("void", {"target": "t", "reason": "oops", "artefacts_published": False}, {}),
    ("settle", {"target": "t", "releases": ["a", "b"]}, {}),
    ("cancel", {"target": "t", "reason": "failed"}, {}),
    ("version", {"fingerprint": "f" * 64, "reason": "new data"}, {}),
    ("cap", {"epsilon": 2.0, "delta": 1e-6}, {}),
    ("cap", {"epsilon": 2.0, "delta": 1e-6, "include_audits": True}, {}),
    ("key", {"key_id": "k", "name": "n", "role": "owner"}, {"signer": "s"}),
    ("key", {"key_id": "k", "name": "n", "role": "member"}, {}),
    ("plan", {"stage": "registered", "plan_id": "p"}, {}),
    ("plan", {"stage": "run", "plan_id": "p", "audit_id": "a"}, {}),
    ("plan", {"stage": "result", "plan_id": "p", "audit_id": "a", "sha256": "s" * 20}, {}),
    ("plan", {}, {}),
    ("policy", {"require_signatures": True}, {}),
    ("policy", {}, {}),
    ("rows", {"set": "z" * 20, "source": "digits", "count": 9}, {}),
    ("partition", {"parent": "train", "children": ["train/a", "train/b"], "declared_by": "me"}, {}),
    ("unknown", {}, {}),
]


def _entry(kind: str, payload: dict, extra: dict) -> Entry:
    return Entry(1, "id", kind, "t", "ds", payload, "p", "h", **extra)


def _rows(private) -> tuple:
    return (RowSet("s", "private", tuple(private)),)


def _masked(lines) -> list:
    return [re.sub(r"\b[0-9a-f]{12,32}\b", "<id>", str(line)) for line in lines]


def text_answers(path) -> dict:
    """Every entry kind described, then the summary table and notes of a small ledger."""
    with open_ledger(path) as led:
        led.cap("a", 3.0, 1e-5)
        plan = dict(partition="train", adjacency=ADJ)
        led.reserve(dataset="a", event=PureEpsilon(0.8), data_rows=_rows(range(10)), **plan)
        led.reserve(dataset="b", event=PureEpsilon(0.5), data_rows=_rows(range(5, 15)), **plan)
        led.declare_partition("a", "train", ["train/x", "train/y"], "golden")
        audit = dict(partition="train", adjacency=ADJ, trials=2, mechanism="m")
        led.record_audit(audit_id="audit1", dataset="a", event=PureEpsilon(0.3), **audit)
        led.record_audit(audit_id="audit2", dataset="c", event=None, **audit)
        cancelled = led.reserve(dataset="b", event=PureEpsilon(0.1), **plan)
        led.void(cancelled, "killed", published=False)
        rows = led.summary()
    return {
        "describe": [text.describe(_entry(*e)) for e in ENTRIES],
        "table": _masked(text.summary_table(rows)),
        "notes": _masked(text.summary_notes(rows)),
    }


def test_the_ledger_in_words_matches_the_golden_file(tmp_path):
    assert text_answers(tmp_path / "ledger.sqlite") == json.loads(GOLDEN.read_text())


if __name__ == "__main__":  # writes the golden file (run with the code it should pin)
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        answers = text_answers(Path(folder) / "ledger.sqlite")
    GOLDEN.write_text(json.dumps(answers, indent=1, sort_keys=True) + "\n")
    sys.exit(0)

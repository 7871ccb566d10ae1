"""The budget answers of a small ledger, pinned to the bytes: the summary rows, a budget check with
shared people and the refusals through a shared cap (``ledger_budget_golden.json``, written by the
code before the ledger's budget modules were merged). Ids are random, so they are left out."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dpaudit.accounting.events import PureEpsilon
from dpaudit.data.rows import RowSet
from dpaudit.errors import BudgetExceededError
from dpaudit.ledger.book import open_ledger
from dpaudit.ledger.compose import release_view

GOLDEN = Path(__file__).with_name("ledger_budget_golden.json")
ADJ = "add-remove-record"


def _rows(private, public=()):
    rows = (RowSet("s", "private", tuple(private)),)
    return rows + ((RowSet("s", "public", tuple(public)),) if public else ())


def _plain(value):
    """JSON-comparable: infinities as text, random ids dropped."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if not k.endswith("_ids")}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def _refusal(call) -> str:
    with pytest.raises(BudgetExceededError) as raised:
        call()
    return str(raised.value)


def budget_answers(path) -> dict:
    """Caps on two names that share people, releases, an audit, then every budget answer."""
    with open_ledger(path) as led:
        led.cap("a", 3.0, 1e-5)
        led.cap("b", 5.0, 1e-6, include_audits=False)
        plan = dict(partition="train", adjacency=ADJ)
        led.reserve(dataset="a", event=PureEpsilon(0.8), data_rows=_rows(range(10)), **plan)
        led.reserve(dataset="b", event=PureEpsilon(0.5), data_rows=_rows(range(5, 15)), **plan)
        led.reserve(dataset="c", event=PureEpsilon(0.4), data_rows=_rows(range(50, 60)), **plan)
        led.declare_partition("c", "train", ["train/x", "train/y"], "golden")
        audit = dict(partition="train", adjacency=ADJ, trials=2, mechanism="m")
        led.record_audit(audit_id="audit1", dataset="a", event=PureEpsilon(0.3), **audit)
        check = led.check(
            dataset="b", event=PureEpsilon(0.7), data_rows=_rows(range(5, 12)), **plan
        )
        big = dict(dataset="b", event=PureEpsilon(1.5), data_rows=_rows(range(12)), **plan)
        return {
            "summary": _plain(led.summary()),
            "summary_rdp": _plain(led.summary(accountants=("rdp",))),
            "check": _plain(check),
            "refused_release": _refusal(lambda: led.reserve(**big)),
            "refused_audit": _refusal(
                lambda: led.record_audit(audit_id="x", dataset="b", event=PureEpsilon(2.0), **audit)
            ),
            "refused_unbounded_audit": _refusal(
                lambda: led.record_audit(audit_id="y", dataset="b", event=None, **audit)
            ),
        }


def test_budget_answers_match_the_golden_file(tmp_path):
    assert budget_answers(tmp_path / "ledger.sqlite") == json.loads(GOLDEN.read_text())


def test_an_unreadable_stored_number_is_no_number():
    """A stored noise tail or claim that is not a number (a boolean included) gives no bound."""
    payload = {"partition": "train", "adjacency": ADJ, "guarantee": PureEpsilon(1.0).to_dict()}
    view = release_view("x", "d", {**payload, "noise_tail_delta": True, "epsilon": True})
    assert view.noise_tail_delta == math.inf and view.epsilon is None


if __name__ == "__main__":  # writes the golden file (run with the code it should pin)
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        answers = budget_answers(Path(folder) / "ledger.sqlite")
    GOLDEN.write_text(json.dumps(answers, indent=1, sort_keys=True) + "\n")
    sys.exit(0)

"""A sweep's budget rows byte for byte where the sweep corpus has no case: groups mixing private
releases, releases the store kept without their file (with and without the parameters their event
needs), non-private releases, ties for the largest single claim and a missing claim. The rows and
notes equal those of the reader that wrote data/sweep_budget_golden.json.

Regenerate (only when a change of output is intended) with
``python tests/reports/test_sweep_budget_golden.py --write`` on the source tree whose output is the
reference.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

DATA = Path(__file__).resolve().parent / "data"
GOLDEN = DATA / "sweep_budget_golden.json"
CORPUS = DATA / "golden_corpus"
#: (corpus release, fields replaced) of each release found below the sweep's folder.
RELEASES = (
    ("e1.0-s0", {}),
    ("e1.0-s1", {}),  # the same claim as e1.0-s0: a tie for the largest single claim
    ("e2.0-s0", {"id": "b" * 32, "epsilon": None}),  # no claim: counted as unbounded
    ("e4.0-s0", {"id": "c" * 32, "partition": "val"}),
    ("np", {"id": "d" * 32, "partition": "val"}),  # a non-private release: the group is unbounded
    ("e2.0-s1", {"id": "e" * 32, "partition": "test", "guarantee": None}),  # unreadable event
    ("e4.0-s1", {"id": "f" * 32, "partition": "test"}),
)
#: What the store kept of releases whose file is missing.
STORE = (
    {"dataset": "digits", "epsilon": 3.0, "delta": 1e-5, "noise_multiplier": 2.0}
    | {"sample_rate": 0.5, "steps": 8},
    {"dataset": "digits", "partition": "test", "epsilon": 1.0, "delta": 1e-6},  # no parameters
    {"dataset": "digits", "partition": "other", "non_private": True, "epsilon": None},
    {"dataset": "digits", "partition": "other", "adjacency": "replace-one", "epsilon": 0.5}
    | {"delta": 1e-5, "noise_multiplier": 4.0, "sample_rate": 1.0, "steps": 3},
)


def _budget() -> dict:
    from dpaudit.records import Release, read_json
    from dpaudit.reports import sweep

    releases = [
        SimpleNamespace(
            release=Release.from_dict(
                {**read_json(CORPUS / name / "release.json", "release"), **fields}
            )
        )
        for name, fields in RELEASES
    ]
    notes: list = []
    found = SimpleNamespace(releases=releases, name="golden")
    rows = sweep._budget(found, [sweep._from_store(r) for r in STORE], notes)
    return json.loads(json.dumps({"rows": rows, "notes": [n.to_dict() for n in notes]}))


def test_sweep_budget_rows_equal_the_stored_ones():
    want, got = json.loads(GOLDEN.read_text()), _budget()
    assert got == want
    assert [list(r) for r in got["rows"]] == [list(r) for r in want["rows"]]  # key order too


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    GOLDEN.write_text(json.dumps(_budget(), indent=2) + "\n")

"""Claim cards byte for byte where the report corpus has no case: a stored delta outside (0, 1) or
missing, stored epsilons as numbers, strings or {epsilon} blocks, and a claimed accountant beside
rdp and prv. Each card (its epsilon rows first of all) and its notes equal those of the reader
that wrote data/claim_rows_golden.json.

Regenerate (only when a change of output is intended) with
``python tests/reports/test_claim_rows_golden.py --write`` on the source tree whose output is the
reference.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
GOLDEN = DATA / "claim_rows_golden.json"
BASE = DATA / "golden_corpus" / "e1.0-s0" / "release.json"
#: Fields replaced in the corpus release, per case.
CASES = {
    "as written": {},
    "delta 0": {"delta": 0.0},
    "delta missing": {"delta": None},
    "delta above 1, stored blocks": {"delta": 1.5, "epsilons": {"rdp": {"epsilon": 0.7}}},
    "stored blocks and text": {"epsilons": {"rdp": {"epsilon": 0.7}, "prv": "0.8"}},
    "pure claimed, delta 0": {"accountant": "pure", "delta": 0.0, "epsilons": {"pure": 2.0}},
    "pld claimed": {"accountant": "pld", "epsilons": {"pld": {"epsilon": 0.74}}},
}


def _cards() -> dict:
    from dpaudit.records import Release, read_json
    from dpaudit.reports.claim import claim_card
    from dpaudit.reports.inputs import LoadedRelease

    out = {}
    for name, fields in CASES.items():
        notes: list = []
        release = Release.from_dict({**read_json(BASE, "release"), **fields})
        card = claim_card(LoadedRelease(Path("corpus"), release), notes)
        out[name] = {"card": card, "notes": [n.to_dict() for n in notes]}
    return json.loads(json.dumps(out, default=str))


def test_claim_cards_equal_the_stored_ones():
    want = json.loads(GOLDEN.read_text())
    got = _cards()
    for name in CASES:
        assert got[name] == want[name], name
        assert list(got[name]["card"]) == list(want[name]["card"]), name  # key order too
        rows = zip(got[name]["card"]["epsilons"], want[name]["card"]["epsilons"])
        assert all(list(g) == list(w) for g, w in rows), name


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    GOLDEN.write_text(json.dumps(_cards(), indent=2) + "\n")

"""Every value of a small grid of events, accountants and adjacencies is bit for bit what the code
gave before the accounting package was split by analysis (commit fc1e126): epsilons, deltas,
optimal orders, prv bounds, calibrated noise, RDP curves, and the text of every refusal.

The stored file was written by ``python tests/accounting/accounting_grid.py small`` with that
commit's ``src`` on PYTHONPATH; the larger grids of the same script (``quick``, ``full``) compare
two checkouts the same way.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "accounting_grid", Path(__file__).with_name("accounting_grid.py")
)
accounting_grid = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(accounting_grid)
STORED = Path(__file__).with_name("data") / "accounting_grid_small.json"


def test_small_grid_is_bit_identical_to_the_stored_values():
    stored = json.loads(STORED.read_text())
    now = json.loads(
        json.dumps(accounting_grid.small_grid(), sort_keys=True)
    )  # as stored: JSON types
    changed = sorted(
        k
        for k in stored.keys() | now.keys()
        if stored.get(k, "<missing>") != now.get(k, "<missing>")
    )
    assert not changed, f"{len(changed)} values changed, e.g. {changed[:3]}: " + "; ".join(
        f"{k}: {stored.get(k, '<missing>')!r} -> {now.get(k, '<missing>')!r}" for k in changed[:3]
    )
    assert len(stored) > 200

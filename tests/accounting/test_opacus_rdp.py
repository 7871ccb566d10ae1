"""The stand-alone load of Opacus's RDP analysis is Opacus's analysis, number for number."""

from __future__ import annotations

import itertools
import subprocess
import sys

import numpy as np
import pytest
import opacus.accountants.analysis.rdp as opacus_rdp

from dpaudit.accounting import opacus_rdp as loader
from dpaudit.accounting.accountants import RDP_ORDERS


def test_standalone_executes_opacus_file():
    mod = loader._standalone()
    assert mod.__name__ == loader.STANDALONE and mod is not opacus_rdp
    assert mod.__file__ == opacus_rdp.__file__


@pytest.mark.filterwarnings(
    "ignore:Optimal order is the"
)  # Opacus notes extreme optimal orders; not under test
def test_standalone_equals_opacus_bit_for_bit():
    mod = loader._standalone()
    # Integer and fractional orders take different code paths; an evaluation at all of RDP_ORDERS
    # (up to 16384) costs about a second, so the grid uses a spread of them and one full curve.
    spread = [1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 7.3, 8.0, 16.0, 32.0, 64.0, 256.0]
    cases = list(itertools.product((1e-4, 0.01, 0.25, 1.0), (0.3, 1.1, 4.0, 30.0), (1, 5000))) + [
        (0.004, 0.8, 17, list(RDP_ORDERS))
    ]
    for q, sigma, steps, *full in cases:
        orders = full[0] if full else spread
        ours = np.asarray(mod.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=orders))
        theirs = np.asarray(
            opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=orders)
        )
        # equal_nan: Opacus's curve is NaN at very large orders for small sigma (both sides alike)
        assert np.array_equal(ours, theirs, equal_nan=True), (q, sigma, steps)
        for delta in (1e-5, 1e-9):
            np.testing.assert_array_equal(
                mod.get_privacy_spent(orders=orders, rdp=list(ours), delta=delta),
                opacus_rdp.get_privacy_spent(orders=orders, rdp=list(theirs), delta=delta),
            )


def test_uses_opacus_module_when_loaded():
    assert "opacus.accountants.analysis.rdp" in sys.modules
    assert loader.analysis() is opacus_rdp


def test_loads_without_opacus_package_or_torch():
    code = (
        "import sys\nfrom dpaudit.accounting import opacus_rdp as o\n"
        "print(o.compute_rdp(q=0.01, noise_multiplier=1.1, steps=100, orders=[2.0, 8.0, 32.0]).tolist())\n"
        "print(sorted(m for m in ('torch', 'opacus') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.splitlines()
    expected = opacus_rdp.compute_rdp(
        q=0.01, noise_multiplier=1.1, steps=100, orders=[2.0, 8.0, 32.0]
    ).tolist()
    assert out == [repr(expected), "[]"]

"""Opacus's RDP analysis of the subsampled Gaussian, loaded without importing torch.

The rdp accountant uses Opacus's own analysis (``opacus/accountants/analysis/rdp.py``:
``compute_rdp`` and ``get_privacy_spent``; Mironov, Talwar & Zhang 2019; Balle et al. 2020).
Importing it runs ``opacus/__init__.py`` (torch and the privacy engine: seconds), although the
file needs only ``math``, numpy and ``scipy.special``; so this module executes that installed file
on its own (or uses Opacus's module when already imported). The code is Opacus's, unchanged: the
numbers are exactly those of ``opacus.accountants.analysis.rdp`` (tests/accounting/test_opacus_rdp.py).
It is the reference of :mod:`dpaudit.accounting.rdp_sgm`, and computes the inputs that one hands
back (extreme parameters, orders next to the binomial overflow, large fractional orders).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

#: The module whose functions we use.
OPACUS_RDP = "opacus.accountants.analysis.rdp"
#: The name the stand-alone copy is registered under (never shadows Opacus's own module).
STANDALONE = "dpaudit.accounting._opacus_rdp_analysis"

_module: ModuleType | None = None


def _standalone() -> ModuleType:
    """Execute Opacus's rdp.py as a top-level module (it has only absolute imports)."""
    # a top-level find_spec locates the package without running it
    spec = importlib.util.find_spec("opacus")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("opacus is not installed; the rdp accountant needs opacus==1.6.0.")
    candidates = (
        Path(root, "accountants", "analysis", "rdp.py") for root in spec.submodule_search_locations
    )
    path = next((file for file in candidates if file.is_file()), None)
    if path is None:
        raise ImportError(
            f"opacus at {list(spec.submodule_search_locations)} has no accountants/analysis/rdp.py."
        )
    file_spec = importlib.util.spec_from_file_location(STANDALONE, path)
    module = importlib.util.module_from_spec(file_spec)
    # as the import system does, so pickling and introspection work
    sys.modules[STANDALONE] = module
    try:
        file_spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(STANDALONE, None)
        raise
    return module


def analysis() -> ModuleType:
    """Opacus's RDP analysis module: Opacus's own when opacus is imported, else the stand-alone load."""
    global _module
    if sys.modules.get(OPACUS_RDP) is not None:
        return sys.modules[OPACUS_RDP]
    if _module is None:
        try:
            _module = _standalone()
        except ImportError:  # opacus missing: the normal import would fail too
            raise
        except Exception:  # noqa: BLE001 - a future layout we cannot load alone: import it the normal way
            _module = importlib.import_module(OPACUS_RDP)
    return _module


def compute_rdp(*, q: float, noise_multiplier: float, steps: int, orders):
    """``opacus.accountants.analysis.rdp.compute_rdp`` (same arguments, same result)."""
    return analysis().compute_rdp(
        q=q, noise_multiplier=noise_multiplier, steps=steps, orders=orders
    )

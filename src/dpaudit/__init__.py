"""dpaudit: train differentially private models, account for every release, audit them."""

# Written here rather than read with importlib.metadata (~70 ms at every start-up of the CLI);
# tests/test_version.py keeps it equal to pyproject.toml and to the installed metadata.
__version__ = "0.1.0"

from .lazy import lazy_exports  # noqa: E402 - after the version, which the CLI reads alone

#: Pre-registered audits (:mod:`dpaudit.audit_plans`), loaded with the audit library on first use.
__getattr__, __dir__ = lazy_exports(__name__, {"make_plan": "audit_plans", "load_plan": "audit_plans", "opacus_plan": "audit_plans"}, globals())
__all__ = ["__version__", "make_plan", "load_plan", "opacus_plan"]

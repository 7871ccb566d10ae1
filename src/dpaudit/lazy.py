"""Lazy re-exports for package ``__init__`` files (PEP 562).

A package that re-exports names from heavy submodules (numpy, scipy, torch behind them) resolves each name on first use, so
``dpaudit --help`` and the accounting commands start without loading what they do not need. Every re-exported name stays
importable as before."""

from __future__ import annotations

import importlib
from typing import Callable


def lazy_exports(package: str, where: dict[str, str], namespace: dict) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``where`` maps an exported name to the submodule (relative to the package) that
    defines it; ``namespace`` is the package's ``globals()``."""

    def __getattr__(name: str):
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        namespace[name] = value  # later look-ups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__

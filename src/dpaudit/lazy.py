"""Deferred loading of dpaudit's own numerical modules: lazy re-exports for package ``__init__`` files (PEP 562) and
:func:`lazy_module` for the command line.

A package that re-exports names from heavy submodules (numpy, scipy, torch behind them) resolves each name on first use, so
``dpaudit --help`` and the accounting commands start without loading what they do not need. Every re-exported name stays
importable as before."""

from __future__ import annotations

import importlib
import sys
import types
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


class _Deferred(types.ModuleType):
    """Stands for a module not imported yet; kept out of ``sys.modules`` so that nothing scanning it (``inspect``) runs the
    module halfway through another import."""

    def __getattr__(self, attr: str):
        return getattr(importlib.import_module(self.__name__), attr)  # every use: a monkeypatched attribute is seen


def lazy_module(name: str) -> types.ModuleType:
    """The module ``name``, imported on its first attribute use.

    For the command line only: a command family names the library modules it calls at its top, where
    tests/test_import_graph.py sees the edge (layer order, no cycle), and ``dpaudit --help`` does not import
    them (they load numpy and torch)."""
    return sys.modules.get(name) or _Deferred(name)

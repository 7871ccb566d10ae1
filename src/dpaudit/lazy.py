"""Deferred loading of the heavy third-party stacks (:data:`HEAVY`: numpy, scipy, torch, matplotlib, Opacus, prv-accountant, ...).

dpaudit's own modules import each other at module top (tests/test_import_graph.py); a module that computes with a heavy stack
binds it with :func:`lazy_import`, so importing any dpaudit module (``dpaudit --help``, argument checks) executes none of
them. The stack is imported on its first attribute use, and from then on the module's global is the real module: hot loops
pay nothing.

Not :class:`importlib.util.LazyLoader`: its stand-in must sit in ``sys.modules``, and anything that scans ``sys.modules``
(``inspect.getmodule``, which torch's own import calls) then executes it, e.g. Opacus in the middle of torch's import, a
circular import error. The stand-in here stays out of ``sys.modules``."""

from __future__ import annotations

import importlib
import sys
import types
from typing import Callable

#: The stacks that may be bound lazily (tests/test_import_graph.py allows no other deferred import).
HEAVY = (
    "numpy",
    "scipy",
    "torch",
    "torchvision",
    "matplotlib",
    "opacus",
    "prv_accountant",
    "sklearn",
    "cryptography",
)

_STAND_INS: dict[str, _StandIn] = {}


class _StandIn(types.ModuleType):
    """A heavy module not imported yet. The first attribute use imports it and rebinds every global that holds this stand-in
    to the real module."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._holders: list[dict] = []

    def __getattr__(self, attr: str):
        module = importlib.import_module(self.__name__)
        for namespace in self._holders:
            for key, value in list(namespace.items()):
                if value is self:
                    namespace[key] = module
        return getattr(module, attr)


def lazy_import(name: str) -> types.ModuleType:
    """The module ``name`` of a :data:`HEAVY` stack (``"numpy"``, ``"scipy.special"``, ``"torch.nn"``), imported on its
    first attribute use; for module-level bindings (``np = lazy_import("numpy")``)."""
    if name.split(".")[0] not in HEAVY:
        raise ValueError(f"lazy_import is for the heavy stacks {HEAVY}, got {name!r}.")
    if name in sys.modules:
        return sys.modules[name]
    stand_in = _STAND_INS.setdefault(name, _StandIn(name))
    stand_in._holders.append(sys._getframe(1).f_globals)
    return stand_in


def torch_module_classes(
    namespace: dict, *names: str
) -> tuple[Callable[[str], type], Callable[[], None]]:
    """``(__getattr__, build)`` for a module whose ``torch.nn.Module`` classes ``names`` are written as plain mixins ``_<name>``.

    ``class Dense(nn.Module)`` would run torch when the module is imported; here ``build()`` (or the first
    ``from module import Dense``, PEP 562) makes ``Dense = type("Dense", (_Dense, nn.Module), ...)`` and puts it in the module's
    globals under its own name and qualified name, so pickling (``torch.save``, worker processes) finds it as ``module.Dense``."""

    def build() -> None:
        nn = importlib.import_module("torch.nn")
        for name in names:
            if name not in namespace:
                namespace[name] = type(
                    name,
                    (namespace[f"_{name}"], nn.Module),
                    {"__module__": namespace["__name__"], "__qualname__": name},
                )

    def __getattr__(name: str) -> type:
        if name not in names:
            raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
        build()
        return namespace[name]

    return __getattr__, build

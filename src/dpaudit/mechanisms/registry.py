"""Mechanism objects by name: the mechanisms layer's half of :mod:`dpaudit.catalogue`.

The catalogue (base layer) names each mechanism's implementation by the ``name`` of its mechanism object; this module
imports every implementation at its top and maps the names to the objects (tests/test_catalogue.py checks that the two
agree). Releasing, auditing, sweeps and the command line look mechanisms up here."""

from __future__ import annotations

from ..catalogue import lookup
from .elm import mechanism as dp_elm
from .dpsgd import mechanism as dpsgd_release
from .simple import gaussian, noisy_sum
from .mixmin import mechanism as mixmin_pipeline
from .contract import MechanismBase

#: Every mechanism object by its ``name``; a new mechanism adds its module here.
IMPLEMENTATIONS: dict[str, MechanismBase] = {
    m.MECHANISM.name: m.MECHANISM
    for m in (dpsgd_release, dp_elm, mixmin_pipeline, noisy_sum, gaussian)
}


def mechanism(name: str) -> MechanismBase:
    """The mechanism object of catalogue name (or alias) ``name``; UsageError naming the allowed names."""
    return IMPLEMENTATIONS[lookup(name).implementation]

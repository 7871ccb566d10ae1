"""Accounting: adjacency, guarantees as events, accountants, calibration, schedules."""

from typing import TYPE_CHECKING

from ..lazy import lazy_exports
from .adjacency import Adjacency, require_same
from .events import Composed, Parallel, PureEpsilon, SubsampledGaussian, event_from_dict
from .schedule import Schedule, dp_sgd_schedule

# The accountants import numpy (and, when they compute, scipy / Opacus's analysis / prv-accountant /
# dp_accounting); their names load on first use (PEP 562) so `dpaudit --help`, `schedule` and the
# light accounting modules (adjacency, events) start without them.
# To export another name of a lazy module, add it to its tuple here and to __all__.
_LAZY = {
    "accountants": ("ACCOUNTANTS", "RDP_ORDERS", "AccountantResult", "compute_epsilon",
                    "Accountant", "EpsilonResult", "DeltaResult", "compute_delta", "register_accountant",
                    "unregister_accountant", "get_accountant", "accountants_supporting", "accountant_names"),
    "calibration": ("Calibration", "calibrate_noise_multiplier", "CalibrationResult", "calibrate", "SearchRange"),
}


_WHERE = {name: module for module, names in _LAZY.items() for name in names}

if TYPE_CHECKING:  # for type checkers and IDEs only
    from .accountants import ACCOUNTANTS, RDP_ORDERS, AccountantResult, compute_epsilon  # noqa: F401
    from .accountants import (  # noqa: F401
        Accountant, DeltaResult, EpsilonResult, accountant_names, accountants_supporting, compute_delta,
        get_accountant, register_accountant, unregister_accountant,
    )
    from .calibration import Calibration, CalibrationResult, SearchRange, calibrate, calibrate_noise_multiplier  # noqa: F401


__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())

__all__ = [
    "ACCOUNTANTS", "RDP_ORDERS", "AccountantResult", "compute_epsilon", "Adjacency", "require_same",
    "Calibration", "calibrate_noise_multiplier", "Composed", "Parallel", "PureEpsilon",
    "SubsampledGaussian", "event_from_dict", "Schedule", "dp_sgd_schedule",
    "Accountant", "EpsilonResult", "DeltaResult", "compute_delta", "register_accountant", "unregister_accountant",
    "get_accountant", "accountants_supporting", "accountant_names", "CalibrationResult", "calibrate", "SearchRange",
]

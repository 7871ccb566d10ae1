"""Accounting: adjacency, guarantees as events, accountants (one module per analysis), calibration,
schedules."""

from .accountants import ACCOUNTANTS, RDP_ORDERS, accountant_names, accountants_supporting
from .accountants import compute_delta, compute_epsilon, get_accountant, register_accountant
from .accountants import unregister_accountant
from .adjacency import Adjacency, require_same
from .base import Accountant, AccountantResult, DeltaResult, EpsilonResult
from .calibration import Calibration, CalibrationResult, SearchRange, calibrate
from .calibration import calibrate_noise_multiplier
from .events import Composed, Parallel, PureEpsilon, SubsampledGaussian, event_from_dict
from .schedule import Schedule, dp_sgd_schedule

__all__ = [
    "ACCOUNTANTS",
    "RDP_ORDERS",
    "AccountantResult",
    "compute_epsilon",
    "Adjacency",
    "require_same",
    "Calibration",
    "calibrate_noise_multiplier",
    "Composed",
    "Parallel",
    "PureEpsilon",
    "SubsampledGaussian",
    "event_from_dict",
    "Schedule",
    "dp_sgd_schedule",
    "Accountant",
    "EpsilonResult",
    "DeltaResult",
    "compute_delta",
    "register_accountant",
    "unregister_accountant",
    "get_accountant",
    "accountants_supporting",
    "accountant_names",
    "CalibrationResult",
    "calibrate",
    "SearchRange",
]

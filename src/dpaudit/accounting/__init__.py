"""Accounting: adjacency, guarantees as events, accountants, calibration, schedules."""

from .accountants import ACCOUNTANTS, RDP_ORDERS, AccountantResult, compute_epsilon
from .adjacency import Adjacency, require_same
from .calibration import Calibration, calibrate_noise_multiplier
from .events import Composed, Parallel, PureEpsilon, SubsampledGaussian, event_from_dict
from .schedule import Schedule, dp_sgd_schedule

__all__ = [
    "ACCOUNTANTS", "RDP_ORDERS", "AccountantResult", "compute_epsilon", "Adjacency", "require_same",
    "Calibration", "calibrate_noise_multiplier", "Composed", "Parallel", "PureEpsilon",
    "SubsampledGaussian", "event_from_dict", "Schedule", "dp_sgd_schedule",
]

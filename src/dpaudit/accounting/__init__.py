"""Accounting: adjacency, guarantees as events, accountants (one module per analysis), calibration,
schedules.

The imports below are the package's public API (one list: no ``__all__`` repeating it)."""

# ruff: noqa: F401

from .accountants import ACCOUNTANTS, RDP_ORDERS, accountant_names, accountants_supporting
from .accountants import compute_delta, compute_epsilon, get_accountant, register_accountant
from .accountants import unregister_accountant
from .adjacency import Adjacency, require_same
from .base import Accountant, AccountantResult, DeltaResult, EpsilonResult
from .calibration import Calibration, CalibrationResult, SearchRange, calibrate
from .calibration import calibrate_noise_multiplier
from .events import Composed, Parallel, PureEpsilon, SubsampledGaussian, event_from_dict
from .schedule import Schedule, dp_sgd_schedule

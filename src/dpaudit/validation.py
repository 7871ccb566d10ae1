"""Small shared validators. Every message reads ``"{name} must be {rule}, got {value}."``."""

from __future__ import annotations

import math
from numbers import Integral, Real

from .errors import UsageError


def _fail(name: str, rule: str, value: object) -> None:
    raise UsageError(f"{name} must be {rule}, got {value!r}.")


def _real(name: str, value: object, rule: str, ok) -> float:
    """``value`` as a float when it is a real number (not a bool) for which ``ok`` holds."""
    if isinstance(value, bool) or not isinstance(value, Real) or not ok(float(value)):  # type: ignore[arg-type]
        _fail(name, rule, value)
    return float(value)  # type: ignore[arg-type]


def positive_finite(name: str, value: object) -> float:
    """Return ``value`` as float if it is finite and > 0."""
    return _real(name, value, "a finite number > 0", lambda v: math.isfinite(v) and v > 0)


def non_negative_finite(name: str, value: object) -> float:
    return _real(name, value, "a finite number >= 0", lambda v: math.isfinite(v) and v >= 0)


def open_unit(name: str, value: object) -> float:
    """Return ``value`` if it lies in the open interval (0, 1) (e.g. delta for approximate DP)."""
    return _real(name, value, "in the open interval (0, 1)", lambda v: 0.0 < v < 1.0)


def half_open_unit(name: str, value: object) -> float:
    """Return ``value`` if it lies in (0, 1] (e.g. a sample rate)."""
    return _real(name, value, "in (0, 1]", lambda v: 0.0 < v <= 1.0)


def positive_int(name: str, value: object, low: int = 1) -> int:
    """``value`` as an int >= ``low`` (1: positive); None reads "got none" (a required value not given)."""
    if isinstance(value, bool) or not isinstance(value, Integral) or int(value) < low:  # type: ignore[arg-type]
        if value is None:
            raise UsageError(f"{name} must be given (an integer >= {low}), got none.")
        _fail(name, f"an integer >= {low}", value)
    return int(value)  # type: ignore[arg-type]


def non_negative_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or int(value) < 0:  # type: ignore[arg-type]
        _fail(name, "an integer >= 0", value)
    return int(value)  # type: ignore[arg-type]


def one_of(name: str, value: object, allowed: list[str] | tuple[str, ...]) -> str:
    if value not in allowed:
        _fail(name, "one of " + ", ".join(allowed), value)
    return str(value)

"""Checks of configuration values shared by the typed configs and the baselines, each naming the field it refuses."""

from __future__ import annotations

import math
import numbers


def is_integer(value: object) -> bool:
    """Whether `value` is an integer (NumPy's too); a bool or a float such as 20.0 is not."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_positive_integer(value: object) -> bool:
    """Whether `value` is an integer >= 1."""
    return is_integer(value) and value >= 1


def check_positive_integer(name: str, value: object) -> None:
    """Refuse a count that is not a positive integer: 20.0 would pass a range check and fail deep inside torch."""
    if not is_positive_integer(value):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def check_positive_finite(name: str, value: object) -> None:
    """Refuse a step size or scale (a temperature, a variance floor) that is not a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be positive and finite, got {value!r}")

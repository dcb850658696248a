"""Exceptions raised by scissorhands, and the integer checks both backends share.

Every error the library raises on bad input derives from :class:`ScissorhandsError`,
and also from the built-in class a caller would expect (``TypeError`` for a value of
the wrong kind, ``ValueError`` for a value out of range), so ``except ValueError``
keeps working in code that does not know this library.  A call that raises leaves the
policy exactly as it was.
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction
from typing import Any

import numpy as np

__all__ = [
    "ScissorhandsError",
    "InvalidTypeError",
    "InvalidInputError",
    "UINT32_MAX",
    "check_int",
    "check_flag",
    "check_recent_window",
]

#: Largest position, budget or vote count the policies can hold (``2**32 - 1``).
UINT32_MAX = 2**32 - 1


class ScissorhandsError(Exception):
    """Base class of every error raised by scissorhands."""


class InvalidTypeError(ScissorhandsError, TypeError):
    """A value of the wrong kind: a bool, float or str where an integer belongs,
    or attention weights that are not real numbers."""


class InvalidInputError(ScissorhandsError, ValueError):
    """A value of the right kind but out of range: a negative or out-of-order position,
    attention of the wrong length or rank, NaN/inf/negative weights, or an inconsistent
    budget, recent window or sink count."""


def check_int(name: str, value: Any, low: int = 0, high: int = UINT32_MAX) -> int:
    """Return ``value`` as a Python ``int`` if it is an integer in ``[low, high]``.

    Python and NumPy integers are accepted; ``bool`` is refused even though it is an
    ``int`` subclass, and so are floats (``3.0`` included) and strings.

    Raises
    ------
    InvalidTypeError
        ``value`` is not an integer (or is a bool).
    InvalidInputError
        ``value`` is outside ``[low, high]``.
    """
    if type(value) is int:  # the common case, without the ABC check
        if low <= value <= high:
            return value
    elif isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidTypeError(f"{name} must be an integer, not {type(value).__name__}")
    value = int(value)
    if value < low or value > high:
        raise InvalidInputError(f"{name} must be in [{low}, {high}], got {value}")
    return value


def check_flag(name: str, value: Any) -> bool:
    """Return ``value`` as a Python ``bool`` if it is one (NumPy's ``bool_`` too).

    Raises
    ------
    InvalidTypeError
        ``value`` is not a bool (``0``, ``1`` and ``None`` included).
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise InvalidTypeError(f"{name} must be a bool, not {type(value).__name__}")


def check_recent_window(value: Any, budget: int) -> int:
    """Return the recent window, in positions, that ``value`` asks of ``budget``.

    An integer is a count of positions in ``[0, budget - 1]``.  A non-integer real
    (``float``, NumPy floating, ``fractions.Fraction``) in ``[0, 1)`` is a fraction of
    the budget, rounded down: ``0.5`` with budget 409 gives 204.  A float counts as the
    decimal it prints as (``0.7`` is exactly 7/10, so ``0.7`` of 10 is 7, not the 6 its
    binary value would give), as the command line's ``70%`` does.

    Raises
    ------
    InvalidTypeError
        ``value`` is neither an integer nor a real number (or is a bool).
    InvalidInputError
        An integer outside ``[0, budget - 1]``, or a fraction outside ``[0, 1)``
        (NaN and infinities included).
    """
    if isinstance(value, numbers.Real) and not isinstance(value, (numbers.Integral, bool)):
        if isinstance(value, Fraction):
            fraction = value
        elif math.isfinite(value):
            fraction = Fraction(str(value))  # the shortest decimal that reads back as value
        else:
            fraction = None
        if fraction is None or not 0 <= fraction < 1:
            raise InvalidInputError(
                f"recent_window as a fraction of the budget must be in [0, 1), got {value}")
        return math.floor(fraction * budget)
    if not isinstance(value, numbers.Integral):
        raise InvalidTypeError("recent_window must be an integer or a fraction of the budget "
                               f"in [0, 1), not {type(value).__name__}")
    return check_int("recent_window", value, 0, budget - 1)

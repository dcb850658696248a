"""Exceptions raised by scissorhands, and the integer checks both backends share.

Every error the library raises on bad input derives from :class:`ScissorhandsError`,
and also from the built-in class a caller would expect (``TypeError`` for a value of
the wrong kind, ``ValueError`` for a value out of range), so ``except ValueError``
keeps working in code that does not know this library.  A call that raises leaves the
policy exactly as it was.
"""

from __future__ import annotations

import numbers
from typing import Any

__all__ = [
    "ScissorhandsError",
    "InvalidTypeError",
    "InvalidInputError",
    "UINT32_MAX",
    "check_int",
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

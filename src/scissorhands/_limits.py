"""The limits both backends hold to (the largest position, head count and history
window, the bytes per slot that :func:`memory_bytes` counts, how storage starts and grows)
and the constructors' integer, flag and recent-window coercion. The C header repeats
the limits C needs (``SH_MAX_HEADS``, ...); a test checks they agree."""

from __future__ import annotations

import math
import numbers
from fractions import Fraction
from typing import Any

import numpy as np

from .errors import InvalidInputError, InvalidTypeError

# ----------------------------------------------------------------------------- limits

#: Largest position, budget or vote count the policies can hold (``2**32 - 1``).
UINT32_MAX = 2**32 - 1
#: Largest ``heads`` (rows) of one policy object.
MAX_HEADS = 65536
#: Largest Scissorhands ``history_window``: the vote bits live in a 64-bit register.
MAX_HISTORY_WINDOW = 64
#: Bytes ``memory_bytes()`` counts for the object itself (the C header, which holds
#: the count of a single row).
HEADER_BYTES = 64
#: Bytes ``memory_bytes()`` counts for each row's count when ``heads > 1``.
COUNT_BYTES = 4
#: Largest ``threads`` of a policy: the threads one call may spread its rows over.
MAX_THREADS = 64
#: A call spreads its rows over threads only when they hold this many positions in all.
PARALLEL_MIN_SLOTS = 262144
#: A row's first capacity is ``min(budget + 1, INITIAL_CAPACITY_LIMIT)`` slots.
INITIAL_CAPACITY_LIMIT = 4096
#: A row's first capacity for :class:`Full`, which has no budget to size it.
FULL_INITIAL_CAPACITY = 64
#: Extra bytes per slot for a Scissorhands history window (a uint64 register of vote bits).
HISTORY_BYTES = 8
#: Extra bytes per slot for a Scissorhands vote rate (a uint32 count of steps held).
HELD_BYTES = 4


#: Most pinned spans one policy holds (merged).
MAX_PINS = 65536
#: Bytes ``memory_bytes()`` counts per pinned span (its start and stop, uint32 each);
#: spans add ``PIN_COUNT_BYTES`` once more for their number.
PIN_BYTES = 8
PIN_COUNT_BYTES = 4


def memory_bytes(capacity: int, heads: int, slot_bytes: int, spans: int = 0) -> int:
    """``memory_bytes()`` of a policy: ``64 + capacity * slot_bytes`` for one row;
    ``64 + 4 * heads + capacity * heads * slot_bytes`` for more (the rows' counts);
    plus ``4 + 8 * spans`` when ``spans >= 1`` spans are pinned (their number, then
    each start and stop)."""
    counts = COUNT_BYTES * heads if heads > 1 else 0
    pins = PIN_COUNT_BYTES + PIN_BYTES * spans if spans else 0
    return HEADER_BYTES + counts + capacity * heads * slot_bytes + pins

# ----------------------------------------------------------------------------- integers


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
        An integer outside ``[0, budget - 1]`` (the message names the budget), or a
        fraction outside ``[0, 1)`` (NaN and infinities included).
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
    if isinstance(value, bool):
        raise InvalidTypeError("recent_window must be an integer, not bool")  # as check_int says it
    count = int(value)
    if not 0 <= count < budget:  # named with the budget, the likely mistake when it is small
        above = f" (or a budget above {count})" if count >= budget else ""
        raise InvalidInputError(f"recent_window must be below the budget ({budget}): in [0, {budget - 1}], "
                                f"got {count}{above}")
    return count

"""What both backends share: the limits, reading inputs, and checking a saved state.

The C-backed classes (:mod:`scissorhands.policies`) and the pure-Python reference
(:mod:`scissorhands.reference`) import this module and nothing else of each other, so a
value is refused for the same reason, with the same exception class, on either path.
It holds no policy semantics (votes, scores, selection): those live in ``csrc/`` and in
the reference, each stated once.

* **Limits**: the largest position, head count and history window, the bytes per slot
  that ``memory_bytes()`` counts, and how storage starts and grows.  The C header
  repeats the ones C needs (``SH_MAX_HEADS``, ...); a test checks they agree.
* **Input coercion**: integers, flags and the recent window of a constructor, and
  attention weights (stage 4 of the validation order in ``docs/architecture.md``: the
  value must be real numbers).
* **Rows**: :class:`RowVictims` (what ``step_rows``/``evict_rows`` return), the
  messages for rows that hold or would evict different counts, and reading the
  ``admit`` mask of ``extend`` and the row index of ``select_rows``.
* **State validation**: ``state_dict()`` data checked field by field, before either
  backend builds anything from it.
* **Object lifecycle**: the ``repr`` of an object whose constructor was refused part-way
  (:func:`partial_repr`), and each object's lock made anew in a forked child
  (:func:`remake_lock_after_fork`).
"""

from __future__ import annotations

import bisect
import math
import numbers
import os
import weakref
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any, NamedTuple

import numpy as np

from .errors import InvalidInputError, InvalidTypeError

__all__ = [
    "COUNT_BYTES",
    "FULL_INITIAL_CAPACITY",
    "HEADER_BYTES",
    "HELD_BYTES",
    "HISTORY_BYTES",
    "INITIAL_CAPACITY_LIMIT",
    "MASKED_MESSAGE",
    "MAX_HEADS",
    "MAX_HISTORY_WINDOW",
    "MAX_PINS",
    "MAX_THREADS",
    "PARALLEL_MIN_SLOTS",
    "PIN_BYTES",
    "PIN_COUNT_BYTES",
    "STATE_FORMAT",
    "STATE_VERSION",
    "UINT32_MAX",
    "RowVictims",
    "Span",
    "StateRows",
    "check_flag",
    "check_int",
    "check_pool",
    "check_pool_kernel",
    "check_recent_window",
    "check_span",
    "chunk_shape_error",
    "is_pinned",
    "memory_bytes",
    "merge_spans",
    "observed_evictions",
    "observed_pooled_error",
    "observed_shape_error",
    "parse_held",
    "parse_history",
    "parse_state",
    "partial_repr",
    "pinned_budget_error",
    "pinned_outside",
    "pins_budget_error",
    "pooled_evict_error",
    "ragged_counts_error",
    "ragged_evict_error",
    "read_admit",
    "read_pins",
    "read_row_index",
    "read_weights",
    "remake_lock_after_fork",
    "row_candidates",
]

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


# ----------------------------------------------------------------------------- weights

#: Why a masked array is refused (both backends): its mask has no meaning for a weight.
MASKED_MESSAGE = ("attn must not be a masked array: fill the masked weights first "
                  "(for example attn.filled(0.0))")


def _is_real(x: Any) -> bool:
    """True for a real number (Python or NumPy int/float), False for bool and the rest."""
    return isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_))


def _check_nested(seq: list[Any] | tuple[Any, ...]) -> None:
    """Every leaf of a list or tuple a real number (bool, str, complex refused)."""
    for item in seq:
        if isinstance(item, (list, tuple)):
            _check_nested(item)
        elif isinstance(item, np.ndarray):
            _check_dtype(item)
        elif not _is_real(item):
            raise InvalidTypeError(f"attn must hold real numbers, not {type(item).__name__}")


def _check_dtype(arr: np.ndarray) -> None:
    """Real dtypes pass; an object array must hold real numbers only."""
    if arr.dtype.kind in "fiu":
        return
    if arr.dtype.kind == "O" and all(_is_real(x) for x in arr.flat):
        return
    raise InvalidTypeError(f"attn must hold real numbers, not dtype {arr.dtype}")


def _check_double_range(arr: np.ndarray) -> None:
    """Every number of an object array fits a double (a Python int may not), whether a
    step reads it or not: the C path converts the whole array."""
    try:
        arr.astype(np.float64)
    except OverflowError:
        raise InvalidInputError("attention weight too large for a float64") from None


def _from_array_like(attn: Any) -> np.ndarray:
    """``np.asarray`` of an object with ``__array__`` (a torch tensor, ...), widening a
    bfloat16 tensor exactly to float32 on its own side first (NumPy has no bfloat16)."""
    if hasattr(attn, "detach") and hasattr(attn, "dtype"):  # torch: no grad, CPU, widened
        attn = attn.detach()
        if str(attn.dtype) == "torch.bfloat16":
            attn = attn.float()
    try:
        return np.asarray(attn)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise InvalidTypeError(
            f"attn of type {type(attn).__name__} cannot be read as an array of real numbers "
            f"({exc})") from None


def read_weights(attn: Any) -> np.ndarray:
    """Read attention weights as an array of real numbers, refusing what is not.

    A list or tuple becomes an ``object`` array of its numbers (nothing is rounded
    here; ragged nesting is refused); an ndarray is returned as it is; an object with
    ``__array__`` (a torch CPU tensor of any float dtype, bfloat16 included, widened
    exactly) is converted; a real scalar becomes a 0-d array (refused later as a rank
    error).  The shape is not checked here.

    Raises
    ------
    InvalidTypeError
        Bools, complex numbers, strings, masked arrays, or anything else that is not
        real numbers.
    InvalidInputError
        Ragged nesting (rows of different lengths), or an integer too large for a
        double anywhere in the array (read by a step or not).
    """
    if isinstance(attn, (list, tuple)):
        _check_nested(attn)
        try:
            arr = np.array(attn, dtype=object)
        except ValueError:  # ragged in a way NumPy cannot even box
            raise InvalidInputError("attn is ragged: rows of different lengths") from None
        if any(not _is_real(x) for x in arr.flat):  # a row left boxed: ragged
            raise InvalidInputError("attn is ragged: rows of different lengths")
        _check_double_range(arr)
        return arr
    if isinstance(attn, np.ma.MaskedArray):
        raise InvalidTypeError(MASKED_MESSAGE)
    if isinstance(attn, np.ndarray):  # a subclass (np.matrix) as the plain array it wraps
        arr = attn if type(attn) is np.ndarray else np.asarray(attn)
    elif hasattr(attn, "__array__") or isinstance(attn, memoryview):
        arr = _from_array_like(attn)
    elif _is_real(attn):
        return np.asarray(attn)
    elif isinstance(attn, (str, bytes)):
        raise InvalidTypeError("attn must be real numbers, not a string")
    else:
        raise InvalidTypeError(f"attn must be an array of real numbers, not {type(attn).__name__}")
    _check_dtype(arr)
    if arr.dtype.kind == "O":
        _check_double_range(arr)
    return arr


# ----------------------------------------------------------------------------- rows


class RowVictims(NamedTuple):
    """The victims of a call whose rows may evict different numbers of positions
    (``step_rows``, ``evict_rows``).

    Attributes
    ----------
    counts : numpy.ndarray
        ``uint32``, shape ``(heads,)``: the victims of each row.
    victims : numpy.ndarray
        ``uint32``, shape ``(counts.sum(),)``: the victims, row after row, each row's
        in ascending position order.
    slots : numpy.ndarray
        ``int64``, same shape: each victim's index in its row's kept order before the
        eviction (what a cache needs to gather its keys and values).
    """

    counts: np.ndarray
    victims: np.ndarray
    slots: np.ndarray


def ragged_counts_error(what: str) -> InvalidInputError:
    """The error of a call that needs every row to hold the same count."""
    return InvalidInputError(
        f"{what}: the rows hold different counts; read counts, kept_row(head) or state_dict() instead")


def ragged_evict_error(call: str) -> InvalidInputError:
    """The error of ``step``/``evict`` when the rows would evict different numbers."""
    return InvalidInputError(
        f"{call}: the rows would evict different numbers of positions; use {call}_rows, which "
        "returns them row by row")


def pooled_evict_error(call: str, pool: int) -> InvalidInputError:
    """The error of ``step``/``evict`` on a pooled policy, whose rows evict different
    numbers."""
    return InvalidInputError(
        f"{call}: with pool={pool} the rows of a pool evict different numbers of positions; "
        f"use {call}_rows, which returns them row by row")


def check_pool(pool: Any, heads: int) -> int:
    """``pool`` (already checked as an option) against ``heads``: a number of rows that
    divides it.

    Raises
    ------
    InvalidInputError
        ``pool`` names a scope (``"layer"``) rather than a number of rows, or does not
        divide ``heads``.
    """
    if isinstance(pool, str):
        raise InvalidInputError(f"pool {pool!r} needs a model's layers and KV heads (the transformers "
                                "cache resolves it); a policy takes a number of rows")
    if heads % pool:
        raise InvalidInputError(f"pool must divide heads: pools are consecutive rows, got pool={pool} "
                                f"with heads={heads}")
    return int(pool)


def chunk_shape_error(heads: int, base: int, shape: tuple[int, ...]) -> InvalidInputError:
    """The error of ``extend`` for an attention of the wrong shape, naming the shape
    expected: ``(heads, C, base + C)``, ``base`` the largest count before the chunk."""
    want = f"({heads}, C, {base} + C)" + (f" or (C, {base} + C)" if heads == 1 else "")
    return InvalidInputError(
        f"extend attn must have shape {want} with C >= 1 tokens: each token's weights over the "
        f"{base} positions held before the chunk (the largest count of a row; 0 on a fresh "
        f"policy), then over the chunk's tokens; got {tuple(shape)}")


# ----------------------------------------------------------------------------- observation window


def check_pool_kernel(value: Any) -> int:
    """``pool_kernel`` of ``evict_observed``: an odd integer in ``[1, 2**32 - 1]``.

    Raises
    ------
    InvalidTypeError
        Not an integer (bools and floats included).
    InvalidInputError
        Below 1, above ``2**32 - 1``, or even.
    """
    value = check_int("pool_kernel", value, 1, UINT32_MAX)
    if value % 2 == 0:
        raise InvalidInputError(f"pool_kernel must be odd (the pool is centred on each position), got {value}")
    return value


def observed_shape_error(heads: int, n: int, shape: tuple[int, ...]) -> InvalidInputError:
    """The error of ``evict_observed`` for an attention of the wrong shape, naming the
    shape expected: ``(heads, W, n)``, ``n`` the largest count of a row."""
    want = f"({heads}, W, {n})" + (f" or (W, {n})" if heads == 1 else "")
    return InvalidInputError(
        f"evict_observed attn must have shape {want} with W >= 1 window rows, each over the {n} "
        f"positions of the fullest row in kept order; got {tuple(shape)}")


def observed_pooled_error(pool: int) -> InvalidInputError:
    """The error of ``evict_observed`` on a pooled policy (its rows share budgets, which
    the rule does not)."""
    return InvalidInputError(f"evict_observed does not take pooled budgets (pool={pool}); "
                             "it evicts each row down to the budget on its own")


def observed_evictions(counts: list[int], candidates: list[int], window: int, sinks: int,
                       budget: int, pinned: list[int] | None = None) -> list[int]:
    """What each row evicts under the observation-window rule: ``max(0, n_h - budget)``.

    ``candidates[h]`` is how many positions of row ``h`` (holding ``counts[h]``) the rule
    may evict: those outside its protected ones (the first ``min(sinks, n_h)``, the last
    ``min(window, n_h)``, the window's own, and the pinned positions). ``pinned[h]``
    (None: the policy pins nothing) is how many of row ``h``'s positions only their
    pins protect.

    Raises
    ------
    InvalidInputError
        A row must evict more positions than it has candidates (the first such row is
        named).
    """
    out = []
    for h, (n, c) in enumerate(zip(counts, candidates)):
        k = max(0, n - budget)
        if k > c:
            pins = "" if pinned is None else f" + pinned {pinned[h]}"
            over = (f"; the window's {window} rows are the row's last {window} positions, and it holds only {n}"
                    if window >= n else "")
            raise InvalidInputError(
                f"evict_observed: window {window} + sinks {sinks}{pins} leave only {c} positions to "
                f"evict in row {h}, need {k} (the row holds {n}, budget {budget}){over}")
        out.append(k)
    return out


def _check_bools(seq: list[Any] | tuple[Any, ...]) -> None:
    """Every leaf of a list or tuple a bool (Python or NumPy)."""
    for item in seq:
        if isinstance(item, (list, tuple)):
            _check_bools(item)
        elif isinstance(item, np.ndarray):
            if item.dtype != np.bool_:
                raise InvalidTypeError(f"admit must hold bools, not dtype {item.dtype}")
        elif not isinstance(item, (bool, np.bool_)):
            raise InvalidTypeError(f"admit must hold bools, not {type(item).__name__}")


def read_admit(admit: Any, heads: int, chunk: int) -> np.ndarray | None:
    """``extend``'s admission mask as a C-contiguous ``uint8`` ``(heads, chunk)`` array
    (1 = the token joins the row), or None when every token joins every row.

    A bool array (NumPy, or anything with ``__array__`` such as a torch bool tensor)
    or nested lists/tuples of bools, shaped ``(heads, chunk)``; ``(chunk,)`` also for
    one head.

    Raises
    ------
    InvalidTypeError
        Anything but bools (integers 0/1 included).
    InvalidInputError
        The wrong shape (ragged nesting included).
    """
    if admit is None:
        return None
    if isinstance(admit, (list, tuple)):
        _check_bools(admit)
        try:
            arr = np.array(admit, dtype=bool)
        except ValueError:
            raise InvalidInputError("admit is ragged: rows of different lengths") from None
    elif isinstance(admit, np.ndarray) or hasattr(admit, "__array__"):
        if isinstance(admit, np.ma.MaskedArray):
            raise InvalidTypeError("admit must not be a masked array")
        try:
            arr = np.asarray(admit)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise InvalidTypeError(f"admit of type {type(admit).__name__} cannot be read ({exc})") from None
        if arr.dtype != np.bool_:
            raise InvalidTypeError(f"admit must be a bool array, not dtype {arr.dtype}")
    else:
        raise InvalidTypeError(f"admit must be a bool array or None, not {type(admit).__name__}")
    if heads == 1 and arr.shape == (chunk,):
        arr = arr.reshape(1, chunk)
    if arr.shape != (heads, chunk):
        want = f"({chunk},) or (1, {chunk})" if heads == 1 else f"({heads}, {chunk})"
        raise InvalidInputError(f"admit must have shape {want} (heads, tokens), got {arr.shape}")
    return np.ascontiguousarray(arr, dtype=np.bool_).view(np.uint8)


def _check_integers(seq: list[Any] | tuple[Any, ...]) -> None:
    """Every leaf of a list or tuple an integer (Python or NumPy; bool refused)."""
    for item in seq:
        if isinstance(item, (list, tuple)):
            _check_integers(item)
        elif isinstance(item, np.ndarray):
            if item.dtype.kind not in "iu":
                raise InvalidTypeError(f"index must hold integers, not dtype {item.dtype}")
        elif isinstance(item, (bool, np.bool_)) or not isinstance(item, numbers.Integral):
            raise InvalidTypeError(f"index must hold integers, not {type(item).__name__}")


def read_row_index(index: Any, heads: int) -> np.ndarray:
    """``select_rows``' index as a C-contiguous ``uint32`` array of row numbers.

    A 1-D integer array-like (a NumPy array, a list or tuple of integers, or anything
    with ``__array__`` such as a torch tensor) of 1 to ``MAX_HEADS`` rows, each in
    ``[0, heads)``; repeats are allowed.

    Raises
    ------
    InvalidTypeError
        Not integers (bools and floats included).
    InvalidInputError
        Not 1-D, empty, longer than ``MAX_HEADS``, or a row out of range.
    """
    if isinstance(index, (list, tuple)):
        _check_integers(index)
        try:
            arr = np.array(index, dtype=object)
        except ValueError:
            raise InvalidInputError("index must be 1-D: a sequence of row numbers") from None
        if arr.ndim != 1 or any(isinstance(v, (list, tuple, np.ndarray)) for v in arr):
            raise InvalidInputError("index must be 1-D: a sequence of row numbers")
        values = [int(v) for v in index]
    elif isinstance(index, np.ndarray) or hasattr(index, "__array__"):
        try:
            arr = np.asarray(index)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise InvalidTypeError(f"index of type {type(index).__name__} cannot be read ({exc})") from None
        if arr.dtype.kind == "O":
            if any(isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral) for v in arr.flat):
                raise InvalidTypeError("index must hold integers")
        elif arr.dtype.kind not in "iu":
            raise InvalidTypeError(f"index must hold integers, not dtype {arr.dtype}")
        if arr.ndim != 1:
            raise InvalidInputError(f"index must be 1-D, got shape {arr.shape}")
        values = [int(v) for v in arr.tolist()]
    elif isinstance(index, numbers.Integral) and not isinstance(index, bool):
        raise InvalidInputError("index must be 1-D: a sequence of row numbers, not one integer")
    else:
        raise InvalidTypeError(f"index must be a 1-D array of integers, not {type(index).__name__}")
    if not 1 <= len(values) <= MAX_HEADS:
        raise InvalidInputError(f"index must select between 1 and {MAX_HEADS} rows, got {len(values)}")
    for v in values:
        if not 0 <= v < heads:
            raise InvalidInputError(f"index holds row {v}, outside [0, {heads})")
    return np.array(values, dtype=np.uint32)


# ----------------------------------------------------------------------------- pinned spans

Span = tuple[int, int]


def check_span(start: Any, stop: Any) -> Span:
    """One pinned span ``(start, stop)``, half-open: integers (not bools) with
    ``0 <= start < stop <= 2**32 - 1``.

    Raises
    ------
    InvalidTypeError
        ``start`` or ``stop`` is not an integer.
    InvalidInputError
        Either is out of range, or ``start >= stop``.
    """
    start = check_int("start", start, 0, UINT32_MAX)
    stop = check_int("stop", stop, 0, UINT32_MAX)
    if start >= stop:
        raise InvalidInputError(f"a pinned span needs start < stop, got ({start}, {stop})")
    return start, stop


def merge_spans(spans: list[Span], more: list[Span]) -> list[Span]:
    """``spans`` and ``more`` as one ascending list, overlapping or adjacent spans
    merged (``(0, 4)`` and ``(4, 6)`` become ``(0, 6)``).

    Raises
    ------
    InvalidInputError
        More than ``MAX_PINS`` spans after merging.
    """
    merged: list[list[int]] = []
    for start, stop in sorted([*spans, *more]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], stop)
        else:
            merged.append([start, stop])
    if len(merged) > MAX_PINS:
        raise InvalidInputError(f"at most {MAX_PINS} pinned spans (merged), got {len(merged)}")
    return [(a, b) for a, b in merged]


def read_pins(pins: Any) -> list[Span]:
    """The constructor's ``pins``: a sequence of ``(start, stop)`` pairs (lists,
    tuples or arrays of two integers), each checked as :func:`check_span`, merged.

    Raises
    ------
    InvalidTypeError
        ``pins`` is not a sequence of pairs, or a bound is not an integer.
    InvalidInputError
        A pair of the wrong length, a bound out of range, ``start >= stop``, or more
        than ``MAX_PINS`` spans after merging.
    """
    if isinstance(pins, (str, bytes, Mapping)) or not hasattr(pins, "__iter__"):
        raise InvalidTypeError(f"pins must be a sequence of (start, stop) pairs, not {type(pins).__name__}")
    spans = []
    for pair in pins:
        if isinstance(pair, (str, bytes, Mapping)) or not hasattr(pair, "__len__"):
            raise InvalidTypeError(f"pins must hold (start, stop) pairs, found {type(pair).__name__}")
        if len(pair) != 2:
            raise InvalidInputError(f"pins must hold (start, stop) pairs, found {len(pair)} values")
        spans.append(check_span(pair[0], pair[1]))
    return merge_spans([], spans)


def pinned_outside(spans: list[Span], sinks: int) -> int:
    """Positions the merged ``spans`` pin outside ``[0, sinks)`` (the sinks' overlap
    counted once)."""
    return sum(stop - max(start, sinks) for start, stop in spans if stop > sinks)


def window_beside_pins(raw: Any, spans: list[Span], sinks: int, budget: int) -> int | None:
    """A recent window given as a fraction (``raw``: a float or ``Fraction``), with
    spans pinned at construction: that fraction of what the pinned positions and the
    sinks leave of the budget, ``floor(fraction * (budget - pinned - sinks))`` (at
    least 0), so that pinning a span smaller than the budget still leaves positions to
    evict; None (the window as resolved against the budget) without spans or for a
    count."""
    if not spans or isinstance(raw, (bool, numbers.Integral)) or not isinstance(raw, numbers.Real):
        return None
    left = max(0, budget - pinned_outside(spans, sinks) - sinks)
    return check_recent_window(raw, left) if left > 0 else 0


def pins_budget_error(spans: list[Span], sinks: int, recent_window: int,
                      budget: int) -> InvalidInputError | None:
    """The refusal of ``spans`` that, with the sinks and the recent window, leave
    nothing to evict at ``budget`` (None when they leave something)."""
    pinned = pinned_outside(spans, sinks)
    if not spans or pinned + recent_window + sinks < budget:
        return None
    total = pinned + recent_window + sinks
    room = budget - pinned - sinks - 1  # the largest recent window these pins leave room for
    smaller = f"recent_window={room} or less (a count) at this budget, " if room >= 0 else ""
    return InvalidInputError(
        f"pins leave nothing to evict: {pinned} pinned (not counting the first {sinks}) + recent_window "
        f"{recent_window} + sinks {sinks} = {total} reach budget {budget}; to pin these, pass {smaller}"
        f"a budget above {total} with recent_window={recent_window} as a count (a fraction of the budget "
        "grows with it), or pin fewer positions")


def is_pinned(spans: list[Span], pos: int) -> bool:
    """Whether ``pos`` lies in one of the merged, ascending ``spans``."""
    j = bisect.bisect_right(spans, (pos, UINT32_MAX + 1))
    return j > 0 and spans[j - 1][0] <= pos < spans[j - 1][1]


def row_candidates(row: list[int], spans: list[Span], sinks: int, recent_window: int,
                   pos: int | None) -> int:
    """Slots a row holding ``row`` (ascending; ``pos`` appended when not None) may give
    up: those after its first ``min(sinks, n)`` and before its last ``recent_window``
    that are not pinned (0 when it holds no more than those)."""
    held = row if pos is None else [*row, pos]
    lo = min(sinks, len(held))
    if len(held) - lo <= recent_window:
        return 0
    return sum(1 for p in held[lo:len(held) - recent_window] if not is_pinned(spans, p))


def pinned_budget_error(rows: list[list[int]], spans: list[Span], sinks: int, recent_window: int,
                        budget: int, pos: int | None, pool: int = 1) -> InvalidInputError | None:
    """The refusal of an eviction to ``budget`` (after ``pos`` joins every row, when
    not None) where some row (with ``pool > 1``, some pool of ``pool`` consecutive
    rows, counted together against its share ``pool * budget``) holds fewer unpinned
    positions outside its sinks and recent window than it must evict; None when
    every row (pool) can."""
    if not spans:
        return None
    admitted = 0 if pos is None else 1
    for first in range(0, len(rows), pool):
        group = rows[first:first + pool]
        held = sum(len(r) + admitted for r in group)
        need = held - pool * budget
        if need <= 0:
            continue
        have = sum(row_candidates(r, spans, sinks, recent_window, pos) for r in group)
        if have < need:
            where = f"row {first}" if pool == 1 else f"pool {first // pool} (rows {first}..{first + pool - 1})"
            return InvalidInputError(
                f"budget {budget}: sinks {sinks}, recent_window {recent_window} and the pinned positions "
                f"leave only {have} positions to evict in {where}, need {need}")
    return None


# ----------------------------------------------------------------------------- state

#: ``state_dict()["format"]`` and ``["version"]``.
STATE_FORMAT = "scissorhands.policy"
STATE_VERSION = 1


class StateRows(NamedTuple):
    """Checked per-slot data of a state: row ``h`` holds ``counts[h]`` entries, and
    the arrays hold the rows one after another (``counts.sum()`` entries; C-contiguous,
    as ``sh_policy_import_rows`` takes them)."""

    counts: np.ndarray
    kept: np.ndarray
    scores: np.ndarray | None
    last: int

    def split(self, flat: np.ndarray) -> list[list[Any]]:
        """``flat`` (one of the arrays) as a list of rows of Python numbers."""
        values = flat.tolist()
        out, at = [], 0
        for n in self.counts.tolist():
            out.append(values[at:at + n])
            at += n
        return out


def _rows(state: Mapping[str, Any], key: str) -> list[list[Any]]:
    rows = state.get(key)
    if not isinstance(rows, (list, tuple)) or not all(isinstance(r, (list, tuple)) for r in rows):
        raise InvalidTypeError(f"state[{key!r}] must be a list of lists")
    return [list(r) for r in rows]


def _rows_like(state: Mapping[str, Any], key: str, counts: np.ndarray) -> list[list[Any]]:
    """``state[key]`` as rows, which must be as many and as long as kept's: one value
    per kept slot."""
    rows = _rows(state, key)
    if [len(r) for r in rows] != counts.tolist():
        raise InvalidInputError(f"state[{key!r}] row lengths {[len(r) for r in rows]} differ from "
                                f"kept's {counts.tolist()}")
    return rows


def _present_exactly_when(state: Mapping[str, Any], key: str, on: bool, option: str) -> bool:
    """Whether ``state`` holds ``key``, which it must exactly when ``params[option]`` is on."""
    if on and key not in state:
        raise InvalidInputError(f"state[{key!r}] is missing (params[{option!r}] is set)")
    if not on and key in state:
        raise InvalidInputError(f"state[{key!r}] needs params[{option!r}]")
    return on


def _int_rows(rows: list[list[Any]], key: str, high: int = UINT32_MAX,
              dtype: Any = np.uint32) -> np.ndarray:
    """Rows of integers in ``[0, high]``, one after another, as a C-contiguous
    ``dtype`` array."""
    flat = _numeric_rows(rows, (int,))
    if flat is not None and (flat.size == 0 or (int(flat.min()) >= 0 and int(flat.max()) <= high)):
        return np.ascontiguousarray(flat, dtype=dtype)
    for row in rows:  # the element that is refused, named
        for v in row:
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise InvalidTypeError(f"state[{key!r}] must hold integers, found {type(v).__name__}")
            if not 0 <= int(v) <= high:
                raise InvalidInputError(f"state[{key!r}] value {v} outside [0, {high}]")
    return np.array([int(v) for row in rows for v in row], dtype=dtype)


def _numeric_rows(rows: list[list[Any]], types: tuple[type, ...]) -> np.ndarray | None:
    """Every row as one flat array when each holds only Python numbers of exactly the
    ``types`` given (never bools: ``bool`` is a type of its own here), read at C speed;
    else None, and the element-wise check runs and names what it refuses."""
    parts: list[np.ndarray] = []
    for row in rows:
        if not isinstance(row, list) or not set(map(type, row)) <= set(types):
            return None
        if row:
            parts.append(np.array(row))
    if not parts:
        return np.zeros(0, dtype=np.int64)
    flat = np.concatenate(parts)
    return flat if flat.dtype.kind in "iuf" else None


def _float_rows(rows: list[list[Any]], key: str) -> np.ndarray:
    flat = _numeric_rows(rows, (int, float))
    if flat is not None and bool(np.isfinite(flat).all()) and bool((flat >= 0).all()):
        return flat.astype(np.float64) + 0.0
    for row in rows:  # the element that is refused, named
        for v in row:
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise InvalidTypeError(f"state[{key!r}] must hold real numbers, found {type(v).__name__}")
            if not (math.isfinite(float(v)) and float(v) >= 0):
                raise InvalidInputError(f"state[{key!r}] value {v} is not finite and >= 0")
    # + 0.0 turns -0.0 into 0.0: the C selection orders scores by their bits.
    return np.array([v for row in rows for v in row], dtype=np.float64) + 0.0


def _ascending_within_rows(flat: np.ndarray, counts: np.ndarray) -> bool:
    """Whether each row of ``flat`` (rows of ``counts`` entries) strictly ascends."""
    if flat.size < 2:
        return True
    rising = np.diff(flat.astype(np.int64)) > 0
    starts = np.cumsum(counts.astype(np.int64))[:-1]  # where rows 1.. begin
    starts = starts[(starts >= 1) & (starts <= flat.size - 1)]
    rising[starts - 1] = True  # the step from one row's last to the next row's first
    return bool(rising.all())


def parse_state(
    state: Any, name: str, score_name: str | None, param_names: tuple[str, ...],
    build: Callable[..., Any], optional_params: tuple[str, ...] = (),
    optional_keys: tuple[str, ...] = (),
) -> tuple[Any, StateRows]:
    """Check ``state`` against the ``state_dict()`` format for policy ``name`` and
    return ``(policy, rows)``, ``rows`` a :class:`StateRows` (positions and scores,
    row after row); the policy is ``build(**params)``, called as soon as the
    parameters are checked (order: format, version, policy, params, kept,
    last_position, scores).

    Rows may hold different counts, and a row may be empty. ``params`` must hold every
    name of ``param_names`` and may hold those of ``optional_params`` (states written
    before those existed lack them); the state may hold the keys of
    ``optional_keys``, which the caller checks. Any mapping is read.

    Raises
    ------
    InvalidTypeError
        ``state`` or a field of the wrong kind.
    InvalidInputError
        Wrong format, version or policy name; missing or unknown keys or parameters;
        not ``heads`` rows; positions not strictly ascending within a row or above
        ``last_position``; per-slot rows not as long as kept's; a vote out of the
        uint32 range; a score NaN, infinite or negative.
    """
    if not isinstance(state, Mapping):
        raise InvalidTypeError(f"state must be a dict, not {type(state).__name__}")
    keys = {"format", "version", "policy", "params", "kept", "last_position"}
    if score_name is not None:
        keys.add(score_name)
    if not keys <= set(state) <= keys | set(optional_keys):
        raise InvalidInputError(f"state keys must be {sorted(keys)}"
                                + (f" (optionally {sorted(optional_keys)})" if optional_keys else "")
                                + f", got {sorted(state)}")
    if state.get("format") != STATE_FORMAT:
        raise InvalidInputError(f"not a scissorhands policy state (format {state.get('format')!r})")
    check_int("version", state.get("version"), STATE_VERSION, STATE_VERSION)
    if state.get("policy") != name:
        raise InvalidInputError(f"state is of policy {state.get('policy')!r}, not {name!r}")
    params = state.get("params")
    if not isinstance(params, Mapping):
        raise InvalidTypeError("state['params'] must be a dict")
    if not set(param_names) <= set(params) <= set(param_names) | set(optional_params):
        raise InvalidInputError(f"state params must be {sorted(param_names)}"
                                + (f" (optionally {sorted(optional_params)})" if optional_params else "")
                                + f", got {sorted(params)}")
    policy = build(**params)
    rows = _rows(state, "kept")
    if len(rows) != policy.heads:
        raise InvalidInputError(f"state has {len(rows)} rows of positions, params say heads={policy.heads}")
    counts = np.array([len(r) for r in rows], dtype=np.uint32)
    kept = _int_rows(rows, "kept")
    if not _ascending_within_rows(kept, counts):
        raise InvalidInputError("state['kept'] rows must be strictly ascending")
    last = check_int("last_position", state.get("last_position"), 0, UINT32_MAX)
    if kept.size and int(kept.max()) > last:
        raise InvalidInputError("state['kept'] holds a position above last_position")
    scores = None
    if score_name is not None:
        rows = _rows_like(state, score_name, counts)
        scores = _int_rows(rows, "votes") if score_name == "votes" else _float_rows(rows, "scores")
    return policy, StateRows(counts, kept, scores, last)


def parse_history(state: Mapping[str, Any], window: int | None, rows: StateRows) -> np.ndarray | None:
    """The vote registers of a Scissorhands state (``state["history"]``), row after
    row as ``rows``' arrays, ``uint64``, or None for a policy without a history window.

    Present exactly when ``window`` is set; each register an integer below
    ``2**window`` whose popcount is the slot's vote count."""
    if not _present_exactly_when(state, "history", window is not None, "history_window") or window is None:
        return None
    values = _rows_like(state, "history", rows.counts)
    history = _int_rows(values, "history", (1 << window) - 1, np.uint64)
    bits = np.array([int(v).bit_count() for row in values for v in row], dtype=np.int64)
    votes = np.zeros(0, dtype=np.uint32) if rows.scores is None else rows.scores
    if np.any(bits != votes.astype(np.int64)):
        raise InvalidInputError("state['votes'] must equal the number of vote bits in state['history']")
    return history


def parse_held(state: Mapping[str, Any], vote_rate: bool, rows: StateRows,
               history: np.ndarray | None) -> np.ndarray | None:
    """The steps held of a Scissorhands state (``state["steps_held"]``), row after row
    as ``rows``' arrays, ``uint32``, or None for a policy without a vote rate.

    Present exactly when ``vote_rate`` is set; each slot has at least as many steps
    held as votes, and no register bit at or above its steps held (a slot votes only
    on steps it was held)."""
    if not _present_exactly_when(state, "steps_held", vote_rate, "vote_rate"):
        return None
    held = _int_rows(_rows_like(state, "steps_held", rows.counts), "steps_held")
    votes = np.zeros(0, dtype=np.uint32) if rows.scores is None else rows.scores
    if np.any(votes > held):
        raise InvalidInputError("a slot of state['votes'] has more votes than state['steps_held']")
    if history is not None:
        for register, steps in zip(history.tolist(), held.tolist()):
            if steps < 64 and register >> steps:
                raise InvalidInputError("a register of state['history'] has a vote bit older than "
                                        "its state['steps_held']")
    return held


# ------------------------------------------------------------------ object lifecycle

def partial_repr(obj: object) -> str:
    """``Name(<incomplete: a, b>)``: the attributes ``obj`` has (leading underscores
    dropped), for the ``repr`` of an object whose constructor did not finish (refused
    part-way, or never run).  Never raises."""
    try:
        have = sorted({name.lstrip("_") for name in vars(obj)})
    except Exception:  # no __dict__ either
        have = []
    return f"{type(obj).__name__}(<incomplete: {', '.join(have) or 'nothing set'}>)"


#: The live objects whose lock is made anew in a forked child.
_FORK_LOCKED: weakref.WeakSet[Any] = weakref.WeakSet()


def remake_lock_after_fork(obj: Any) -> None:
    """Have ``obj._remake_lock()`` called in the child of every later ``os.fork``.

    A lock held by another thread at the fork stays held in the child, where that thread
    does not exist, so the child's next call would wait forever; the child's object gets a
    new, free lock instead.  The object is held weakly (it is forgotten when collected)."""
    _FORK_LOCKED.add(obj)


def _after_fork_in_child() -> None:
    for obj in list(_FORK_LOCKED):
        obj._remake_lock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)

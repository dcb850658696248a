"""Reading what a call is given, the same on both backends: attention weights (stage 4
of the validation order in ``docs/architecture.md``: real numbers), the rows'
:class:`RowVictims` and their messages, the ``admit`` mask of ``extend``, the row index
of ``select_rows``, pooling, and the observation window's shapes and rule."""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple

import numpy as np

from ._limits import MAX_HEADS, UINT32_MAX, check_int
from .errors import InvalidInputError, InvalidTypeError

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

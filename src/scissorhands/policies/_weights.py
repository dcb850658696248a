"""The attention weights a C-backed policy takes: conversion to a C-contiguous
float array, the shape read without converting, and the copies a refused call's error
names (the weights that call read, the rest zeroed); the C constants of the hot path.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from scissorhands._native import ffi, lib
from scissorhands._shared import (
    read_weights,
)
from scissorhands.errors import InvalidInputError

_DTYPE_CODES = {np.dtype(np.float32): lib.SH_DTYPE_F32, np.dtype(np.float64): lib.SH_DTYPE_F64}
_ADMIT = lib.SH_STEP_ADMIT
_EVICT = lib.SH_STEP_EVICT
_BOTH = _ADMIT | _EVICT
_ndarray = np.ndarray
_NONE = lib.SH_DTYPE_NONE
_NULL = ffi.NULL
_ERR_LENGTH = lib.SH_ERR_LENGTH
_ERR_RAGGED = lib.SH_ERR_RAGGED
_ERR_WEIGHT = lib.SH_ERR_WEIGHT
_step = lib.sh_policy_step
_from_buffer = ffi.from_buffer
_unpack = ffi.unpack


def as_weights(attn: Any) -> np.ndarray:
    """Read attention weights as a C-contiguous float32 or float64 array.

    float32 and float64 C-contiguous arrays are returned as they are (no copy); other
    real dtypes (float16, integers, torch's bfloat16, ...), strided or Fortran-order
    arrays, lists, tuples and objects with ``__array__`` are converted once
    (:func:`scissorhands._shared.read_weights` decides what is real numbers).

    Raises
    ------
    InvalidTypeError
        Bools, complex numbers, strings or other non-numeric values.
    InvalidInputError
        Ragged nesting, or integers too large for a float64.
    """
    arr = read_weights(attn)
    if arr.dtype.kind == "O":
        try:
            arr = arr.astype(np.float64)
        except OverflowError:
            raise InvalidInputError("attention weight too large for a float64") from None
    elif arr.dtype not in _DTYPE_CODES:
        arr = arr.astype(np.float64)
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return arr


def _weights_or_shape(attn: Any, read: bool, ragged: str) -> tuple[np.ndarray | None, tuple[int, ...]]:
    """``attn`` as weights (:func:`as_weights`) and its shape when ``read``; else only its
    shape, for a policy that reads none (``ragged``: the error when it has none)."""
    if read:
        arr = as_weights(attn)
        return arr, tuple(arr.shape)
    try:
        return None, tuple(np.shape(attn))
    except (TypeError, ValueError):
        raise InvalidInputError(ragged) from None


# The weights a refused call read, for the error that names the first refused one (on the
# error path only: C checks them without NumPy's help when they are valid). Each is a copy
# of the array the caller handed in, in its shape, the weights the call never reads zeroed.

def _read_by_prefill(arr: np.ndarray) -> np.ndarray:
    """``(P, P)`` or ``(heads, P, P)`` as :meth:`NativePolicy.prefill` reads it: token
    ``i``'s weights over positions ``0 .. i - 1`` (the strict lower triangle)."""
    size = arr.shape[-1]
    return np.where(np.tri(size, k=-1, dtype=bool), arr, 0)


def _read_by_extend(arr: np.ndarray, counts: np.ndarray | None, admit: np.ndarray | None) -> np.ndarray:
    """``(C, W)`` or ``(heads, C, W)`` as :meth:`NativePolicy.extend` reads it: a token
    that joins row ``h`` reads the row's ``n_h`` held columns (``counts``; None on a fresh
    policy: none) and column ``n_h + j`` of each earlier token ``j`` that joined it."""
    shaped = arr.reshape(-1, *arr.shape[-2:])
    heads, chunk, width = shaped.shape
    held = np.zeros(heads, dtype=np.int64) if counts is None else counts.astype(np.int64)
    joins = np.ones((heads, chunk), dtype=bool) if admit is None else admit.reshape(heads, chunk).astype(bool)
    token = np.arange(width)[None, :] - held[:, None]  # (heads, W): the chunk token of a column, if >= 0
    earlier = (token[:, None, :] >= 0) & (token[:, None, :] < np.arange(chunk)[None, :, None])
    joined = np.take_along_axis(joins, np.clip(token, 0, chunk - 1), axis=1)[:, None, :]
    read = ((token < 0)[:, None, :] | (earlier & joined)) & joins[:, :, None]
    return np.where(read, shaped, 0).reshape(arr.shape)


def _read_by_observe(arr: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``(W, n)`` or ``(heads, W, n)`` as :meth:`NativePolicy.evict_observed_rows` reads
    it: window row ``j`` of row ``h`` over the slots below ``counts[h] - W + j``."""
    shaped = arr.reshape(-1, *arr.shape[-2:])
    window = shaped.shape[1]
    below = counts[:, None] - window + np.arange(window)[None, :]  # (heads, W)
    read = np.arange(shaped.shape[2])[None, None, :] < below[:, :, None]
    return np.where(read, shaped, 0).reshape(arr.shape)

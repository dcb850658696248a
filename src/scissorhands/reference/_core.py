"""Helpers of the reference that touch no policy: reading attention weights (stage (6)
of the validation order in docs/architecture.md), a call's weights or only their shape,
the lock every public call holds, and the ceiling of H2O's scores.
"""

from __future__ import annotations

import functools
import math
import sys
from typing import Any

import numpy as np

from scissorhands._shared import read_weights
from scissorhands.errors import InvalidInputError

#: H2O scores saturate here (the largest finite double).
DBL_MAX = sys.float_info.max


def _widen(values: Any) -> list[float]:
    """Stage (6): the weights as Python floats, refusing NaN, inf, negative and overflow.

    float64 stays as is, float32 and float16 widen exactly, integers round to the nearest
    double; an integer too large for a double is out of range.
    """
    out = []
    for x in values:
        try:
            w = float(x)
        except OverflowError:
            raise InvalidInputError("an attention weight is too large for a double") from None
        if math.isnan(w) or math.isinf(w) or w < 0.0:
            raise InvalidInputError(f"attention weights must be finite and >= 0, got {w}")
        out.append(w)
    return out




def _weights_or_shape(attn: Any, read: bool, ragged: str) -> tuple[np.ndarray | None, tuple[int, ...]]:
    """``attn`` as weights (:func:`read_weights`) and its shape when ``read``; else only
    its shape, for a policy that reads none (``ragged``: the error when its rows differ
    in length)."""
    if read:
        arr = read_weights(attn)
        return arr, tuple(arr.shape)
    try:
        return None, tuple(np.shape(attn))
    except ValueError:
        raise InvalidInputError(ragged) from None


def _locked(method: Any) -> Any:
    """Run ``method`` holding the object's lock, as the C-backed classes do, so one
    object may be shared between threads."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper

"""The arrays of an evicting cache's storage as NumPy and C see them: the slot table's
dtype, the most slots a row may have, the float dtypes NumPy shares with torch, and the
C views of the int32 slot table and its int64 companions (:mod:`scissorhands.hf.storage`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..._native import ffi

#: The slot table's dtype: 4 bytes a held position, read (and partly moved) by every
#: decode step's C passes; a row's slots are below its capacity, at most 2**31 - 1.
SLOT_DTYPE = np.int32


_MAX_CAPACITY = 2**31 - 1


#: The float dtypes NumPy shares with torch (a CPU tensor's ``.numpy()`` is a view).
NUMPY_FLOATS = (torch.float16, torch.float32, torch.float64)


def _int64_p(array: np.ndarray) -> Any:
    """A C-contiguous int64 array's data as ``int64_t *``."""
    return ffi.from_buffer("int64_t[]", array)


def _int32_p(array: np.ndarray) -> Any:
    """A C-contiguous int32 array's data as ``int32_t *`` (the slot table)."""
    return ffi.from_buffer("int32_t[]", array)

"""The thin layer over the C core: the cffi ``ffi``/``lib`` pair and ``check``.

Everything here mirrors ``csrc/scissorhands.h`` one to one; the friendly classes live
in :mod:`scissorhands.policies`. ``check`` turns a C status code into the library's
exception, so no other module needs to know the codes.

``SCISSORHANDS_SIMD=0`` in the environment when this module is first imported forces
the C core's portable scalar kernels for the process (``lib.sh_set_simd(0)``; the AVX2
ones give bit-identical results, so this is for testing the scalar path, as
``.ci/sanitize`` does); unset or any other value leaves the default, AVX2 where the CPU
has it. ``lib.sh_simd_level()`` says which path runs.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from scissorhands._sh_cffi import ffi, lib
from scissorhands.errors import InvalidInputError, ScissorhandsError

__all__ = ["check", "ffi", "lib"]

if os.environ.get("SCISSORHANDS_SIMD", "").strip() == "0":
    lib.sh_set_simd(0)

_MESSAGES = {
    lib.SH_ERR_ARG: (ScissorhandsError, "invalid argument to the C core"),
    lib.SH_ERR_LENGTH: (InvalidInputError, "attention does not match the held positions"),
    lib.SH_ERR_WEIGHT: (InvalidInputError,
                        "attention weights must be finite and >= 0 (found NaN, inf or a negative weight)"),
    lib.SH_ERR_POSITION: (InvalidInputError, "position must be greater than every position admitted"),
    lib.SH_ERR_BUDGET: (InvalidInputError, "budget must be >= 1 and greater than recent_window + sinks"),
    lib.SH_ERR_STATE: (InvalidInputError, "the policy is not in a state that allows this call"),
    lib.SH_ERR_BUFFER: (ScissorhandsError, "output buffer too small (internal error)"),
    lib.SH_ERR_RAGGED: (InvalidInputError, "the rows hold different counts where the call needs them equal"),
    lib.SH_ERR_PINNED: (InvalidInputError, "the pinned positions leave too few positions to evict"),
}


def check(rc: int, what: str = "", weights: Any = None) -> None:
    """Raise the exception for C status ``rc`` (``MemoryError`` for ``SH_ERR_NOMEM``);
    ``what`` is prefixed to the message.  For ``SH_ERR_WEIGHT``, ``weights`` (the array
    handed to C, or None) lets the message name the first weight that is not finite and
    >= 0 and its index."""
    if rc == lib.SH_OK:
        return
    if rc == lib.SH_ERR_NOMEM:
        raise MemoryError(f"{what}: allocation failed" if what else "allocation failed")
    cls, message = _MESSAGES.get(rc, (ScissorhandsError, f"unknown status {rc}"))
    if rc == lib.SH_ERR_WEIGHT and weights is not None:
        message += _first_bad_weight(weights)
    raise cls(f"{what}: {message}" if what else message)


def _first_bad_weight(weights: Any) -> str:
    """``", got <value> at <index>"`` for the first weight of ``weights`` (in C order)
    that is not finite and >= 0, or ``""`` when there is none (only on the error path:
    the C core found it without a pass of NumPy's)."""
    a = np.asarray(weights)
    with np.errstate(invalid="ignore"):
        bad = ~(np.isfinite(a) & (a >= 0))
    if not bad.any():
        return ""
    index = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), a.shape))
    where = str(index[0]) if len(index) == 1 else str(list(index))
    return f", got {float(a[index])!r} at index {where}"

"""What both backends share: the limits, reading inputs, and checking a saved state.

The C-backed classes (:mod:`scissorhands.policies`) and the pure-Python reference
(:mod:`scissorhands.reference`) import this module and nothing else of each other, so a
value is refused for the same reason, with the same exception class, on either path.
It holds no policy semantics (votes, scores, selection): those live in ``csrc/`` and in
the reference, each stated once.

Its parts, one module each, re-exported here so every caller imports ``_shared``:

* **Limits** (:mod:`._limits`): the largest position, head count and history window, the
  bytes per slot that ``memory_bytes()`` counts, and how storage starts and grows.  The
  C header repeats the ones C needs (``SH_MAX_HEADS``, ...); a test checks they agree.
  With them, a constructor's integers, flags and recent window.
* **Inputs** (:mod:`._inputs`): attention weights (stage 4 of the validation order in
  ``docs/architecture.md``: the value must be real numbers); :class:`RowVictims` (what
  ``step_rows``/``evict_rows`` return), the messages for rows that hold or would evict
  different counts, the ``admit`` mask of ``extend``, the row index of ``select_rows``,
  pooling and the observation window.
* **Pinned spans** (:mod:`._pins`): spans checked, merged and read; the budget they leave.
* **State validation** (:mod:`._state`): ``state_dict()`` data checked field by field,
  before either backend builds anything from it.
* **Object lifecycle** (here): the ``repr`` of an object whose constructor was refused
  part-way (:func:`partial_repr`), and each object's lock made anew in a forked child
  (:func:`remake_lock_after_fork`).
"""

from __future__ import annotations

import os
import weakref
from typing import Any

from ._inputs import (
    MASKED_MESSAGE,
    RowVictims,
    check_pool,
    check_pool_kernel,
    chunk_shape_error,
    observed_evictions,
    observed_pooled_error,
    observed_shape_error,
    pooled_evict_error,
    ragged_counts_error,
    ragged_evict_error,
    read_admit,
    read_row_index,
    read_weights,
)
from ._limits import (
    COUNT_BYTES,
    FULL_INITIAL_CAPACITY,
    HEADER_BYTES,
    HELD_BYTES,
    HISTORY_BYTES,
    INITIAL_CAPACITY_LIMIT,
    MAX_HEADS,
    MAX_HISTORY_WINDOW,
    MAX_PINS,
    MAX_THREADS,
    PARALLEL_MIN_SLOTS,
    PIN_BYTES,
    PIN_COUNT_BYTES,
    UINT32_MAX,
    check_flag,
    check_int,
    check_recent_window,
    memory_bytes,
)
from ._pins import (
    Span,
    check_span,
    is_pinned,
    merge_spans,
    pinned_budget_error,
    pinned_outside,
    pins_budget_error,
    read_pins,
    row_candidates,
    window_beside_pins,
)
from ._state import STATE_FORMAT, STATE_VERSION, StateRows, parse_held, parse_history, parse_state

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
    "window_beside_pins",
]

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

"""Pure-Python reference of the five KV-cache eviction policies: the spec you can read.

This module is the executable statement of what :mod:`scissorhands` computes.  It has
the public API of the C-backed classes (same names, arguments, return types, errors and
``state_dict`` format) and is written to be read in one sitting: clarity over speed.
Every behaviour of the C path is checked against it.

Each policy holds, per row (KV head), ``kept``: the cached positions in ascending order;
rows may hold different counts, and a row may be empty.  A new policy holds position 0.
A decode step shows the policy the new token's attention over the kept positions
(index-aligned with ``kept``, not renormalised); the policy updates its per-position
score, then admits the new position.  ``evict(budget)`` drops positions until
at most ``budget`` remain and returns the victims in ascending order.  ``extend`` applies a
chunk of tokens as the decode steps they stand for (with per-row admission), and
``select_rows`` copies rows into a new set (beams, batch changes).

* :class:`Scissorhands` counts votes: a position earns one on each step where its weight
  strictly exceeds the fair share ``1 / len(attn)`` (Liu et al., NeurIPS 2023,
  arXiv:2305.17118); optionally only over the last ``history_window`` steps.
* :class:`H2O` sums the weights in float64 (Zhang et al., NeurIPS 2023, arXiv:2306.14048).
* :class:`TOVA` keeps only the latest step's weight, in float64, and always keeps the
  newest position (Oren et al., 2024, arXiv:2401.06104).
  All three may pin their first ``sinks`` positions, as StreamingLLM does.
* :class:`StreamingLLM` keeps the first ``sinks`` positions and the most recent ones,
  ignoring attention (Xiao et al., ICLR 2024, arXiv:2309.17453).
* :class:`Full` never evicts: the baseline.

Every class also evicts by an observation window (``evict_observed``,
``evict_observed_rows``: SnapKV, Li et al., 2024, arXiv:2404.14469): the window's rows'
attention summed per held position, max-pooled over kept order, the least pooled
scores evicted outside the sinks and the window's own positions.  It reads the window it
is given and changes nothing but which positions are held.

It imports nothing of the package but :mod:`scissorhands.errors`; NumPy only reads array
input and builds the array properties.
"""

from __future__ import annotations

import bisect
import functools
import math
import numbers
import sys
import threading
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from ._shared import (
    FULL_INITIAL_CAPACITY,
    HELD_BYTES,
    HISTORY_BYTES,
    INITIAL_CAPACITY_LIMIT,
    MAX_HEADS,
    MAX_THREADS,
    STATE_FORMAT,
    STATE_VERSION,
    UINT32_MAX,
    RowVictims,
    Span,
    check_flag,
    check_int,
    check_pool,
    check_pool_kernel,
    check_span,
    chunk_shape_error,
    is_pinned,
    memory_bytes,
    merge_spans,
    observed_evictions,
    observed_pooled_error,
    observed_shape_error,
    parse_held,
    parse_history,
    parse_state,
    partial_repr,
    pinned_budget_error,
    pins_budget_error,
    pooled_evict_error,
    ragged_counts_error,
    ragged_evict_error,
    read_admit,
    read_pins,
    read_row_index,
    read_weights,
    remake_lock_after_fork,
    window_beside_pins,
)
from .errors import InvalidInputError, InvalidTypeError
from .options import SPECS, PolicyRegistry, protected_message, shown_values

__all__ = ["H2O", "POLICIES", "TOVA", "Full", "Scissorhands", "StreamingLLM"]

#: H2O scores saturate here (the largest finite double).
DBL_MAX = sys.float_info.max


# --------------------------------------------------------------------------------------
# Reading attention weights.  Stages (4) type, (5) rank and length, (6) values of the
# validation order in docs/architecture.md.  Nothing here touches a policy.
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# The shared machinery.
# --------------------------------------------------------------------------------------


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


class _Policy:
    """What every policy shares: kept rows, admission, validation, growth, state.

    A subclass sets the class attributes below and overrides :meth:`_update` (how the
    attention changes the per-position scores) and :meth:`_victim_slots` (which slots an
    eviction drops).
    """

    #: Registry name, also ``state_dict()["policy"]``; its spec in
    #: :data:`scissorhands.options.SPECS` lists the options the constructor takes.
    name: ClassVar[str]
    #: Key of the per-position scores in the state dict (None: the policy keeps none):
    #: the spec's ``score_key``, set for each subclass.
    _score_key: ClassVar[str | None] = None
    #: Whether on_decode_step reads ``attn`` at all (the spec's ``reads_attention``).
    _reads_attention: ClassVar[bool] = False

    budget: int | None
    heads: int
    #: The option values (name -> value), checked by the spec.
    _options: dict[str, Any]
    _kept: list[list[int]]
    _scores: list[list[Any]]
    #: Per slot, the vote bits of the last ``history_window`` steps (None: not kept).
    _history: list[list[int]] | None
    #: Per slot, the decode steps that carried attention since admission (None: not kept).
    _held: list[list[int]] | None
    _last: int
    _capacity: int
    #: Consecutive rows sharing one budget (1: each row its own).
    pool: int = 1
    #: The pinned spans, merged and ascending: positions no eviction takes.
    _pins: list[Span]
    #: The spans given to the constructor (what reset() goes back to).
    _initial_pins: list[Span]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:  # a policy of the registry: what its spec declares
            cls._score_key = SPECS[cls.name].score_key
            cls._reads_attention = SPECS[cls.name].reads_attention

    def _configure(self, budget: Any, **options: Any) -> None:
        """Validate ``budget``, then the options of the policy's spec in their order
        (their protected sum against the budget after the last of them), and keep each
        as an attribute of the same name."""
        self.budget = check_int("budget", budget, 1, UINT32_MAX)
        self._options = SPECS[self.name].check(self.budget, options)
        self._given_window = options.get("recent_window")  # a fraction shares what pins leave (_setup)
        for name, value in self._options.items():
            setattr(self, name, value)

    def _setup(self, heads: Any, pins: Any = ()) -> None:
        """Validate ``heads``, then the pinned spans, and start holding ``{0}`` in every
        row."""
        self.heads = check_int("heads", heads, 1, MAX_HEADS)
        self.pool = check_pool(self.pool, self.heads)
        self._initial_pins = read_pins(pins)
        shared = window_beside_pins(getattr(self, "_given_window", None), self._initial_pins,
                                    self._options.get("sinks", 0), self._pin_budget())
        if shared is not None:  # a fraction of what the spans and the sinks leave
            self._options["recent_window"] = shared
            self.recent_window = shared
        self._check_spans(self._initial_pins)
        self._remake_lock()
        remake_lock_after_fork(self)
        self._capacity = self._initial_capacity()
        self._threads = 1
        self.reset()

    def _remake_lock(self) -> None:
        """A new, free lock (at construction, and in a forked child: the parent's may be
        held by a thread the child does not have)."""
        self._lock = threading.RLock()

    # -- hooks --------------------------------------------------------------------------

    def _initial_capacity(self) -> int:
        return min(self.budget + 1, INITIAL_CAPACITY_LIMIT)  # type: ignore[operator]

    def _capacity_limit(self) -> int | None:
        """Growth doubles but stops once at ``budget + 1`` (None: doubling only)."""
        return self.budget + 1 if self.budget is not None else None

    def _new_score(self) -> Any:
        return 0

    def _keeps_history(self) -> bool:
        """Whether each slot keeps a register of its recent vote bits."""
        return False

    def _keeps_held(self) -> bool:
        """Whether each slot counts the steps it has been held (for a vote rate)."""
        return False

    def _slot_bytes(self) -> int:
        """Bytes per slot counted by :meth:`memory_bytes`: the policy's own, plus a vote
        register with a history window and a step count with a vote rate."""
        return (SPECS[self.name].slot_bytes + (HISTORY_BYTES if self._keeps_history() else 0)
                + (HELD_BYTES if self._keeps_held() else 0))

    def _update(self, head: int, weights: list[float]) -> None:
        """Apply one step's weights (validated, aligned with the row, which holds at
        least one position) to row ``head``."""

    def _victim_slots(self, head: int, count: int) -> list[int]:
        """The ``count`` slots of row ``head`` to evict (``count`` < kept count)."""
        raise NotImplementedError

    def _evictable(self, head: int) -> list[int]:
        """The slots of row ``head`` a pool may evict (policies that take ``pool``)."""
        raise NotImplementedError

    def _rank(self, head: int, slot: int) -> Any:
        """What orders slot ``slot`` of row ``head`` in its pool (least goes first)."""
        raise NotImplementedError

    # -- pinned spans -------------------------------------------------------------------

    def _pin_budget(self) -> int:
        """The budget the spans are checked against: the configured one (``Full``, with
        none, as its C object is built: ``2**32 - 1``)."""
        return UINT32_MAX if self.budget is None or self.name == "full" else self.budget

    def _check_spans(self, spans: list[Span]) -> None:
        """Refuse spans whose pinned positions outside the sinks, with the sinks and the
        recent window, reach the configured budget (nothing would be left to evict)."""
        error = pins_budget_error(spans, self._options.get("sinks", 0),
                                  self._options.get("recent_window", 0), self._pin_budget())
        if error is not None:
            raise error

    @_locked
    def pin(self, start: int, stop: int) -> None:
        """Pin positions ``start <= pos < stop``: no eviction takes them, in any row.

        Sinks are the special case ``pin(0, sinks)`` (StreamingLLM, Xiao et al., ICLR
        2024, arXiv 2309.17453); llama.cpp's ``n_keep`` and TensorRT-LLM's token-range
        retention priorities keep spans the same way (a system prompt, the start of a
        turn).  A span may name positions not admitted yet (protected once they join)
        or already evicted (nothing comes back); overlapping or adjacent spans merge.
        Every eviction (``evict``, ``step``, ``evict_rows``, ``step_rows``, pooled
        budgets) chooses among the slots outside the sinks, the recent window and the
        pinned positions; ``evict_observed_rows`` among those outside the sinks, the
        window and the pinned positions.

        Parameters
        ----------
        start, stop : int
            The half-open span, ``0 <= start < stop <= 2**32 - 1``; bools refused.

        Raises
        ------
        InvalidTypeError
            ``start`` or ``stop`` is not an integer.
        InvalidInputError
            Out of range, ``start >= stop``, more than 65536 spans after merging, or the
            positions pinned outside the sinks plus ``recent_window`` plus ``sinks``
            reach the configured budget ("pins leave nothing to evict").  Nothing
            changes.
        """
        span = check_span(start, stop)
        spans = merge_spans(self._pins, [span])
        self._check_spans(spans)
        self._pins = spans

    @property
    def pins(self) -> list[tuple[int, int]]:
        """The pinned spans ``(start, stop)``, half-open, merged, ascending (a copy)."""
        return list(self._pins)

    def _unpinned(self, head: int, slots: range) -> list[int]:
        """The slots of ``slots`` in row ``head`` whose positions are not pinned."""
        row = self._kept[head]
        return [s for s in slots if not is_pinned(self._pins, row[s])]

    def _check_pinned(self, budget: int | None, pos: int | None) -> None:
        """A per-call ``budget`` below the configured one is refused, before anything
        changes, where some row (pool) would hold fewer unpinned positions outside its
        sinks and recent window than it must evict (after ``pos`` joins, when not None).
        At the configured budget the spans' own check leaves enough."""
        if (not self._pins or budget is None or self.budget is None or budget >= self.budget
                or not SPECS[self.name].evicts):
            return
        error = pinned_budget_error(self._kept, self._pins, self._options.get("sinks", 0),
                                    self._options.get("recent_window", 0), budget, pos, self.pool)
        if error is not None:
            raise error

    # -- validation ---------------------------------------------------------------------

    def _check_pos(self, pos: Any) -> int:
        """Stages (1) and (2): an integer in ``[0, 2**32-1]`` above every admitted one."""
        pos = check_int("pos", pos, 0, UINT32_MAX)
        if pos <= self._last:
            raise InvalidInputError(
                f"pos must be greater than every position admitted ({self._last}), got {pos}"
            )
        return pos

    def _check_budget(self, budget: Any) -> int | None:
        """Stage (3): the per-call budget, or the configured one when None; it must be
        above the protected positions (recent window and sinks)."""
        if budget is None:
            return self.budget
        budget = check_int("budget", budget, 1, UINT32_MAX)
        protected = {o.name: self._options[o.name] for o in SPECS[self.name].options if o.protects}
        if sum(protected.values()) >= budget:
            raise InvalidInputError(protected_message(protected, budget))
        return budget

    def _read_step(self, attn: Any) -> list[list[float]] | None:
        """Stages (4) to (6): one step's weights as ``heads`` rows, or None for no update.

        ``attn`` is ``(heads, n)`` with ``n`` the largest count; row ``h`` reads only its
        first ``counts[h]`` weights (the rest is never read, never checked).
        """
        if attn is None or not self._reads_attention:
            return None
        arr = read_weights(attn)
        counts = self._counts()
        n = max(counts)
        if arr.shape != (self.heads, n) and not (self.heads == 1 and arr.shape == (n,)):
            want = f"({n},) or (1, {n})" if self.heads == 1 else f"({self.heads}, {n})"
            raise InvalidInputError(f"attn must have shape {want}, got {arr.shape}")
        grid = arr.reshape(self.heads, n)
        return [_widen(grid[h, :counts[h]]) for h in range(self.heads)]

    def _read_prompt(self, attn: Any) -> tuple[int, list[list[list[float]]] | None]:
        """``prefill``'s prompt length ``P`` and each row's weights for steps 1..P-1.

        A policy that ignores attention reads only the shape.
        """
        arr, shape = _weights_or_shape(attn, self._reads_attention, "attn is ragged: rows of different lengths")
        p = shape[-1] if shape else 0
        allowed = [(self.heads, p, p)] + ([(p, p)] if self.heads == 1 else [])
        if p < 1 or shape not in allowed:
            raise InvalidInputError(
                f"prefill attn must have shape (P, P) or ({self.heads}, P, P), got {shape}"
            )
        if arr is None:  # a policy that reads no attention
            return p, None
        grid = arr.reshape(self.heads, p, p)
        rows = [[_widen(grid[h, i, :i]) for i in range(1, p)] for h in range(self.heads)]
        return p, rows

    # -- mutation (only after everything is validated) -----------------------------------

    def _grow_to(self, slots: int) -> None:
        """Grow the capacity, one doubling at a time, until ``slots`` fit in a row.

        Below ``budget + 1`` a doubling stops at ``budget + 1``; from there on it doubles.
        """
        while self._capacity < slots:
            limit = self._capacity_limit()
            if limit is not None and self._capacity < limit:
                self._capacity = min(2 * self._capacity, limit)
            else:
                self._capacity = 2 * self._capacity

    def _vote(self, head: int, weights: list[float]) -> None:
        """One decode step's vote over what row ``head`` holds (nothing when it is empty)."""
        if weights:
            self._update(head, weights)

    def _append(self, head: int, pos: int) -> None:
        """Append ``pos`` to row ``head`` with a zero score (capacity already grown)."""
        self._kept[head].append(pos)
        if self._score_key is not None:
            self._scores[head].append(self._new_score())
        if self._history is not None:
            self._history[head].append(0)  # a new position has voted on no step yet
        if self._held is not None:
            self._held[head].append(0)  # ... and been held for none

    def _admit(self, pos: int, weights: list[list[float]] | None) -> None:
        """Update the scores of each row, then append ``pos`` to every row."""
        self._grow_to(max(self._counts()) + 1)
        for h in range(self.heads):
            if weights is not None:
                self._vote(h, weights[h])
            self._append(h, pos)
        self._last = pos

    def _evictions(self, budget: int | None, admitted: int = 0) -> list[int]:
        """Positions each row evicts down to ``budget`` after ``admitted`` more join it."""
        if budget is None:
            return [0] * self.heads
        return [max(0, n + admitted - budget) for n in self._counts()]

    def _check_unpooled(self, budget: int | None, call: str) -> None:
        """``step``/``evict`` return one ``(heads, k)`` array, which a pooled policy's
        rows (evicting different numbers) cannot fill: refused, right after the budget."""
        if budget is not None and self.pool != 1:
            raise pooled_evict_error(call, self.pool)

    def _check_same_evictions(self, budget: int | None, admitted: int, call: str) -> None:
        """``step``/``evict`` return one ``(heads, k)`` array: every row must evict k."""
        if len(set(self._evictions(budget, admitted))) > 1:
            raise ragged_evict_error(call)

    def _pooled_slots(self, budget: int) -> list[list[int]]:
        """The slots each row evicts when pools of ``pool`` consecutive rows share
        ``pool * budget`` positions: per pool over its share, the excess, least
        (key, position, row) first among the rows' evictable slots."""
        chosen: list[list[int]] = [[] for _ in range(self.heads)]
        for first in range(0, self.heads, self.pool):
            rows = range(first, first + self.pool)
            excess = sum(len(self._kept[h]) for h in rows) - self.pool * budget
            if excess <= 0:
                continue
            candidates = [(self._rank(h, s), self._kept[h][s], h, s)
                          for h in rows for s in self._evictable(h)]
            for _, _, h, s in sorted(candidates)[:excess]:
                chosen[h].append(s)
        return chosen

    def _evict(self, budget: int | None) -> tuple[list[list[int]], list[list[int]]]:
        """Drop ``n_h - budget`` slots from each row holding ``n_h > budget``; victims and
        their slots, ascending, row by row."""
        victims: list[list[int]] = [[] for _ in range(self.heads)]
        slots: list[list[int]] = [[] for _ in range(self.heads)]
        pooled = self._pooled_slots(budget) if budget is not None and self.pool != 1 else None
        for h, k in enumerate(self._evictions(budget)):
            if pooled is not None:
                k = len(pooled[h])
            if k == 0:
                continue
            chosen = sorted(self._victim_slots(h, k) if pooled is None else pooled[h])
            slots[h] = chosen
            victims[h] = self._remove_slots(h, chosen)
        return victims, slots

    def _remove_slots(self, head: int, chosen: list[int]) -> list[int]:
        """Drop the slots ``chosen`` (ascending) from row ``head``, keeping the order of
        the rest and every survivor's per-slot values; returns their positions."""
        victims = [self._kept[head][s] for s in chosen]
        gone = set(chosen)
        self._kept[head] = [p for s, p in enumerate(self._kept[head]) if s not in gone]
        if self._score_key is not None:
            self._scores[head] = [v for s, v in enumerate(self._scores[head]) if s not in gone]
        if self._history is not None:
            self._history[head] = [r for s, r in enumerate(self._history[head]) if s not in gone]
        if self._held is not None:
            self._held[head] = [c for s, c in enumerate(self._held[head]) if s not in gone]
        return victims

    # -- the observation-window rule (SnapKV) ----------------------------------------------

    def _observed_sinks(self) -> int:
        """The leading positions the observation-window rule protects: the ``sinks``
        option (0 for a policy without one)."""
        return int(self._options.get("sinks", 0))

    def _observation_protected(self, head: int, slot: int, n: int, window: int) -> bool:
        """Whether slot ``slot`` of row ``head`` (holding ``n``) is never evicted by the
        observation-window rule: one of the first ``min(sinks, n)`` held, or of the last
        ``min(window, n)`` (the window's own rows), or pinned.  The one place that says it."""
        if slot < min(self._observed_sinks(), n) or slot >= n - min(window, n):
            return True
        return is_pinned(self._pins, self._kept[head][slot])

    def _read_observation(self, attn: Any, counts: list[int]) -> tuple[int, Any]:
        """The window's height ``W`` and its weights as a ``(heads, W, n)`` array, ``n``
        the largest count; a policy that never evicts reads only the shape (None)."""
        n = max(counts)
        arr, given = _weights_or_shape(attn, SPECS[self.name].evicts,
                                       "evict_observed attn is ragged: rows of different lengths")
        shape = (1, *given) if len(given) == 2 and self.heads == 1 else given
        if len(shape) != 3 or shape[0] != self.heads or shape[1] < 1 or shape[2] != n:
            raise observed_shape_error(self.heads, n, given)
        return shape[1], None if arr is None else arr.reshape(shape)

    @staticmethod
    def _window_scores(rows: list[list[float]], n: int) -> list[float]:
        """Per slot, the sum over the window's rows (in order) of the weights they give
        it, in float64 (Python floats): the order of the additions is part of the rule."""
        score = [0.0] * n
        for weights in rows:
            for i, w in enumerate(weights):
                score[i] += w
        return score

    @staticmethod
    def _max_pool(score: list[float], kernel: int) -> list[float]:
        """Each slot's largest score within ``kernel // 2`` slots either side (stride 1,
        the row's ends not padded)."""
        r = kernel // 2
        return [max(score[max(0, i - r):i + r + 1]) for i in range(len(score))]

    def _observe(self, attn: Any, budget: Any, pool_kernel: Any, equal: bool
                 ) -> tuple[list[list[int]], list[list[int]]]:
        """Validate everything of an ``evict_observed`` call, then evict; victims and
        slots row by row.  ``equal``: every row must evict the same number."""
        budget = self.budget if budget is None else check_int("budget", budget, 1, UINT32_MAX)
        pool_kernel = check_pool_kernel(pool_kernel)
        if self.pool != 1:
            raise observed_pooled_error(self.pool)
        counts = self._counts()
        window, grid = self._read_observation(attn, counts)
        victims: list[list[int]] = [[] for _ in range(self.heads)]
        slots: list[list[int]] = [[] for _ in range(self.heads)]
        if grid is None or budget is None:  # a policy that never evicts
            return victims, slots
        if equal and len({max(0, n - budget) for n in counts}) > 1:
            raise ragged_evict_error("evict_observed")
        candidates = [[s for s in range(n) if not self._observation_protected(h, s, n, window)]
                      for h, n in enumerate(counts)]
        # Of the slots outside the sinks and the window, those only their pins protect.
        sinks = self._observed_sinks()
        pinned = None if not self._pins else [
            max(0, n - min(sinks, n) - min(window, n)) - len(c) for n, c in zip(counts, candidates)]
        need = observed_evictions(counts, [len(c) for c in candidates], window, sinks, budget, pinned)
        # Row h's window row j is its held slot t = n_h - W + j and reads slots i < t
        # (none when t <= 0); every row's weights are checked before any row changes.
        rows = [[_widen(grid[h, j, :n - window + j]) for j in range(max(0, window - n + 1), window)]
                for h, n in enumerate(counts)]
        for h, k in enumerate(need):
            if k == 0:
                continue
            pooled = self._max_pool(self._window_scores(rows[h], counts[h]), pool_kernel)
            chosen = sorted(sorted(candidates[h], key=lambda s: (pooled[s], s))[:k])
            slots[h] = chosen
            victims[h] = self._remove_slots(h, chosen)
        return victims, slots

    def _result(self, victims: list[list[int]], slots: list[list[int]], return_indices: bool) -> Any:
        """Shape the victims as the API returns them (list for one head, array for more)."""
        if self.heads == 1:
            return (victims[0], slots[0]) if return_indices else victims[0]
        k = len(victims[0])
        v = np.array(victims, dtype=np.uint32).reshape(self.heads, k)
        if not return_indices:
            return v
        return v, np.array(slots, dtype=np.int64).reshape(self.heads, k)

    @staticmethod
    def _row_victims(victims: list[list[int]], slots: list[list[int]]) -> RowVictims:
        """The victims row by row, as ``step_rows``/``evict_rows`` return them."""
        return RowVictims(np.array([len(v) for v in victims], dtype=np.uint32),
                          np.array([p for row in victims for p in row], dtype=np.uint32),
                          np.array([s for row in slots for s in row], dtype=np.int64))

    # -- public API -----------------------------------------------------------------------

    @_locked
    def on_decode_step(self, pos: int, attn: Any) -> None:
        """Apply one decode step: update the scores from ``attn``, then admit ``pos``.

        Parameters
        ----------
        pos : int
            The new token's position, greater than every position admitted so far and at
            most ``2**32 - 1``.  Python or NumPy integer; bool and float are refused.
        attn : array_like or None
            The new token's attention weights over the kept positions, index-aligned with
            ``kept`` and not renormalised: shape ``(n,)`` when ``heads == 1`` (``(1, n)``
            also accepted), ``(heads, n)`` otherwise, ``n`` the largest count of a row;
            row ``h`` reads only its first ``counts[h]`` weights.  A list or
            tuple of real numbers or any real-valued array (float32 is widened exactly,
            other dtypes converted to float64), or an object with ``__array__``.  None
            changes no score but still admits ``pos``.  Policies that ignore attention
            (:class:`StreamingLLM`, :class:`Full`) never read it.

        Raises
        ------
        InvalidTypeError
            ``pos`` is not an integer; ``attn`` does not hold real numbers.
        InvalidInputError
            ``pos`` out of range or not increasing; ``attn`` of the wrong rank or length;
            a weight that is NaN, infinite or negative.  The policy is left unchanged.
        """
        pos = self._check_pos(pos)
        weights = self._read_step(attn)
        self._admit(pos, weights)

    @_locked
    def evict(self, budget: int | None = None, return_indices: bool = False) -> Any:
        """Evict until at most ``budget`` positions are held in every row.

        Parameters
        ----------
        budget : int or None, default None
            Positions to keep; None means the configured budget.  A per-call budget may
            exceed the configured one and does not replace it.
        return_indices : bool, default False
            Also return each victim's slot (index in ``kept`` before the eviction).

        Returns
        -------
        list[int] or numpy.ndarray or tuple
            ``heads == 1``: the victims as a list, ascending.  ``heads > 1``: a
            ``(heads, k)`` uint32 array, each row ascending.  With ``return_indices`` a
            pair ``(victims, slots)`` of lists, or of ``(heads, k)`` arrays (slots int64).

        Raises
        ------
        InvalidTypeError
            ``budget`` is not an integer.
        InvalidInputError
            ``budget < 1``, or not above ``recent_window + sinks`` (the positions never
            evicted); checked even when nothing needs evicting.  The rows would evict
            different numbers of positions (:meth:`evict_rows` takes that case).
        """
        return_indices = check_flag("return_indices", return_indices)
        budget = self._check_budget(budget)
        self._check_pinned(budget, None)
        self._check_unpooled(budget, "evict")
        self._check_same_evictions(budget, 0, "evict")
        return self._result(*self._evict(budget), return_indices)

    @_locked
    def step(self, pos: int, attn: Any, budget: int | None = None, return_indices: bool = False) -> Any:
        """``on_decode_step(pos, attn)`` then ``evict(budget)``, validated as one call.

        Everything (``pos``, then ``budget``, then ``attn``, then that every row evicts
        the same number) is checked before anything changes; see
        :meth:`on_decode_step` and :meth:`evict` for the arguments, the return value and
        the errors.
        """
        return_indices = check_flag("return_indices", return_indices)
        pos = self._check_pos(pos)
        budget = self._check_budget(budget)
        self._check_pinned(budget, pos)
        self._check_unpooled(budget, "step")
        weights = self._read_step(attn)
        self._check_same_evictions(budget, 1, "step")
        self._admit(pos, weights)
        return self._result(*self._evict(budget), return_indices)

    @_locked
    def evict_rows(self, budget: int | None = None) -> RowVictims:
        """Evict each row down to ``budget`` on its own: row ``h`` holding ``n_h``
        positions loses ``max(0, n_h - budget)``, chosen as :meth:`evict` chooses.

        Parameters
        ----------
        budget : int or None, default None
            As for :meth:`evict`.

        Returns
        -------
        RowVictims
            ``counts`` (``uint32``, ``(heads,)``), ``victims`` (``uint32``, row after
            row, each ascending) and ``slots`` (``int64``: each victim's index in its
            row before the eviction).

        Raises
        ------
        InvalidTypeError, InvalidInputError
            For a bad budget, as :meth:`evict`.
        """
        budget = self._check_budget(budget)
        self._check_pinned(budget, None)
        return self._row_victims(*self._evict(budget))

    @_locked
    def step_rows(self, pos: int, attn: Any, budget: int | None = None) -> RowVictims:
        """``on_decode_step(pos, attn)`` then ``evict_rows(budget)``, validated as one
        call (position, budget, attention, in that order) before anything changes.

        Parameters
        ----------
        pos, attn
            As for :meth:`on_decode_step`: ``attn`` is ``(heads, n)`` with ``n`` the
            largest count, row ``h`` reading its first ``counts[h]`` weights.
        budget : int or None, default None
            As for :meth:`evict_rows`.

        Returns
        -------
        RowVictims
            As :meth:`evict_rows` returns, after ``pos`` joined every row.

        Raises
        ------
        InvalidTypeError, InvalidInputError
            As :meth:`step`, except that rows may evict different numbers.
        """
        pos = self._check_pos(pos)
        budget = self._check_budget(budget)
        self._check_pinned(budget, pos)
        weights = self._read_step(attn)
        self._admit(pos, weights)
        return self._row_victims(*self._evict(budget))

    @_locked
    def evict_observed_rows(self, attn: Any, budget: int | None = None, pool_kernel: int = 15) -> RowVictims:
        """Evict each row down to ``budget`` by an observation window's attention, pooled
        (SnapKV's rule): the prompt-end eviction that keeps what a question reads.

        Row ``h`` holds ``n_h`` positions in kept order; its last ``W`` held positions
        are the window's own tokens, window row ``j`` being held slot ``t = n_h - W + j``
        (rows with ``t <= 0`` read nothing).  Slot ``i``'s score is the sum, for ``j =
        0 .. W-1`` in that order, of ``float64(attn[h, j, i])`` over the rows with ``i <
        t``; its pooled score the largest score of slots ``[i - r, i + r]`` of the row
        (``r = pool_kernel // 2``, clipped at the row's ends).  A row holding more than
        ``budget`` evicts its ``n_h - budget`` unprotected slots of least pooled score,
        equal pooled scores evicting the lower position.  Protected: the first
        ``min(sinks, n_h)`` held (``sinks`` the policy's option, 0 without one), the
        last ``min(W, n_h)`` and the pinned positions; ``recent_window`` is not used.  Survivors keep their
        votes, scores and registers; nothing else changes.

        Parameters
        ----------
        attn : array_like
            ``(heads, W, n)`` (or ``(W, n)`` for one head), ``W >= 1`` the window's rows,
            ``n`` the largest count of a row: row ``h``'s window row ``j`` weights over
            the row's held positions in kept order, not renormalised.  Only ``attn[h, j,
            i]`` with ``i < n_h - W + j`` is read and checked (finite, ``>= 0``).  Any
            real dtype (float32 widened exactly).  A policy that never evicts
            (:class:`Full`) reads only its shape.
        budget : int or None, default None
            Positions each row keeps, ``>= 1``; None: the configured budget.  A per-call
            budget may exceed the configured one and does not stick.
        pool_kernel : int, default 15
            The max-pool's width over kept order, odd, ``>= 1`` (1: no pooling).

        Returns
        -------
        RowVictims
            ``counts`` (``uint32``, ``(heads,)``), ``victims`` (``uint32``, row after
            row, each ascending) and ``slots`` (``int64``: kept-order index before the
            eviction).

        Raises
        ------
        InvalidTypeError
            ``budget`` or ``pool_kernel`` not an integer (bools, floats); ``attn`` not
            real numbers.
        InvalidInputError
            In this order, before anything changes: ``budget < 1``; ``pool_kernel``
            even or below 1; a pooled policy (``pool != 1``); ``attn`` of the wrong
            shape (the message names the expected one); a row whose protected
            positions leave fewer candidates than it must evict; a read weight NaN,
            infinite or negative.

        References
        ----------
        Y. Li et al., "SnapKV: LLM Knows What You are Looking for Before Generation",
        2024, arXiv:2404.14469 (observation window, pooled scores).
        """
        return self._row_victims(*self._observe(attn, budget, pool_kernel, equal=False))

    @_locked
    def evict_observed(self, attn: Any, budget: int | None = None, pool_kernel: int = 15,
                       return_indices: bool = False) -> Any:
        """:meth:`evict_observed_rows` returning what :meth:`evict` returns: a list for
        one head, a ``(heads, k)`` array otherwise (with ``return_indices`` a pair with
        the slots).

        Raises
        ------
        InvalidTypeError, InvalidInputError
            As :meth:`evict_observed_rows`; also, right after the shape, rows that would
            evict different numbers (``evict_observed_rows`` takes them).
        """
        return self._result(*self._observe(attn, budget, pool_kernel, equal=True), return_indices)

    @_locked
    def extend(self, attn: Any, admit: Any = None, unread: bool = False) -> None:
        """Apply a chunk of ``C`` tokens, each as a decode step over what each row holds
        at that moment (a vote, then admission); no eviction.

        The tokens take positions ``last + 1 .. last + C``, shared by the rows; on a fresh
        policy (every row holding ``{0}``, ``last == 0``) positions ``0 .. C - 1``, token
        0 being the position 0 each row holds (kept as it is when it joins, dropped when
        not), so ``extend(attn)`` there equals ``prefill(attn)``.

        Parameters
        ----------
        attn : array_like
            ``(heads, C, n + C)`` (or ``(C, n + C)`` for one head), ``n`` the largest
            count before the chunk (0 when fresh).  For row ``h`` holding ``n_h``
            positions before the chunk (0 when fresh), a token ``i`` that joins the row
            reads columns ``[0, n_h)`` and ``n_h + j`` for each earlier token ``j`` that
            joined it, and nothing else.  Policies that ignore attention read only its shape.
        admit : array_like of bool, optional
            ``(heads, C)`` (or ``(C,)`` for one head): whether token ``i`` joins row
            ``h``; a token that does not neither votes in the row nor joins it (none of
            its weights there is read).  None: every token joins every row.
        unread : bool, default False
            Read no weights (only ``attn``'s shape): the tokens join with a new
            position's state and the held positions are not updated.

        Raises
        ------
        InvalidTypeError
            The weights are not real numbers; ``admit`` is not bools.
        InvalidInputError
            A wrong shape (of ``attn``, then of ``admit``); positions passing
            ``2**32 - 1``; a weight read that is NaN, infinite or negative.
        """
        if not isinstance(unread, bool):
            raise InvalidTypeError(f"unread must be a bool, got {unread!r}")
        fresh = self._fresh()
        before = [0] * self.heads if fresh else self._counts()
        base = max(before)
        arr, shape = _weights_or_shape(attn, self._reads_attention and not unread,
                                       "extend attn must be a rectangular (heads, C, W) array")
        given = shape
        if len(shape) == 2 and self.heads == 1:
            shape = (1, *shape)
        if len(shape) != 3 or shape[0] != self.heads or shape[1] < 1 or shape[2] != base + shape[1]:
            raise chunk_shape_error(self.heads, base, given)
        chunk = shape[1]
        mask = read_admit(admit, self.heads, chunk)
        joins = [[True] * chunk for _ in range(self.heads)] if mask is None else mask.astype(bool).tolist()
        first = 0 if fresh else self._last + 1
        if first + chunk - 1 > UINT32_MAX:
            raise InvalidInputError(f"a chunk of {chunk} tokens after position {self._last} "
                                    "would pass position 2**32 - 1")
        # The weights each vote step reads, all checked before anything changes: a token
        # votes only in the rows it joins, over what the row holds at that moment.
        steps: list[list[list[float]]] | None = None
        if arr is not None:
            grid = arr.reshape(self.heads, chunk, shape[2])
            steps = []
            for h in range(self.heads):
                n = before[h]
                steps.append([_widen(grid[h, i, list(range(n)) + [n + j for j in range(i) if joins[h][j]]])
                              if joins[h][i] else [] for i in range(chunk)])
        self._grow_to(max(n + sum(row) for n, row in zip(before, joins)))
        for h in range(self.heads):
            if fresh and not joins[h][0]:  # position 0 leaves the row
                self._kept[h] = []
                if self._score_key is not None:
                    self._scores[h] = []
                if self._history is not None:
                    self._history[h] = []
                if self._held is not None:
                    self._held[h] = []
            for i in range(1 if fresh else 0, chunk):
                if not joins[h][i]:
                    continue  # the token neither votes in this row nor joins it
                if steps is not None:
                    self._vote(h, steps[h][i])
                self._append(h, first + i)
        self._last = first + chunk - 1

    @_locked
    def select_rows(self, index: Any) -> None:
        """Replace the rows by copies of old rows ``index`` (repeats allowed): row ``i``
        becomes an exact copy of old row ``index[i]``, and ``heads`` ``len(index)``;
        the capacity per row stays.

        Raises
        ------
        InvalidTypeError
            ``index`` is not integers (bools included).
        InvalidInputError
            ``index`` empty, not 1-D, longer than 65536, or naming a row outside
            ``[0, heads)``.
        """
        rows = read_row_index(index, self.heads).tolist()
        if len(rows) % self.pool:
            raise InvalidInputError(f"index must hold a multiple of pool={self.pool} rows (pools are "
                                    f"consecutive rows), got {len(rows)}")
        p = self.pool
        for at in range(0, len(rows), p):
            if rows[at] % p or rows[at:at + p] != list(range(rows[at], rows[at] + p)):
                raise InvalidInputError(f"index must take each pool of {p} rows whole and in order (rows "
                                        f"p*{p} .. p*{p}+{p - 1}), got {rows[at:at + p]} at {at}")
        kept = [list(self._kept[r]) for r in rows]
        scores = [list(self._scores[r]) for r in rows] if self._score_key is not None else []
        history = None if self._history is None else [list(self._history[r]) for r in rows]
        held = None if self._held is None else [list(self._held[r]) for r in rows]
        self._kept, self._scores, self._history, self._held = kept, scores, history, held
        self.heads = len(rows)

    @_locked
    def prefill(self, attn: Any) -> None:
        """Consume a prompt's attention as the decode steps admitting positions 1..P-1.

        Parameters
        ----------
        attn : array_like
            Lower-triangular prompt attention, shape ``(P, P)`` or ``(heads, P, P)``,
            ``P >= 1``: row ``i`` holds token ``i``'s weights over positions ``0..i``.
            Row ``i >= 1`` is applied as ``on_decode_step(i, attn[..., i, :i])``; the
            diagonal and the upper triangle are never read.  Policies that ignore
            attention read only its shape.  Nothing is evicted.

        Raises
        ------
        InvalidInputError
            The policy is not fresh (a position was admitted since construction or
            :meth:`reset`); a bad shape; a NaN, infinite or negative weight in the
            lower triangle.
        InvalidTypeError
            ``attn`` does not hold real numbers.
        """
        if not self._fresh():
            raise InvalidInputError("prefill needs a fresh policy (holding {0}); call reset()")
        p, rows = self._read_prompt(attn)
        for i in range(1, p):
            self._admit(i, None if rows is None else [rows[h][i - 1] for h in range(self.heads)])

    def _counts(self) -> list[int]:
        """Positions held by each row."""
        return [len(row) for row in self._kept]

    def _fresh(self) -> bool:
        """Nothing admitted since construction or reset: every row holds {0}."""
        return self._last == 0 and all(len(row) == 1 for row in self._kept)

    def kept_count(self) -> int:
        """Number of positions held per head (every head holds the same number).

        Raises
        ------
        InvalidInputError
            The rows hold different counts (read ``counts``, ``kept_row(head)`` or
            ``state_dict()``).
        """
        counts = self._counts()
        if any(n != counts[0] for n in counts):
            raise ragged_counts_error("kept_count()")
        return counts[0]

    @property
    def counts(self) -> np.ndarray:
        """Positions held by each row: uint32, shape ``(heads,)``."""
        return np.array(self._counts(), dtype=np.uint32)

    def kept_row(self, head: int) -> np.ndarray:
        """Positions held by row ``head``, ascending: uint32, shape ``(counts[head],)``.

        Raises
        ------
        InvalidTypeError
            ``head`` is not an integer.
        InvalidInputError
            ``head`` is outside ``[0, heads)``.
        """
        head = check_int("head", head, 0, self.heads - 1)
        return np.array(self._kept[head], dtype=np.uint32)

    @property
    def kept(self) -> np.ndarray:
        """Held positions, uint32, ascending: shape ``(n,)``, or ``(heads, n)`` if heads > 1.

        Raises
        ------
        InvalidInputError
            The rows hold different counts.
        """
        return self._as_array(self._kept, np.uint32, "kept")

    def _as_array(self, rows: list[list[Any]], dtype: Any, name: str) -> np.ndarray:
        """Rows of one count as ``(n,)`` or ``(heads, n)``; rows of different counts raise."""
        counts = self._counts()
        if any(n != counts[0] for n in counts):
            raise ragged_counts_error(name)
        arr = np.array(rows, dtype=dtype).reshape(self.heads, counts[0])
        return arr[0] if self.heads == 1 else arr

    def _slot_of(self, pos: Any, head: Any) -> int | None:
        """Slot of ``pos`` in row ``head``, or None when it is not held."""
        if isinstance(pos, (bool, np.bool_)) or not isinstance(pos, numbers.Integral):
            raise InvalidTypeError(f"pos must be an integer, not {type(pos).__name__}")
        head = check_int("head", head, 0, self.heads - 1)
        row = self._kept[head]
        i = bisect.bisect_left(row, int(pos))
        return i if i < len(row) and row[i] == pos else None

    @property
    def threads(self) -> int:
        """Threads the C path may use for one call's rows (default 1). The reference
        keeps and validates the setting as the C-backed classes do (an integer in
        ``[1, 64]``, not part of the state) and always works on one thread: the count
        never changes a result."""
        return self._threads

    @threads.setter
    def threads(self, value: int) -> None:
        self._threads = check_int("threads", value, 1, MAX_THREADS)

    def memory_bytes(self) -> int:
        """``64 + capacity * bytes per slot`` for one head, ``64 + 4 * heads + capacity *
        heads * bytes per slot`` for more (each row's count), plus ``4 + 8 * m`` with
        ``m >= 1`` pinned spans (their number, each start and stop): the C object's
        footprint.

        Capacity per head starts at ``min(budget + 1, 4096)`` and, when a position is
        admitted into a full row, grows to ``min(2 * capacity, budget + 1)`` while below
        ``budget + 1``, else doubles; ``reset()`` keeps it.
        """
        return memory_bytes(self._capacity, self.heads, self._slot_bytes(), len(self._pins))

    @_locked
    def fit_capacity(self, capacity: int) -> None:
        """Every row's storage becomes ``capacity`` slots (at least each row's count);
        growth doubles from there as usual (:meth:`memory_bytes`).  The transformers
        cache starts its policies at what they hold, so that their state follows it.

        Raises
        ------
        InvalidInputError
            ``capacity`` below a row's count, below 1 or above 2**32 - 1.
        """
        low = max(1, int(max(self._counts(), default=1)))
        self._capacity = check_int("capacity", capacity, low, 2**32 - 1)

    @_locked
    def reset(self) -> None:
        """Go back to holding ``{0}`` with nothing remembered (capacity is kept): a fresh
        object as constructed, so the spans given to the constructor stay pinned and
        those :meth:`pin` added are forgotten (a policy loaded from a state counts every
        span the state held as given to the constructor)."""
        self._pins = list(self._initial_pins)
        self._kept = [[0] for _ in range(self.heads)]
        self._scores = [[self._new_score()] for _ in range(self.heads)] if self._score_key else []
        self._history = [[0] for _ in range(self.heads)] if self._keeps_history() else None
        self._held = [[0] for _ in range(self.heads)] if self._keeps_held() else None
        self._last = 0

    def _params(self) -> dict[str, Any]:
        """``state_dict()["params"]``: budget, the first option, heads, then the other
        options not at their default (the C-backed classes record the same)."""
        shown = shown_values(self.name, self._options)
        first = dict(list(shown.items())[:1])
        params = {"budget": self.budget, **first, "heads": self.heads,
                  **{k: v for k, v in shown.items() if k not in first}}
        if self._pins:
            params["pins"] = [list(span) for span in self._pins]
        return params

    @_locked
    def state_dict(self) -> dict[str, Any]:
        """The state as plain data (JSON-ready), loadable by either backend.

        Returns
        -------
        dict
            ``{"format": "scissorhands.policy", "version": 1, "policy": name, "params":
            {...}, "kept": [[int]*n]*heads, "last_position": int}`` plus ``"votes"``
            (Scissorhands) or ``"scores"`` (H2O, TOVA), shaped like ``"kept"``, and for a
            Scissorhands policy with a history window ``"history"``: each slot's vote
            register (bit ``j`` = the vote of the step ``j`` steps back), also shaped
            like ``"kept"``.  Rows may differ in length (a row may be empty).
        """
        state: dict[str, Any] = {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "policy": self.name,
            "params": self._params(),
            "kept": [list(row) for row in self._kept],
        }
        if self._score_key is not None:
            state[self._score_key] = [list(row) for row in self._scores]
        if self._history is not None:
            state["history"] = [list(row) for row in self._history]
        if self._held is not None:
            state["steps_held"] = [list(row) for row in self._held]
        state["last_position"] = self._last
        return state

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> Any:
        """Rebuild a policy from :meth:`state_dict` output (of either backend).

        Every field is validated; capacity grows from its initial value, one doubling at
        a time, until the state fits.  ``params`` may lack the optional parameters
        (``sinks`` of Scissorhands, H2O and TOVA, ``history_window`` of Scissorhands), as
        states written before they existed do: they take their defaults.  ``history``
        is present exactly when ``params`` sets a history window.

        Raises
        ------
        InvalidTypeError
            ``state`` or a field has the wrong kind (not a dict, not a list, a non-integer
            position or vote, a non-real score).
        InvalidInputError
            Wrong format, version or policy name; missing or unknown keys; parameters out
            of range; not ``heads`` rows, or per-slot rows not as long as kept's (rows may
            differ in length, and may be empty); positions not strictly ascending within
            a row, out of range or above ``last_position``; votes out of range; scores NaN,
            infinite or negative; ``history`` missing or unexpected, a register with a bit
            at or above the window, or a vote count that is not its register's number of
            bits.
        """
        spec = SPECS[cls.name]
        names = [o.name for o in spec.options]
        keeps_registers = spec.takes("history_window")
        policy, rows = parse_state(
            state, cls.name, cls._score_key, ("budget", *names[:1], "heads"), cls, (*names[1:], "pins"),
            ("history", "steps_held") if keeps_registers else ())
        if rows.scores is not None:
            policy._scores = rows.split(rows.scores)
        if keeps_registers:
            history = parse_history(state, policy._options["history_window"], rows)
            held = parse_held(state, policy._options["vote_rate"], rows, history)
            policy._history = None if history is None else rows.split(history)
            policy._held = None if held is None else rows.split(held)
        policy._kept = rows.split(rows.kept)
        policy._last = rows.last
        policy._grow_to(int(rows.counts.max()))
        return policy

    def __reduce__(self) -> tuple[Any, ...]:
        # pickle and copy.deepcopy go through the state dict.
        return (type(self).from_state_dict, (self.state_dict(),))

    def __repr__(self) -> str:
        """Never raises (also for a policy whose constructor was refused part-way)."""
        try:
            params = ", ".join(f"{k}={v}" for k, v in self._params().items())
            counts = self._counts()
            held = str(counts[0]) if min(counts) == max(counts) else f"{min(counts)}..{max(counts)}"
        except Exception:  # a partly built object: what it has
            return partial_repr(self)
        return f"{type(self).__name__}({params}, held={held})"


class _HeavyHitters(_Policy):
    """Score-based eviction with sinks and a recent window, shared by Scissorhands, H2O and
    TOVA.

    The evictable range is ``kept[min(sinks, n) : n - recent_window]``: the first
    ``sinks`` positions held and the ``recent_window`` newest are never evicted.  Its
    lowest-scored slots go first, equal scores evicting the lower position.
    """

    recent_window: int
    sinks: int

    def __init__(self, budget: int = 512, recent_window: int = 32, rng: Any = None, heads: int = 1,
                 sinks: int = 0, pool: int = 1, pins: Any = ()) -> None:
        self._configure(budget, recent_window=recent_window, sinks=sinks, pool=pool)
        self._setup(heads, pins)

    def _evictable(self, head: int) -> list[int]:
        """The slots of row ``head`` outside its sinks, its recent window and the
        pinned positions."""
        n = len(self._kept[head])
        return self._unpinned(head, range(min(self.sinks, n), n - self.recent_window))

    def _rank(self, head: int, slot: int) -> Any:
        """What orders slot ``slot`` of row ``head`` for eviction (least goes first)."""
        return self._scores[head][slot]

    def _victim_slots(self, head: int, count: int) -> list[int]:
        # kept is ascending, so ordering ties by slot orders them by position.
        return sorted(self._evictable(head), key=lambda s: (self._rank(head, s), s))[:count]

    def sink_count(self) -> int:
        """Sinks held: ``min(sinks, kept_count())``."""
        return min(self.sinks, self.kept_count())


class Scissorhands(_HeavyHitters):
    """Scissorhands: evict the positions that were important on the fewest steps.

    A position earns one vote on each decode step where its attention weight strictly
    exceeds the fair share ``1.0 / len(attn)`` (compared in double on the value as given:
    a float32 weight is widened exactly).  Votes are uint32 and saturate at ``2**32 - 1``.
    Eviction drops the least-voted positions outside the sinks and the recent window,
    ties to the lower position.

    With a ``history_window`` of ``w`` steps a vote counts only while it is among the
    last ``w`` decode steps that carried attention: each slot keeps a register of its
    vote bits (bit 0 the latest step); every such step shifts each held slot's register
    left by one, adds the new bit and keeps the low ``w`` bits, and the slot's vote count
    is the number of bits set.  A step with ``attn=None`` is not a step of the history.

    With ``vote_rate=True`` each slot also counts the decode steps that carried attention
    since it was admitted (``steps_held``, uint32, saturating), and eviction ranks slots by
    ``votes / steps`` instead of votes, where ``steps`` is the count capped at the history
    window (when set) and raised to at least 1; the rate is a Python float (a correctly
    rounded double, as in C), equal rates evicting the lower position.

    Parameters
    ----------
    budget : int, default 512
        Positions to keep per head, in ``[1, 2**32 - 1]``.
    recent_window : int or float, default 32
        The most recent positions, never evicted: an int in ``[0, budget - 1]``, or a
        float (or ``Fraction``) in ``[0, 1)``: that fraction of the budget, rounded down,
        a float read as the decimal it prints as (``0.7`` of 10 is 7; the attribute and
        the state hold the resolved count).
    rng : any, default None
        Accepted and ignored (the policy is deterministic).
    heads : int, default 1
        Independent rows (KV heads), in ``[1, 65536]``.
    sinks : int, default 0
        The first positions held, never evicted; ``recent_window + sinks < budget``.
    history_window : int or None, default None
        Decode steps a vote counts for, in ``[1, 64]``; None counts them forever.
    vote_rate : bool, default False
        Evict by votes per step held rather than by votes.
    pool : int, default 1
        Consecutive rows sharing one budget (Ada-KV, Feng et al., 2024, arXiv
        2407.11550): rows ``[g * pool, (g + 1) * pool)`` hold at most
        ``pool * budget`` positions in all, so a row whose attention is spread out may
        hold more than ``budget`` while another holds less. Over that share a pool
        evicts its least-ranked evictable slots, ties going to the lower position,
        then the lower row (each row keeps its sinks and recent window). Must divide
        ``heads``; with ``pool > 1`` rows evict different numbers, so only
        ``step_rows``/``evict_rows`` evict. 1 = each row its own budget.

    pins : sequence of (int, int), default ()
        Pinned spans ``(start, stop)``, half-open, that no eviction takes in any row;
        checked and merged as :meth:`pin` does (refused as it refuses a span).  Sinks
        are the span ``(0, sinks)``; :meth:`reset` keeps these spans.
    Raises
    ------
    InvalidTypeError
        A parameter is not an integer (bool and float refused, except a float
        ``recent_window``, a fraction of the budget; ``history_window`` may also be None),
        or ``vote_rate`` is not a bool.
    InvalidInputError
        A parameter is out of range.

    References
    ----------
    Z. Liu et al., "Scissorhands: Exploiting the Persistence of Importance Hypothesis for
    LLM KV Cache Compression at Test Time", NeurIPS 2023, arXiv:2305.17118.
    """

    name = "scissorhands"
    history_window: int | None
    vote_rate: bool

    def __init__(self, budget: int = 512, recent_window: int = 32, rng: Any = None, heads: int = 1,
                 sinks: int = 0, history_window: int | None = None, vote_rate: bool = False,
                 pool: int = 1, pins: Any = ()) -> None:
        self._configure(budget, recent_window=recent_window, sinks=sinks,
                        history_window=history_window, vote_rate=vote_rate, pool=pool)
        self._setup(heads, pins)

    def _keeps_history(self) -> bool:
        return self.history_window is not None

    def _keeps_held(self) -> bool:
        return self.vote_rate

    def _rank(self, head: int, slot: int) -> Any:
        if self._held is None:
            return self._scores[head][slot]
        cap = self.history_window if self.history_window is not None else UINT32_MAX
        return self._scores[head][slot] / max(1, min(self._held[head][slot], cap))

    def _update(self, head: int, weights: list[float]) -> None:
        if self._held is not None:
            self._held[head] = [min(c + 1, UINT32_MAX) for c in self._held[head]]
        share = 1.0 / len(weights)
        votes = self._scores[head]
        if self._history is None:
            for i, w in enumerate(weights):
                if w > share and votes[i] < UINT32_MAX:
                    votes[i] += 1
            return
        keep = (1 << self.history_window) - 1  # type: ignore[operator]
        registers = self._history[head]
        for i, w in enumerate(weights):
            registers[i] = ((registers[i] << 1) | int(w > share)) & keep
            votes[i] = registers[i].bit_count()

    @property
    def steps_held(self) -> np.ndarray:
        """Decode steps that carried attention since each position was admitted, aligned
        with :attr:`kept`, uint32, shape ``(n,)`` or ``(heads, n)``.

        Raises
        ------
        InvalidInputError
            The policy was built without ``vote_rate``.
        """
        if self._held is None:
            raise InvalidInputError("steps_held is kept only with vote_rate=True")
        return self._as_array(self._held, np.uint32, "steps_held")

    @property
    def votes(self) -> np.ndarray:
        """Votes aligned with :attr:`kept`, uint32, shape ``(n,)`` or ``(heads, n)``
        (rows of different counts raise ``InvalidInputError``)."""
        return self._as_array(self._scores, np.uint32, "votes")

    def votes_of(self, pos: int, head: int = 0) -> int:
        """Votes of ``pos`` in row ``head``, or -1 when it is not held.

        Raises
        ------
        InvalidTypeError
            ``pos`` or ``head`` is not an integer.
        InvalidInputError
            ``head`` is outside ``[0, heads)``.
        """
        slot = self._slot_of(pos, head)
        return -1 if slot is None else self._scores[head][slot]


class H2O(_HeavyHitters):
    """H2O (heavy-hitter oracle): evict the lowest cumulative attention.

    Each position's score is the sum, in float64, of every weight it has received
    (float32 weights widened exactly before adding), saturating at the largest finite
    double so that a score stays finite (weights near 1e308 would otherwise overflow).
    Eviction drops the lowest scores outside the sinks and the recent window, ties to the lower
    position.

    Parameters
    ----------
    budget : int, default 512
        Positions to keep per head, in ``[1, 2**32 - 1]``.
    recent_window : int or float, default 32
        The most recent positions, never evicted: an int in ``[0, budget - 1]``, or a
        float (or ``Fraction``) in ``[0, 1)``: that fraction of the budget, rounded down,
        a float read as the decimal it prints as (``0.7`` of 10 is 7; the attribute and
        the state hold the resolved count).
    rng : any, default None
        Accepted and ignored.
    heads : int, default 1
        Independent rows (KV heads), in ``[1, 65536]``.
    sinks : int, default 0
        The first positions held, never evicted; ``recent_window + sinks < budget``.
    pool : int, default 1
        Consecutive rows sharing one budget (Ada-KV), as :class:`Scissorhands` takes it.

    pins : sequence of (int, int), default ()
        Pinned spans ``(start, stop)``, half-open, that no eviction takes in any row;
        checked and merged as :meth:`pin` does (refused as it refuses a span).  Sinks
        are the span ``(0, sinks)``; :meth:`reset` keeps these spans.
    Raises
    ------
    InvalidTypeError
        A parameter is not an integer (a float ``recent_window`` is a fraction).
    InvalidInputError
        A parameter is out of range.

    References
    ----------
    Z. Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of
    Large Language Models", NeurIPS 2023, arXiv:2306.14048.
    """

    name = "h2o"

    def _new_score(self) -> float:
        return 0.0

    def _update(self, head: int, weights: list[float]) -> None:
        scores = self._scores[head]
        for i, w in enumerate(weights):
            scores[i] = min(scores[i] + w, DBL_MAX)  # +inf would not survive state_dict()

    @property
    def scores(self) -> np.ndarray:
        """Scores aligned with :attr:`kept`, float64, shape ``(n,)`` or ``(heads, n)``
        (rows of different counts raise ``InvalidInputError``)."""
        return self._as_array(self._scores, np.float64, "scores")

    def score_of(self, pos: int, head: int = 0) -> float:
        """Cumulative score of ``pos`` in row ``head``, or -1.0 when it is not held.

        Raises
        ------
        InvalidTypeError
            ``pos`` or ``head`` is not an integer.
        InvalidInputError
            ``head`` is outside ``[0, heads)``.
        """
        slot = self._slot_of(pos, head)
        return -1.0 if slot is None else self._scores[head][slot]


class TOVA(_HeavyHitters):
    """TOVA (token omission via attention): evict the positions the current token attends
    to least.

    Each decode step that carries attention sets every held position's score to that
    step's weight, a float64 (float32 weights widened exactly; ``-0.0`` stored as
    ``0.0``), instead of adding it as :class:`H2O` does; the new position then joins
    with a score of 0, and a step with ``attn=None`` changes no score.  ``prefill`` and
    ``extend`` apply each token as a decode step, so after a chunk a position's score is
    the weight of the last token that read it.  Eviction is H2O's: the lowest scores
    outside the sinks and the recent window go, ties to the lower position.

    A step's weights never include the new token's weight on itself, so the newest
    position has no score yet: TOVA needs ``recent_window >= 1`` and always keeps it (as
    kvpress's ``TOVAPress`` keeps the last token).  With several heads, each row takes
    the attention averaged over the query heads it serves.

    Parameters
    ----------
    budget : int, default 512
        Positions to keep per head, in ``[2, 2**32 - 1]`` (above the recent window and
        the sinks).
    recent_window : int or float, default 1
        The most recent positions, never evicted: an int in ``[1, budget - 1]``, or a
        float (or ``Fraction``) in ``[0, 1)``: that fraction of the budget, rounded down,
        which must come to at least 1 (the attribute and the state hold the resolved
        count).
    rng : any, default None
        Accepted and ignored.
    heads : int, default 1
        Independent rows (KV heads), in ``[1, 65536]``.
    sinks : int, default 0
        The first positions held, never evicted; ``recent_window + sinks < budget``.
    pool : int, default 1
        Consecutive rows sharing one budget (Ada-KV), as :class:`Scissorhands` takes it.

    pins : sequence of (int, int), default ()
        Pinned spans ``(start, stop)``, half-open, that no eviction takes in any row;
        checked and merged as :meth:`pin` does (refused as it refuses a span).  Sinks
        are the span ``(0, sinks)``; :meth:`reset` keeps these spans.
    Raises
    ------
    InvalidTypeError
        A parameter is not an integer (a float ``recent_window`` is a fraction).
    InvalidInputError
        A parameter is out of range; ``recent_window`` below 1 (``"tova needs
        recent_window >= 1 ..."``).

    References
    ----------
    M. Oren, M. Hassid, N. Yarden, Y. Adi and R. Schwartz, "Transformers are Multi-State
    RNNs", 2024, arXiv:2401.06104.
    """

    name = "tova"

    def __init__(self, budget: int = 512, recent_window: int = 1, rng: Any = None, heads: int = 1,
                 sinks: int = 0, pool: int = 1, pins: Any = ()) -> None:
        self._configure(budget, recent_window=recent_window, sinks=sinks, pool=pool)
        self._setup(heads, pins)

    def _new_score(self) -> float:
        return 0.0

    def _update(self, head: int, weights: list[float]) -> None:
        # Assigned, not added; + 0.0 stores a -0.0 weight as 0.0 (the C selection orders
        # scores by their bits).
        self._scores[head] = [w + 0.0 for w in weights]

    @property
    def scores(self) -> np.ndarray:
        """Scores (the latest step's weights) aligned with :attr:`kept`, float64, shape
        ``(n,)`` or ``(heads, n)`` (rows of different counts raise ``InvalidInputError``)."""
        return self._as_array(self._scores, np.float64, "scores")

    def score_of(self, pos: int, head: int = 0) -> float:
        """Score of ``pos`` in row ``head`` (the weight the latest step with attention
        gave it; 0 before any), or -1.0 when it is not held.

        Raises
        ------
        InvalidTypeError
            ``pos`` or ``head`` is not an integer.
        InvalidInputError
            ``head`` is outside ``[0, heads)``.
        """
        slot = self._slot_of(pos, head)
        return -1.0 if slot is None else self._scores[head][slot]


class StreamingLLM(_Policy):
    """StreamingLLM: keep the attention sinks and a sliding window of recent positions.

    The first ``sinks`` positions admitted are never evicted; otherwise the oldest go
    first.  Attention is ignored entirely (never read, never validated).  ``sinks=0`` is
    a plain sliding window.

    Parameters
    ----------
    budget : int, default 512
        Positions to keep per head, in ``[1, 2**32 - 1]``.
    sinks : int, default 4
        Leading positions never evicted, in ``[0, budget - 1]``.
    rng : any, default None
        Accepted and ignored.
    heads : int, default 1
        Rows, in ``[1, 65536]`` (all identical, since attention is ignored).

    pins : sequence of (int, int), default ()
        Pinned spans ``(start, stop)``, half-open, that no eviction takes in any row;
        checked and merged as :meth:`pin` does (refused as it refuses a span).  Sinks
        are the span ``(0, sinks)``; :meth:`reset` keeps these spans.
    Raises
    ------
    InvalidTypeError
        A parameter is not an integer.
    InvalidInputError
        A parameter is out of range.

    References
    ----------
    G. Xiao et al., "Efficient Streaming Language Models with Attention Sinks",
    ICLR 2024, arXiv:2309.17453.
    """

    name = "streaming-llm"
    sinks: int

    def __init__(self, budget: int = 512, sinks: int = 4, rng: Any = None, heads: int = 1,
                 pins: Any = ()) -> None:
        self._configure(budget, sinks=sinks)
        self._setup(heads, pins)

    def _victim_slots(self, head: int, count: int) -> list[int]:
        # The oldest positions after the sinks that are not pinned.
        n = len(self._kept[head])
        return self._unpinned(head, range(min(self.sinks, n), n))[:count]

    def sink_count(self) -> int:
        """Sinks held: ``min(sinks, kept_count())``."""
        return min(self.sinks, self.kept_count())


class Full(_Policy):
    """Full cache: never evicts (the baseline every policy is compared with).

    Parameters
    ----------
    budget : int or None, default None
        Validated (``[1, 2**32 - 1]``) and recorded, never used.
    rng : any, default None
        Accepted and ignored.
    heads : int, default 1
        Rows, in ``[1, 65536]``.

    pins : sequence of (int, int), default ()
        Pinned spans, checked and kept as :meth:`pin` keeps them; they change nothing,
        since the full cache never evicts.
    Notes
    -----
    Capacity starts at 64 per head and doubles when full; ``evict`` validates its budget
    and returns nothing.  Attention is never read.
    """

    name = "full"

    def __init__(self, budget: int | None = None, rng: Any = None, heads: int = 1, pins: Any = ()) -> None:
        self.budget = None if budget is None else check_int("budget", budget, 1, UINT32_MAX)
        self._options = {}
        self._setup(heads, pins)

    def _initial_capacity(self) -> int:
        return FULL_INITIAL_CAPACITY

    def _capacity_limit(self) -> int | None:
        return None

    def _evictions(self, budget: int | None, admitted: int = 0) -> list[int]:
        return [0] * self.heads


#: Registry: name -> class, the same names as the C-backed package, in the registry's
#: order, each the class its :class:`~scissorhands.options.PolicySpec` names; an
#: unknown name raises :class:`~scissorhands.errors.UnknownPolicyError`.
POLICIES: PolicyRegistry[type[_Policy]] = PolicyRegistry(
    (name, globals()[spec.class_name]) for name, spec in SPECS.items())

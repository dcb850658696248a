"""The first layer of the reference's :class:`~scissorhands.reference._base._Policy`:
the object (configuration checked by the policy's spec, rows, capacity and its growth,
the lock), the hooks each policy overrides, and the pinned spans no eviction takes.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar

from scissorhands._shared import (
    HELD_BYTES,
    HISTORY_BYTES,
    INITIAL_CAPACITY_LIMIT,
    MAX_HEADS,
    MAX_THREADS,
    UINT32_MAX,
    Span,
    check_int,
    check_pool,
    check_span,
    is_pinned,
    memory_bytes,
    merge_spans,
    pinned_budget_error,
    pins_budget_error,
    read_pins,
    remake_lock_after_fork,
    window_beside_pins,
)
from scissorhands.options import SPECS
from scissorhands.reference._core import _locked


class _PolicyObject:
    """The object every policy is: its configuration, rows, capacity, lock and pinned
    spans, the hooks a policy overrides, and reset.

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
        """The budget the spans are checked against: the configured one (``2**32 - 1`` for a
        policy without one or whose spec never evicts, as its C object is built)."""
        return UINT32_MAX if self.budget is None or not SPECS[self.name].evicts else self.budget

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

    # -- rows and capacity ----------------------------------------------------------

    def _counts(self) -> list[int]:
        """Positions held by each row."""
        return [len(row) for row in self._kept]

    def _fresh(self) -> bool:
        """Nothing admitted since construction or reset: every row holds {0}."""
        return self._last == 0 and all(len(row) == 1 for row in self._kept)

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

"""A C-backed policy's object: construction, the lock, pinned spans, validation
and what a policy holds (counts, rows, threads, memory, reset, look-ups); the calls that
change it are the layers above (:mod:`._decode`, :mod:`._rows`, :mod:`._chunks`).
"""

from __future__ import annotations

import numbers
import threading
from typing import Any, ClassVar

import numpy as np

from scissorhands._native import check, ffi, lib
from scissorhands._policy_spec import protected_message
from scissorhands._registry import declared_spec, policy_spec
from scissorhands._shared import (
    MAX_HEADS,
    MAX_THREADS,
    UINT32_MAX,
    Span,
    check_int,
    check_pool,
    check_span,
    merge_spans,
    pinned_budget_error,
    pins_budget_error,
    ragged_counts_error,
    read_pins,
    remake_lock_after_fork,
    window_beside_pins,
)
from scissorhands.errors import InvalidInputError, InvalidTypeError


class _PolicyCore:
    """A C-backed policy's object and what it holds; the base of :class:`._base.NativePolicy`."""

    #: Registry name (``state_dict()["policy"]``); its :class:`~scissorhands.options.PolicySpec`,
    #: the ``SPEC`` of the class's module, declares the options the constructor takes.
    name: ClassVar[str]
    #: The C kind (``sh_config.kind``) and the name of the per-slot score property
    #: (``"votes"``, ``"scores"``) or None: what the spec declares, set for each subclass.
    _kind: ClassVar[int]
    _score_name: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:  # a policy of the registry (its module's SPEC: the registry may be discovering)
            spec = declared_spec(cls)
            cls._kind = getattr(lib, spec.kind)
            cls._score_name = spec.score_key

    def __init__(self, *, budget: int, heads: int, pins: Any = (), **options: Any) -> None:
        """Validate in the order both backends share (budget, then the spec's options
        with their sum against the budget, then heads, then the pinned spans) and build
        the C object; each option goes to the ``sh_config`` field of the same name."""
        spec = policy_spec(self.name)
        self._reads_attention = spec.reads_attention
        self._evicts = spec.evicts
        self._budget = check_int("budget", budget, 1, UINT32_MAX)
        self._options = spec.check(self._budget, options)
        self._protected = {o.name: self._options[o.name] for o in spec.options if o.protects}
        self._heads = check_int("heads", heads, 1, MAX_HEADS)
        self._pool = check_pool(self._options.get("pool", 1), self._heads)
        spans = read_pins(pins)
        shared = window_beside_pins(options.get("recent_window"), spans, self._options.get("sinks", 0), self._budget)
        if shared is not None:  # a fraction of what the spans and the sinks leave
            self._options["recent_window"] = shared
            self._protected["recent_window"] = shared
        self._check_spans(spans)
        cfg = ffi.new("sh_config *")
        cfg.kind = self._kind
        cfg.heads = self._heads
        cfg.budget = self._budget
        for name, value in self._options.items():
            if name != "pool":  # an argument of each pooled call, not of the C object
                setattr(cfg, name, 0 if value is None else int(value))
        out = ffi.new("sh_policy **")
        check(lib.sh_policy_new(cfg, out), type(self).__name__)
        self._ptr = ffi.gc(out[0], lib.sh_policy_free)
        self._remake_lock()
        remake_lock_after_fork(self)
        # Mirrors of the C object, read on the hot path: the largest count of a row,
        # whether the rows hold different counts, and the last position.
        self._n = 1
        self._ragged = False
        self._last = 0
        self._n_victims = ffi.new("size_t *")
        self._grow_victims(1)
        self._pins: list[Span] = []
        self._set_pins(spans)
        #: The spans given at construction: what reset() goes back to.
        self._initial_pins = spans

    def _remake_lock(self) -> None:
        """A new, free lock (at construction, and in a forked child: the parent's may be
        held by a thread the child does not have)."""
        self._lock = threading.Lock()
        # Bound once: the decode step takes and releases the lock on every call.
        self._acquire = self._lock.acquire
        self._release = self._lock.release

    def _grow_victims(self, size: int) -> None:
        """(Re)allocate the reusable output buffers and their C views."""
        self._victims = np.empty(size, dtype=np.uint32)
        self._slots = np.empty(size, dtype=np.int64)
        self._victims_size = size
        self._victims_c = ffi.from_buffer("uint32_t[]", self._victims)
        self._slots_c = ffi.from_buffer("int64_t[]", self._slots)

    # ------------------------------------------------------------ pinned spans

    def _check_spans(self, spans: list[Span]) -> None:
        """Refuse merged ``spans`` that leave nothing to evict at the configured budget."""
        error = pins_budget_error(spans, self._options.get("sinks", 0), self._options.get("recent_window", 0),
                                  self._budget)
        if error is not None:
            raise error

    def _set_pins(self, spans: list[Span]) -> None:
        """Give the C object exactly ``spans`` (checked, merged); must hold the lock or
        be constructing. ``MemoryError`` leaves the old spans."""
        flat = np.array(spans, dtype=np.uint32).reshape(-1)
        check(lib.sh_policy_set_pins(self._ptr, ffi.from_buffer("uint32_t[]", flat), len(spans)),
              type(self).__name__)
        self._pins = list(spans)

    def pin(self, start: int, stop: int) -> None:
        """Pin positions ``start <= pos < stop``: no eviction takes them, in any row.

        Pinned spans generalise attention sinks (StreamingLLM, Xiao et al., ICLR 2024,
        arXiv 2309.17453: a policy with ``sinks=s`` evicts as one with ``sinks=0`` and
        ``pin(0, s)``), as llama.cpp's ``n_keep`` and TensorRT-LLM's token-range
        retention priorities do: a system prompt, the start of each turn. A span may
        name positions not admitted yet (they are protected once they join) and
        positions already evicted (nothing comes back). Overlapping or adjacent spans
        merge (:attr:`pins`). :meth:`evict`, :meth:`step`, :meth:`evict_rows`,
        :meth:`step_rows`, pooled budgets and the observation-window rule
        (:meth:`evict_observed_rows`) all leave pinned positions alone, so a
        row holds its sinks, its recent window and its pinned positions outside them;
        :class:`Full` keeps the spans and, never evicting, is unchanged by them.

        Parameters
        ----------
        start, stop : int
            The half-open span, ``0 <= start < stop <= 2**32 - 1`` (integers, not bools).

        Raises
        ------
        InvalidTypeError
            ``start`` or ``stop`` is not an integer.
        InvalidInputError
            Out of range, ``start >= stop``, more than 65536 spans after merging, or
            spans that leave nothing to evict: the positions pinned outside the sinks
            plus ``recent_window`` plus ``sinks`` reach the configured budget. The
            spans stay as they were.
        MemoryError
            Storing the spans failed (they stay as they were).
        """
        span = check_span(start, stop)
        with self._lock:
            spans = merge_spans(self._pins, [span])
            self._check_spans(spans)
            self._set_pins(spans)

    @property
    def pins(self) -> list[tuple[int, int]]:
        """The pinned spans, ``(start, stop)`` half-open, merged and ascending (a copy);
        ``[]`` when none."""
        return list(self._pins)

    def _check_pinned(self, budget: int, pos: int | None) -> None:
        """Refuse an eviction to a per-call ``budget`` below the configured one where
        the pinned positions leave some row (pool) too few to evict (after ``pos``
        joins, when not None); must hold the lock. At the configured budget or above
        the spans' own check guarantees enough."""
        if not self._pins or budget >= self._budget or not self._evicts:
            return
        counts, positions = self._export_locked()[:2]
        ends = np.cumsum(counts, dtype=np.int64)[:-1]
        rows = [part.tolist() for part in np.split(positions, ends)]
        error = pinned_budget_error(rows, self._pins, self._options.get("sinks", 0),
                                    self._options.get("recent_window", 0), budget, pos, self._pool)
        if error is not None:
            raise error

    # ------------------------------------------------------------ validation

    def _check_budget(self, budget: Any) -> int:
        if budget is None:
            return self._budget
        budget = check_int("budget", budget, 1)
        if sum(self._protected.values()) >= budget:
            raise InvalidInputError(protected_message(self._protected, budget))
        return budget

    def _check_position(self, pos: Any) -> int:
        if type(pos) is not int:
            pos = check_int("pos", pos, 0, UINT32_MAX)
        if not self._last < pos <= UINT32_MAX:
            check_int("pos", pos, 0, UINT32_MAX)
            raise InvalidInputError(
                f"pos must be greater than every position admitted ({self._last}), got {pos}"
            )
        return pos

    def _shape_error(self, shape: tuple[int, ...]) -> InvalidInputError:
        n, h = self._n, self._heads
        want = f"({n},) or (1, {n})" if h == 1 else f"({h}, {n})"
        what = ("max(counts) columns: row h reads its first counts[h]" if self._ragged
                else "one weight per held position")
        return InvalidInputError(f"attn must have shape {want} ({what}), got {shape}")

    def _weights_read(self, attn: np.ndarray) -> np.ndarray:
        """``attn`` as a step's rows read it, for the error that names a refused weight:
        with rows of different counts, the columns past a row's count (never read) are
        zeroed in a copy; must hold the lock."""
        if not self._ragged or attn.ndim != 2:
            return attn
        read = np.array(attn)
        read[np.arange(read.shape[1])[None, :] >= self._counts_locked()[:, None]] = 0
        return read

    def _counts_locked(self) -> np.ndarray:
        """The count of every row, ``uint32`` ``(heads,)``; must hold the lock."""
        out = np.empty(self._heads, dtype=np.uint32)
        check(lib.sh_policy_counts(self._ptr, ffi.from_buffer("uint32_t[]", out), out.size))
        return out

    def _sync(self) -> None:
        """Re-read the count mirrors from C (after a call that may change them
        unevenly); must hold the lock."""
        counts = self._counts_locked()
        self._n = int(counts.max())
        self._ragged = bool(counts.min() != self._n)

    def _fresh(self) -> bool:
        """Nothing admitted since construction or reset: every row holds {0}."""
        return not self._ragged and self._n == 1 and self._last == 0

    # ------------------------------------------------------------ inspection

    def kept_count(self) -> int:
        """Positions held per head (every head holds the same count).

        Raises
        ------
        InvalidInputError
            The rows hold different counts: read :attr:`counts`,
            :meth:`kept_row` or :meth:`state_dict` instead.
        """
        if self._ragged:
            raise ragged_counts_error("kept_count()")
        return self._n

    @property
    def counts(self) -> np.ndarray:
        """Positions held by each row: ``uint32``, shape ``(heads,)``."""
        with self._lock:
            return self._counts_locked()

    def kept_row(self, head: int) -> np.ndarray:
        """The positions row ``head`` holds, ascending: a ``uint32`` copy of shape
        ``(counts[head],)``.

        Raises
        ------
        InvalidTypeError
            ``head`` is not an integer.
        InvalidInputError
            ``head`` is outside ``[0, heads)``.
        """
        with self._lock:
            head = check_int("head", head, 0, self._heads - 1)
            out = np.empty(lib.sh_policy_row_count(self._ptr, head), dtype=np.uint32)
            check(lib.sh_policy_export_row(self._ptr, head, ffi.from_buffer("uint32_t[]", out), out.size))
            return out

    def _export(self, with_history: bool = False, equal: str | None = None) -> tuple[
            np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None, int]:
        """(counts, positions, scores, vote registers, steps held, last position), the
        arrays holding the rows one after another, all read under one hold of the lock;
        the registers and steps held only when asked for and kept (else None). With
        ``equal`` (a property's name), rows of different counts raise instead."""
        with self._lock:
            return self._export_locked(with_history, equal)

    def _export_locked(self, with_history: bool = False, equal: str | None = None) -> tuple[
            np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None, int]:
        """:meth:`_export`; must hold the lock."""
        if self._ragged:
            if equal is not None:
                raise ragged_counts_error(equal)
            counts = self._counts_locked()
        else:
            counts = np.full(self._heads, self._n, dtype=np.uint32)
        total = int(counts.sum())
        positions = np.empty(total, dtype=np.uint32)
        scores = None
        votes_ptr = scores_ptr = ffi.NULL
        if self._score_name == "votes":
            scores = np.empty(total, dtype=np.uint32)
            votes_ptr = ffi.from_buffer("uint32_t[]", scores)
        elif self._score_name == "scores":
            scores = np.empty(total, dtype=np.float64)
            scores_ptr = ffi.from_buffer("double[]", scores)
        check(lib.sh_policy_export(self._ptr, ffi.from_buffer("uint32_t[]", positions),
                                   votes_ptr, scores_ptr, total))
        history = None
        if with_history and self._options.get("history_window") is not None:
            history = np.empty(total, dtype=np.uint64)
            check(lib.sh_policy_export_history(self._ptr, ffi.from_buffer("uint64_t[]", history), total))
        held = None
        if with_history and self._options.get("vote_rate"):
            held = np.empty(total, dtype=np.uint32)
            check(lib.sh_policy_export_held(self._ptr, ffi.from_buffer("uint32_t[]", held), total))
        return counts, positions, scores, history, held, self._last

    def _equal_rows(self, name: str, index: int, with_history: bool = False) -> np.ndarray:
        """Array ``index`` of :meth:`_export` shaped as the property ``name`` returns it."""
        exported = self._export(with_history, equal=name)
        heads = len(exported[0])
        arr = exported[index]
        if not isinstance(arr, np.ndarray):  # the subclass's property names an array it keeps
            raise TypeError(f"{type(self).__name__} keeps no {name}")
        return arr if heads == 1 else arr.reshape(heads, len(arr) // heads)

    @property
    def kept(self) -> np.ndarray:
        """Held positions, ascending: a ``uint32`` copy of shape ``(n,)`` for one head,
        ``(heads, n)`` otherwise.

        Raises
        ------
        InvalidInputError
            The rows hold different counts (read :attr:`counts` and
            :meth:`kept_row` instead).
        """
        return self._equal_rows("kept", 1)

    @property
    def heads(self) -> int:
        """Independent rows (KV heads, or flattened sequences x heads)."""
        return self._heads

    @property
    def budget(self) -> int:
        """The configured budget (positions kept per head after :meth:`evict`)."""
        return self._budget

    @property
    def threads(self) -> int:
        """Threads one :meth:`step`, :meth:`step_rows`, :meth:`evict` or
        :meth:`evict_rows` call may spread its rows over (default 1).

        A call uses ``min(threads, heads)`` threads only when its rows hold at least
        262,144 positions in all (``PARALLEL_MIN_SLOTS`` in ``scissorhands._shared``:
        a model's layers x KV heads at long budgets); below that one thread does the
        work, since starting another costs more than it saves. The threads are
        started for the call and joined before it returns. Each row is one thread's work, so
        victims, slots and state are identical for every thread count. Settable, in
        ``[1, 64]``; a runtime setting, not part of :meth:`state_dict` (a loaded or
        copied policy starts at 1), kept by :meth:`reset` and :meth:`select_rows`.
        Leave it at 1 where another library already keeps the cores busy (torch in
        the transformers cache and ``eval``).

        Raises
        ------
        InvalidTypeError
            A value that is not an integer (bools included).
        InvalidInputError
            A value outside ``[1, 64]``.
        """
        return int(lib.sh_policy_threads(self._ptr))

    @threads.setter
    def threads(self, value: int) -> None:
        value = check_int("threads", value, 1, MAX_THREADS)
        with self._lock:
            check(lib.sh_policy_set_threads(self._ptr, value), type(self).__name__)

    def memory_bytes(self) -> int:
        """Bytes of policy state: ``64 + capacity * bytes_per_slot`` for one head,
        ``64 + 4 * heads + capacity * heads * bytes_per_slot`` for more (each row's
        count); bytes per slot 9 Scissorhands (+8 with a history window, +4 with a
        vote rate), 13 for a float64 score (H2O's, the latest-attention policy's),
        4 StreamingLLM and Full (the spec's ``slot_bytes``); plus ``4 + 8 * m``
        with ``m >= 1`` pinned spans (their number, each start and stop: the spans are
        the object's, not per slot)."""
        return int(lib.sh_policy_memory_bytes(self._ptr))

    def fit_capacity(self, capacity: int) -> None:
        """Every row's storage becomes ``capacity`` slots (at least each row's count);
        growth doubles from there as usual (:meth:`memory_bytes`).  The transformers
        cache starts its policies at what they hold, so that their state follows it.

        Raises
        ------
        InvalidInputError
            ``capacity`` below a row's count, below 1 or above 2**32 - 1.
        """
        with self._lock:
            low = max(1, int(self._counts_locked().max(initial=1)))
            capacity = check_int("capacity", capacity, low, 2**32 - 1)
            check(lib.sh_policy_fit_capacity(self._ptr, capacity), type(self).__name__)

    def reset(self) -> None:
        """Back to holding ``{0}`` in every row with nothing remembered, for a new
        sequence (the number of rows and the capacity stay): a fresh object as
        constructed, so the pinned spans given to the constructor stay and those added
        by :meth:`pin` are forgotten (a policy loaded by :meth:`from_state_dict` counts
        every span its state held as given to the constructor).

        Raises
        ------
        MemoryError
            Storing the constructor's spans again failed (nothing changes).
        """
        with self._lock:
            if self._pins != self._initial_pins:
                self._set_pins(self._initial_pins)
            check(lib.sh_policy_reset(self._ptr))
            self._n = 1
            self._ragged = False
            self._last = 0

    def _check_head(self, head: Any) -> int:
        return check_int("head", head, 0, self._heads - 1)

    @staticmethod
    def _lookup_position(pos: Any) -> int | None:
        """``pos`` as an int, or None when no held position can equal it."""
        if isinstance(pos, bool) or not isinstance(pos, numbers.Integral):
            raise InvalidTypeError(f"pos must be an integer, not {type(pos).__name__}")
        pos = int(pos)
        return pos if 0 <= pos <= UINT32_MAX else None

    def _lookup(self, pos: Any, head: Any, getter: Any, missing: Any) -> Any:
        """``getter(ptr, head, pos)`` for a held-position accessor, or ``missing``
        when ``pos`` is outside the uint32 range; checks ``pos`` before ``head``."""
        pos = self._lookup_position(pos)
        head = self._check_head(head)
        if pos is None:
            return missing
        with self._lock:
            return getter(self._ptr, head, pos)

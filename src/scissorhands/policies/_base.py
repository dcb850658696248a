"""The machinery every C-backed policy shares: input conversion, validation, the
lock, the single C call per step, chunks and row selection, and plain-data state.

A subclass names its C kind, its constructor parameters and its score array; all the
behaviour lives here and in ``csrc/``.
"""

from __future__ import annotations

import numbers
import threading
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from scissorhands._native import check, ffi, lib
from scissorhands._shared import (
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
from scissorhands.errors import InvalidInputError, InvalidTypeError
from scissorhands.options import SPECS, protected_message, shown_values

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


class NativePolicy:
    """Base of the C-backed policies; see the subclasses for the public API."""

    #: Registry name (``state_dict()["policy"]``); its :class:`~scissorhands.options.PolicySpec`
    #: in ``SPECS`` declares the options the constructor takes.
    name: ClassVar[str]
    #: The C kind (``sh_config.kind``) and the name of the per-slot score property
    #: (``"votes"``, ``"scores"``) or None: what the spec declares, set for each subclass.
    _kind: ClassVar[int]
    _score_name: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:  # a policy of the registry
            spec = SPECS[cls.name]
            cls._kind = getattr(lib, spec.kind)
            cls._score_name = spec.score_key

    def __init__(self, *, budget: int, heads: int, pins: Any = (), **options: Any) -> None:
        """Validate in the order both backends share (budget, then the spec's options
        with their sum against the budget, then heads, then the pinned spans) and build
        the C object; each option goes to the ``sh_config`` field of the same name."""
        spec = SPECS[self.name]
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

    # ------------------------------------------------------------ decode loop

    def _call(self, flags: int, pos: Any, attn: Any, budget: Any, return_indices: bool) -> Any:
        """Validate in the documented order, then run one sh_policy_step; must hold
        the lock. The common case (int position, C-contiguous float32/float64 array)
        is checked inline; the row length is checked by C, before any weight. Python
        mirrors of the count and last position change only after C succeeds."""
        admit = flags & _ADMIT
        if admit and not (type(pos) is int and self._last < pos <= UINT32_MAX):
            pos = self._check_position(pos)
        if flags & _EVICT:
            budget = self._budget if budget is None else self._check_budget(budget)
            self._check_pinned(budget, pos if admit else None)
            if self._pool != 1:
                raise pooled_evict_error("step" if admit else "evict", self._pool)
        h = self._heads
        if not admit or attn is None or not self._reads_attention:
            dtype, ptr, width = _NONE, _NULL, 0
        else:
            if not (type(attn) is np.ndarray and attn.flags.c_contiguous
                    and (dtype := _DTYPE_CODES.get(attn.dtype))):
                attn = as_weights(attn)
                dtype = _DTYPE_CODES[attn.dtype]
            shape = attn.shape
            if len(shape) == 2 and shape[0] == h:
                width = shape[1]
            elif len(shape) == 1 and h == 1:
                width = shape[0]
            else:
                raise self._shape_error(shape)
            ptr = _from_buffer(attn)
        held = self._n + admit
        k = held - budget if flags & _EVICT and held > budget and self._evicts else 0
        if h * k > self._victims_size:
            self._grow_victims(max(h * k, 2 * self._victims_size))
        vc = self._victims_c
        rc = _step(self._ptr, flags, pos, dtype, ptr, h, width, budget, vc,
                   self._slots_c if return_indices else _NULL, self._victims_size, self._n_victims)
        if rc:
            if rc == _ERR_LENGTH or (rc == _ERR_RAGGED and dtype != _NONE and width != self._n):
                raise self._shape_error(attn.shape)
            if rc == _ERR_RAGGED:
                raise ragged_evict_error("step" if admit else "evict")
            check(rc, type(self).__name__, None if dtype == _NONE else self._weights_read(attn))
        k = self._n_victims[0]
        self._n = held - k  # every row evicted k (with different counts, k is 0)
        if admit:
            self._last = pos
        if not flags & _EVICT:
            return None
        if h == 1:
            out = [vc[0]] if k == 1 else _unpack(vc, k)
            return (out, _unpack(self._slots_c, k)) if return_indices else out
        out = self._victims[: h * k].reshape(h, k).copy()
        return (out, self._slots[: h * k].reshape(h, k).copy()) if return_indices else out

    def on_decode_step(self, pos: int, attn: Any) -> None:
        """Record the new token's attention over the held positions, then admit ``pos``.

        Parameters
        ----------
        pos : int
            The new token's position: an integer in ``[0, 2**32 - 1]`` greater than
            every position admitted so far.
        attn : array_like or None
            The new token's attention weights over the held positions, index-aligned
            with :attr:`kept` and not renormalised: shape ``(n,)`` (or ``(1, n)``)
            for one head, ``(heads, n)`` otherwise. When the rows hold different
            counts, ``n = max(counts)`` and row ``h`` reads only its first
            ``counts[h]`` weights (the rest is neither read nor checked). Any real
            dtype; float32 and float64 C-contiguous arrays are read in place.
            ``None`` admits ``pos`` without changing any score.

        Raises
        ------
        InvalidTypeError
            ``pos`` is not an integer, or the weights are not real numbers.
        InvalidInputError
            ``pos`` is out of range or not above every admitted position; ``attn``
            has the wrong shape; a weight read is NaN, infinite or negative.
        """
        self._acquire()
        try:
            self._call(_ADMIT, pos, attn, 0, False)
        finally:
            self._release()

    def evict(self, budget: int | None = None, return_indices: bool = False) -> Any:
        """Evict down to ``budget`` positions per head and return the victims.

        Parameters
        ----------
        budget : int, optional
            Positions to keep; defaults to the configured budget. It may exceed the
            configured one and does not stick. It is validated (``>= 1`` and greater
            than the protected ``recent_window + sinks``) even when nothing needs
            evicting.
        return_indices : bool, default False
            Also return each victim's slot index in :attr:`kept` before the
            eviction, so a cache can gather its keys and values without a search.

        Returns
        -------
        list[int] or numpy.ndarray
            One head: the victims in ascending position order (``[]`` when the
            policy holds at most ``budget``). Several heads: a ``(heads, k)``
            ``uint32`` array, each row ascending. With ``return_indices``, a pair
            ``(victims, slots)`` of the same shapes (slots ``int64`` when an array).

        Raises
        ------
        InvalidTypeError, InvalidInputError
            For a budget that is not an integer or is out of range.
        InvalidInputError
            The rows would evict different numbers of positions (rows holding
            different counts): nothing changes; :meth:`evict_rows` takes that case.
        """
        if return_indices is not False and return_indices is not True:
            return_indices = check_flag("return_indices", return_indices)
        self._acquire()
        try:
            return self._call(_EVICT, 0, None, budget, return_indices)
        finally:
            self._release()

    def step(self, pos: int, attn: Any, budget: int | None = None, return_indices: bool = False) -> Any:
        """:meth:`on_decode_step` then :meth:`evict`, validated together and run as one
        C call: either both happen or, on an error, neither does. Returns what
        :meth:`evict` returns; rows that would evict different numbers raise
        ``InvalidInputError`` before anything changes (:meth:`step_rows` takes them).

        The serving loop's call: with an ``int`` position, the configured budget and a
        C-contiguous float32/float64 NumPy array of the right rank, it goes straight to
        C, which checks the position, the row length and every weight before anything
        changes. Anything else, and any error C reports, takes the path that validates
        in the documented order first (so errors are the same either way)."""
        if return_indices is not False and return_indices is not True:
            return_indices = check_flag("return_indices", return_indices)
        self._acquire()
        try:
            if budget is None and not return_indices:
                k = self._fast_step(pos, attn, self._budget, False)
                if k is not None:
                    h = self._heads
                    if h == 1:
                        return [self._victims_c[0]] if k == 1 else _unpack(self._victims_c, k)
                    return self._victims[: h * k].reshape(h, k).copy()
            return self._call(_BOTH, pos, attn, budget, return_indices)
        finally:
            self._release()

    def _fast_step(self, pos: Any, attn: Any, budget: int, with_slots: bool) -> int | None:
        """The serving loop's step straight to C: one ``sh_policy_step`` admitting an
        ``int`` ``pos`` and evicting to ``budget``, from a C-contiguous float32/float64
        array of the rank :meth:`step` takes (anything, for a policy that reads no
        attention), into the reusable buffers (their slots too with ``with_slots``).
        Returns every row's victim count, or None when the call is not that case or C
        refused it (nothing changed: the general path validates, then raises or takes
        it). Must hold the lock."""
        if type(pos) is not int or self._pool != 1:
            return None
        h = self._heads
        if not self._reads_attention:
            dtype, buf, width = _NONE, _NULL, 0
        elif (type(attn) is _ndarray and (dtype := _DTYPE_CODES.get(attn.dtype))
              and ((attn.ndim == 1 and h == 1) or (attn.ndim == 2 and len(attn) == h))):
            try:  # ValueError: not C-contiguous (the general path copies it)
                buf = _from_buffer(attn)
            except ValueError:
                return None
            width = attn.shape[-1]
        else:
            return None
        most = self._n + 1 - budget if self._evicts else 0
        if h * most > self._victims_size:
            self._grow_victims(h * most)
        try:  # OverflowError: pos outside uint32 (the general path says why)
            rc = _step(self._ptr, _BOTH, pos, dtype, buf, h, width, budget, self._victims_c,
                       self._slots_c if with_slots else _NULL, self._victims_size, self._n_victims)
        except OverflowError:
            return None
        if rc:
            return None
        k = int(self._n_victims[0])
        self._n += 1 - k  # every row admitted pos and evicted k
        self._last = pos
        return k

    def _step_slots(self, pos: Any, attn: Any, budget: Any) -> tuple[int, np.ndarray] | None:
        """The transformers cache's decode step, when every row holds the same count:
        :meth:`step_rows` as :meth:`_fast_step` at the configured budget, with the slots.
        Returns ``(k, slots)``: every row evicted ``k``, ``slots`` their kept-order
        indices row after row (``int64`` ``(heads * k,)``, a view of a buffer the next
        call overwrites); None when the call is not that case or C refused it (nothing
        changed: :meth:`step_rows` then validates and raises, or takes the case)."""
        if budget != self._budget:
            return None
        self._acquire()
        try:
            if self._ragged:  # rows of different counts: step_rows' case
                return None
            k = self._fast_step(pos, attn, budget, True)
            return None if k is None else (k, self._slots[: self._heads * k])
        finally:
            self._release()

    def _step_with(self, pos: Any, budget: Any, call: Callable[..., tuple[int, float]]
                   ) -> tuple[int, float, int, np.ndarray, np.ndarray] | None:
        """The transformers cache's steady decode step, run by the cache's own C call:
        ``call(state, pos, budget, victims, slots, capacity, n_victims)`` (this policy's C
        state and reusable output buffers) steps this policy inside
        ``sh_cache_step_steady`` and returns ``(done, policy_seconds)``, ``done`` 0 when
        nothing changed.  Returns ``(done, policy_seconds, k, slots, victims)`` (every row
        evicted ``k``; their kept-order indices row after row are the first ``heads * k``
        of ``slots``, their positions the first ``heads * k`` of ``victims``: buffers the
        next call overwrites), or None when the call is not this
        case (an ``int`` position in range, the configured budget, rows of equal counts, no
        pooled budget, a policy that reads attention) or changed nothing: the caller then
        takes its general path, which validates and raises."""
        if (budget != self._budget or type(pos) is not int or not 0 <= pos <= UINT32_MAX or self._pool != 1
                or not self._reads_attention):
            return None
        self._acquire()
        try:
            if self._ragged:
                return None
            most = self._n + 1 - budget if self._evicts else 0
            if self._heads * most > self._victims_size:
                self._grow_victims(self._heads * most)
            done, seconds = call(self._ptr, pos, budget, self._victims_c, self._slots_c, self._victims_size,
                                 self._n_victims)
            if not done:
                return None
            k = self._n_victims[0]
            self._n += 1 - k  # every row admitted pos and evicted k
            self._last = pos
            return done, seconds, k, self._slots, self._victims
        finally:
            self._release()

    def _call_rows(self, flags: int, pos: Any, attn: Any, budget: Any) -> RowVictims:
        """:meth:`_call` for rows that may evict different numbers: the same validation
        in the same order, one sh_policy_step_rows; must hold the lock."""
        admit = flags & _ADMIT
        if admit:
            pos = self._check_position(pos)
        budget = self._check_budget(budget) if flags & _EVICT else 0
        if flags & _EVICT:
            self._check_pinned(budget, pos if admit else None)
        h = self._heads
        if not admit or attn is None or not self._reads_attention:
            dtype, ptr, width = _NONE, _NULL, 0
        else:
            attn = as_weights(attn)
            dtype = _DTYPE_CODES[attn.dtype]
            shape = attn.shape
            if len(shape) == 2 and shape[0] == h:
                width = shape[1]
            elif len(shape) == 1 and h == 1:
                width = shape[0]
            else:
                raise self._shape_error(shape)
            ptr = _from_buffer(attn)
        most = self._n + admit - budget if flags & _EVICT and self._evicts else 0
        size = h * max(most, 0)
        victims = np.empty(size, dtype=np.uint32)
        slots = np.empty(size, dtype=np.int64)
        counts = np.empty(h, dtype=np.uint32)
        rc = lib.sh_policy_step_pools(self._ptr, flags, pos, dtype, ptr, h, width, budget, self._pool,
                                      ffi.from_buffer("uint32_t[]", victims), ffi.from_buffer("int64_t[]", slots),
                                      size, ffi.from_buffer("uint32_t[]", counts), self._n_victims)
        if rc == _ERR_LENGTH:
            raise self._shape_error(attn.shape)
        check(rc, type(self).__name__, None if dtype == _NONE else self._weights_read(attn))
        total = self._n_victims[0]
        if admit:
            self._last = pos
        self._sync()
        return RowVictims(counts, victims[:total].copy(), slots[:total].copy())

    def evict_rows(self, budget: int | None = None) -> RowVictims:
        """Evict each row down to ``budget`` positions on its own and return the victims
        row by row: the form for rows that hold, or evict, different counts.

        Row ``h`` holding ``n_h`` positions evicts ``k_h = max(0, n_h - budget)`` of
        them, chosen as :meth:`evict` chooses.

        Parameters
        ----------
        budget : int, optional
            As for :meth:`evict` (the configured budget when None; validated even
            when nothing needs evicting).

        Returns
        -------
        RowVictims
            ``counts`` (``uint32``, ``(heads,)``: ``k_h``), ``victims`` (``uint32``,
            ``(sum k_h,)``: row after row, each row ascending) and ``slots``
            (``int64``, same shape: each victim's index in its row's :meth:`kept_row`
            before the eviction).

        Raises
        ------
        InvalidTypeError, InvalidInputError
            For a budget that is not an integer or is out of range (as :meth:`evict`).
        """
        with self._lock:
            return self._call_rows(_EVICT, 0, None, budget)

    def step_rows(self, pos: int, attn: Any, budget: int | None = None) -> RowVictims:
        """:meth:`on_decode_step` then :meth:`evict_rows`, validated together and run as
        one C call (either both happen or neither does).

        Parameters
        ----------
        pos, attn
            As for :meth:`on_decode_step`: ``attn`` is ``(heads, max(counts))`` and row
            ``h`` reads its first ``counts[h]`` weights.
        budget : int, optional
            As for :meth:`evict_rows`.

        Returns
        -------
        RowVictims
            As :meth:`evict_rows` returns, after the admission of ``pos``.

        Raises
        ------
        InvalidTypeError, InvalidInputError
            As :meth:`step`, in the same order (position, budget, weights), except
            that rows may evict different numbers.
        """
        with self._lock:
            return self._call_rows(_ADMIT | _EVICT, pos, attn, budget)

    def _observe(self, attn: Any, budget: Any, pool_kernel: Any, equal: bool) -> RowVictims:
        """Validate an ``evict_observed`` call in the reference's order (budget,
        pool_kernel, pooling, the attention's type and shape, equal evictions when
        ``equal``, candidates per row), then one sh_policy_evict_observed, which checks
        the weights before any row changes; must hold the lock."""
        budget = self._budget if budget is None else check_int("budget", budget, 1, UINT32_MAX)
        pool_kernel = check_pool_kernel(pool_kernel)
        if self._pool != 1:
            raise observed_pooled_error(self._pool)
        h = self._heads
        arr, given = _weights_or_shape(attn, self._evicts,  # never evicts: only the shape is checked
                                       "evict_observed attn is ragged: rows of different lengths")
        shape = (1, *given) if len(given) == 2 and h == 1 else tuple(given)
        if len(shape) != 3 or shape[0] != h or shape[1] < 1 or shape[2] != self._n:
            raise observed_shape_error(h, self._n, tuple(given))
        window = shape[1]
        counts = self._counts_locked().tolist()
        total = 0
        if self._evicts:
            if equal and len({max(0, n - budget) for n in counts}) > 1:
                raise ragged_evict_error("evict_observed")
            sinks = self._options.get("sinks", 0)
            candidates = [max(0, n - min(sinks, n) - min(window, n)) for n in counts]
            pinned = None
            if self._pins:  # the pinned slots between the sinks and the window stay too
                held, kept = self._export_locked()[:2]
                ends = np.cumsum(held, dtype=np.int64)[:-1]
                pinned = [sum(1 for pos in row[min(sinks, n):max(min(sinks, n), n - min(window, n))]
                              if is_pinned(self._pins, pos))
                          for row, n in zip((r.tolist() for r in np.split(kept, ends)), counts)]
                candidates = [c - q for c, q in zip(candidates, pinned)]
            total = sum(observed_evictions(counts, candidates, window, sinks, budget, pinned))
        victims = np.empty(total, dtype=np.uint32)
        slots = np.empty(total, dtype=np.int64)
        rows = np.empty(h, dtype=np.uint32)
        dtype, ptr = (_NONE, _NULL) if arr is None else (_DTYPE_CODES[arr.dtype], _from_buffer(arr))
        rc = lib.sh_policy_evict_observed(self._ptr, dtype, ptr, h, window, self._n, budget, pool_kernel,
                                          ffi.from_buffer("uint32_t[]", victims),
                                          ffi.from_buffer("int64_t[]", slots), total,
                                          ffi.from_buffer("uint32_t[]", rows), self._n_victims)
        check(rc, type(self).__name__, None if arr is None or rc != _ERR_WEIGHT else
              _read_by_observe(arr, np.asarray(counts, dtype=np.int64)))
        self._sync()
        return RowVictims(rows, victims, slots)

    def evict_observed_rows(self, attn: Any, budget: int | None = None, pool_kernel: int = 15) -> RowVictims:
        """Evict each row down to ``budget`` by an observation window's attention,
        pooled (SnapKV's rule): the prompt-end eviction that keeps what a question reads.

        Row ``h`` holds ``n_h`` positions in kept order; its last ``W`` held positions
        are the window's own tokens, window row ``j`` being held slot ``t = n_h - W + j``
        (rows with ``t <= 0`` read nothing). Slot ``i``'s score is the sum, for ``j = 0
        .. W-1`` in that order, of ``float64(attn[h, j, i])`` over the rows with ``i <
        t``; its pooled score the largest score of slots ``[i - r, i + r]`` of the row
        (``r = pool_kernel // 2``, clipped at the row's ends, protected slots included).
        A row holding more than ``budget`` evicts its ``n_h - budget`` unprotected slots
        of least pooled score, equal pooled scores evicting the lower position.
        Protected: the first ``min(sinks, n_h)`` held (``sinks`` the policy's option, 0
        without one), the last ``min(W, n_h)`` and the pinned positions (:meth:`pin`);
        ``recent_window`` is not used.
        Survivors keep their votes, scores, vote registers and steps held; nothing else
        changes. Full evicts nothing.

        Parameters
        ----------
        attn : array_like
            ``(heads, W, n)`` (or ``(W, n)`` for one head), ``W >= 1`` the window's rows
            and ``n`` the largest count of a row: row ``h``'s window row ``j`` weights
            over the row's held positions in kept order (the GQA-reduced attention of
            the last ``W`` tokens read), not renormalised. Only ``attn[h, j, i]`` with
            ``i < n_h - W + j`` is read and checked (finite, ``>= 0``). Any real dtype;
            float32 and float64 C-contiguous arrays are read in place (float32 widened
            exactly). Full reads only its shape.
        budget : int, optional
            Positions each row keeps, ``>= 1``; the configured budget when None. A
            per-call budget may exceed the configured one and does not stick.
        pool_kernel : int, default 15
            The max-pool's width over kept order: odd, ``>= 1`` (1: no pooling).

        Returns
        -------
        RowVictims
            ``counts`` (``uint32``, ``(heads,)``: ``max(0, n_h - budget)``), ``victims``
            (``uint32``, row after row, each row ascending) and ``slots`` (``int64``:
            each victim's index in its row's :meth:`kept_row` before the eviction).

        Raises
        ------
        InvalidTypeError
            ``budget`` or ``pool_kernel`` is not an integer (bools and floats too);
            ``attn`` is not real numbers.
        InvalidInputError
            In this order, before anything changes: ``budget < 1``; ``pool_kernel``
            even or below 1; a pooled policy (``pool != 1``); ``attn`` of the wrong
            shape (the message names the expected one); a row whose protected
            positions leave fewer candidates than it must evict (the message names
            the window, the sinks, the pinned positions when there are spans, the
            row and both counts); a read weight that is
            NaN, infinite or negative (any row).
        MemoryError
            The call's scratch (22 bytes per slot of the fullest evicting row) could
            not be allocated; nothing changes.

        References
        ----------
        Y. Li et al., "SnapKV: LLM Knows What You are Looking for Before Generation",
        2024, arXiv:2404.14469 (observation window, pooled scores).
        """
        with self._lock:
            return self._observe(attn, budget, pool_kernel, equal=False)

    def evict_observed(self, attn: Any, budget: int | None = None, pool_kernel: int = 15,
                       return_indices: bool = False) -> Any:
        """:meth:`evict_observed_rows` returning what :meth:`evict` returns.

        Returns
        -------
        list[int] or numpy.ndarray
            One head: the victims, ascending. Several heads: a ``(heads, k)``
            ``uint32`` array, each row ascending. With ``return_indices``, a pair
            ``(victims, slots)`` of the same shapes (slots ``int64`` when an array).

        Raises
        ------
        InvalidTypeError, InvalidInputError, MemoryError
            As :meth:`evict_observed_rows`; also, right after the shape check, rows
            that would evict different numbers (:meth:`evict_observed_rows` takes them).
        """
        with self._lock:
            out = self._observe(attn, budget, pool_kernel, equal=True)
        h = self._heads
        k = len(out.victims) // h
        if h == 1:
            victims = out.victims.tolist()
            return (victims, out.slots.tolist()) if return_indices else victims
        victims = out.victims.reshape(h, k)
        return (victims, out.slots.reshape(h, k)) if return_indices else victims

    def extend(self, attn: Any, admit: Any = None, unread: bool = False) -> None:
        """Apply a chunk of ``C`` tokens, each as a decode step, in one call: for every
        row, each token votes over what the row holds at that moment, then joins it.
        Nothing is evicted (call :meth:`evict_rows` after, as after :meth:`prefill`).

        The tokens take positions ``last + 1 .. last + C``, shared by all rows
        (``last``: the largest position ever admitted). On a fresh policy (every row
        holding ``{0}``, nothing admitted since construction or :meth:`reset`) they are
        positions ``0 .. C - 1``, token 0 being the position 0 every row already holds:
        then ``extend(attn)`` leaves exactly the state :meth:`prefill` leaves.

        Parameters
        ----------
        attn : array_like
            Shape ``(heads, C, W)``, or ``(C, W)`` for one head, with ``W = n + C``:
            ``n`` the largest count of a row before the chunk (0 on a fresh policy).
            For row ``h`` holding ``n_h`` positions before the chunk, token ``i``'s
            weights are ``attn[h, i, :n_h]`` over those positions (in kept order) and
            ``attn[h, i, n_h + j]`` over chunk token ``j < i``. A token that joins row
            ``h`` reads only the columns of what the row holds at that moment:
            ``[0, n_h)`` and ``n_h + j`` for each earlier token ``j`` that joined it. Not
            renormalised; any real dtype (float32 and float64 C-contiguous arrays are
            read in place). StreamingLLM and Full read only its shape.
        admit : array_like of bool, optional
            ``(heads, C)`` (or ``(C,)`` for one head): whether token ``i`` joins row
            ``h``. A token that does not neither votes in the row nor joins it (none of
            its weights there is read; its position is skipped there, positions stay
            shared), which keeps a
            left-padded prompt's padding out; on a fresh policy ``admit[h, 0]`` False
            drops position 0 from row ``h``. None: every token joins every row.
        unread : bool, default False
            Read no weights, whatever the policy (only ``attn``'s shape, as StreamingLLM
            does): the tokens join with a new position's state (0 votes, score 0.0, empty
            registers) and what the rows held is not updated; for a prompt whose positions
            are decided at its end by an observation window (prompt-aware eviction).

        Raises
        ------
        InvalidTypeError
            The weights are not real numbers; ``admit`` is not bools.
        InvalidInputError
            ``attn`` or ``admit`` of the wrong shape (the message names the expected
            one), ``C < 1``; the positions would pass ``2**32 - 1``; a weight read
            is NaN, infinite or negative. A failed call changes nothing.
        MemoryError
            Growing the storage failed (nothing changes).
        """
        if not isinstance(unread, bool):
            raise InvalidTypeError(f"unread must be a bool, got {unread!r}")
        with self._lock:
            h = self._heads
            fresh = self._fresh()
            base = 0 if fresh else self._n
            arr, given = _weights_or_shape(attn, self._reads_attention and not unread,  # else only its shape
                                           "extend attn must be a rectangular (heads, C, W) array")
            shape = given
            if len(shape) == 2 and h == 1:
                shape = (1, *shape)
            if len(shape) != 3 or shape[0] != h or shape[1] < 1 or shape[2] != base + shape[1]:
                raise chunk_shape_error(h, base, given)
            chunk = shape[1]
            mask = read_admit(admit, h, chunk)
            if (chunk - 1 if fresh else self._last + chunk) > UINT32_MAX:
                raise InvalidInputError(f"a chunk of {chunk} tokens after position {self._last} "
                                        "would pass position 2**32 - 1")
            rc = lib.sh_policy_extend(
                self._ptr, _NONE if arr is None else _DTYPE_CODES[arr.dtype],
                _NULL if arr is None else _from_buffer(arr), h, chunk, shape[2],
                _NULL if mask is None else ffi.from_buffer("uint8_t[]", mask))
            check(rc, type(self).__name__, None if arr is None or rc != _ERR_WEIGHT else
                  _read_by_extend(arr, None if fresh else self._counts_locked(), mask))
            self._last = chunk - 1 if fresh else self._last + chunk
            self._sync()

    def select_rows(self, index: Any) -> None:
        """Replace the rows by copies of the rows ``index`` names: afterwards the policy
        has ``len(index)`` rows, row ``i`` an exact copy of old row ``index[i]``
        (positions, votes or scores, vote registers, steps held, count). For beam
        search (reorder, repeat), ``num_return_sequences`` and batch changes.

        :attr:`heads` becomes ``len(index)``; the capacity per row is kept, so
        :meth:`memory_bytes` scales with the new number of rows.

        Parameters
        ----------
        index : array_like of int
            1-D row numbers in ``[0, heads)``, repeats allowed, 1 to 65536 of them: a
            list or tuple of integers, an integer NumPy array, or anything with
            ``__array__`` (a torch tensor).

        Raises
        ------
        InvalidTypeError
            ``index`` is not integers (bools and floats included).
        InvalidInputError
            ``index`` is empty, not 1-D, longer than 65536, or names a row outside
            ``[0, heads)``.
        MemoryError
            Allocating the new rows failed (nothing changes: they are allocated
            before anything is replaced).
        """
        with self._lock:
            rows = read_row_index(index, self._heads)
            if rows.size % self._pool:
                raise InvalidInputError(f"index must hold a multiple of pool={self._pool} rows (pools are "
                                        f"consecutive rows), got {rows.size}")
            pool = self._pool
            groups = rows.reshape(-1, pool).astype(np.int64)
            broken = (groups[:, 0] % pool != 0) | np.any(groups - groups[:, :1] != np.arange(pool), axis=1)
            if broken.any():
                at = int(np.argmax(broken)) * pool
                raise InvalidInputError(f"index must take each pool of {pool} rows whole and in order (rows "
                                        f"p*{pool} .. p*{pool}+{pool - 1}), got {rows[at:at + pool].tolist()} at {at}")
            check(lib.sh_policy_select_rows(self._ptr, ffi.from_buffer("uint32_t[]", rows), rows.size),
                  type(self).__name__)
            self._heads = int(rows.size)
            self._sync()

    def prefill(self, attn: Any) -> None:
        """Consume a prompt's attention in one call, on a fresh policy.

        Parameters
        ----------
        attn : array_like
            The prompt's causal attention, shape ``(P, P)`` for one head or
            ``(heads, P, P)``: row ``i`` holds token ``i``'s weights over positions
            ``0..i``. Applied exactly as ``on_decode_step(i, attn[..., i, :i])`` for
            ``i = 1..P-1``; the diagonal (a token's weight on itself) and the upper
            triangle are never read. Nothing is evicted: call :meth:`evict` after.

        Raises
        ------
        InvalidInputError
            The policy has admitted a position since construction or
            :meth:`reset`; ``attn`` is not square per head; a read weight is NaN,
            infinite or negative; ``P - 1`` exceeds ``2**32 - 1``.
        InvalidTypeError
            The weights are not real numbers.
        """
        with self._lock:
            if not self._fresh():
                raise InvalidInputError("prefill needs a fresh policy (holding only position 0)")
            h = self._heads
            arr, shape = _weights_or_shape(attn, self._reads_attention,  # else only the prompt length matters
                                           "prefill attn must be a rectangular (P, P) array")
            if len(shape) == 2 and h == 1:
                shape = (1, *shape)
            if len(shape) != 3 or shape[0] != h or shape[1] != shape[2] or shape[1] < 1:
                want = "(P, P) or (1, P, P)" if h == 1 else f"({h}, P, P)"
                raise InvalidInputError(f"prefill attn must have shape {want}, got {np.shape(attn)}")
            prompt_len = shape[1]
            if prompt_len - 1 > UINT32_MAX:
                raise InvalidInputError("prompt too long for uint32 positions")
            if arr is not None:
                rc = lib.sh_policy_prefill(self._ptr, _DTYPE_CODES[arr.dtype], _from_buffer(arr), h, prompt_len)
            else:
                rc = lib.sh_policy_prefill(self._ptr, _NONE, _NULL, h, prompt_len)
            check(rc, type(self).__name__, None if arr is None or rc != _ERR_WEIGHT else _read_by_prefill(arr))
            self._n = prompt_len
            self._last = prompt_len - 1

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
        vote rate), 13 H2O and TOVA, 4 StreamingLLM and Full; plus ``4 + 8 * m``
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

    # ------------------------------------------------------------ state

    def _params(self) -> dict[str, Any]:
        """The constructor parameters but rng, as ``state_dict()["params"]`` records
        them: budget, the policy's first option, heads, then its other options that are
        not at their default (so that a default configuration's state is as it was
        before those options existed)."""
        shown = shown_values(self.name, self._options)
        first = dict(list(shown.items())[:1])
        params = {"budget": self._budget, **first, "heads": self._heads,
                  **{k: v for k, v in shown.items() if k not in first}}
        if self._pins:
            params["pins"] = [list(span) for span in self._pins]
        return params

    def _sink_count(self) -> int:
        return min(self._options["sinks"], self.kept_count())

    def state_dict(self) -> dict[str, Any]:
        """The policy as plain data (ints, floats, lists, str), loadable by
        :meth:`from_state_dict` of either backend; versioned. A Scissorhands policy
        with a history window adds ``"history"`` (its vote registers) and one with a
        vote rate ``"steps_held"``, both shaped like ``"kept"``. Rows may hold
        different counts (a row may be empty): each list is then as long as its row."""
        counts, positions, scores, history, held, last = self._export(with_history=True)
        ends = np.cumsum(counts, dtype=np.int64)[:-1]

        def rows(flat: np.ndarray) -> list[list[Any]]:
            return [part.tolist() for part in np.split(flat, ends)]

        state: dict[str, Any] = {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "policy": self.name,
            "params": self._params(),
            "kept": rows(positions),
        }
        if self._score_name is not None and scores is not None:
            state[self._score_name] = rows(scores)
        if history is not None:
            state["history"] = rows(history)
        if held is not None:
            state["steps_held"] = rows(held)
        state["last_position"] = last  # read under the same lock as the arrays
        return state

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> NativePolicy:
        """Rebuild a policy from :meth:`state_dict` output (of either backend).

        Raises
        ------
        InvalidInputError
            Wrong format, version or policy name; not ``heads`` rows; positions
            not strictly ascending within a row or above ``last_position``; per-slot
            rows not as long as kept's; scores out of range;
            ``history`` missing although ``params`` sets a history window (or present
            although none is set), a register with a bit at or above the window, or
            votes that are not the registers' popcounts; ``steps_held`` missing
            although ``params`` sets ``vote_rate`` (or present although not), or a
            slot with more votes (or register bits) than steps held.
        InvalidTypeError
            A field of the wrong kind.

        Rows may hold different counts, and a row may be empty. A state without the
        optional parameters (``sinks`` of Scissorhands, H2O and TOVA, ``history_window``
        and ``vote_rate`` of Scissorhands: states written before they existed) loads
        with their defaults.
        """
        spec = SPECS[cls.name]
        names = [o.name for o in spec.options]
        required = ("budget", *names[:1], "heads")
        keeps_registers = spec.takes("history_window")
        optional_keys = ("history", "steps_held") if keeps_registers else ()
        policy, rows = parse_state(state, cls.name, cls._score_name, required, cls, (*names[1:], "pins"),
                                   optional_keys)
        history = held = None
        if keeps_registers:
            history = parse_history(state, policy._options["history_window"], rows)
            held = parse_held(state, policy._options["vote_rate"], rows, history)
        votes_ptr = scores_ptr = ffi.NULL
        if cls._score_name == "votes":
            votes_ptr = ffi.from_buffer("uint32_t[]", rows.scores)
        elif cls._score_name == "scores":
            scores_ptr = ffi.from_buffer("double[]", rows.scores)
        rc = lib.sh_policy_import_rows(
            policy._ptr, policy._heads, ffi.from_buffer("uint32_t[]", rows.counts),
            ffi.from_buffer("uint32_t[]", rows.kept), votes_ptr, scores_ptr,
            _NULL if history is None else ffi.from_buffer("uint64_t[]", history),
            _NULL if held is None else ffi.from_buffer("uint32_t[]", held), rows.last)
        check(rc, cls.__name__)
        with policy._lock:
            policy._last = rows.last
            policy._sync()
        return policy

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        return (type(self).from_state_dict, (self.state_dict(),))

    def __repr__(self) -> str:
        """Never raises (also for a policy whose constructor was refused part-way)."""
        try:
            params = ", ".join(f"{k}={v}" for k, v in self._params().items())
            with self._lock:
                held = f"{int(self._counts_locked().min())}..{self._n}" if self._ragged else str(self._n)
        except Exception:  # a partly built object: what it has
            return partial_repr(self)
        return f"{type(self).__name__}({params}, held={held})"



class RankingPolicy(NativePolicy):
    """Base of the policies that rank positions by a per-slot key and protect sinks and a
    recent window (H2O, TOVA, Scissorhands), as ``reference._HeavyHitters`` is."""

    @property
    def recent_window(self) -> int:
        """The most recent positions that are never evicted."""
        return self._options["recent_window"]

    @property
    def sinks(self) -> int:
        """The first positions held that are never evicted."""
        return self._options["sinks"]

    def sink_count(self) -> int:
        """Sinks held: ``min(sinks, kept_count())``."""
        return self._sink_count()

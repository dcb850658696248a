"""The machinery every C-backed policy shares: input conversion, validation, the
lock, the single C call per step, and plain-data state.

A subclass names its C kind, its constructor parameters and its score array; all the
behaviour lives here and in ``csrc/``.
"""

from __future__ import annotations

import numbers
import threading
from typing import Any, ClassVar

import numpy as np

from scissorhands._native import check, ffi, lib
from scissorhands._shared import (
    MAX_HEADS,
    STATE_FORMAT,
    STATE_VERSION,
    UINT32_MAX,
    check_int,
    parse_held,
    parse_history,
    parse_state,
    read_weights,
)
from scissorhands.errors import InvalidInputError, InvalidTypeError
from scissorhands.options import SPECS, protected_message, shown_values

_DTYPE_CODES = {np.dtype(np.float32): lib.SH_DTYPE_F32, np.dtype(np.float64): lib.SH_DTYPE_F64}
_ADMIT = lib.SH_STEP_ADMIT
_EVICT = lib.SH_STEP_EVICT
_NONE = lib.SH_DTYPE_NONE
_NULL = ffi.NULL
_ERR_LENGTH = lib.SH_ERR_LENGTH
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


class NativePolicy:
    """Base of the C-backed policies; see the subclasses for the public API."""

    #: Registry name (``state_dict()["policy"]``); its :class:`~scissorhands.options.PolicySpec`
    #: in ``SPECS`` declares the options the constructor takes.
    name: ClassVar[str]
    _kind: ClassVar[int]
    #: Name of the per-slot score property (``"votes"``, ``"scores"``) or None.
    _score_name: ClassVar[str | None] = None

    def __init__(self, *, budget: int, heads: int, **options: Any) -> None:
        """Validate in the order both backends share (budget, then the spec's options
        with their sum against the budget, then heads) and build the C object; each
        option goes to the ``sh_config`` field of the same name."""
        spec = SPECS[self.name]
        self._reads_attention = spec.reads_attention
        self._evicts = spec.evicts
        self._budget = check_int("budget", budget, 1, UINT32_MAX)
        self._options = spec.check(self._budget, options)
        self._protected = {o.name: self._options[o.name] for o in spec.options if o.protects}
        self._heads = check_int("heads", heads, 1, MAX_HEADS)
        cfg = ffi.new("sh_config *")
        cfg.kind = self._kind
        cfg.heads = self._heads
        cfg.budget = self._budget
        for name, value in self._options.items():
            setattr(cfg, name, 0 if value is None else int(value))
        out = ffi.new("sh_policy **")
        check(lib.sh_policy_new(cfg, out), type(self).__name__)
        self._ptr = ffi.gc(out[0], lib.sh_policy_free)
        self._lock = threading.Lock()
        # Mirrors of the C object's count and last position, read on the hot path.
        self._n = 1
        self._last = 0
        self._n_victims = ffi.new("size_t *")
        self._grow_victims(1)

    def _grow_victims(self, size: int) -> None:
        """(Re)allocate the reusable output buffers and their C views."""
        self._victims = np.empty(size, dtype=np.uint32)
        self._slots = np.empty(size, dtype=np.int64)
        self._victims_size = size
        self._victims_c = ffi.from_buffer("uint32_t[]", self._victims)
        self._slots_c = ffi.from_buffer("int64_t[]", self._slots)

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
        return InvalidInputError(
            f"attn must have shape {want} (one weight per held position), got {shape}"
        )

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
            if rc == _ERR_LENGTH:
                raise self._shape_error(attn.shape)
            check(rc, type(self).__name__)
        k = self._n_victims[0]
        self._n = held - k
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
            for one head, ``(heads, n)`` otherwise. Any real dtype; float32 and
            float64 C-contiguous arrays are read in place. ``None`` admits ``pos``
            without changing any score.

        Raises
        ------
        InvalidTypeError
            ``pos`` is not an integer, or the weights are not real numbers.
        InvalidInputError
            ``pos`` is out of range or not above every admitted position; ``attn``
            has the wrong shape; a weight is NaN, infinite or negative.
        """
        lock = self._lock
        lock.acquire()
        try:
            self._call(_ADMIT, pos, attn, 0, False)
        finally:
            lock.release()

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
        """
        lock = self._lock
        lock.acquire()
        try:
            return self._call(_EVICT, 0, None, budget, return_indices)
        finally:
            lock.release()

    def step(self, pos: int, attn: Any, budget: int | None = None, return_indices: bool = False) -> Any:
        """:meth:`on_decode_step` then :meth:`evict`, validated together and run as one
        C call: either both happen or, on an error, neither does. Returns what
        :meth:`evict` returns."""
        lock = self._lock
        lock.acquire()
        try:
            return self._call(_ADMIT | _EVICT, pos, attn, budget, return_indices)
        finally:
            lock.release()

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
            if self._n != 1 or self._last != 0:
                raise InvalidInputError("prefill needs a fresh policy (holding only position 0)")
            h = self._heads
            arr = None
            if self._reads_attention:
                arr = as_weights(attn)
                shape = arr.shape
            else:  # attention is never read: only the prompt length matters
                try:
                    shape = np.shape(attn)
                except (TypeError, ValueError):
                    raise InvalidInputError("prefill attn must be a rectangular (P, P) array") from None
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
            check(rc, type(self).__name__)
            self._n = prompt_len
            self._last = prompt_len - 1

    # ------------------------------------------------------------ inspection

    def kept_count(self) -> int:
        """Positions held (per head; every head holds the same count)."""
        return self._n

    def _export(self, with_history: bool = False) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None,
                                                           np.ndarray | None, int]:
        """(positions, scores, vote registers, steps held, last position), the arrays
        ``(heads, n)``, all read under one hold of the lock; the registers and steps
        held only when asked for and kept (else None)."""
        with self._lock:
            n = self._n
            positions = np.empty((self._heads, n), dtype=np.uint32)
            scores = None
            votes_ptr = scores_ptr = ffi.NULL
            if self._score_name == "votes":
                scores = np.empty((self._heads, n), dtype=np.uint32)
                votes_ptr = ffi.from_buffer("uint32_t[]", scores)
            elif self._score_name == "scores":
                scores = np.empty((self._heads, n), dtype=np.float64)
                scores_ptr = ffi.from_buffer("double[]", scores)
            check(lib.sh_policy_export(self._ptr, ffi.from_buffer("uint32_t[]", positions),
                                       votes_ptr, scores_ptr, positions.size))
            history = None
            if with_history and self._options.get("history_window") is not None:
                history = np.empty((self._heads, n), dtype=np.uint64)
                check(lib.sh_policy_export_history(self._ptr, ffi.from_buffer("uint64_t[]", history),
                                                   history.size))
            held = None
            if with_history and self._options.get("vote_rate"):
                held = np.empty((self._heads, n), dtype=np.uint32)
                check(lib.sh_policy_export_held(self._ptr, ffi.from_buffer("uint32_t[]", held), held.size))
            return positions, scores, history, held, self._last

    def _shaped(self, arr: np.ndarray) -> np.ndarray:
        return arr[0] if self._heads == 1 else arr

    @property
    def kept(self) -> np.ndarray:
        """Held positions, ascending: a ``uint32`` copy of shape ``(n,)`` for one head,
        ``(heads, n)`` otherwise."""
        return self._shaped(self._export()[0])

    @property
    def heads(self) -> int:
        """Independent rows (KV heads, or flattened sequences x heads)."""
        return self._heads

    @property
    def budget(self) -> int:
        """The configured budget (positions kept per head after :meth:`evict`)."""
        return self._budget

    def memory_bytes(self) -> int:
        """Bytes of policy state: ``64 + capacity * heads * bytes_per_slot`` (9
        Scissorhands, +8 with a history window, +4 with a vote rate; 13 H2O; 4
        StreamingLLM and Full)."""
        return int(lib.sh_policy_memory_bytes(self._ptr))

    def reset(self) -> None:
        """Back to holding ``{0}`` with nothing remembered, for a new sequence."""
        with self._lock:
            check(lib.sh_policy_reset(self._ptr))
            self._n = 1
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
        return {"budget": self._budget, **first, "heads": self._heads,
                **{k: v for k, v in shown.items() if k not in first}}

    def _sink_count(self) -> int:
        return min(self._options["sinks"], self._n)

    def state_dict(self) -> dict[str, Any]:
        """The policy as plain data (ints, floats, lists, str), loadable by
        :meth:`from_state_dict` of either backend; versioned. A Scissorhands policy
        with a history window adds ``"history"`` (its vote registers) and one with a
        vote rate ``"steps_held"``, both shaped like ``"kept"``."""
        positions, scores, history, held, last = self._export(with_history=True)
        state: dict[str, Any] = {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "policy": self.name,
            "params": self._params(),
            "kept": positions.tolist(),
        }
        if self._score_name is not None:
            state[self._score_name] = scores.tolist()
        if history is not None:
            state["history"] = history.tolist()
        if held is not None:
            state["steps_held"] = held.tolist()
        state["last_position"] = last  # read under the same lock as the arrays
        return state

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> NativePolicy:
        """Rebuild a policy from :meth:`state_dict` output (of either backend).

        Raises
        ------
        InvalidInputError
            Wrong format, version or policy name; rows of unequal length; positions
            not strictly ascending or above ``last_position``; scores out of range;
            ``history`` missing although ``params`` sets a history window (or present
            although none is set), a register with a bit at or above the window, or
            votes that are not the registers' popcounts; ``steps_held`` missing
            although ``params`` sets ``vote_rate`` (or present although not), or a
            slot with more votes (or register bits) than steps held.
        InvalidTypeError
            A field of the wrong kind.

        A state without the optional parameters (``sinks`` of Scissorhands and H2O,
        ``history_window`` and ``vote_rate`` of Scissorhands: states written before
        they existed) loads with their defaults.
        """
        spec = SPECS[cls.name]
        names = [o.name for o in spec.options]
        required = ("budget", *names[:1], "heads")
        keeps_registers = spec.takes("history_window")
        optional_keys = ("history", "steps_held") if keeps_registers else ()
        policy, kept, scores, last = parse_state(state, cls.name, cls._score_name, required,
                                                 cls, tuple(names[1:]), optional_keys)
        h, n = kept.shape
        history = held = None
        if keeps_registers:
            history = parse_history(state, policy._options["history_window"], scores)
            held = parse_held(state, policy._options["vote_rate"], scores, history)
        votes_ptr = scores_ptr = ffi.NULL
        if cls._score_name == "votes":
            votes_ptr = ffi.from_buffer("uint32_t[]", scores)
        elif cls._score_name == "scores":
            scores_ptr = ffi.from_buffer("double[]", scores)
        rc = lib.sh_policy_import_state(
            policy._ptr, h, n, ffi.from_buffer("uint32_t[]", kept), votes_ptr, scores_ptr,
            _NULL if history is None else ffi.from_buffer("uint64_t[]", history),
            _NULL if held is None else ffi.from_buffer("uint32_t[]", held), last)
        check(rc, cls.__name__)
        policy._n = n
        policy._last = last
        return policy

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        return (type(self).from_state_dict, (self.state_dict(),))

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v}" for k, v in self._params().items())
        return f"{type(self).__name__}({params}, held={self.kept_count()})"

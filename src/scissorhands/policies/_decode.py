"""The decode loop of a C-backed policy: one C call per step (admit, evict or
both), with or without the evicted slots, and the fast paths the cache drives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from scissorhands._native import check
from scissorhands._shared import (
    UINT32_MAX,
    check_flag,
    pooled_evict_error,
    ragged_evict_error,
)
from scissorhands.policies._core import _PolicyCore
from scissorhands.policies._weights import (
    _ADMIT,
    _BOTH,
    _DTYPE_CODES,
    _ERR_LENGTH,
    _ERR_RAGGED,
    _EVICT,
    _NONE,
    _NULL,
    _from_buffer,
    _ndarray,
    _step,
    _unpack,
    as_weights,
)


class _DecodeLoop(_PolicyCore):
    """The decode step and evictions with one count for every row."""

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

"""Calls that may evict a different number from each row: per-row evictions and
steps, and evictions ranked by observed (pooled) attention.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from scissorhands._native import check, ffi, lib
from scissorhands._shared import (
    UINT32_MAX,
    RowVictims,
    check_int,
    check_pool_kernel,
    is_pinned,
    observed_evictions,
    observed_pooled_error,
    observed_shape_error,
    ragged_evict_error,
)
from scissorhands.policies._decode import _DecodeLoop
from scissorhands.policies._weights import (
    _ADMIT,
    _DTYPE_CODES,
    _ERR_LENGTH,
    _ERR_WEIGHT,
    _EVICT,
    _NONE,
    _NULL,
    _from_buffer,
    _read_by_observe,
    _weights_or_shape,
    as_weights,
)


class _RowCalls(_DecodeLoop):
    """Row-wise evictions and the observed-attention evictions."""

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

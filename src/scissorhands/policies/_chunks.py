"""Calls that apply many tokens at once: a chunk (``extend``), the prompt
(``prefill``) and selecting rows (beams).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from scissorhands._native import check, ffi, lib
from scissorhands._shared import (
    UINT32_MAX,
    chunk_shape_error,
    read_admit,
    read_row_index,
)
from scissorhands.errors import InvalidInputError, InvalidTypeError
from scissorhands.policies._rows import _RowCalls
from scissorhands.policies._weights import (
    _DTYPE_CODES,
    _ERR_WEIGHT,
    _NONE,
    _NULL,
    _from_buffer,
    _read_by_extend,
    _read_by_prefill,
    _weights_or_shape,
)


class _ChunkCalls(_RowCalls):
    """Chunks, the prompt and row selection."""

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

"""Chunks, prompts and rows, the reference's fifth layer: ``extend`` (a chunk of tokens
as the decode steps they stand for, with per-row admission), ``prefill`` (a prompt's
attention on a fresh policy) and ``select_rows`` (beams, batch changes).
"""

from __future__ import annotations

from typing import Any

from scissorhands._shared import UINT32_MAX, chunk_shape_error, read_admit, read_row_index
from scissorhands.errors import InvalidInputError, InvalidTypeError
from scissorhands.reference._core import _locked, _weights_or_shape, _widen
from scissorhands.reference._observed import _Observed


class _Chunks(_Observed):
    """Several tokens in one call: a chunk as its decode steps (per-row admission), a
    prompt's lower-triangular attention, and rows copied into a new set."""

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

    # -- public API -----------------------------------------------------------------

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

"""Decode steps, the reference's third layer: stages (1) to (6) of a step's checks,
the policy's update (its :meth:`_update` hook) and admission, and ``on_decode_step``,
``step`` and ``step_rows``.
"""

from __future__ import annotations

from typing import Any

from scissorhands._shared import UINT32_MAX, RowVictims, check_flag, check_int, read_weights
from scissorhands.errors import InvalidInputError
from scissorhands.reference._core import _locked, _widen
from scissorhands.reference._evict import _Evictions


class _Steps(_Evictions):
    """Decode steps: one step's position and weights checked, the scores updated, the
    new position admitted, and a step fused with its eviction."""

    def _check_pos(self, pos: Any) -> int:
        """Stages (1) and (2): an integer in ``[0, 2**32-1]`` above every admitted one."""
        pos = check_int("pos", pos, 0, UINT32_MAX)
        if pos <= self._last:
            raise InvalidInputError(
                f"pos must be greater than every position admitted ({self._last}), got {pos}"
            )
        return pos

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

    # -- mutation (only after everything is validated) -----------------------------------

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

    # -- public API -----------------------------------------------------------------

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

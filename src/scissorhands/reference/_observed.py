"""The observation-window rule (SnapKV, Li et al., 2024, arXiv:2404.14469), the
reference's fourth layer: the window's rows' attention summed per held position,
max-pooled over kept order, the least pooled scores evicted outside the sinks, the
window's own positions and the pinned ones; ``evict_observed_rows`` and ``evict_observed``.
"""

from __future__ import annotations

from typing import Any

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
from scissorhands.options import SPECS
from scissorhands.reference._core import _locked, _weights_or_shape, _widen
from scissorhands.reference._steps import _Steps


class _Observed(_Steps):
    """Eviction by an observation window's pooled attention (SnapKV): the same rule for
    every policy, which reads the window it is given and changes nothing but which
    positions are held."""

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

    # -- public API -----------------------------------------------------------------

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

"""Eviction to a budget, the reference's second layer: per row (a policy's own
choice of victims) or per pool (Ada-KV: consecutive rows sharing ``pool * budget``), the
victims removed with their per-slot values, and ``evict`` / ``evict_rows``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from scissorhands._shared import UINT32_MAX, RowVictims, check_flag, check_int, pooled_evict_error, ragged_evict_error
from scissorhands.errors import InvalidInputError
from scissorhands.options import SPECS, protected_message
from scissorhands.reference._core import _locked
from scissorhands.reference._object import _PolicyObject


class _Evictions(_PolicyObject):
    """Eviction down to a budget: the per-call budget's check, the victims of each row
    (its own choice, or a pool's shared one), their removal, and how they are returned."""

    def _check_budget(self, budget: Any) -> int | None:
        """Stage (3): the per-call budget, or the configured one when None; it must be
        above the protected positions (recent window and sinks)."""
        if budget is None:
            return self.budget
        budget = check_int("budget", budget, 1, UINT32_MAX)
        protected = {o.name: self._options[o.name] for o in SPECS[self.name].options if o.protects}
        if sum(protected.values()) >= budget:
            raise InvalidInputError(protected_message(protected, budget))
        return budget

    def _evictions(self, budget: int | None, admitted: int = 0) -> list[int]:
        """Positions each row evicts down to ``budget`` after ``admitted`` more join it."""
        if budget is None:
            return [0] * self.heads
        return [max(0, n + admitted - budget) for n in self._counts()]

    def _check_unpooled(self, budget: int | None, call: str) -> None:
        """``step``/``evict`` return one ``(heads, k)`` array, which a pooled policy's
        rows (evicting different numbers) cannot fill: refused, right after the budget."""
        if budget is not None and self.pool != 1:
            raise pooled_evict_error(call, self.pool)

    def _check_same_evictions(self, budget: int | None, admitted: int, call: str) -> None:
        """``step``/``evict`` return one ``(heads, k)`` array: every row must evict k."""
        if len(set(self._evictions(budget, admitted))) > 1:
            raise ragged_evict_error(call)

    def _pooled_slots(self, budget: int) -> list[list[int]]:
        """The slots each row evicts when pools of ``pool`` consecutive rows share
        ``pool * budget`` positions: per pool over its share, the excess, least
        (key, position, row) first among the rows' evictable slots."""
        chosen: list[list[int]] = [[] for _ in range(self.heads)]
        for first in range(0, self.heads, self.pool):
            rows = range(first, first + self.pool)
            excess = sum(len(self._kept[h]) for h in rows) - self.pool * budget
            if excess <= 0:
                continue
            candidates = [(self._rank(h, s), self._kept[h][s], h, s)
                          for h in rows for s in self._evictable(h)]
            for _, _, h, s in sorted(candidates)[:excess]:
                chosen[h].append(s)
        return chosen

    def _evict(self, budget: int | None) -> tuple[list[list[int]], list[list[int]]]:
        """Drop ``n_h - budget`` slots from each row holding ``n_h > budget``; victims and
        their slots, ascending, row by row."""
        victims: list[list[int]] = [[] for _ in range(self.heads)]
        slots: list[list[int]] = [[] for _ in range(self.heads)]
        pooled = self._pooled_slots(budget) if budget is not None and self.pool != 1 else None
        for h, k in enumerate(self._evictions(budget)):
            if pooled is not None:
                k = len(pooled[h])
            if k == 0:
                continue
            chosen = sorted(self._victim_slots(h, k) if pooled is None else pooled[h])
            slots[h] = chosen
            victims[h] = self._remove_slots(h, chosen)
        return victims, slots

    def _remove_slots(self, head: int, chosen: list[int]) -> list[int]:
        """Drop the slots ``chosen`` (ascending) from row ``head``, keeping the order of
        the rest and every survivor's per-slot values; returns their positions."""
        victims = [self._kept[head][s] for s in chosen]
        gone = set(chosen)
        self._kept[head] = [p for s, p in enumerate(self._kept[head]) if s not in gone]
        if self._score_key is not None:
            self._scores[head] = [v for s, v in enumerate(self._scores[head]) if s not in gone]
        if self._history is not None:
            self._history[head] = [r for s, r in enumerate(self._history[head]) if s not in gone]
        if self._held is not None:
            self._held[head] = [c for s, c in enumerate(self._held[head]) if s not in gone]
        return victims

    def _result(self, victims: list[list[int]], slots: list[list[int]], return_indices: bool) -> Any:
        """Shape the victims as the API returns them (list for one head, array for more)."""
        if self.heads == 1:
            return (victims[0], slots[0]) if return_indices else victims[0]
        k = len(victims[0])
        v = np.array(victims, dtype=np.uint32).reshape(self.heads, k)
        if not return_indices:
            return v
        return v, np.array(slots, dtype=np.int64).reshape(self.heads, k)

    @staticmethod
    def _row_victims(victims: list[list[int]], slots: list[list[int]]) -> RowVictims:
        """The victims row by row, as ``step_rows``/``evict_rows`` return them."""
        return RowVictims(np.array([len(v) for v in victims], dtype=np.uint32),
                          np.array([p for row in victims for p in row], dtype=np.uint32),
                          np.array([s for row in slots for s in row], dtype=np.int64))

    # -- public API -----------------------------------------------------------------

    @_locked
    def evict(self, budget: int | None = None, return_indices: bool = False) -> Any:
        """Evict until at most ``budget`` positions are held in every row.

        Parameters
        ----------
        budget : int or None, default None
            Positions to keep; None means the configured budget.  A per-call budget may
            exceed the configured one and does not replace it.
        return_indices : bool, default False
            Also return each victim's slot (index in ``kept`` before the eviction).

        Returns
        -------
        list[int] or numpy.ndarray or tuple
            ``heads == 1``: the victims as a list, ascending.  ``heads > 1``: a
            ``(heads, k)`` uint32 array, each row ascending.  With ``return_indices`` a
            pair ``(victims, slots)`` of lists, or of ``(heads, k)`` arrays (slots int64).

        Raises
        ------
        InvalidTypeError
            ``budget`` is not an integer.
        InvalidInputError
            ``budget < 1``, or not above ``recent_window + sinks`` (the positions never
            evicted); checked even when nothing needs evicting.  The rows would evict
            different numbers of positions (:meth:`evict_rows` takes that case).
        """
        return_indices = check_flag("return_indices", return_indices)
        budget = self._check_budget(budget)
        self._check_pinned(budget, None)
        self._check_unpooled(budget, "evict")
        self._check_same_evictions(budget, 0, "evict")
        return self._result(*self._evict(budget), return_indices)

    @_locked
    def evict_rows(self, budget: int | None = None) -> RowVictims:
        """Evict each row down to ``budget`` on its own: row ``h`` holding ``n_h``
        positions loses ``max(0, n_h - budget)``, chosen as :meth:`evict` chooses.

        Parameters
        ----------
        budget : int or None, default None
            As for :meth:`evict`.

        Returns
        -------
        RowVictims
            ``counts`` (``uint32``, ``(heads,)``), ``victims`` (``uint32``, row after
            row, each ascending) and ``slots`` (``int64``: each victim's index in its
            row before the eviction).

        Raises
        ------
        InvalidTypeError, InvalidInputError
            For a bad budget, as :meth:`evict`.
        """
        budget = self._check_budget(budget)
        self._check_pinned(budget, None)
        return self._row_victims(*self._evict(budget))

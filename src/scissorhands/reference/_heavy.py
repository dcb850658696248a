"""The policies that evict by a per-position score, outside their sinks, their
recent window and the pinned positions: what they share.
"""

from __future__ import annotations

from typing import Any

from scissorhands.reference._base import _Policy


class _HeavyHitters(_Policy):
    """Score-based eviction with sinks and a recent window, shared by every policy that
    keeps a per-position score (its spec's ``score_key``).

    The evictable range is ``kept[min(sinks, n) : n - recent_window]``: the first
    ``sinks`` positions held and the ``recent_window`` newest are never evicted.  Its
    lowest-scored slots go first, equal scores evicting the lower position.
    """

    recent_window: int
    sinks: int

    def __init__(self, budget: int = 512, recent_window: int = 32, rng: Any = None, heads: int = 1,
                 sinks: int = 0, pool: int = 1, pins: Any = ()) -> None:
        self._configure(budget, recent_window=recent_window, sinks=sinks, pool=pool)
        self._setup(heads, pins)

    def _evictable(self, head: int) -> list[int]:
        """The slots of row ``head`` outside its sinks, its recent window and the
        pinned positions."""
        n = len(self._kept[head])
        return self._unpinned(head, range(min(self.sinks, n), n - self.recent_window))

    def _rank(self, head: int, slot: int) -> Any:
        """What orders slot ``slot`` of row ``head`` for eviction (least goes first)."""
        return self._scores[head][slot]

    def _victim_slots(self, head: int, count: int) -> list[int]:
        # kept is ascending, so ordering ties by slot orders them by position.
        return sorted(self._evictable(head), key=lambda s: (self._rank(head, s), s))[:count]

    def sink_count(self) -> int:
        """Sinks held: ``min(sinks, kept_count())``."""
        return min(self.sinks, self.kept_count())

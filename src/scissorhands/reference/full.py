"""The reference's full cache: never evicts (the baseline)."""

from __future__ import annotations

from typing import Any

from scissorhands._shared import FULL_INITIAL_CAPACITY, UINT32_MAX, check_int
from scissorhands.reference._base import _Policy


class Full(_Policy):
    """Full cache: never evicts (the baseline every policy is compared with).

    Parameters
    ----------
    budget : int or None, default None
        Validated (``[1, 2**32 - 1]``) and recorded, never used.
    rng : any, default None
        Accepted and ignored.
    heads : int, default 1
        Rows, in ``[1, 65536]``.

    pins : sequence of (int, int), default ()
        Pinned spans, checked and kept as :meth:`pin` keeps them; they change nothing,
        since the full cache never evicts.
    Notes
    -----
    Capacity starts at 64 per head and doubles when full; ``evict`` validates its budget
    and returns nothing.  Attention is never read.
    """

    name = "full"

    def __init__(self, budget: int | None = None, rng: Any = None, heads: int = 1, pins: Any = ()) -> None:
        self.budget = None if budget is None else check_int("budget", budget, 1, UINT32_MAX)
        self._options = {}
        self._setup(heads, pins)

    def _initial_capacity(self) -> int:
        return FULL_INITIAL_CAPACITY

    def _capacity_limit(self) -> int | None:
        return None

    def _evictions(self, budget: int | None, admitted: int = 0) -> list[int]:
        return [0] * self.heads

"""H2O: evict the positions with the least cumulative attention."""

from __future__ import annotations

from typing import Any

import numpy as np

from scissorhands._native import lib
from scissorhands._option_specs import POOL, RECENT_WINDOW, SINKS
from scissorhands._policy_spec import PolicySpec
from scissorhands.policies._base import RankingPolicy

#: H2O's declaration (:mod:`scissorhands._registry` finds it).
SPEC = PolicySpec(
    "h2o", "H2O", (RECENT_WINDOW, SINKS, POOL),
    paper="Zhang et al., NeurIPS 2023, arXiv 2306.14048",
    module="h2o", kind="SH_H2O", slot_bytes=13, score_key="scores", colour="tab:orange", marker="^", order=20)


class H2O(RankingPolicy):
    """Heavy-Hitter Oracle eviction (Zhang et al., NeurIPS 2023, arXiv 2306.14048).

    Each decode step adds every held position's attention weight to its score,
    accumulated in float64 (saturating at the largest finite double). Over budget,
    the lowest-scored positions outside the sinks and the recent window are evicted;
    equal scores evict the lower position.

    Parameters
    ----------
    budget : int, default 512
        Positions kept per head after :meth:`evict`, in ``[1, 2**32 - 1]``.
    recent_window : int or float, default 32
        The most recent positions never evicted: an int in ``[0, budget - 1]``, or a
        float (or ``Fraction``) in ``[0, 1)`` taken as that fraction of the budget,
        rounded down, a float read as the decimal it prints as (``recent_window=0.5``
        holds ``budget // 2``; ``0.7`` of 10 is 7); ``self.recent_window`` and the state
        keep the resolved count.
    rng : object, optional
        Accepted and ignored (the policy is deterministic).
    heads : int, default 1
        Independent rows (KV heads) held in one object, ``[1, 65536]``.
    sinks : int, default 0
        The first positions held (as StreamingLLM's attention sinks), never evicted;
        ``recent_window + sinks < budget``. 0 = none (the seed's semantics).
    pool : int, default 1
        Consecutive rows sharing one budget (Ada-KV, Feng et al., 2024, arXiv
        2407.11550): rows ``[g * pool, (g + 1) * pool)`` hold at most
        ``pool * budget`` positions in all, so a row whose attention is spread out may
        hold more than ``budget`` while another holds less. Over that share a pool
        evicts its least-ranked evictable slots, ties going to the lower position,
        then the lower row (each row keeps its sinks and recent window). Must divide
        ``heads``; with ``pool > 1`` rows evict different numbers, so only
        ``step_rows``/``evict_rows`` evict. 1 = each row its own budget.

    pins : sequence of (int, int), default ()
        Pinned spans ``(start, stop)``, half-open: positions ``start <= pos < stop``
        that no eviction takes, in any row, merged as :meth:`pin` merges them and
        refused as it refuses them (``InvalidTypeError``, ``InvalidInputError``).
        Sinks are the span ``(0, sinks)``; :meth:`reset` keeps these spans.
    Raises
    ------
    InvalidTypeError
        A parameter is not an integer (bools included; ``recent_window`` may also be
        a float fraction).
    InvalidInputError
        ``budget < 1``, ``recent_window`` outside ``[0, budget - 1]`` (a fraction
        outside ``[0, 1)``), ``sinks < 0`` or ``recent_window + sinks >= budget``.

    Notes
    -----
    13 bytes per slot: 4 position + 8 float64 score + 1 selection scratch.
    """

    name = "h2o"

    def __init__(self, budget: int = 512, recent_window: int = 32, rng: Any = None, heads: int = 1,
                 sinks: int = 0, pool: int = 1, pins: Any = ()) -> None:
        super().__init__(budget=budget, recent_window=recent_window, sinks=sinks, heads=heads, pool=pool, pins=pins)

    @property
    def scores(self) -> np.ndarray:
        """Cumulative attention, index-aligned with :attr:`kept`: ``float64``,
        ``(n,)`` or ``(heads, n)``.

        Raises
        ------
        InvalidInputError
            The rows hold different counts (read :meth:`state_dict` instead).
        """
        return self._equal_rows("scores", 2)

    def score_of(self, pos: int, head: int = 0) -> float:
        """The cumulative score of ``pos`` in ``head``'s row, or ``-1.0`` when it is
        not held (also for ``pos < 0`` or ``pos > 2**32 - 1``).

        Raises
        ------
        InvalidTypeError
            ``pos`` or ``head`` is not an integer.
        InvalidInputError
            ``head`` is outside ``[0, heads)``.
        """
        return float(self._lookup(pos, head, lib.sh_policy_score_of, -1.0))

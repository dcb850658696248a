"""Scissorhands: evict the positions that mattered least often."""

from __future__ import annotations

from typing import Any

import numpy as np

from scissorhands._native import lib
from scissorhands._option_specs import HISTORY_WINDOW, POOL, RECENT_WINDOW, SINKS, VOTE_RATE
from scissorhands._policy_spec import PolicySpec
from scissorhands.errors import InvalidInputError
from scissorhands.policies._base import RankingPolicy

#: Scissorhands' declaration (:mod:`scissorhands._registry` finds it).
SPEC = PolicySpec(
    "scissorhands", "Scissorhands", (RECENT_WINDOW, SINKS, HISTORY_WINDOW, VOTE_RATE, POOL),
    paper="Liu et al., NeurIPS 2023, arXiv 2305.17118",
    module="scissorhands", kind="SH_SCISSORHANDS", slot_bytes=9, score_key="votes",
    colour="tab:green", marker="o", order=40)


class Scissorhands(RankingPolicy):
    """Scissorhands KV-cache eviction (Liu et al., NeurIPS 2023, arXiv 2305.17118).

    Each decode step, every held position whose attention weight strictly exceeds its
    fair share ``1 / n`` (``n`` = positions held) earns one vote. Over budget, the
    least-voted positions outside the protected sinks and recent window are evicted;
    equal votes evict the lower position. Counting how *often* a token mattered,
    rather than how much (H2O), lets a one-off spike stop defending its slot.

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
        Accepted for the shared constructor shape and ignored: the policy is
        deterministic.
    heads : int, default 1
        Independent rows (KV heads) held in one object, ``[1, 65536]``.
    sinks : int, default 0
        The first positions held (as StreamingLLM's attention sinks), never evicted;
        ``recent_window + sinks < budget``. 0 = none (the seed's semantics).
    history_window : int or None, default None
        Votes count only the last ``history_window`` decode steps that carried
        attention (the paper's history window), in ``[1, 64]``; a step with
        ``attn=None`` is not one of them. None: votes accumulate forever (the
        seed's semantics).
    vote_rate : bool, default False
        Rank positions by votes per decode step held instead of by votes: each slot
        counts the steps that carried attention since it was admitted (capped at
        ``history_window`` when set, at least 1), and eviction takes the lowest
        ``votes / steps`` (a correctly rounded float64; equal rates evict the lower
        position). An old position's head start in votes then no longer protects
        it. False: the seed's semantics.
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
        A parameter is not an integer (bools and floats included, except a float
        ``recent_window`` fraction), or ``history_window`` is neither an integer nor None.
    InvalidInputError
        ``budget < 1``, ``recent_window`` outside ``[0, budget - 1]`` (a fraction
        outside ``[0, 1)``), ``sinks < 0``,
        ``recent_window + sinks >= budget``, or ``history_window`` outside ``[1, 64]``.
        (``vote_rate`` not a bool is an ``InvalidTypeError``.)

    Notes
    -----
    State per slot: 4 bytes position + 4 bytes ``uint32`` votes (saturating at
    ``2**32 - 1``) + 1 byte of selection scratch, 9 bytes; with a history window
    also an 8-byte register of the last ``history_window`` vote bits (+8 bytes), with
    a vote rate a ``uint32`` count of steps held (+4 bytes). A step and an eviction
    are O(n). A new policy holds position 0 with no votes.
    """

    name = "scissorhands"

    def __init__(self, budget: int = 512, recent_window: int = 32, rng: Any = None, heads: int = 1,
                 sinks: int = 0, history_window: int | None = None, vote_rate: bool = False,
                 pool: int = 1, pins: Any = ()) -> None:
        super().__init__(budget=budget, recent_window=recent_window, sinks=sinks,
                         history_window=history_window, vote_rate=vote_rate, heads=heads, pool=pool,
                         pins=pins)

    @property
    def history_window(self) -> int | None:
        """Decode steps a vote counts for, or None (forever)."""
        return self._options["history_window"]

    @property
    def vote_rate(self) -> bool:
        """Whether eviction ranks positions by votes per step held."""
        return self._options["vote_rate"]

    @property
    def steps_held(self) -> np.ndarray:
        """Decode steps that carried attention since each position was admitted
        (saturating), index-aligned with :attr:`kept`: ``uint32``, ``(n,)`` or
        ``(heads, n)``.

        Raises
        ------
        InvalidInputError
            The policy was built without ``vote_rate`` (it keeps no such count), or
            the rows hold different counts (read :meth:`state_dict` instead).
        """
        if not self._options["vote_rate"]:
            raise InvalidInputError("steps_held is kept only with vote_rate=True")
        return self._equal_rows("steps_held", 4, with_history=True)

    @property
    def votes(self) -> np.ndarray:
        """Votes, index-aligned with :attr:`kept`: ``uint32``, ``(n,)`` or ``(heads, n)``.

        Raises
        ------
        InvalidInputError
            The rows hold different counts (read :meth:`state_dict` instead).
        """
        return self._equal_rows("votes", 2)

    def votes_of(self, pos: int, head: int = 0) -> int:
        """The votes of ``pos`` in ``head``'s row, or ``-1`` when it is not held
        (also for ``pos < 0`` or ``pos > 2**32 - 1``).

        Raises
        ------
        InvalidTypeError
            ``pos`` or ``head`` is not an integer.
        InvalidInputError
            ``head`` is outside ``[0, heads)``.
        """
        return int(self._lookup(pos, head, lib.sh_policy_votes_of, -1))

"""The reference's Scissorhands: votes over the fair share (Liu et al., NeurIPS 2023)."""

from __future__ import annotations

from typing import Any

import numpy as np

from scissorhands._shared import UINT32_MAX
from scissorhands.errors import InvalidInputError
from scissorhands.reference._heavy import _HeavyHitters


class Scissorhands(_HeavyHitters):
    """Scissorhands: evict the positions that were important on the fewest steps.

    A position earns one vote on each decode step where its attention weight strictly
    exceeds the fair share ``1.0 / len(attn)`` (compared in double on the value as given:
    a float32 weight is widened exactly).  Votes are uint32 and saturate at ``2**32 - 1``.
    Eviction drops the least-voted positions outside the sinks and the recent window,
    ties to the lower position.

    With a ``history_window`` of ``w`` steps a vote counts only while it is among the
    last ``w`` decode steps that carried attention: each slot keeps a register of its
    vote bits (bit 0 the latest step); every such step shifts each held slot's register
    left by one, adds the new bit and keeps the low ``w`` bits, and the slot's vote count
    is the number of bits set.  A step with ``attn=None`` is not a step of the history.

    With ``vote_rate=True`` each slot also counts the decode steps that carried attention
    since it was admitted (``steps_held``, uint32, saturating), and eviction ranks slots by
    ``votes / steps`` instead of votes, where ``steps`` is the count capped at the history
    window (when set) and raised to at least 1; the rate is a Python float (a correctly
    rounded double, as in C), equal rates evicting the lower position.

    Parameters
    ----------
    budget : int, default 512
        Positions to keep per head, in ``[1, 2**32 - 1]``.
    recent_window : int or float, default 32
        The most recent positions, never evicted: an int in ``[0, budget - 1]``, or a
        float (or ``Fraction``) in ``[0, 1)``: that fraction of the budget, rounded down,
        a float read as the decimal it prints as (``0.7`` of 10 is 7; the attribute and
        the state hold the resolved count).
    rng : any, default None
        Accepted and ignored (the policy is deterministic).
    heads : int, default 1
        Independent rows (KV heads), in ``[1, 65536]``.
    sinks : int, default 0
        The first positions held, never evicted; ``recent_window + sinks < budget``.
    history_window : int or None, default None
        Decode steps a vote counts for, in ``[1, 64]``; None counts them forever.
    vote_rate : bool, default False
        Evict by votes per step held rather than by votes.
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
        Pinned spans ``(start, stop)``, half-open, that no eviction takes in any row;
        checked and merged as :meth:`pin` does (refused as it refuses a span).  Sinks
        are the span ``(0, sinks)``; :meth:`reset` keeps these spans.
    Raises
    ------
    InvalidTypeError
        A parameter is not an integer (bool and float refused, except a float
        ``recent_window``, a fraction of the budget; ``history_window`` may also be None),
        or ``vote_rate`` is not a bool.
    InvalidInputError
        A parameter is out of range.

    References
    ----------
    Z. Liu et al., "Scissorhands: Exploiting the Persistence of Importance Hypothesis for
    LLM KV Cache Compression at Test Time", NeurIPS 2023, arXiv:2305.17118.
    """

    name = "scissorhands"
    history_window: int | None
    vote_rate: bool

    def __init__(self, budget: int = 512, recent_window: int = 32, rng: Any = None, heads: int = 1,
                 sinks: int = 0, history_window: int | None = None, vote_rate: bool = False,
                 pool: int = 1, pins: Any = ()) -> None:
        self._configure(budget, recent_window=recent_window, sinks=sinks,
                        history_window=history_window, vote_rate=vote_rate, pool=pool)
        self._setup(heads, pins)

    def _keeps_history(self) -> bool:
        return self.history_window is not None

    def _keeps_held(self) -> bool:
        return self.vote_rate

    def _rank(self, head: int, slot: int) -> Any:
        if self._held is None:
            return self._scores[head][slot]
        cap = self.history_window if self.history_window is not None else UINT32_MAX
        return self._scores[head][slot] / max(1, min(self._held[head][slot], cap))

    def _update(self, head: int, weights: list[float]) -> None:
        if self._held is not None:
            self._held[head] = [min(c + 1, UINT32_MAX) for c in self._held[head]]
        share = 1.0 / len(weights)
        votes = self._scores[head]
        if self._history is None:
            for i, w in enumerate(weights):
                if w > share and votes[i] < UINT32_MAX:
                    votes[i] += 1
            return
        keep = (1 << self.history_window) - 1  # type: ignore[operator]
        registers = self._history[head]
        for i, w in enumerate(weights):
            registers[i] = ((registers[i] << 1) | int(w > share)) & keep
            votes[i] = registers[i].bit_count()

    @property
    def steps_held(self) -> np.ndarray:
        """Decode steps that carried attention since each position was admitted, aligned
        with :attr:`kept`, uint32, shape ``(n,)`` or ``(heads, n)``.

        Raises
        ------
        InvalidInputError
            The policy was built without ``vote_rate``.
        """
        if self._held is None:
            raise InvalidInputError("steps_held is kept only with vote_rate=True")
        return self._as_array(self._held, np.uint32, "steps_held")

    @property
    def votes(self) -> np.ndarray:
        """Votes aligned with :attr:`kept`, uint32, shape ``(n,)`` or ``(heads, n)``
        (rows of different counts raise ``InvalidInputError``)."""
        return self._as_array(self._scores, np.uint32, "votes")

    def votes_of(self, pos: int, head: int = 0) -> int:
        """Votes of ``pos`` in row ``head``, or -1 when it is not held.

        Raises
        ------
        InvalidTypeError
            ``pos`` or ``head`` is not an integer.
        InvalidInputError
            ``head`` is outside ``[0, heads)``.
        """
        slot = self._slot_of(pos, head)
        return -1 if slot is None else self._scores[head][slot]

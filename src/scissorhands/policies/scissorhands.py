"""Scissorhands: evict the positions that mattered least often."""

from __future__ import annotations

from typing import Any

import numpy as np

from scissorhands._native import lib
from scissorhands.policies._base import NativePolicy


class Scissorhands(NativePolicy):
    """Scissorhands KV-cache eviction (Liu et al., NeurIPS 2023, arXiv 2305.17118).

    Each decode step, every held position whose attention weight strictly exceeds its
    fair share ``1 / n`` (``n`` = positions held) earns one vote. Over budget, the
    least-voted positions outside the protected recent window are evicted; equal
    votes evict the lower position. Counting how *often* a token mattered, rather
    than how much (H2O), lets a one-off spike stop defending its slot.

    Parameters
    ----------
    budget : int, default 512
        Positions kept per head after :meth:`evict`, in ``[1, 2**32 - 1]``.
    recent_window : int, default 32
        The most recent positions never evicted; ``0 <= recent_window < budget``.
    rng : object, optional
        Accepted for the shared constructor shape and ignored: the policy is
        deterministic.
    heads : int, default 1
        Independent rows (KV heads) held in one object, ``[1, 65536]``.

    Raises
    ------
    InvalidTypeError
        A parameter is not an integer (bools and floats included).
    InvalidInputError
        ``budget < 1``, ``recent_window < 0`` or ``recent_window >= budget``.

    Notes
    -----
    State per slot: 4 bytes position + 4 bytes ``uint32`` votes (saturating at
    ``2**32 - 1``) + 1 byte of selection scratch, 9 bytes; a step and an eviction
    are O(n). A new policy holds position 0 with no votes.
    """

    name = "scissorhands"
    _kind = lib.SH_SCISSORHANDS
    _param_names = ("budget", "recent_window", "heads")
    _score_name = "votes"
    _reads_attention = True

    def __init__(self, budget: int = 512, recent_window: int = 32, rng: Any = None, heads: int = 1) -> None:
        super().__init__(budget=budget, recent_window=recent_window, heads=heads)

    def _params(self) -> dict[str, int]:
        return {"budget": self._budget, "recent_window": self._recent_window, "heads": self._heads}

    @property
    def recent_window(self) -> int:
        """The most recent positions that are never evicted."""
        return self._recent_window

    @property
    def votes(self) -> np.ndarray:
        """Votes, index-aligned with :attr:`kept`: ``uint32``, ``(n,)`` or ``(heads, n)``."""
        return self._shaped(self._export()[1])

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
        pos = self._lookup_position(pos)
        head = self._check_head(head)
        if pos is None:
            return -1
        with self._lock:
            return int(lib.sh_policy_votes_of(self._ptr, head, pos))

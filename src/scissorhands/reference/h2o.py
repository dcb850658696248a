"""The reference's H2O: cumulative attention (Zhang et al., NeurIPS 2023)."""

from __future__ import annotations

import numpy as np

from scissorhands.reference._core import DBL_MAX
from scissorhands.reference._heavy import _HeavyHitters


class H2O(_HeavyHitters):
    """H2O (heavy-hitter oracle): evict the lowest cumulative attention.

    Each position's score is the sum, in float64, of every weight it has received
    (float32 weights widened exactly before adding), saturating at the largest finite
    double so that a score stays finite (weights near 1e308 would otherwise overflow).
    Eviction drops the lowest scores outside the sinks and the recent window, ties to the lower
    position.

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
        Accepted and ignored.
    heads : int, default 1
        Independent rows (KV heads), in ``[1, 65536]``.
    sinks : int, default 0
        The first positions held, never evicted; ``recent_window + sinks < budget``.
    pool : int, default 1
        Consecutive rows sharing one budget (Ada-KV), as :class:`Scissorhands` takes it.

    pins : sequence of (int, int), default ()
        Pinned spans ``(start, stop)``, half-open, that no eviction takes in any row;
        checked and merged as :meth:`pin` does (refused as it refuses a span).  Sinks
        are the span ``(0, sinks)``; :meth:`reset` keeps these spans.
    Raises
    ------
    InvalidTypeError
        A parameter is not an integer (a float ``recent_window`` is a fraction).
    InvalidInputError
        A parameter is out of range.

    References
    ----------
    Z. Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of
    Large Language Models", NeurIPS 2023, arXiv:2306.14048.
    """

    name = "h2o"

    def _new_score(self) -> float:
        return 0.0

    def _update(self, head: int, weights: list[float]) -> None:
        scores = self._scores[head]
        for i, w in enumerate(weights):
            scores[i] = min(scores[i] + w, DBL_MAX)  # +inf would not survive state_dict()

    @property
    def scores(self) -> np.ndarray:
        """Scores aligned with :attr:`kept`, float64, shape ``(n,)`` or ``(heads, n)``
        (rows of different counts raise ``InvalidInputError``)."""
        return self._as_array(self._scores, np.float64, "scores")

    def score_of(self, pos: int, head: int = 0) -> float:
        """Cumulative score of ``pos`` in row ``head``, or -1.0 when it is not held.

        Raises
        ------
        InvalidTypeError
            ``pos`` or ``head`` is not an integer.
        InvalidInputError
            ``head`` is outside ``[0, heads)``.
        """
        slot = self._slot_of(pos, head)
        return -1.0 if slot is None else self._scores[head][slot]

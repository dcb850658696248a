"""The reference's TOVA: each position keeps only the latest step's weight, in float64,
and the newest position is always kept (Oren et al., 2024, arXiv:2401.06104,
"Transformers are Multi-State RNNs"); it may pin its first ``sinks`` positions."""

from __future__ import annotations

from typing import Any

import numpy as np

from scissorhands.reference._heavy import _HeavyHitters


class TOVA(_HeavyHitters):
    """TOVA (token omission via attention): evict the positions the current token attends
    to least.

    Each decode step that carries attention sets every held position's score to that
    step's weight, a float64 (float32 weights widened exactly; ``-0.0`` stored as
    ``0.0``), instead of adding it as :class:`H2O` does; the new position then joins
    with a score of 0, and a step with ``attn=None`` changes no score.  ``prefill`` and
    ``extend`` apply each token as a decode step, so after a chunk a position's score is
    the weight of the last token that read it.  Eviction is H2O's: the lowest scores
    outside the sinks and the recent window go, ties to the lower position.

    A step's weights never include the new token's weight on itself, so the newest
    position has no score yet: TOVA needs ``recent_window >= 1`` and always keeps it (as
    kvpress's ``TOVAPress`` keeps the last token).  With several heads, each row takes
    the attention averaged over the query heads it serves.

    Parameters
    ----------
    budget : int, default 512
        Positions to keep per head, in ``[2, 2**32 - 1]`` (above the recent window and
        the sinks).
    recent_window : int or float, default 1
        The most recent positions, never evicted: an int in ``[1, budget - 1]``, or a
        float (or ``Fraction``) in ``[0, 1)``: that fraction of the budget, rounded down,
        which must come to at least 1 (the attribute and the state hold the resolved
        count).
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
        A parameter is out of range; ``recent_window`` below 1 (``"tova needs
        recent_window >= 1 ..."``).

    References
    ----------
    M. Oren, M. Hassid, N. Yarden, Y. Adi and R. Schwartz, "Transformers are Multi-State
    RNNs", 2024, arXiv:2401.06104.
    """

    name = "tova"

    def __init__(self, budget: int = 512, recent_window: int = 1, rng: Any = None, heads: int = 1,
                 sinks: int = 0, pool: int = 1, pins: Any = ()) -> None:
        self._configure(budget, recent_window=recent_window, sinks=sinks, pool=pool)
        self._setup(heads, pins)

    def _new_score(self) -> float:
        return 0.0

    def _update(self, head: int, weights: list[float]) -> None:
        # Assigned, not added; + 0.0 stores a -0.0 weight as 0.0 (the C selection orders
        # scores by their bits).
        self._scores[head] = [w + 0.0 for w in weights]

    @property
    def scores(self) -> np.ndarray:
        """Scores (the latest step's weights) aligned with :attr:`kept`, float64, shape
        ``(n,)`` or ``(heads, n)`` (rows of different counts raise ``InvalidInputError``)."""
        return self._as_array(self._scores, np.float64, "scores")

    def score_of(self, pos: int, head: int = 0) -> float:
        """Score of ``pos`` in row ``head`` (the weight the latest step with attention
        gave it; 0 before any), or -1.0 when it is not held.

        Raises
        ------
        InvalidTypeError
            ``pos`` or ``head`` is not an integer.
        InvalidInputError
            ``head`` is outside ``[0, heads)``.
        """
        slot = self._slot_of(pos, head)
        return -1.0 if slot is None else self._scores[head][slot]

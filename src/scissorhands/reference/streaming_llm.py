"""The reference's StreamingLLM: sinks and a sliding window (Xiao et al., ICLR 2024)."""

from __future__ import annotations

from typing import Any

from scissorhands.reference._base import _Policy


class StreamingLLM(_Policy):
    """StreamingLLM: keep the attention sinks and a sliding window of recent positions.

    The first ``sinks`` positions admitted are never evicted; otherwise the oldest go
    first.  Attention is ignored entirely (never read, never validated).  ``sinks=0`` is
    a plain sliding window.

    Parameters
    ----------
    budget : int, default 512
        Positions to keep per head, in ``[1, 2**32 - 1]``.
    sinks : int, default 4
        Leading positions never evicted, in ``[0, budget - 1]``.
    rng : any, default None
        Accepted and ignored.
    heads : int, default 1
        Rows, in ``[1, 65536]`` (all identical, since attention is ignored).

    pins : sequence of (int, int), default ()
        Pinned spans ``(start, stop)``, half-open, that no eviction takes in any row;
        checked and merged as :meth:`pin` does (refused as it refuses a span).  Sinks
        are the span ``(0, sinks)``; :meth:`reset` keeps these spans.
    Raises
    ------
    InvalidTypeError
        A parameter is not an integer.
    InvalidInputError
        A parameter is out of range.

    References
    ----------
    G. Xiao et al., "Efficient Streaming Language Models with Attention Sinks",
    ICLR 2024, arXiv:2309.17453.
    """

    name = "streaming-llm"
    sinks: int

    def __init__(self, budget: int = 512, sinks: int = 4, rng: Any = None, heads: int = 1,
                 pins: Any = ()) -> None:
        self._configure(budget, sinks=sinks)
        self._setup(heads, pins)

    def _victim_slots(self, head: int, count: int) -> list[int]:
        # The oldest positions after the sinks that are not pinned.
        n = len(self._kept[head])
        return self._unpinned(head, range(min(self.sinks, n), n))[:count]

    def sink_count(self) -> int:
        """Sinks held: ``min(sinks, kept_count())``."""
        return min(self.sinks, self.kept_count())

"""StreamingLLM: attention sinks plus a sliding window."""

from __future__ import annotations

from typing import Any

from scissorhands._option_specs import SINKS
from scissorhands._policy_spec import PolicySpec
from scissorhands.policies._base import NativePolicy

#: StreamingLLM's declaration (:mod:`scissorhands._registry` finds it).
SPEC = PolicySpec(
    "streaming-llm", "StreamingLLM", (SINKS,), defaults={"sinks": 4}, reads_attention=False,
    paper="Xiao et al., ICLR 2024, arXiv 2309.17453",
    module="streaming_llm", kind="SH_STREAMING_LLM", slot_bytes=4, colour="tab:blue", marker="s", order=10)


class StreamingLLM(NativePolicy):
    """Attention sinks + recency (Xiao et al., ICLR 2024, arXiv 2309.17453).

    The first ``sinks`` positions admitted are never evicted; past them the oldest
    positions go first. Attention is ignored entirely (not even validated).

    Parameters
    ----------
    budget : int, default 512
        Positions kept per head after :meth:`evict`, in ``[1, 2**32 - 1]``.
    sinks : int, default 4
        Leading positions pinned; ``0 <= sinks < budget`` (0 is a plain sliding
        window).
    rng : object, optional
        Accepted and ignored.
    heads : int, default 1
        Independent rows held in one object, ``[1, 65536]``.

    pins : sequence of (int, int), default ()
        Pinned spans ``(start, stop)``, half-open: positions ``start <= pos < stop``
        that no eviction takes, in any row, merged as :meth:`pin` merges them and
        refused as it refuses them (``InvalidTypeError``, ``InvalidInputError``).
        Sinks are the span ``(0, sinks)``; :meth:`reset` keeps these spans.
    Raises
    ------
    InvalidTypeError
        A parameter is not an integer.
    InvalidInputError
        ``budget < 1``, ``sinks < 0`` or ``sinks >= budget``.

    Notes
    -----
    4 bytes per slot (the position).
    """

    name = "streaming-llm"

    def __init__(self, budget: int = 512, sinks: int = 4, rng: Any = None, heads: int = 1,
                 pins: Any = ()) -> None:
        super().__init__(budget=budget, sinks=sinks, heads=heads, pins=pins)

    @property
    def sinks(self) -> int:
        """Leading positions that are never evicted."""
        return self._options["sinks"]

    def sink_count(self) -> int:
        """Sinks held: ``min(sinks, kept_count())``."""
        return self._sink_count()

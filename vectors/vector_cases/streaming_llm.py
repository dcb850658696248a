"""StreamingLLM's scenarios."""

from __future__ import annotations

from typing import Any

from vector_cases.pins import _pin_errors, _pin_life
from vector_cases.rows import _streaming_rows_cases
from vector_cases.shared import _constructor_errors, _state_errors
from vector_cases.writing import IIE, ITE, case, on, s, state

# --------------------------------------------------------------------------------------
# StreamingLLM.
# --------------------------------------------------------------------------------------


def _streaming_cases_1() -> list[dict[str, Any]]:
    """Part 1 of :func:`streaming_cases`'s cases, in order."""
    return [
        case("the sinks stay and the oldest non-sink goes",
             "Sinks {0,1}; holding 0..4 with budget 4 drops 2, then 3.",
             [on(1), on(2), on(3), on(4), s("sink_count", expect=2), s("evict", expect=[2]),
              on(5), s("evict", expect=[3]), s("kept", expect=[0, 1, 4, 5])],
             budget=4, sinks=2),
        case("sink_count is min(sinks, held)",
             "Holding 1, 2, 3, 4, 5 positions with sinks = 4.",
             [s("sink_count", expect=1), on(1), s("sink_count", expect=2), on(2), on(3),
              s("sink_count", expect=4), on(4), s("sink_count", expect=4)],
             budget=6, sinks=4),
        case("sinks = 0 is a plain sliding window",
             "Budget 3: 0 goes when 3 arrives, 1 when 4 arrives.",
             [on(1), on(2), on(3), s("sink_count", expect=0), s("evict", expect=[0]),
              s("step", 4, None, expect=[1]), s("kept", expect=[2, 3, 4])],
             budget=3, sinks=0),
        case("attention is ignored and never validated",
             "Garbage, bools, negatives, wrong lengths and ranks are all accepted unread.",
             [on(1, "garbage"), on(2, [True]), on(3, [-1.0, 5]), on(4, [[1.0]]),
              s("step", 5, [1.0, 2.0], expect=[1]), s("kept", expect=[0, 2, 3, 4, 5])],
             budget=5, sinks=1),
        case("several victims come back ascending, with their slots",
             "Kept [0,3,4,5,6,7,8] after a first eviction; evict(3) drops slots 1..4.",
             [on(1), on(2), on(3), s("evict", 2, expect=[1, 2]),
              on(4), on(5), on(6), on(7), on(8),
              s("evict", 3, expect=[[3, 4, 5, 6], [1, 2, 3, 4]], return_indices=True),
              s("kept", expect=[0, 7, 8])],
             budget=5, sinks=1),
        case("a budget at or below the sinks is refused, even with nothing to evict",
             "sinks = 2: evict(2) and evict(1) raise; evict(3) and a larger per-call budget "
             "work and do not stick.",
             [s("evict", 2, raises=IIE), s("evict", 1, raises=IIE), s("evict", 0, raises=IIE),
              s("evict", 3, expect=[]), on(1), on(2), on(3), on(4),
              s("evict", 5, expect=[]), s("evict", expect=[2]), s("evict", 3, expect=[3]),
              s("step", 5, None, 2, raises=IIE), s("kept", expect=[0, 1, 4])],
             budget=4, sinks=2),
    ]


def _streaming_cases_2() -> list[dict[str, Any]]:
    """Part 2 of :func:`streaming_cases`'s cases, in order."""
    return [
        case("batched eviction grows the capacity by doubling past budget + 1",
             "4 bytes a slot: 64 + 3*4 = 76, then 6 slots (88), then 12 (112).",
             [s("memory_bytes", expect=76), on(1), on(2), on(3), s("memory_bytes", expect=88),
              on(4), on(5), on(6), s("memory_bytes", expect=112),
              s("evict", expect=[0, 1, 2, 3, 4]), s("kept", expect=[5, 6])],
             budget=2, sinks=0),
        case("errors: positions and budgets are validated, attention is not",
             "Position order and type, budget type and range; state unchanged after each.",
             [on(1, None), on(1, None, raises=IIE), on(0, "x", raises=IIE),
              on(True, None, raises=ITE), on(2.0, None, raises=ITE), on(2**32, None, raises=IIE),
              s("evict", True, raises=ITE), s("evict", 2**32, raises=IIE),
              s("step", 2, None, 1.5, raises=ITE), s("prefill", [[0.0]], raises=IIE),
              s("kept", expect=[0, 1]), s("sink_count", expect=2)],
             budget=4, sinks=4 - 1),
        case("multi-head: every row holds the same positions",
             "Attention is ignored, so the rows agree; evict returns a (heads, k) array. "
             "Memory: 64 + 4 bytes for each row's count + 4 slots * 2 rows * 4.",
             [on(1), on(2), on(3), s("evict", expect=[[1], [1]]),
              s("evict", expect=[[[], []], [[], []]], return_indices=True),
              s("step", 4, [[1.0]], expect=[[2], [2]]),
              s("kept", expect=[[0, 3, 4], [0, 3, 4]]), s("memory_bytes", expect=64 + 2 * 4 + 4 * 2 * 4),
              s("state_dict", expect=state("streaming-llm", {"budget": 3, "sinks": 1, "heads": 2},
                                           [[0, 3, 4], [0, 3, 4]], 4))],
             budget=3, sinks=1, heads=2),
        case("prefill admits 1..P-1 and reads only the shape",
             "The values (negative here) are never read; nothing is evicted.",
             [s("prefill", [[0.0, 0.0, 0.0], [-1.0, 0.0, 0.0], [-1.0, -1.0, 0.0]]),
              s("kept", expect=[0, 1, 2]), s("prefill", [[0.0]], raises=IIE),
              s("reset"), s("prefill", [[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]], raises=IIE),
              s("kept", expect=[0])],
             budget=2, sinks=1),
        case("defaults: budget 512, four sinks",
             "Capacity 513 slots of 4 bytes plus the header.",
             [s("memory_bytes", expect=64 + 513 * 4),
              s("state_dict", expect=state("streaming-llm", {"budget": 512, "sinks": 4, "heads": 1},
                                           [[0]], 0))]),
    ] + _constructor_errors("sinks") + _state_errors(
        "streaming-llm", {"budget": 4, "sinks": 1, "heads": 1}, None, None, None) + _streaming_rows_cases()


def streaming_cases() -> list[dict[str, Any]]:
    """StreamingLLM: the first `sinks` positions stay, otherwise the oldest go."""
    return (
        _streaming_cases_1()
        + _streaming_cases_2()
    )


def streaming_pin_cases() -> list[dict[str, Any]]:
    """StreamingLLM with pinned spans."""
    base = {"budget": 6, "sinks": 1}
    return [
        case("pins: the oldest unpinned positions after the sinks go",
             "Sink 0, pinned 2 and 3, budget 5: 1 goes, then 4, 5, 6.",
             [s("step", t, None, expect=v) for t, v in
              [(1, []), (2, []), (3, []), (4, []), (5, [1]), (6, [4]), (7, [5]), (8, [6])]]
             + [s("kept", expect=[0, 2, 3, 7, 8])],
             budget=5, sinks=1, pins=[[2, 4]]),
        case("pins: pin(0, 2) evicts as sinks=2",
             "The answers of 'the sinks stay and the oldest non-sink goes'.",
             [on(1), on(2), on(3), on(4), s("evict", expect=[2]), on(5), s("evict", expect=[3]),
              s("kept", expect=[0, 1, 4, 5])],
             budget=4, sinks=0, pins=[[0, 2]]),
        case("pins: a per-call budget the pins leave too little is refused",
             "0..6 held, sink 0, pinned 1 and 2: 4 candidates; budget 2 needs 5, budget 3 takes 4.",
             [on(t) for t in range(1, 7)]
             + [s("evict", 2, raises=IIE), s("evict", 3, expect=[3, 4, 5, 6]), s("kept", expect=[0, 1, 2])],
             budget=5, sinks=1, pins=[[1, 3]]),
        *_pin_errors(base, [10, 11], [0, 5], "Budget 6, sinks 1: (0, 5) pins 4 outside the sink, 5 < 6; "
                     "one more is 6."),
        *_pin_life("streaming-llm", {**base, "budget": 12}, 64 + 13 * 4),
    ]


#: The registry name whose vector file these cases make (``vectors/streaming-llm.json``).
POLICY = "streaming-llm"


def cases() -> list[dict[str, Any]]:
    """Every case of ``vectors/streaming-llm.json`` but the observation-window rule's (which
    ``vectors/generate.py`` adds to every policy's file)."""
    return streaming_cases() + streaming_pin_cases()

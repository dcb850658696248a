"""H2O's scenarios: its options and its rule."""

from __future__ import annotations

from typing import Any

from vector_cases.pins import _pin_errors, _pin_life
from vector_cases.rows import _h2o_rows_cases
from vector_cases.shared import _constructor_errors, _heavy_hitter_errors, _sinks_option_errors, _state_errors
from vector_cases.writing import IIE, case, f32, on, s, state


def _h2o_option_cases() -> list[dict[str, Any]]:
    """H2O with sinks."""
    return [
        case("sinks: the first position held stays although it has the lowest score",
             "Scores [0, 1.5, 0.5, 0]: without sinks 0 and 3 tie at 0 and 0 goes; with "
             "sink 0 pinned, 3 goes, then evict(2) drops 2 (0.5 < 1.5); evict(1) is at the "
             "sinks and raises.",
             [on(1, [0.0]), on(2, [0.0, 1.0]), on(3, [0.0, 0.5, 0.5]),
              s("scores", expect=[0.0, 1.5, 0.5, 0.0]), s("sink_count", expect=1),
              s("evict", expect=[3]), s("kept", expect=[0, 1, 2]),
              s("evict", 2, expect=[2]), s("evict", 1, raises=IIE), s("kept", expect=[0, 1])],
             budget=3, recent_window=0, sinks=1),
        case("sinks and the recent window together: only the slots between them compete",
             "Scores [0, 1.25, 0.75, 1.0, 0]: 0 (sink) and 4 (recent) are protected at 0.0; "
             "of {1,2,3} 2 goes. evict(2) is at recent_window + sinks and raises; evict(3) "
             "compares 1 (1.25) and 3 (1.0).",
             [on(1, [0.0]), on(2, [0.0, 1.0]), on(3, [0.0, 0.25, 0.75]),
              on(4, [0.0, 0.0, 0.0, 1.0]), s("scores", expect=[0.0, 1.25, 0.75, 1.0, 0.0]),
              s("evict", expect=[2]), s("kept", expect=[0, 1, 3, 4]),
              s("evict", 2, raises=IIE), s("step", 5, None, 2, raises=IIE),
              s("evict", 3, expect=[3]),
              s("state_dict", expect=state("h2o", {"budget": 4, "recent_window": 1, "heads": 1,
                                                   "sinks": 1},
                                           [[0, 1, 4]], 4, scores=[[0.0, 1.25, 0.0]])),
              s("memory_bytes", expect=64 + 5 * 13)],
             budget=4, recent_window=1, sinks=1),
        case("sinks = 0: the same first steps evict the lowest position",
             "Scores [0, 1.5, 0.5, 0]: 0 and 3 tie and the lower goes.",
             [on(1, [0.0]), on(2, [0.0, 1.0]), on(3, [0.0, 0.5, 0.5]),
              s("sink_count", expect=0), s("evict", expect=[0])],
             budget=3, recent_window=0, sinks=0),
        case("a state with sinks loads them; one without loads with sinks 0",
             "Scores [0.0, 0.5, 0.25]: sink 0 is pinned, so 2 goes.",
             [s("sink_count", expect=1), s("evict", 2, expect=[2]), s("kept", expect=[0, 1])],
             state=state("h2o", {"budget": 2, "recent_window": 0, "heads": 1, "sinks": 1},
                         [[0, 1, 2]], 2, scores=[[0.0, 0.5, 0.25]])),
        case("a state with explicit sinks 0 loads; state_dict omits it",
             "sinks is recorded only when set.",
             [s("sink_count", expect=0),
              s("state_dict", expect=state("h2o", {"budget": 2, "recent_window": 0, "heads": 1},
                                           [[0, 1]], 1, scores=[[0.0, 0.5]]))],
             state=state("h2o", {"budget": 2, "recent_window": 0, "heads": 1, "sinks": 0},
                         [[0, 1]], 1, scores=[[0.0, 0.5]])),
    ] + _sinks_option_errors("h2o", "scores", 0.5)


# --------------------------------------------------------------------------------------
# H2O.
# --------------------------------------------------------------------------------------


def _h2o_cases_1(tiny: Any) -> list[dict[str, Any]]:
    """Part 1 of :func:`h2o_cases`'s cases, in order."""
    return [
        case("first step: position 0 scores the whole weight",
             "Unlike a vote, a sum counts the first step: score(0) = 1.0.",
             [on(1, [1.0]), s("score_of", 0, expect=1.0), s("score_of", 1, expect=0.0),
              s("scores", expect=[1.0, 0.0]), s("kept_count", expect=2)],
             budget=4, recent_window=1),
        case("float32 weights are widened exactly before the float64 sum",
             "score(0) = 1.0 + float32(0.1) = 1.0 + 0.10000000149011612 in double.",
             [on(1, [1.0], dtype="float32"), on(2, [0.1, 0.9], dtype="float32"),
              s("score_of", 0, expect=1.0 + f32(0.1)), s("score_of", 1, expect=f32(0.9))],
             budget=4, recent_window=1),
        case("scores accumulate in float64: 1 + 2**-30 keeps its low bit",
             "In float32 1 + 2**-30 rounds back to 1; in float64 it is exact, twice.",
             [on(1, [1.0]), on(2, [tiny, 0.0], dtype="float32"),
              s("score_of", 0, expect=1.0 + tiny), on(3, [tiny, 0.0, 0.0], dtype="float32"),
              s("score_of", 0, expect=1.0 + 2 * tiny)],
             budget=4, recent_window=1),
        case("tiebreak: equal scores evict the lower position; victims ascending",
             "Scores [0.75,0.75,0.5,0] then evict(3) drops 2; step 4 gives [1,1,0.5,0] and "
             "evict(2) drops 3 (0.5), then 0 before 1 (1.0 each).",
             [on(1, None), on(2, [0.5, 0.5]), on(3, [0.25, 0.25, 0.5]),
              s("scores", expect=[0.75, 0.75, 0.5, 0.0]), s("evict", 3, expect=[2]),
              on(4, [0.25, 0.25, 0.5]), s("scores", expect=[1.0, 1.0, 0.5, 0.0]),
              s("evict", 2, expect=[0, 3]), s("kept", expect=[1, 4])],
             budget=3, recent_window=1),
        case("several victims come back ascending, with their slots before the eviction",
             "Prefix scores [5,2,0,1,4]: the three lowest are positions 5, 7, 2, returned as "
             "[2,5,7] at slots [1,2,3].",
             [s("evict", expect=[[2, 5, 7], [1, 2, 3]], return_indices=True),
              s("kept", expect=[0, 8, 9]), s("scores", expect=[5.0, 4.0, 0.0])],
             state=state("h2o", {"budget": 3, "recent_window": 1, "heads": 1},
                         [[0, 2, 5, 7, 8, 9]], 9, scores=[[5.0, 2.0, 0.0, 1.0, 4.0, 0.0]])),
        case("null attention changes no score but admits the position",
             "Scores stay [1.0, 0.0] through a None step; position 2 joins with 0.0.",
             [on(1, [1.0]), on(2, None), s("scores", expect=[1.0, 0.0, 0.0]),
              s("kept", expect=[0, 1, 2]), on(3, [0.25, 0.25, 0.5]),
              s("scores", expect=[1.25, 0.25, 0.5, 0.0]), s("evict", expect=[1])],
             budget=3, recent_window=1),
    ]


def _h2o_cases_2(as_steps: Any, spike: Any, twin: Any, twin_note: Any, twin_tail: Any) -> list[dict[str, Any]]:
    """Part 2 of :func:`h2o_cases`'s cases, in order."""
    return [
        case("the recent window protects a position with the lowest score of all",
             "Scores [2.125, 0.75, 0.125, 0]; only {0,1} may go, so 1 goes.",
             [on(1, [1.0]), on(2, [0.75, 0.25]), on(3, [0.375, 0.5, 0.125]),
              s("scores", expect=[2.125, 0.75, 0.125, 0.0]), s("evict", expect=[1]),
              s("kept", expect=[0, 2, 3])],
             budget=3, recent_window=2),
        case("early spike: one large weight defends its position (Scissorhands evicts it)",
             "Sums [1.75, 1.125, 0.8125, 0.3125, 0]: position 1's 0.9375 spike keeps it; 3 "
             "goes. Scissorhands on the same steps evicts 1.",
             spike + [s("scores", expect=[1.75, 1.125, 0.8125, 0.3125, 0.0]),
                      s("evict", expect=[3])],
             budget=4, recent_window=1),
        case("batched eviction grows the capacity by doubling past budget + 1",
             "13 bytes a slot: 64 + 3*13 = 103, then 6 slots (142), then 12 (220).",
             [s("memory_bytes", expect=103), on(1), on(2), s("memory_bytes", expect=103),
              on(3), s("memory_bytes", expect=142), on(4), on(5), on(6),
              s("memory_bytes", expect=220), s("evict", expect=[0, 1, 2, 3, 4]),
              s("reset"), s("memory_bytes", expect=220)],
             budget=2, recent_window=0),
        case("step is on_decode_step then evict in one call", twin_note,
             as_steps + twin_tail, budget=3, recent_window=1),
        case("on_decode_step then evict gives what step gives", twin_note,
             [x for pair in twin for x in pair] + twin_tail, budget=3, recent_window=1),
        case("errors: each bad call raises its class and leaves the policy unchanged",
             "Same validation order as Scissorhands; score_of answers -1.0 when not held.",
             _heavy_hitter_errors("score_of", -1.0) + [s("scores", expect=[1.5, 0.5, 0.0])],
             budget=3, recent_window=1),
        case("multi-head: each row sums and evicts on its own weights",
             "Row 0 favours position 0, row 1 position 1; evict drops 1 from row 0 and 0 "
             "from row 1. Memory: 64 + 4 bytes for each row's count + 4 slots * 2 rows * 13.",
             [on(1, [[1.0], [0.0]]), on(2, [[0.75, 0.25], [0.25, 0.75]]),
              s("scores", expect=[[1.75, 0.25, 0.0], [0.25, 0.75, 0.0]]),
              s("score_of", 1, 1, expect=0.75),
              s("evict", 2, expect=[[1], [0]]),
              s("scores", expect=[[1.75, 0.0], [0.75, 0.0]]), s("score_of", 0, 1, expect=-1.0),
              s("memory_bytes", expect=64 + 2 * 4 + 4 * 2 * 13)],
             budget=3, recent_window=1, heads=2),
    ]


def _h2o_cases_3(prompt: Any) -> list[dict[str, Any]]:
    """Part 3 of :func:`h2o_cases`'s cases, in order."""
    return [
        case("prefill is the decode steps 1..P-1; diagonal and upper triangle unread",
             "Row 1 adds 1.0 to position 0, row 2 adds 0.75 and 0.25.",
             [s("prefill", prompt, dtype="float32"), s("scores", expect=[1.75, 0.25, 0.0]),
              s("prefill", prompt, raises=IIE)],
             budget=4, recent_window=1),
    ] + _constructor_errors("recent_window") + _state_errors(
        "h2o", {"budget": 4, "recent_window": 1, "heads": 1}, "scores", 0.5, -0.5) + _h2o_option_cases() + (
        _h2o_rows_cases())


def h2o_cases() -> list[dict[str, Any]]:
    """H2O: each position sums its weights in float64; the lowest sum goes."""
    spike = [on(1, [1.0]), on(2, [0.0625, 0.9375]), on(3, [0.375, 0.125, 0.5]),
             on(4, [0.3125, 0.0625, 0.3125, 0.3125])]
    twin_note = ("Scores after step 3: [2.0, 0.25, 0.25, 0]; evict drops 1 (tie with 2, "
                 "lower wins). Step 4 -> [2.25, 0.75, 0.25, 0]: drops 3 (slot 2). Step 5 with "
                 "budget 4 drops nothing -> [2.5, 1.0, 0.5, 0]; evict() then drops 4 (0.5).")
    twin = [
        (on(1, [1.0]), s("evict", expect=[])),
        (on(2, [0.75, 0.25]), s("evict", expect=[])),
        (on(3, [0.25, 0.0, 0.25]), s("evict", expect=[1])),
        (on(4, [0.25, 0.5, 0.25]), s("evict", expect=[[3], [2]], return_indices=True)),
        (on(5, [0.25, 0.25, 0.5]), s("evict", 4, expect=[])),
    ]
    as_steps = [
        s("step", 1, [1.0], expect=[]),
        s("step", 2, [0.75, 0.25], expect=[]),
        s("step", 3, [0.25, 0.0, 0.25], expect=[1]),
        s("step", 4, [0.25, 0.5, 0.25], expect=[[3], [2]], return_indices=True),
        s("step", 5, [0.25, 0.25, 0.5], 4, expect=[]),
    ]
    twin_tail = [s("scores", expect=[2.5, 1.0, 0.5, 0.0]), s("kept", expect=[0, 2, 4, 5]),
                 s("evict", expect=[4]), s("kept", expect=[0, 2, 5])]
    prompt = [[-1.0, -1.0, -1.0], [1.0, -1.0, -1.0], [0.75, 0.25, -1.0]]
    tiny = 2.0**-30
    return (
        _h2o_cases_1(tiny)
        + _h2o_cases_2(as_steps, spike, twin, twin_note, twin_tail)
        + _h2o_cases_3(prompt)
    )


def h2o_pin_cases() -> list[dict[str, Any]]:
    """H2O with pinned spans."""
    base = {"budget": 6, "recent_window": 2}
    return [
        case("pins: many victims at once skip the pinned slot",
             "Scores 0:2.0, 1:0 (pinned), 2:0.5, 3:0.125, 4:0 (recent): two go, 3 and 2.",
             [on(1, [0.5]), on(2, [0.5, 0.0]), on(3, [0.5, 0.0, 0.25]), on(4, [0.5, 0.0, 0.25, 0.125]),
              s("evict", 3, return_indices=True, expect=[[2, 3], [2, 3]]), s("kept", expect=[0, 1, 4])],
             budget=4, recent_window=1, pins=[[1, 2]]),
        *_pin_errors(base, [10, 11], [0, 3], "Budget 6, recent 2: 3 pinned + 2 = 5 < 6; one more is 6."),
        *_pin_life("h2o", {**base, "budget": 12}, 64 + 13 * 13),
    ]


#: The registry name whose vector file these cases make (``vectors/h2o.json``).
POLICY = "h2o"


def cases() -> list[dict[str, Any]]:
    """Every case of ``vectors/h2o.json`` but the observation-window rule's (which
    ``vectors/generate.py`` adds to every policy's file)."""
    return h2o_cases() + h2o_pin_cases()

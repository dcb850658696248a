"""TOVA's scenarios."""

from __future__ import annotations

from typing import Any

from vector_cases.pins import _pin_errors, _pin_life
from vector_cases.shared import _constructor_errors, _heavy_hitter_errors, _sinks_option_errors, _state_errors
from vector_cases.writing import IIE, RAGGED_NOTE, case, f32, on, s, state

# --------------------------------------------------------------------------------------
# TOVA.
# --------------------------------------------------------------------------------------


def _tova_cases_1() -> list[dict[str, Any]]:
    """Part 1 of :func:`tova_cases`'s cases, in order."""
    return [
        case("first step: position 0 scores the step's weight; the new position 0",
             "score(0) = 1.0, the weight; position 1 joins with 0.0.",
             [on(1, [1.0]), s("score_of", 0, expect=1.0), s("score_of", 1, expect=0.0),
              s("scores", expect=[1.0, 0.0]), s("kept_count", expect=2)],
             budget=4, recent_window=1),
        case("scores are the latest weights, not their sum",
             "Step 3 assigns [0.5, 0.125, 0.375] (H2O would hold the sums [1.75, 0.875, 0.375] "
             "and drop 2); evict(3) drops 1, the lowest latest weight.",
             [on(1, [1.0]), on(2, [0.25, 0.75]), s("scores", expect=[0.25, 0.75, 0.0]),
              on(3, [0.5, 0.125, 0.375]), s("scores", expect=[0.5, 0.125, 0.375, 0.0]),
              s("evict", 3, expect=[1]), s("kept", expect=[0, 2, 3]),
              s("scores", expect=[0.5, 0.375, 0.0]), s("score_of", 2, expect=0.375)],
             budget=4, recent_window=1),
        case("float32 weights are widened exactly",
             "score(0) = float32(0.1) = 0.10000000149011612 in double, not 0.1.",
             [on(1, [1.0], dtype="float32"), on(2, [0.1, 0.9], dtype="float32"),
              s("score_of", 0, expect=f32(0.1)), s("score_of", 1, expect=f32(0.9))],
             budget=4, recent_window=1),
        case("a -0.0 weight is stored as 0.0 and ties with 0.0, lower position first",
             "Step 4 assigns [0.5, -0.0, 0.0, 0.5] -> [0.5, 0.0, 0.0, 0.5, 0]: evict(3) drops "
             "1 and 2 (a -0.0 ordered by its sign bit would rank above 0.5).",
             [on(1), on(2), on(3), on(4, [0.5, -0.0, 0.0, 0.5]),
              s("scores", expect=[0.5, 0.0, 0.0, 0.5, 0.0]), s("evict", 3, expect=[1, 2]),
              s("kept", expect=[0, 3, 4])],
             budget=3, recent_window=1),
        case("tiebreak: equal weights evict the lower positions; the newest stays at 0",
             "Step 4 assigns [0.25, 0.5, 0.25, 0.25]; two go of the three at 0.25: 0 and 2. "
             "Position 4 scores 0 but is the recent window.",
             [on(1), on(2), on(3), s("step", 4, [0.25, 0.5, 0.25, 0.25], expect=[0, 2]),
              s("kept", expect=[1, 3, 4]), s("scores", expect=[0.5, 0.25, 0.0])],
             budget=3, recent_window=1),
        case("null attention changes no score but admits the position",
             "Scores stay [1.0, 0.0] through a None step; 2 joins with 0.0. Step 3 assigns "
             "[0.25, 0.25, 0.5]: 0 and 1 tie, 0 goes.",
             [on(1, [1.0]), on(2, None), s("scores", expect=[1.0, 0.0, 0.0]),
              s("kept", expect=[0, 1, 2]), on(3, [0.25, 0.25, 0.5]),
              s("scores", expect=[0.25, 0.25, 0.5, 0.0]), s("evict", expect=[0])],
             budget=3, recent_window=1),
    ]


def _tova_cases_2(as_steps: Any, spike: Any, twin: Any, twin_note: Any, twin_tail: Any) -> list[dict[str, Any]]:
    """Part 2 of :func:`tova_cases`'s cases, in order."""
    return [
        case("the recent window protects a position with the lowest score of all",
             "Scores [0.375, 0.5, 0.125, 0]; only {0, 1} may go, so 0 goes.",
             [on(1, [1.0]), on(2, [0.75, 0.25]), on(3, [0.375, 0.5, 0.125]),
              s("scores", expect=[0.375, 0.5, 0.125, 0.0]), s("evict", expect=[0]),
              s("kept", expect=[1, 2, 3])],
             budget=3, recent_window=2),
        case("early spike: TOVA forgets it (H2O's sum keeps it)",
             "Latest weights [0.3125, 0.0625, 0.3125, 0.3125, 0]: 1 goes although its 0.9375 "
             "spike would keep it under H2O.",
             spike + [s("scores", expect=[0.3125, 0.0625, 0.3125, 0.3125, 0.0]),
                      s("evict", expect=[1])],
             budget=4, recent_window=1),
        case("batched eviction grows the capacity by doubling past budget + 1",
             "13 bytes a slot: 64 + 3*13 = 103, then 6 slots (142), then 12 (220); every score "
             "is 0, so the lowest five positions go.",
             [s("memory_bytes", expect=103), on(1), on(2), s("memory_bytes", expect=103),
              on(3), s("memory_bytes", expect=142), on(4), on(5), on(6),
              s("memory_bytes", expect=220), s("evict", expect=[0, 1, 2, 3, 4]),
              s("reset"), s("memory_bytes", expect=220)],
             budget=2, recent_window=1),
        case("step is on_decode_step then evict in one call", twin_note,
             as_steps + twin_tail, budget=3, recent_window=1),
        case("on_decode_step then evict gives what step gives", twin_note,
             [x for pair in twin for x in pair] + twin_tail, budget=3, recent_window=1),
        case("errors: each bad call raises its class and leaves the policy unchanged",
             "Same validation order as H2O; score_of answers -1.0 when not held. The last step "
             "assigns [0.5, 0.5].",
             _heavy_hitter_errors("score_of", -1.0) + [s("scores", expect=[0.5, 0.5, 0.0])],
             budget=3, recent_window=1),
        case("multi-head: each row takes its own weights and evicts on them",
             "Row 0 ends [0.75, 0.25], row 1 [0.25, 0.75]: evict drops 1 from row 0 and 0 from "
             "row 1. Memory: 64 + 4 bytes for each row's count + 4 slots * 2 rows * 13.",
             [on(1, [[1.0], [0.0]]), on(2, [[0.75, 0.25], [0.25, 0.75]]),
              s("scores", expect=[[0.75, 0.25, 0.0], [0.25, 0.75, 0.0]]),
              s("score_of", 1, 1, expect=0.75), s("evict", 2, expect=[[1], [0]]),
              s("scores", expect=[[0.75, 0.0], [0.75, 0.0]]), s("score_of", 0, 1, expect=-1.0),
              s("memory_bytes", expect=64 + 2 * 4 + 4 * 2 * 13)],
             budget=3, recent_window=1, heads=2),
    ]


def _tova_cases_3(prompt: Any, x: Any) -> list[dict[str, Any]]:
    """Part 3 of :func:`tova_cases`'s cases, in order."""
    return [
        case("prefill is the decode steps 1..P-1: the last row that reads a slot sets it",
             "Row 1 sets position 0 to 1.0, row 2 sets 0 and 1 to 0.75 and 0.25; the diagonal "
             "and the upper triangle (-1.0) are never read.",
             [s("prefill", prompt, dtype="float32"), s("scores", expect=[0.75, 0.25, 0.0]),
              s("prefill", prompt, raises=IIE)],
             budget=4, recent_window=1),
        case("extend: each token is a decode step; a token left out reads nothing",
             "Chunk of 3 after [0, 1] (width 2 + 3): tokens read [0.5, 0.125], [0.25, 0.5, 0.75], "
             "[0.375, 0.0, 0.125, 0.25], so the scores are the last of these. A chunk of 2 "
             "(width 5 + 2) with admit [False, True]: 5 is skipped, 6 reads columns 0..4. Step 7 "
             "with budget 4 drops the three lowest of 0..6: 3 (0.0), 0 and 6 (0.125).",
             [on(1, [1.0]),
              s("extend", [[0.5, 0.125, x, x, x], [0.25, 0.5, 0.75, x, x], [0.375, 0.0, 0.125, 0.25, x]]),
              s("kept", expect=[0, 1, 2, 3, 4]), s("scores", expect=[0.375, 0.0, 0.125, 0.25, 0.0]),
              s("extend", [[x] * 7, [0.5, 0.5, 0.5, 0.5, 0.25, x, x]], admit=[False, True]),
              s("kept", expect=[0, 1, 2, 3, 4, 6]), s("scores", expect=[0.5, 0.5, 0.5, 0.5, 0.25, 0.0]),
              s("step", 7, [0.125, 0.5, 0.25, 0.0, 0.5, 0.125], 4, expect=[0, 3, 6]),
              s("kept", expect=[1, 2, 4, 7]), s("scores", expect=[0.5, 0.25, 0.5, 0.0])],
             budget=8, recent_window=1),
        case("sinks: the first positions held stay although they score lowest",
             "Step 5 assigns [0, 0, 0.5, 0.25, 0.25]: sinks 0 and 1 stay, 3 and 4 go; evict(3) "
             "is at recent_window + sinks and raises.",
             [on(1), on(2), on(3), on(4), on(5, [0.0, 0.0, 0.5, 0.25, 0.25]),
              s("sink_count", expect=2), s("evict", expect=[3, 4]), s("kept", expect=[0, 1, 2, 5]),
              s("evict", 3, raises=IIE),
              s("state_dict", expect=state("tova", {"budget": 4, "recent_window": 1, "heads": 1,
                                                    "sinks": 2},
                                           [[0, 1, 2, 5]], 5, scores=[[0.0, 0.0, 0.5, 0.0]]))],
             budget=4, recent_window=1, sinks=2),
        case("sinks = 0: the same steps evict the lowest positions",
             "[0, 0, 0.5, 0.25, 0.25, 0]: 0 and 1 go.",
             [on(1), on(2), on(3), on(4), on(5, [0.0, 0.0, 0.5, 0.25, 0.25]),
              s("sink_count", expect=0), s("evict", expect=[0, 1])],
             budget=4, recent_window=1, sinks=0),
        case("defaults: budget 512, recent window 1, no sinks",
             "The newest position is always kept: TOVA's recent window defaults to 1. "
             "64 + 513 * 13 bytes.",
             [s("state_dict", expect=state("tova", {"budget": 512, "recent_window": 1, "heads": 1},
                                           [[0]], 0, scores=[[0.0]])),
              s("sink_count", expect=0), s("memory_bytes", expect=64 + 513 * 13)]),
    ]


def _tova_cases_4(sinks_errors: Any, two: Any, x: Any) -> list[dict[str, Any]]:
    """Part 4 of :func:`tova_cases`'s cases, in order."""
    return [
        case("a fractional recent window resolves to positions",
             "0.5 of budget 4 is 2.",
             [s("state_dict", expect=state("tova", {"budget": 4, "recent_window": 2, "heads": 1},
                                           [[0]], 0, scores=[[0.0]]))],
             budget=4, recent_window=0.5),
        case("constructor: recent_window 0 is refused",
             "TOVA has no score for the newest position, so it needs recent_window >= 1.",
             [], raises=IIE, budget=4, recent_window=0),
        case("constructor: a fraction that rounds to 0 is refused",
             "0.2 of budget 4 is 0 positions: below the least window of 1.",
             [], raises=IIE, budget=4, recent_window=0.2),
        case("constructor: budget 1 is refused",
             "A budget must exceed the recent window, which is at least 1.",
             [], raises=IIE, budget=1),
        case("from_state_dict: recent_window 0 is refused",
             "Loading checks the parameters as the constructor does.",
             [], raises=IIE,
             state=state("tova", {"budget": 4, "recent_window": 0, "heads": 1}, [[0, 2]], 5,
                         scores=[[0.5, 0.5]])),
        case("rows of different counts: evict refuses, evict_rows evicts each row on its own",
             "Rows [0,1,2] (scores [0.5,0.25,0]) and [1] (1.0). evict() would take 1 and 0: it "
             "raises; evict_rows drops 1 (0.25) from row 0. step_rows 3: row 0 assigns [0.5, 0.5] "
             "and drops 0 (tie, lower); row 1 reads its one weight (0.25) and holds 2, the "
             "budget. select_rows([1, 1]) copies row 1 twice. " + RAGGED_NOTE,
             [s("counts", expect=[3, 1]), s("scores", raises=IIE), s("score_of", 1, 1, expect=1.0),
              s("evict", raises=IIE), s("evict_rows", expect=[[1, 0], [1], [1]]),
              s("state_dict", expect=state("tova", two, [[0, 2], [1]], 2, scores=[[0.5, 0.0], [1.0]])),
              s("step_rows", 3, [[0.5, 0.5], [0.25, x]], expect=[[1, 0], [0], [0]]),
              s("kept", expect=[[2, 3], [1, 3]]), s("scores", expect=[[0.5, 0.0], [0.25, 0.0]]),
              s("memory_bytes", expect=64 + 2 * 4 + 3 * 2 * 13), s("select_rows", [1, 1]),
              s("kept", expect=[[1, 3], [1, 3]]), s("scores", expect=[[0.25, 0.0], [0.25, 0.0]])],
             state=state("tova", two, [[0, 1, 2], [1]], 2, scores=[[0.5, 0.25, 0.0], [1.0]])),
    ] + _constructor_errors("recent_window") + _state_errors(
        "tova", {"budget": 4, "recent_window": 1, "heads": 1}, "scores", 0.5, -0.5) + sinks_errors


def tova_cases() -> list[dict[str, Any]]:
    """TOVA: each position holds the latest step's weight (assigned, not added); the lowest
    goes, H2O's selection; the newest position is always kept (recent_window >= 1)."""
    x = -1.0  # a weight no step reads
    spike = [on(1, [1.0]), on(2, [0.0625, 0.9375]), on(3, [0.375, 0.125, 0.5]),
             on(4, [0.3125, 0.0625, 0.3125, 0.3125])]
    twin_note = ("Step 2 -> [0.75, 0.25, 0]; step 3 assigns [0.25, 0.0, 0.25] and drops 1 (0.0). "
                 "Step 4 on [0, 2, 3] assigns [0.25, 0.5, 0.25]: 0 and 3 tie, 0 goes (slot 0). "
                 "Step 5 with budget 4 drops nothing -> [0.25, 0.25, 0.5, 0] on [2, 3, 4, 5]; "
                 "evict() then drops 2 (tie with 3, lower wins).")
    twin = [
        (on(1, [1.0]), s("evict", expect=[])),
        (on(2, [0.75, 0.25]), s("evict", expect=[])),
        (on(3, [0.25, 0.0, 0.25]), s("evict", expect=[1])),
        (on(4, [0.25, 0.5, 0.25]), s("evict", expect=[[0], [0]], return_indices=True)),
        (on(5, [0.25, 0.25, 0.5]), s("evict", 4, expect=[])),
    ]
    as_steps = [
        s("step", 1, [1.0], expect=[]),
        s("step", 2, [0.75, 0.25], expect=[]),
        s("step", 3, [0.25, 0.0, 0.25], expect=[1]),
        s("step", 4, [0.25, 0.5, 0.25], expect=[[0], [0]], return_indices=True),
        s("step", 5, [0.25, 0.25, 0.5], 4, expect=[]),
    ]
    twin_tail = [s("scores", expect=[0.25, 0.25, 0.5, 0.0]), s("kept", expect=[2, 3, 4, 5]),
                 s("evict", expect=[2]), s("kept", expect=[3, 4, 5])]
    prompt = [[x, x, x], [1.0, x, x], [0.75, 0.25, x]]
    two = {"budget": 2, "recent_window": 1, "heads": 2}
    sinks_errors = [c for c in _sinks_option_errors("tova", "scores", 0.5)
                    if c.get("params", {}).get("recent_window") != 0]  # that one is refused for its window
    return (
        _tova_cases_1()
        + _tova_cases_2(as_steps, spike, twin, twin_note, twin_tail)
        + _tova_cases_3(prompt, x)
        + _tova_cases_4(sinks_errors, two, x)
    )


def tova_pin_cases() -> list[dict[str, Any]]:
    """TOVA with pinned spans."""
    base = {"budget": 6, "recent_window": 2}
    return [
        case("pins: the lowest latest weight is pinned, the next lowest goes",
             "Scores 0:0.125 (pinned), 1:0.875, 2:0.25, 3:0 (recent): 2 goes.",
             [on(1, [0.125]), on(2, [0.125, 0.875]), on(3, [0.125, 0.875, 0.25]),
              s("evict", expect=[2]), s("kept", expect=[0, 1, 3])],
             budget=3, recent_window=1, pins=[[0, 1]]),
        *_pin_errors(base, [10, 11], [0, 3], "Budget 6, recent 2: 3 pinned + 2 = 5 < 6; one more is 6."),
        *_pin_life("tova", {**base, "budget": 12}, 64 + 13 * 13),
    ]


#: The registry name whose vector file these cases make (``vectors/tova.json``).
POLICY = "tova"


def cases() -> list[dict[str, Any]]:
    """Every case of ``vectors/tova.json`` but the observation-window rule's (which
    ``vectors/generate.py`` adds to every policy's file)."""
    return tova_cases() + tova_pin_cases()

"""Scissorhands' scenarios: its options, its vote rate, its rule."""

from __future__ import annotations

import math
from typing import Any

from vector_cases.pins import _pin_errors, _pin_life
from vector_cases.rows import _scissorhands_rows_cases
from vector_cases.shared import (
    _constructor_errors,
    _heavy_hitter_errors,
    _history_errors,
    _sinks_option_errors,
    _state_errors,
)
from vector_cases.writing import IIE, ITE, U32, case, on, s, state


def _scissorhands_option_cases_1(sink_steps: Any) -> list[dict[str, Any]]:
    """Part 1 of :func:`_scissorhands_option_cases`'s cases, in order."""
    return [
        case("sinks: the first positions held stay although they have the fewest votes",
             "Shares 1, 1/2, 1/3, 1/4, 1/5 give votes [0,0,3,2,1,0]. Sinks {0,1} (0 votes "
             "each) are pinned, so the evictable slots 2..5 lose the two fewest: 5 (0) and "
             "4 (1). Without sinks 0 and 1 would go.",
             sink_steps + [s("sink_count", expect=2), s("evict", expect=[4, 5]),
                           s("kept", expect=[0, 1, 2, 3]), s("votes", expect=[0, 0, 3, 2]),
                           s("sink_count", expect=2)],
             budget=4, recent_window=0, sinks=2),
        case("sinks = 0: the same steps evict the two least-voted lowest positions",
             "Votes [0,0,3,2,1,0]; without sinks 0, 1 and 5 tie at 0 votes and the lower "
             "two go.",
             sink_steps + [s("sink_count", expect=0), s("evict", expect=[0, 1])],
             budget=4, recent_window=0, sinks=0),
        case("sinks and the recent window together: only the slots between them compete",
             "Votes [0,2,1,1,0]: position 0 (sink) and 4 (recent) are protected although "
             "they have 0 votes; of {1,2,3} the tie at 1 vote drops 2. step 5 gives "
             "[0,2,1,1,0] over [0,1,3,4,5]; of {1,3,4} the tie drops 3. evict(3) then "
             "compares 1 (2 votes) and 4 (1 vote).",
             [on(1, [1.0]), on(2, [0.25, 0.75]), on(3, [0.0, 0.5, 0.5]),
              on(4, [0.0, 0.25, 0.25, 0.5]), s("votes", expect=[0, 2, 1, 1, 0]),
              s("evict", expect=[2]), s("kept", expect=[0, 1, 3, 4]),
              s("step", 5, [0.0, 0.0, 0.0, 1.0], expect=[3]), s("kept", expect=[0, 1, 4, 5]),
              s("evict", 2, raises=IIE), s("evict", 3, expect=[4]),
              s("kept", expect=[0, 1, 5]), s("votes", expect=[0, 2, 0])],
             budget=4, recent_window=1, sinks=1),
        case("sinks: a per-call budget must exceed recent_window + sinks",
             "recent_window 1 + sinks 2 = 3: evict(3), evict(2), evict(0) and a step with "
             "budget 3 raise even with nothing to evict; evict(4) drops the two lowest "
             "positions between the sinks {0,1} and the recent 5 (all 0 votes).",
             [s("evict", 3, raises=IIE), s("evict", 2, raises=IIE), s("evict", 0, raises=IIE),
              s("step", 1, None, 3, raises=IIE), s("evict", 4, expect=[]), s("kept", expect=[0]),
              on(1), on(2), on(3), on(4), on(5), s("evict", 4, expect=[2, 3]),
              s("kept", expect=[0, 1, 4, 5]), s("evict", 10, expect=[]), s("evict", expect=[])],
             budget=5, recent_window=1, sinks=2),
    ]


def _scissorhands_option_cases_2(burst_steps: Any) -> list[dict[str, Any]]:
    """Part 2 of :func:`_scissorhands_option_cases`'s cases, in order."""
    return [
        case("sinks: sink_count is min(sinks, held), and sinks are recorded in the state",
             "Holding 1, 2, 3, 4 positions with sinks = 3.",
             [s("sink_count", expect=1), on(1), s("sink_count", expect=2), on(2),
              s("sink_count", expect=3), on(3), s("sink_count", expect=3),
              s("state_dict", expect=state("scissorhands",
                                           {"budget": 6, "recent_window": 1, "heads": 1, "sinks": 3},
                                           [[0, 1, 2, 3]], 3, votes=[[0, 0, 0, 0]]))],
             budget=6, recent_window=1, sinks=3),
        case("history_window forgets an early burst: the once-popular position goes",
             "Window 2. Position 1 votes at steps 2 and 3 (registers [0,3,0,0]), then never: "
             "step 4 (share 1/4) votes 0 and 2, step 5 (share 1/5) votes 0, 2, 3, so the "
             "registers are [3,0,3,1,0,0] and the votes [2,0,2,1,0,0]. evict drops 1, 4 "
             "(0 votes) and 3 (1). Without the window 1 keeps its 2 votes and 0 goes.",
             burst_steps + [s("votes", expect=[2, 0, 2, 1, 0, 0]), s("votes_of", 1, expect=0),
                            s("evict", expect=[1, 3, 4]), s("kept", expect=[0, 2, 5]),
                            s("state_dict", expect=state(
                                "scissorhands",
                                {"budget": 3, "recent_window": 1, "heads": 1, "history_window": 2},
                                [[0, 2, 5]], 5, votes=[[2, 2, 0]], history=[[3, 3, 0]]))],
             budget=3, recent_window=1, history_window=2),
        case("history_window None: the same steps keep the early burst's votes",
             "Votes accumulate forever: [2,2,2,1,0,0]; evict drops 4 (0), 3 (1) and, of the "
             "three tied at 2, the lowest position 0.",
             burst_steps + [s("votes", expect=[2, 2, 2, 1, 0, 0]), s("evict", expect=[0, 3, 4])],
             budget=3, recent_window=1, history_window=None),
        case("history_window: a step with attn=None is not a step of the history",
             "Window 2. Position 1 votes at step 2; steps 3 and 4 carry no attention and "
             "shift nothing, so its vote at step 5 makes register 3 (2 votes). Were they "
             "history steps the register would be 1. Step 6 (share 1/6) votes 2 and 3: "
             "registers [0,2,1,1,0,0,0]; evict drops the 0-vote 0, 4, 5.",
             [on(1, [1.0]), on(2, [0.25, 0.75]), on(3, None), on(4, None),
              s("votes", expect=[0, 1, 0, 0, 0]),
              on(5, [0.0, 1.0, 0.0, 0.0, 0.0]), s("votes_of", 1, expect=2),
              on(6, [0.0, 0.0, 0.5, 0.5, 0.0, 0.0]), s("votes", expect=[0, 1, 1, 1, 0, 0, 0]),
              s("evict", expect=[0, 4, 5]),
              s("state_dict", expect=state(
                  "scissorhands", {"budget": 4, "recent_window": 1, "heads": 1, "history_window": 2},
                  [[1, 2, 3, 6]], 6, votes=[[1, 1, 1, 0]], history=[[2, 1, 1, 0]]))],
             budget=4, recent_window=1, history_window=2),
    ]


def _scissorhands_option_cases_3(h3: Any, h64: Any) -> list[dict[str, Any]]:
    """Part 3 of :func:`_scissorhands_option_cases`'s cases, in order."""
    return [
        case("history_window: a state with registers round-trips and continues",
             "Window 3, registers [5,4,0] (votes [2,1,0]). Step 3 (share 1/3) votes 1 and 2: "
             "registers (5<<1)&7=2, (4<<1|1)&7=1, 1 -> votes [1,1,1,0]. Step 4 votes 3: "
             "[4,2,2,1], one vote each; evict drops the lowest tied position 0. 5 slots of "
             "17 bytes: 64 + 85.",
             [s("state_dict", expect=state("scissorhands", h3, [[0, 1, 2]], 2,
                                           votes=[[2, 1, 0]], history=[[5, 4, 0]])),
              on(3, [0.0, 0.5, 0.5]),
              s("state_dict", expect=state("scissorhands", h3, [[0, 1, 2, 3]], 3,
                                           votes=[[1, 1, 1, 0]], history=[[2, 1, 1, 0]])),
              on(4, [0.0, 0.0, 0.0, 1.0]), s("votes", expect=[1, 1, 1, 1, 0]),
              on(5, [0.5], raises=IIE), s("evict", 1, raises=IIE),
              s("evict", expect=[0]), s("votes", expect=[1, 1, 1, 0]),
              s("state_dict", expect=state("scissorhands", h3, [[1, 2, 3, 4]], 4,
                                           votes=[[1, 1, 1, 0]], history=[[2, 2, 1, 0]])),
              s("memory_bytes", expect=64 + 5 * 17)],
             state=state("scissorhands", h3, [[0, 1, 2]], 2, votes=[[2, 1, 0]], history=[[5, 4, 0]])),
        case("history_window 64: the register uses all 64 bits",
             "A full register (64 votes) shifts in a 0 at step 2 (share 1/2): 2**64-2, 63 "
             "votes; position 1 votes: register 1.",
             [on(2, [0.25, 0.75]), s("votes", expect=[63, 1, 0]),
              s("state_dict", expect=state("scissorhands", h64, [[0, 1, 2]], 2,
                                           votes=[[63, 1, 0]], history=[[2**64 - 2, 1, 0]]))],
             state=state("scissorhands", h64, [[0, 1]], 1, votes=[[64, 0]], history=[[2**64 - 1, 0]])),
        case("a state with explicit default options loads; state_dict omits them",
             "sinks 0 and history_window None are the defaults, recorded only when set.",
             [s("state_dict", expect=state("scissorhands", {"budget": 4, "recent_window": 1, "heads": 1},
                                           [[0, 2]], 2, votes=[[1, 0]]))],
             state=state("scissorhands", {"budget": 4, "recent_window": 1, "heads": 1, "sinks": 0,
                                          "history_window": None}, [[0, 2]], 2, votes=[[1, 0]])),
        case("history_window: 17 bytes per slot, capacity growing as without it",
             "64 + 3*17 = 115; the fourth position doubles to 6 slots (166), the seventh to "
             "12 (268); neither evict nor reset shrinks it.",
             [s("memory_bytes", expect=115), on(1), on(2), s("memory_bytes", expect=115),
              on(3), s("memory_bytes", expect=166), on(4), on(5), s("memory_bytes", expect=166),
              on(6), s("memory_bytes", expect=268), s("evict", expect=[0, 1, 2, 3, 4]),
              s("memory_bytes", expect=268), s("reset"), s("kept", expect=[0]),
              s("votes", expect=[0]), s("memory_bytes", expect=268)],
             budget=2, recent_window=0, history_window=4),
    ]


def _scissorhands_option_cases_4() -> list[dict[str, Any]]:
    """Part 4 of :func:`_scissorhands_option_cases`'s cases, in order."""
    return [
        case("history_window with the default budget: 513 slots of 17 bytes",
             "The register adds 8 bytes to the 9 of a slot.",
             [s("memory_bytes", expect=64 + 513 * 17)], history_window=64),
        case("history_window: prefill is the decode steps 1..P-1",
             "Window 2: rows 2 and 3 vote position 0 (register 3, votes [2,0,0,0]); step 4 "
             "(share 1/4) votes 2 and 3 and shifts 0's register to 2: votes [1,0,1,1,0], so "
             "1 goes.",
             [s("prefill", [[0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.75, 0.25, 0.0, 0.0],
                            [0.5, 0.25, 0.25, 0.0]]),
              s("votes", expect=[2, 0, 0, 0]), on(4, [0.0, 0.0, 0.5, 0.5]),
              s("votes", expect=[1, 0, 1, 1, 0]), s("evict", expect=[1])],
             budget=4, recent_window=1, history_window=2),
        case("multi-head: sinks and a one-step history window per row",
             "Window 1: a vote lasts one step. Step 2 votes 1 in row 0 and 0 in row 1; step 3 "
             "(share 1/3) votes 2 in both and forgets the rest: votes [0,0,1,0] per row. With "
             "sink 0 pinned and no recent window, the lowest of {1,2,3} is 1 in both rows. "
             "Memory: 64 + 4 bytes for each of the 2 rows' counts + 4 slots * 2 rows * 17.",
             [on(1, [[1.0], [1.0]]), on(2, [[0.25, 0.75], [0.75, 0.25]]),
              s("votes", expect=[[0, 1, 0], [1, 0, 0]]),
              on(3, [[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]]),
              s("votes", expect=[[0, 0, 1, 0], [0, 0, 1, 0]]),
              s("evict", expect=[[1], [1]]), s("sink_count", expect=1),
              s("memory_bytes", expect=64 + 2 * 4 + 4 * 2 * 17),
              s("state_dict", expect=state(
                  "scissorhands",
                  {"budget": 3, "recent_window": 0, "heads": 2, "sinks": 1, "history_window": 1},
                  [[0, 2, 3], [0, 2, 3]], 3, votes=[[0, 1, 0], [0, 1, 0]],
                  history=[[0, 1, 0], [0, 1, 0]]))],
             budget=3, recent_window=0, heads=2, sinks=1, history_window=1),
    ] + _sinks_option_errors("scissorhands", "votes", 0) + _history_errors() + _vote_rate_cases()


def _scissorhands_option_cases() -> list[dict[str, Any]]:
    """Scissorhands with sinks and with a history window."""
    sink_steps = [on(1, [1.0]), on(2, [0.5, 0.5]), on(3, [0.0, 0.0, 1.0]),
                  on(4, [0.0, 0.0, 0.5, 0.5]), on(5, [0.0, 0.0, 0.25, 0.25, 0.5]),
                  s("votes", expect=[0, 0, 3, 2, 1, 0])]
    burst_steps = [on(1, [1.0]), on(2, [0.25, 0.75]), on(3, [0.0, 1.0, 0.0]),
                   on(4, [0.5, 0.0, 0.5, 0.0]), on(5, [0.375, 0.0, 0.3125, 0.3125, 0.0])]
    h3 = {"budget": 4, "recent_window": 1, "heads": 1, "history_window": 3}
    h64 = {"budget": 4, "recent_window": 1, "heads": 1, "history_window": 64}
    return (
        _scissorhands_option_cases_1(sink_steps)
        + _scissorhands_option_cases_2(burst_steps)
        + _scissorhands_option_cases_3(h3, h64)
        + _scissorhands_option_cases_4()
    )


def _vote_rate_cases_1(capped: Any, head_start: Any, rate: Any, tie: Any) -> list[dict[str, Any]]:
    """Part 1 of :func:`_vote_rate_cases`'s cases, in order."""
    return [
        case("vote_rate: an old position's head start in votes stops protecting it",
             "Position 0 votes on steps 2 and 3 only; later steps vote 2, 3 and 4. After step "
             "5 the votes are [2,0,1,2,1,0] over steps held [5,4,3,2,1,0]: rates 0.4, 0, 1/3, "
             "1, 1 (5 is recent). The three lowest, 1, 2 and 0, go. By votes alone 0 would "
             "stay and 1, 2 and 4 would go. 13 bytes per slot; 4 slots grew to 8.",
             head_start + [s("votes", expect=[2, 0, 1, 2, 1, 0]),
                           s("steps_held", expect=[5, 4, 3, 2, 1, 0]),
                           s("evict", expect=[0, 1, 2]), s("kept", expect=[3, 4, 5]),
                           s("state_dict", expect=state("scissorhands", rate, [[3, 4, 5]], 5,
                                                        votes=[[2, 1, 0]], steps_held=[[2, 1, 0]])),
                           s("memory_bytes", expect=64 + 8 * 13)],
             **rate),
        case("vote_rate off: the same steps evict by votes",
             "Votes [2,0,1,2,1,0]: 1 (0 votes), then 2 and 4 (1 vote each) go.",
             head_start + [s("evict", expect=[1, 2, 4]), s("kept", expect=[0, 3, 5])],
             budget=3, recent_window=1, vote_rate=False),
        case("vote_rate: equal rates evict the lower position",
             "Rates 2/4 = 1/2 = 0.5 for positions 0 and 1, 0 for 2, 3 recent: evict(2) drops 2 "
             "and, of the tie, 0.",
             [s("evict", 2, expect=[0, 2]), s("kept", expect=[1, 3]),
              s("steps_held", expect=[2, 0])],
             state=tie),
        case("vote_rate with a history window: the steps held count up to the window",
             "Window 2: position 0 has 2 votes in its last 2 steps (held 10: rate 2/2 = 1), "
             "position 1 one vote in 2 steps (0.5), so 1 goes; uncapped, 0's rate would be "
             "2/10 and 0 would go. 21 bytes per slot.",
             [s("evict", expect=[1]), s("kept", expect=[0, 2]), s("memory_bytes", expect=64 + 3 * 21)],
             state=state("scissorhands", capped, [[0, 1, 2]], 12, votes=[[2, 1, 0]],
                         history=[[3, 1, 0]], steps_held=[[10, 2, 0]])),
        case("vote_rate: a step without attention is not a step held; prefill's steps are",
             "Prefill of 3 tokens is steps 1 and 2: held [2,1,0]; only row 2 votes (0.75 > "
             "1/2; row 1's 1.0 is not above its share 1). on_decode_step(3, None) "
             "changes no count; step 4 adds one to each slot held before it.",
             [s("prefill", [[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.75, 0.25, 0.0]]),
              s("steps_held", expect=[2, 1, 0]), s("votes", expect=[1, 0, 0]), on(3, None),
              s("steps_held", expect=[2, 1, 0, 0]), on(4, [0.25, 0.25, 0.25, 0.25]),
              s("steps_held", expect=[3, 2, 1, 1, 0]), s("reset"), s("steps_held", expect=[0])],
             budget=4, recent_window=1, vote_rate=True),
    ]


def _vote_rate_cases_2(bad_state: Any) -> list[dict[str, Any]]:
    """Part 2 of :func:`_vote_rate_cases`'s cases, in order."""
    return [
        case("vote_rate off: steps_held is not kept",
             "Only a policy built with vote_rate=True counts the steps held.",
             [s("steps_held", raises=IIE)], budget=4, recent_window=1),
        case("constructor: a non-bool vote_rate is refused",
             "vote_rate is a bool: 1 is the wrong kind.",
             [], raises=ITE, budget=4, recent_window=1, vote_rate=1),
        case("constructor: a None vote_rate is refused",
             "vote_rate is a bool: None is the wrong kind.",
             [], raises=ITE, budget=4, recent_window=1, vote_rate=None),
    ] + [case(f"from_state_dict: {name}", "Loading checks the steps held against the votes, "
              "the registers and the parameters.", [], raises=err, state=d)
         for name, err, d in bad_state]


def _vote_rate_cases() -> list[dict[str, Any]]:
    """Scissorhands ranking by votes per step held, and the states it refuses."""
    rate = {"budget": 3, "recent_window": 1, "heads": 1, "vote_rate": True}
    head_start = [on(1, [1.0]), on(2, [1.0, 0.0]), on(3, [1.0, 0.0, 0.0]),
                  on(4, [0.0, 0.0, 0.5, 0.5]), on(5, [0.0, 0.0, 0.0, 0.5, 0.5])]
    tie = state("scissorhands", rate, [[0, 1, 2, 3]], 3, votes=[[2, 1, 0, 0]],
                steps_held=[[4, 2, 1, 0]])
    capped = {"budget": 2, "recent_window": 1, "heads": 1, "history_window": 2, "vote_rate": True}

    def st(votes: Any = None, held: Any = None, history: Any = None, **over: Any) -> dict[str, Any]:
        d = state("scissorhands", dict(rate), [[0, 2]], 5, votes=votes or [[1, 0]],
                  steps_held=held or [[3, 1]])
        if history is not None:
            d["history"] = history
        d.update(over)
        return d

    no_held = st()
    del no_held["steps_held"]
    no_rate = st()
    del no_rate["params"]["vote_rate"]
    bad_state: list[tuple[str, str, dict[str, Any]]] = [
        ("steps_held missing although vote_rate is set", IIE, no_held),
        ("steps_held without vote_rate", IIE, no_rate),
        ("more votes than steps held", IIE, st(votes=[[2, 0]], held=[[1, 1]])),
        ("a register bit older than the steps held", IIE,
         st(held=[[1, 1]], history=[[2, 0]], params=dict(rate, history_window=2))),
        ("a negative steps_held", IIE, st(held=[[-1, 1]])),
        ("steps_held above 2**32-1", IIE, st(held=[[2**32, 1]])),
        ("a float steps_held", ITE, st(held=[[3.0, 1]])),
        ("steps_held of the wrong length", IIE, st(held=[[3]])),
        ("a non-bool vote_rate", ITE, st(params=dict(rate, vote_rate=1))),
    ]
    return (
        _vote_rate_cases_1(capped, head_start, rate, tie)
        + _vote_rate_cases_2(bad_state)
    )


# --------------------------------------------------------------------------------------
# Scissorhands.
# --------------------------------------------------------------------------------------


def _scissorhands_cases_1(down: Any, up: Any) -> list[dict[str, Any]]:
    """Part 1 of :func:`scissorhands_cases`'s cases, in order."""
    return [
        case("first step: position 0 holds all the attention and earns no vote",
             "kept = {0}, attn = [1.0], share = 1/1 = 1.0; 1.0 > 1.0 is false.",
             [on(1, [1.0]), s("votes_of", 0, expect=0), s("votes_of", 1, expect=0),
              s("votes", expect=[0, 0]), s("kept", expect=[0, 1]), s("kept_count", expect=2)],
             budget=4, recent_window=1),
        case("boundary: exactly the fair share earns no vote, one ulp above earns one",
             "[0.5, 0.5] at share 0.5 and 0.25 at share 1/4 vote no one; nextafter(0.25, 1) "
             "votes, nextafter(0.25, 0) does not.",
             [on(1, [1.0]), on(2, [0.5, 0.5]), s("votes", expect=[0, 0, 0]),
              on(3, [0.25, 0.25, 0.5]), s("votes", expect=[0, 0, 1, 0]),
              on(4, [up, 0.25, down, 0.25]), s("votes", expect=[1, 0, 1, 0, 0])],
             budget=4, recent_window=1),
        case("float32: weights of 1/3 widen above the fair share, so everyone votes",
             "float32(1/3) = 0.3333333432674408 > 1.0/3 = 0.3333333333333333 in double.",
             [on(1, [1.0], dtype="float32"), on(2, [0.5, 0.5], dtype="float32"),
              on(3, [1 / 3] * 3, dtype="float32"), s("votes", expect=[1, 1, 1, 0])],
             budget=4, recent_window=1),
        case("float64: weights of 1/3 equal the fair share, so no one votes",
             "The double nearest 1/3 is exactly 1.0/3; the comparison is strict.",
             [on(1, [1.0]), on(2, [0.5, 0.5]), on(3, [1 / 3] * 3),
              s("votes", expect=[0, 0, 0, 0])],
             budget=4, recent_window=1),
        case("tiebreak: equal votes evict the lower position",
             "Votes [1,1,0,0] (0 votes at step 2, 1 at step 3); evict(2) drops 2 of the "
             "prefix {0,1,2}: position 2 (0 votes), then 0 before 1 (1 vote each).",
             [on(1, [1.0]), on(2, [0.625, 0.375]), on(3, [0.25, 0.5, 0.25]),
              s("votes", expect=[1, 1, 0, 0]), s("evict", 2, expect=[0, 2]),
              s("kept", expect=[1, 3]), s("votes", expect=[1, 0])]
             , budget=3, recent_window=1),
        case("several victims come back ascending, with their slots before the eviction",
             "Prefix slots 0..4 hold votes [5,2,0,1,4]; the three fewest are positions 5 "
             "(0), 7 (1), 2 (2), chosen in that order and returned as [2,5,7] at slots [1,2,3].",
             [s("evict", expect=[[2, 5, 7], [1, 2, 3]], return_indices=True),
              s("kept", expect=[0, 8, 9]), s("votes", expect=[5, 4, 0])],
             state=state("scissorhands", {"budget": 3, "recent_window": 1, "heads": 1},
                         [[0, 2, 5, 7, 8, 9]], 9, votes=[[5, 2, 0, 1, 4, 0]])),
    ]


def _scissorhands_cases_2(spike: Any) -> list[dict[str, Any]]:
    """Part 2 of :func:`scissorhands_cases`'s cases, in order."""
    return [
        case("null attention changes no vote but admits the position",
             "None is not read as zeros or anything else: votes stay [1,0,0] and 3, 4 join; "
             "step 5 (share 1/5) votes 0; evict(3) drops the three lowest zero-vote positions.",
             [on(1, [1.0]), on(2, [0.75, 0.25]), on(3, None), s("votes", expect=[1, 0, 0, 0]),
              s("kept", expect=[0, 1, 2, 3]), on(4, None),
              on(5, [0.5, 0.125, 0.125, 0.125, 0.125]), s("votes", expect=[2, 0, 0, 0, 0, 0]),
              s("evict", 3, expect=[1, 2, 3])],
             budget=3, recent_window=1),
        case("the recent window protects a position with the fewest votes of all",
             "Votes [2,1,0,0]; with recent_window 2 only {0,1} may go, so 1 goes although "
             "2 and 3 have fewer votes.",
             [on(1, [1.0]), on(2, [0.75, 0.25]), on(3, [0.375, 0.5, 0.125]),
              s("votes", expect=[2, 1, 0, 0]), s("evict", expect=[1]),
              s("kept", expect=[0, 2, 3]), s("votes", expect=[2, 0, 0])],
             budget=3, recent_window=2),
        case("early spike: one large weight buys a single vote, so the spike goes (H2O keeps it)",
             "Position 1 takes 0.9375 once, then little: votes [2,1,2,1,0]; 1 and 3 tie at one "
             "vote and the lower goes. H2O on the same steps evicts 3 (lowest sum 0.3125).",
             spike + [s("votes", expect=[2, 1, 2, 1, 0]), s("evict", expect=[1])],
             budget=4, recent_window=1),
        case("votes saturate at 2**32-1 instead of wrapping",
             "Position 0 starts at 2**32-2 and votes twice (0.75 > 1/2, 0.5 > 1/3).",
             [on(2, [0.75, 0.25]), s("votes_of", 0, expect=U32),
              on(3, [0.5, 0.25, 0.25]), s("votes_of", 0, expect=U32),
              s("votes", expect=[U32, 0, 0, 0]),
              s("state_dict", expect=state("scissorhands",
                                           {"budget": 4, "recent_window": 1, "heads": 1},
                                           [[0, 1, 2, 3]], 3, votes=[[U32, 0, 0, 0]]))],
             state=state("scissorhands", {"budget": 4, "recent_window": 1, "heads": 1},
                         [[0, 1]], 1, votes=[[U32 - 1, 0]])),
        case("batched eviction grows the capacity by doubling past budget + 1",
             "Capacity starts at budget + 1 = 3 (64 + 3*9 = 91 bytes); admitting into a full "
             "row doubles it: 6 (118), then 12 (172). Neither evict nor reset shrinks it.",
             [s("memory_bytes", expect=91), on(1), on(2), s("memory_bytes", expect=91),
              on(3), s("memory_bytes", expect=118), on(4), on(5), s("memory_bytes", expect=118),
              on(6), s("memory_bytes", expect=172), s("kept_count", expect=7),
              s("evict", expect=[0, 1, 2, 3, 4]), s("memory_bytes", expect=172),
              s("reset"), s("kept", expect=[0]), s("memory_bytes", expect=172)],
             budget=2, recent_window=0),
    ]


def _scissorhands_cases_3(as_steps: Any, twin_note: Any, twin_steps: Any, twin_tail: Any) -> list[dict[str, Any]]:
    """Part 3 of :func:`scissorhands_cases`'s cases, in order."""
    return [
        case("step is on_decode_step then evict in one call", twin_note,
             as_steps + twin_tail, budget=3, recent_window=1),
        case("on_decode_step then evict gives what step gives", twin_note,
             [x for pair in twin_steps for x in pair] + twin_tail, budget=3, recent_window=1),
        case("a per-call budget may exceed the configured one and does not stick",
             "evict(5) with 5 held returns nothing; evict() then uses the configured 3.",
             [on(1), on(2), on(3), on(4), s("evict", 5, expect=[]), s("evict", 4, expect=[0]),
              s("evict", expect=[1]), s("kept", expect=[2, 3, 4])],
             budget=3, recent_window=1),
        case("errors: each bad call raises its class and leaves the policy unchanged",
             "Validation order: position type, position range/order, budget, attention type, "
             "attention shape, weight values. (1, n) attention is accepted for one head.",
             _heavy_hitter_errors("votes_of", -1) + [s("votes", expect=[0, 0, 0])],
             budget=3, recent_window=1),
        case("defaults: budget 512, recent window 32, one head",
             "Capacity 513 slots of 9 bytes plus the 64-byte header.",
             [s("memory_bytes", expect=64 + 513 * 9), s("kept", expect=[0]),
              s("votes", expect=[0]),
              s("state_dict", expect=state("scissorhands",
                                           {"budget": 512, "recent_window": 32, "heads": 1},
                                           [[0]], 0, votes=[[0]]))]),
    ]


def _scissorhands_cases_4(prompt: Any) -> list[dict[str, Any]]:
    """Part 4 of :func:`scissorhands_cases`'s cases, in order."""
    return [
        case("multi-head: each row votes and evicts on its own weights",
             "Row 0 votes position 0 twice, row 1 votes position 1 twice; evict drops the "
             "lowest of each prefix {0,1,2}: row 0 -> 1 (tie with 2), row 1 -> 0 (tie with 2). "
             "Memory: 64 + 4 bytes for each of the 2 rows' counts + 4 slots * 2 rows * 9.",
             [on(1, [[1.0], [1.0]]), on(2, [[0.75, 0.25], [0.25, 0.75]]),
              on(3, [[0.5, 0.25, 0.25], [0.25, 0.5, 0.25]], dtype="float32"),
              s("votes", expect=[[2, 0, 0, 0], [0, 2, 0, 0]]),
              s("votes_of", 1, 1, expect=2), s("votes_of", 1, head=0, expect=0),
              s("votes_of", 0, 2, raises=IIE),
              on(4, [1.0, 0.0, 0.0, 0.0], raises=IIE),
              on(4, [[1.0, 0.0, 0.0, 0.0]], raises=IIE),
              s("evict", expect=[[[1], [0]], [[1], [0]]], return_indices=True),
              s("kept", expect=[[0, 2, 3], [1, 2, 3]]), s("votes_of", 1, 0, expect=-1),
              s("evict", expect=[[], []]),
              s("step", 4, None, 2, expect=[[2, 3], [2, 3]]),
              s("kept", expect=[[0, 4], [1, 4]]), s("memory_bytes", expect=64 + 2 * 4 + 4 * 2 * 9),
              s("state_dict", expect=state("scissorhands",
                                           {"budget": 3, "recent_window": 1, "heads": 2},
                                           [[0, 4], [1, 4]], 4, votes=[[2, 0], [2, 0]]))],
             budget=3, recent_window=1, heads=2),
        case("prefill is the decode steps 1..P-1; diagonal and upper triangle unread",
             "Rows 1..3 vote position 0 at rows 2 and 3 -> [2,0,0,0]; the -1.0 entries on and "
             "above the diagonal are never read. A second prefill needs a reset; P = 1 admits "
             "nothing and leaves the policy fresh.",
             [s("prefill", prompt, expect=None), s("votes", expect=[2, 0, 0, 0]),
              s("kept", expect=[0, 1, 2, 3]), s("prefill", [[1.0]], raises=IIE),
              on(4, [0.25, 0.25, 0.25, 0.25]), s("evict", expect=[1]), s("reset"),
              s("prefill", [[5.0]]), s("kept", expect=[0]),
              s("prefill", [[[0.0, 0.0], [0.5, 0.0]]], dtype="float32"),
              s("votes", expect=[0, 0]), s("kept", expect=[0, 1])],
             budget=4, recent_window=1),
    ]


def _scissorhands_cases_5() -> list[dict[str, Any]]:
    """Part 5 of :func:`scissorhands_cases`'s cases, in order."""
    return [
        case("prefill refuses a bad prompt and changes nothing",
             "Shapes must be (P, P) or (heads, P, P) with P >= 1; a negative weight in the "
             "lower triangle is refused.",
             [s("prefill", [[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]], raises=IIE),
              s("prefill", [], raises=IIE),
              s("prefill", [1.0, 0.0], raises=IIE),
              s("prefill", [[[0.0]], [[0.0]]], raises=IIE),
              s("prefill", [[0.0, 0.0], [-1.0, 0.0]], raises=IIE),
              s("prefill", [[0.0, 0.0], [True, 0.0]], raises=ITE),
              s("kept", expect=[0])],
             budget=4, recent_window=1),
        case("prefill with several heads reads each head's triangle",
             "Head 0 prompt votes position 0 at row 2; head 1 votes position 1 at row 2.",
             [s("prefill", [[[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.75, 0.25, 0.0]],
                            [[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.25, 0.75, 0.0]]]),
              s("votes", expect=[[1, 0, 0], [0, 1, 0]]),
              s("prefill", [[0.0]], raises=IIE)],
             budget=4, recent_window=1, heads=2),
    ] + _constructor_errors("recent_window") + [
        case("constructor: the default recent window 32 needs a budget above 32",
             "recent_window defaults to 32, so budget=32 is refused.", [], raises=IIE,
             budget=32),
    ] + _state_errors("scissorhands", {"budget": 4, "recent_window": 1, "heads": 1},
                      "votes", 0, 2**32) + _scissorhands_option_cases() + _scissorhands_rows_cases()


def scissorhands_cases() -> list[dict[str, Any]]:
    """Scissorhands: a vote when a weight strictly exceeds 1/len(attn); fewest votes go."""
    up = math.nextafter(0.25, 1.0)
    down = math.nextafter(0.25, 0.0)
    spike = [on(1, [1.0]), on(2, [0.0625, 0.9375]), on(3, [0.375, 0.125, 0.5]),
             on(4, [0.3125, 0.0625, 0.3125, 0.3125])]
    twin_steps = [
        (on(1, [1.0]), s("evict", expect=[])),
        (on(2, [0.75, 0.25]), s("evict", expect=[])),
        (on(3, [0.5, 0.25, 0.25]), s("evict", expect=[1])),
        (on(4, [0.25, 0.5, 0.25]), s("evict", expect=[[3], [2]], return_indices=True)),
        (on(5, [0.25, 0.25, 0.5]), s("evict", 4, expect=[])),
    ]
    as_steps = [
        s("step", 1, [1.0], expect=[]),
        s("step", 2, [0.75, 0.25], expect=[]),
        s("step", 3, [0.5, 0.25, 0.25], expect=[1]),
        s("step", 4, [0.25, 0.5, 0.25], expect=[[3], [2]], return_indices=True),
        s("step", 5, [0.25, 0.25, 0.5], 4, expect=[]),
    ]
    twin_tail = [s("votes", expect=[2, 1, 1, 0]), s("kept", expect=[0, 2, 4, 5]),
                 s("evict", expect=[2]), s("kept", expect=[0, 4, 5])]
    twin_note = ("Votes: step 3 (share 1/3) votes 0 -> [2,0,0,0], evict drops 1 (0 votes, tie "
                 "with 2, lower wins); step 4 votes 2 -> [2,1,0,0], evict drops 3 (slot 2); "
                 "step 5 votes 4 under a per-call budget of 4 (nothing to evict); the "
                 "configured budget 3 then drops 2 (tie with 4 at one vote).")
    prompt = [[-1.0, -1.0, -1.0, -1.0],
              [1.0, -1.0, -1.0, -1.0],
              [0.75, 0.25, -1.0, -1.0],
              [0.5, 0.25, 0.25, -1.0]]
    return (
        _scissorhands_cases_1(down, up)
        + _scissorhands_cases_2(spike)
        + _scissorhands_cases_3(as_steps, twin_note, twin_steps, twin_tail)
        + _scissorhands_cases_4(prompt)
        + _scissorhands_cases_5()
    )


def scissorhands_pin_cases() -> list[dict[str, Any]]:
    """Scissorhands with pinned spans."""
    base = {"budget": 6, "recent_window": 2, "sinks": 1}
    steps_none = [on(1), on(2), on(3), on(4)]
    return [
        case("pins: the least-voted position is pinned, the next least goes",
             "Votes 0:2, 1:0, 2:2, 3:0, 4:0 (0.5 > 1/3 and > 1/4); slots 0..3 may go but 1 is "
             "pinned: 3 is the least left.",
             [on(1, [0.0]), on(2, [0.0, 0.0]), on(3, [0.5, 0.0, 0.5]), on(4, [0.5, 0.0, 0.5, 0.0]),
              s("votes", expect=[2, 0, 2, 0, 0]), s("evict", return_indices=True, expect=[[3], [3]]),
              s("kept", expect=[0, 1, 2, 4])],
             budget=4, recent_window=1, pins=[[1, 2]]),
        case("pins: sinks=2 evicts as pin(0, 2)", "Every vote 0: the lowest unprotected, 2.",
             steps_none + [s("evict", expect=[2]), s("kept", expect=[0, 1, 3, 4])],
             budget=4, recent_window=1, sinks=2),
        case("pins: pin(0, 2) evicts as sinks=2", "The same steps and answers as sinks=2.",
             steps_none + [s("evict", expect=[2]), s("kept", expect=[0, 1, 3, 4])],
             budget=4, recent_window=1, pins=[[0, 2]]),
        case("pins: a span pinned ahead protects positions when they arrive",
             "Pinned 5..6 before they exist; budget 4, recent 1, all votes 0: the oldest "
             "unpinned go.",
             [s("step", t, None, expect=v) for t, v in
              [(1, []), (2, []), (3, []), (4, [0]), (5, [1]), (6, [2]), (7, [3]), (8, [4]), (9, [7])]]
             + [s("kept", expect=[5, 6, 8, 9])],
             budget=4, recent_window=1, pins=[[5, 7]]),
        case("pins: a per-call budget the pins leave too little is refused",
             "8 held, 4 pinned, 1 recent: budget 4 must evict 4 of 3 candidates; budget 5 "
             "evicts the 3.",
             [on(t) for t in range(1, 8)]
             + [s("evict", 4, raises=IIE), s("evict_rows", 4, raises=IIE), s("step", 8, None, 4, raises=IIE),
                s("evict", 5, expect=[4, 5, 6]), s("kept", expect=[0, 1, 2, 3, 7])],
             budget=8, recent_window=1, pins=[[0, 4]]),
        case("pins: a fractional recent window is that fraction of what the pins and sinks leave",
             "Budget 16, sinks 1, pins (0, 9): 8 pinned outside the sinks leave 16 - 8 - 1 = 7, so "
             "recent_window=0.5 is floor(3.5) = 3 (0.5 of the budget, 8, would leave nothing to evict). "
             "17 held, every vote 0: evict takes the lowest unprotected, 9.",
             [on(t) for t in range(1, 17)]
             + [s("evict", expect=[9]),
                s("state_dict", expect=state("scissorhands", {"budget": 16, "recent_window": 3, "heads": 1, "sinks": 1,
                                                              "pins": [[0, 9]]},
                                             [[*range(9), *range(10, 17)]], 16, votes=[[0] * 16]))],
             budget=16, recent_window=0.5, sinks=1, pins=[[0, 9]]),
        *_pin_errors(base, [20, 21], [0, 3],
                     "Budget 6, recent 2, sinks 1: (0, 3) pins 2 outside the sinks (5 < 6); "
                     "one more reaches 6."),
        *_pin_life("scissorhands", {**base, "budget": 12}, 64 + 13 * 9),
    ]


#: The registry name whose vector file these cases make (``vectors/scissorhands.json``).
POLICY = "scissorhands"


def cases() -> list[dict[str, Any]]:
    """Every case of ``vectors/scissorhands.json`` but the observation-window rule's (which
    ``vectors/generate.py`` adds to every policy's file)."""
    return scissorhands_cases() + scissorhands_pin_cases()

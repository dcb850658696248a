"""Pinned spans on every policy: refusals, a pin's life, states with pins."""

from __future__ import annotations

from typing import Any

from vector_cases.writing import IIE, ITE, case, on, s, state


def _pin_errors(params: dict[str, Any], refused: list[int], accepted: list[int], why: str) -> list[dict[str, Any]]:
    """pin() and pins= refusals every policy shares: bad spans, then spans that leave
    nothing to evict (``refused``, after ``accepted`` was taken), state unchanged."""
    return [
        case("pin: bad spans are refused",
             "start < stop, both integers in [0, 2**32 - 1]; a refusal changes nothing.",
             [s("pin", 3, 3, raises=IIE), s("pin", 4, 2, raises=IIE), s("pin", -1, 2, raises=IIE),
              s("pin", 0, 2**32, raises=IIE), s("pin", True, 2, raises=ITE), s("pin", 0, 2.5, raises=ITE),
              s("pins", expect=[])], **params),
        case("pin: spans that leave nothing to evict are refused", why,
             [s("pin", *accepted, expect=None), s("pin", *refused, raises=IIE),
              s("pins", expect=[accepted])], **params),
        case("constructor: pins that are not (start, stop) pairs", "Each span is a pair.",
             [], raises=IIE, **params, pins=[[0, 1, 2]]),
        case("constructor: pins that leave nothing to evict", why, [], raises=IIE, **params,
             pins=[accepted, refused]),
    ]


def _pin_life(policy: str, params: dict[str, Any], memory: int) -> list[dict[str, Any]]:
    """What every policy does with its spans: merging, memory, reset, the state."""
    return [
        case("pins: spans merge, ascending; memory counts 4 + 8 bytes a span",
             "(6, 8) and (8, 9) are adjacent, (0, 1) comes first: two spans.",
             [s("memory_bytes", expect=memory), s("pin", 6, 8, expect=None), s("pin", 8, 9, expect=None),
              s("pin", 0, 1, expect=None), s("pins", expect=[[0, 1], [6, 9]]),
              s("memory_bytes", expect=memory + 4 + 2 * 8)], **params),
        case("reset keeps the constructor's spans, forgets pin()'s",
             "A fresh object as constructed.",
             [s("pin", 7, 8, expect=None), s("pins", expect=[[0, 1], [7, 8]]), s("reset"),
              s("pins", expect=[[0, 1]])], **params, pins=[[0, 1]]),
        case("from_state_dict: the spans come back from params",
             "state['params']['pins'] is the merged list.",
             [s("pins", expect=[[0, 1], [6, 7]])],
             state=state_with_pins(policy, params, [[0, 1], [6, 7]])),
    ]


def state_with_pins(policy: str, params: dict[str, Any], pins: list[list[int]]) -> dict[str, Any]:
    """A fresh policy's state literal, its params holding ``pins`` after the others."""
    return {"format": "scissorhands.policy", "version": 1, "policy": policy,
            "params": {"budget": params["budget"], **{k: v for k, v in params.items() if k != "budget"},
                       "heads": 1, "pins": pins},
            "kept": [[0]], **({"votes": [[0]]} if policy == "scissorhands" else
                              {"scores": [[0.0]]} if policy in ("h2o", "tova") else {}),
            "last_position": 0}


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


def full_pin_cases() -> list[dict[str, Any]]:
    """Full with pinned spans: kept, and nothing changes."""
    return [
        case("pins: the full cache keeps its spans and never evicts",
             "Spans are recorded (4 + 8 bytes each) and change no eviction.",
             [s("pin", 4, 6, expect=None), s("pins", expect=[[0, 2], [4, 6]]), on(1), on(2),
              s("evict", expect=[]), s("kept", expect=[0, 1, 2]), s("memory_bytes", expect=64 + 64 * 4 + 4 + 16)],
             pins=[[0, 2]]),
        case("pin: bad spans are refused", "start < stop, both integers.",
             [s("pin", 2, 2, raises=IIE), s("pin", 0, True, raises=ITE), s("pins", expect=[])]),
    ]

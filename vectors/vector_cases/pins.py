"""Pinned spans on every policy: refusals, a pin's life, states with pins."""

from __future__ import annotations

from typing import Any

from vector_cases.writing import IIE, ITE, case, s


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


def _fresh_values(policy: str) -> dict[str, Any]:
    """A fresh slot's per-slot value in a state literal, by the registry's score key: a
    vote count 0, a score 0.0, or nothing for a policy that keeps positions only."""
    from scissorhands.options import SPECS

    key = SPECS[policy].score_key
    return {} if key is None else {key: [[0]] if key == "votes" else [[0.0]]}


def state_with_pins(policy: str, params: dict[str, Any], pins: list[list[int]]) -> dict[str, Any]:
    """A fresh policy's state literal, its params holding ``pins`` after the others."""
    return {"format": "scissorhands.policy", "version": 1, "policy": policy,
            "params": {"budget": params["budget"], **{k: v for k, v in params.items() if k != "budget"},
                       "heads": 1, "pins": pins},
            "kept": [[0]], **_fresh_values(policy),
            "last_position": 0}

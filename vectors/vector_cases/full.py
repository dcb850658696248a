"""Full's scenarios."""

from __future__ import annotations

from typing import Any

from vector_cases.rows import _full_rows_cases
from vector_cases.shared import _state_errors
from vector_cases.writing import IIE, ITE, case, on, s, state

# --------------------------------------------------------------------------------------
# Full.
# --------------------------------------------------------------------------------------


def full_cases() -> list[dict[str, Any]]:
    """Full: never evicts."""
    return [
        case("never evicts, whatever the budget",
             "evict() and evict(1) return nothing; the budget is still validated.",
             [on(1), on(2), on(3, [0.5]), s("evict", expect=[]), s("evict", 1, expect=[]),
              s("step", 4, "ignored", 1, expect=[]), s("kept_count", expect=5),
              s("evict", 0, raises=IIE), s("evict", True, raises=ITE),
              s("evict", expect=[[], []], return_indices=True),
              s("kept", expect=[0, 1, 2, 3, 4]),
              s("state_dict", expect=state("full", {"budget": None, "heads": 1},
                                           [[0, 1, 2, 3, 4]], 4))]),
        case("a configured budget is recorded and never used",
             "Full(budget=2) holds everything it is given.",
             [on(1), on(2), on(3), s("evict", expect=[]), s("kept", expect=[0, 1, 2, 3]),
              s("state_dict", expect=state("full", {"budget": 2, "heads": 1},
                                           [[0, 1, 2, 3]], 3))],
             budget=2),
        case("capacity starts at 64 slots and doubles",
             "64 + 64*4 = 320 bytes while 64 positions are held; the 65th doubles it (576).",
             [s("memory_bytes", expect=320), on(64), s("memory_bytes", expect=576),
              s("kept_count", expect=65)],
             state=state("full", {"budget": None, "heads": 1}, [list(range(64))], 63)),
        case("a loaded state larger than 64 starts at the first doubling that fits",
             "65 positions need 128 slots: 64 + 128*4 = 576.",
             [s("memory_bytes", expect=576)],
             state=state("full", {"budget": None, "heads": 1}, [list(range(65))], 64)),
        case("multi-head: every row holds everything",
             "evict returns an empty (heads, 0) array. Memory: 64 + 4 bytes for each row's "
             "count + 64 slots * 2 rows * 4.",
             [on(1, [[1.0]]), s("evict", expect=[[], []]), s("kept", expect=[[0, 1], [0, 1]]),
              s("memory_bytes", expect=64 + 2 * 4 + 64 * 2 * 4)],
             heads=2),
        case("errors: positions and budgets are validated, attention is not",
             "State unchanged after each.",
             [on(1, "x"), on(1, None, raises=IIE), on(True, None, raises=ITE),
              s("evict", 2**32, raises=IIE), s("kept", expect=[0, 1])]),
        case("prefill admits 1..P-1 and reads only the shape",
             "Three rows admit 1 and 2.",
             [s("prefill", [[0.0, 0.0, 0.0], [-1.0, 0.0, 0.0], [-1.0, -1.0, 0.0]]),
              s("kept", expect=[0, 1, 2])]),
        case("constructor: budget 0 is refused", "Full validates its budget.", [],
             raises=IIE, budget=0),
        case("constructor: a float budget is refused", "Full validates its budget.", [],
             raises=ITE, budget=4.0),
        case("constructor: heads 0 is refused", "Full validates heads.", [],
             raises=IIE, heads=0),
    ] + _state_errors("full", {"budget": None, "heads": 1}, None, None, None) + _full_rows_cases()


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


#: The registry name whose vector file these cases make (``vectors/full.json``).
POLICY = "full"


def cases() -> list[dict[str, Any]]:
    """Every case of ``vectors/full.json`` but the observation-window rule's (which
    ``vectors/generate.py`` adds to every policy's file)."""
    return full_cases() + full_pin_cases()

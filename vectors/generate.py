"""Generate the known-answer vectors in this directory from the pure-Python reference.

    python vectors/generate.py          # rewrite vectors/*.json
    python vectors/generate.py --check  # exit 1 if a committed file would change

Each scenario below is written by hand together with the answer it must give: every
step that returns something carries a hand-written ``expect`` (or ``raises``), and the
generator refuses to write a file when :mod:`scissorhands.reference` disagrees with a
hand-written answer.  The files therefore hold two independent statements of the
semantics that agree.  The format is described in ``vectors/README.md``.

The interpreter that replays a vector step (``tests/vector_runner.py``) is the tests'
own; the generator uses it too, so the two read the format in exactly one way.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from vector_runner import ATTN_ARG, FORMAT, VERSION, VectorError, check_case  # noqa: E402

U32 = 2**32 - 1
IIE = "InvalidInputError"
ITE = "InvalidTypeError"

# --------------------------------------------------------------------------------------
# Writing scenarios.
# --------------------------------------------------------------------------------------

_NONE_CALLS = {"on_decode_step", "prefill", "reset", "extend", "select_rows"}


def s(call_name: str, *args: Any, expect: Any = ..., raises: str | None = None,
      dtype: str | None = None, **kwargs: Any) -> dict[str, Any]:
    """One step.  ``expect`` is the hand-written answer (None for the calls returning None)."""
    step: dict[str, Any] = {"call": call_name, "args": list(args)}
    if kwargs:
        step["kwargs"] = kwargs
    if dtype is not None:
        step["dtype"] = dtype
        i = ATTN_ARG[call_name]
        # Write the float32 values exactly (as their widening to double) so that
        # np.asarray(values, dtype="float32") reproduces them bit for bit.
        step["args"][i] = np.asarray(args[i], dtype=dtype).astype(np.float64).tolist()
    if raises is not None:
        step["raises"] = raises
    elif expect is not ...:
        step["expect"] = expect
    elif call_name in _NONE_CALLS:
        step["expect"] = None
    else:
        raise ValueError(f"step {call_name}{args} needs a hand-written expect or raises")
    return step


def on(pos: Any, attn: Any = None, **kw: Any) -> dict[str, Any]:
    """``on_decode_step(pos, attn)``."""
    return s("on_decode_step", pos, attn, **kw)


def case(name: str, note: str, steps: list[dict[str, Any]], raises: str | None = None,
         state: dict[str, Any] | None = None, **params: Any) -> dict[str, Any]:
    """A case: a name, why its answers are right, a starting policy and its steps."""
    c: dict[str, Any] = {"name": name, "note": note}
    if state is not None:
        c["state"] = state
    else:
        c["params"] = params
    if raises is not None:
        c["raises"] = raises
    c["steps"] = steps
    return c


def state(policy: str, params: dict[str, Any], kept: list[list[int]], last: int,
          **scores: list[list[Any]]) -> dict[str, Any]:
    """A ``state_dict()`` literal."""
    d: dict[str, Any] = {"format": "scissorhands.policy", "version": 1, "policy": policy,
                         "params": params, "kept": kept}
    d.update(scores)
    d["last_position"] = last
    return d


def f32(x: float) -> float:
    """``x`` rounded to float32 and widened back to double, exactly."""
    return float(np.float32(x))


# --------------------------------------------------------------------------------------
# Scenarios shared by the attention-driven policies (Scissorhands, H2O, TOVA).
# --------------------------------------------------------------------------------------


def _heavy_hitter_errors(accessor: str, missing: Any) -> list[dict[str, Any]]:
    """Every bad call a Scissorhands/H2O/TOVA policy refuses, holding {0, 1}, budget 3, window 1."""
    return [
        on(1, [1.0]),
        on(1, [1.0, 0.0], raises=IIE),               # not above the last position
        on(0, None, raises=IIE),
        on(-1, None, raises=IIE),
        on(2**32, None, raises=IIE),
        on(True, [0.5, 0.5], raises=ITE),
        on(2.0, [0.5, 0.5], raises=ITE),
        on("2", [0.5, 0.5], raises=ITE),
        on(1, "garbage", raises=IIE),                 # the position is checked first
        on(2, [0.5], raises=IIE),                     # too short
        on(2, [0.5, 0.25, 0.25], raises=IIE),         # too long
        on(2, [[0.5, 0.5], [0.5, 0.5]], raises=IIE),  # two rows for one head
        on(2, [[[0.5, 0.5]]], raises=IIE),            # rank 3
        on(2, 0.5, raises=IIE),                       # rank 0
        on(2, [True, 0.5], raises=ITE),
        on(2, ["0.5", 0.5], raises=ITE),
        on(2, "ab", raises=ITE),
        on(2, ["a"], raises=ITE),                     # the type is checked before the length
        on(2, [0.5, -0.25], raises=IIE),
        on(2, [-0.25], raises=IIE),
        s("evict", 0, raises=IIE),
        s("evict", 1, raises=IIE),                    # = recent_window, with nothing to evict
        s("evict", True, raises=ITE),
        s("evict", 2.0, raises=ITE),
        s("evict", 2**32, raises=IIE),
        s("step", 2, [0.5, 0.5], 1, raises=IIE),
        s("step", 2, [True], 1, raises=IIE),          # the budget is checked before the weights
        s("step", 2, [0.5], 2, raises=IIE),           # a bad step admits nothing
        s("step", 1, [0.5, 0.5], 2, raises=IIE),
        s("prefill", [[1.0]], raises=IIE),            # not fresh
        s(accessor, 1.0, raises=ITE),
        s(accessor, True, raises=ITE),
        s(accessor, "0", raises=ITE),
        s(accessor, 0, 1, raises=IIE),                # head out of range
        s(accessor, 0, -1, raises=IIE),
        s(accessor, 0, True, raises=ITE),
        s(accessor, -1, expect=missing),
        s(accessor, 2**32, expect=missing),
        s(accessor, 2**32 - 1, expect=missing),
        s(accessor, 2, expect=missing),               # never admitted
        s("kept", expect=[0, 1]),
        on(2, [[0.5, 0.5]]),                          # (1, n) is accepted for one head
        s("kept", expect=[0, 1, 2]),
    ]


def _constructor_errors(window: str) -> list[dict[str, Any]]:
    """Bad constructor parameters, for a policy whose protected count is ``window``."""
    bad = [
        ("budget 0 is refused", IIE, {"budget": 0, window: 0}),
        ("budget above 2**32-1 is refused", IIE, {"budget": 2**32, window: 0}),
        ("a bool budget is refused", ITE, {"budget": True, window: 0}),
        ("a float budget is refused", ITE, {"budget": 4.0, window: 0}),
        (f"{window} equal to the budget is refused", IIE, {"budget": 4, window: 4}),
        (f"a negative {window} is refused", IIE, {"budget": 4, window: -1}),
        *([("a float recent_window of 1 or more is refused (a fraction must be in [0, 1))", IIE,
            {"budget": 4, window: 1.0}),
           ("a negative fraction recent_window is refused", IIE, {"budget": 4, window: -0.25}),
           ("a string recent_window is refused", ITE, {"budget": 4, window: "1"})]
          if window == "recent_window" else
          [(f"a float {window} is refused", ITE, {"budget": 4, window: 1.0})]),
        ("heads 0 is refused", IIE, {"budget": 4, window: 1, "heads": 0}),
        ("heads above 65536 is refused", IIE, {"budget": 4, window: 1, "heads": 65537}),
        ("a bool heads is refused", ITE, {"budget": 4, window: 1, "heads": True}),
    ]
    return [case(f"constructor: {name}", "Construction validates every integer parameter.",
                 [], raises=err, **params) for name, err, params in bad]


def _state_errors(policy: str, params: dict[str, Any], key: str | None, good: Any,
                  bad_score: Any) -> list[dict[str, Any]]:
    """Bad state dicts ``from_state_dict`` refuses (``good``/``bad_score``: a score value)."""
    def st(kept: Any, last: Any = 5, scores: Any = None, **over: Any) -> dict[str, Any]:
        extra = {} if key is None else {key: scores if scores is not None
                                        else [[good] * len(r) for r in kept]}
        d = state(policy, dict(params), kept, last, **extra)
        d.update(over)
        return d

    heads2 = dict(params, heads=2)
    bad: list[tuple[str, str, dict[str, Any]]] = [
        ("positions not ascending", IIE, st([[0, 3, 2]])),
        ("a repeated position", IIE, st([[0, 2, 2]])),
        ("a position above last_position", IIE, st([[0, 2, 6]])),
        ("a negative position", IIE, st([[-1, 2]])),
        ("a float position", ITE, st([[0, 2.0]])),
        ("rows not a list of lists", ITE, st([0, 2], scores=[[good, good]])),
        ("more rows than heads", IIE, st([[0], [0]])),
        ("fewer rows than heads", IIE, dict(st([[0, 1]]), params=heads2)),
        ("a row ascending but the next row not", IIE, dict(st([[0, 1], [3, 2]]), params=heads2)),
        ("a bool last_position", ITE, st([[0, 2]], last=True)),
        ("the wrong format", IIE, st([[0, 2]], format="scissorhands.other")),
        ("an unknown version", IIE, st([[0, 2]], version=2)),
        ("another policy's name", IIE, st([[0, 2]], policy="full" if policy != "full" else "h2o")),
        ("an unknown parameter", IIE, st([[0, 2]], params=dict(params, window=3))),
        ("a missing parameter", IIE,
         st([[0, 2]], params={k: v for k, v in params.items() if k != "heads"})),
        ("an out-of-range parameter", IIE, st([[0, 2]], params=dict(params, budget=0))),
    ]
    if key is not None:
        bad += [
            (f"{key} of the wrong length", IIE, st([[0, 2]], scores=[[good]])),
            (f"a {key} value out of range", IIE, st([[0, 2]], scores=[[good, bad_score]])),
            (f"a string in {key}", ITE, st([[0, 2]], scores=[[good, "1"]])),
            (f"a bool in {key}", ITE, st([[0, 2]], scores=[[good, True]])),
            (f"{key} rows not as long as kept's rows", IIE,
             dict(st([[0, 1], [0]], scores=[[good, good], [good, good]]), params=heads2)),
            (f"{key} with a row for an empty kept row", IIE,
             dict(st([[0, 1], []], scores=[[good, good], [good]]), params=heads2)),
        ]
        missing = st([[0, 2]])
        del missing[key]
        bad.append((f"{key} missing", IIE, missing))
    return [case(f"from_state_dict: {name}", "Loading validates every field of the state.",
                 [], raises=err, state=d) for name, err, d in bad]


# --------------------------------------------------------------------------------------
# The options of the attention-driven policies: sinks (both), history_window (Scissorhands).
# --------------------------------------------------------------------------------------


def _sinks_option_errors(policy: str, key: str, good: Any) -> list[dict[str, Any]]:
    """Bad ``sinks`` in a constructor or a state of Scissorhands, H2O or TOVA (recent window 1,
    budget 4, so sinks may be 0..2); ``good`` is a valid score value."""
    bad_ctor = [
        ("a negative sinks is refused", IIE, {"sinks": -1}),
        ("a float sinks is refused", ITE, {"sinks": 1.0}),
        ("a bool sinks is refused", ITE, {"sinks": True}),
        ("recent_window + sinks equal to the budget is refused", IIE, {"sinks": 3}),
        ("sinks equal to the budget is refused", IIE, {"sinks": 4, "recent_window": 0}),
    ]
    out = [case(f"constructor: {name}", "sinks is an integer with recent_window + sinks < budget.",
                [], raises=err, **{"budget": 4, "recent_window": 1, **params})
           for name, err, params in bad_ctor]
    for name, err, sinks in (("sinks making recent_window + sinks reach the budget", IIE, 3),
                             ("a float sinks", ITE, 1.0)):
        out.append(case(f"from_state_dict: {name}", "Loading validates the optional parameters too.",
                        [], raises=err,
                        state=state(policy, {"budget": 4, "recent_window": 1, "heads": 1, "sinks": sinks},
                                    [[0, 2]], 5, **{key: [[good, good]]})))
    return out


def _history_errors() -> list[dict[str, Any]]:
    """Bad history windows and vote registers Scissorhands refuses (window 2: registers 0..3)."""
    params = {"budget": 4, "recent_window": 1, "heads": 1, "history_window": 2}
    bad_ctor = [
        ("history_window 0 is refused", IIE, 0),
        ("history_window 65 is refused", IIE, 65),
        ("a negative history_window is refused", IIE, -1),
        ("a float history_window is refused", ITE, 2.0),
        ("a bool history_window is refused", ITE, True),
        ("a string history_window is refused", ITE, "4"),
    ]
    out = [case(f"constructor: {name}", "history_window is None or an integer in [1, 64].",
                [], raises=err, budget=4, recent_window=1, history_window=w)
           for name, err, w in bad_ctor]

    def st(votes: Any = None, history: Any = None, **over: Any) -> dict[str, Any]:
        d = state("scissorhands", dict(params), [[0, 2]], 5, votes=votes or [[1, 0]],
                  history=history or [[1, 0]])
        d.update(over)
        return d

    no_history = st()
    del no_history["history"]
    no_window = st()
    del no_window["params"]["history_window"]
    bad: list[tuple[str, str, dict[str, Any]]] = [
        ("history missing although history_window is set", IIE, no_history),
        ("history without a history_window", IIE, no_window),
        ("a register with a bit at or above the window", IIE, st(history=[[4, 0]])),
        ("votes that are not the register's number of bits", IIE, st(votes=[[1, 0]], history=[[3, 0]])),
        ("a negative register", IIE, st(history=[[-1, 0]])),
        ("a float register", ITE, st(history=[[1.0, 0]])),
        ("a bool register", ITE, st(history=[[True, 0]])),
        ("history of the wrong length", IIE, st(history=[[1]])),
        ("history not a list of lists", ITE, st(history=[1, 0])),
        ("history_window 0", IIE, st(params=dict(params, history_window=0))),
        ("history_window 65", IIE, st(params=dict(params, history_window=65))),
        ("a float history_window", ITE, st(params=dict(params, history_window=2.0))),
    ]
    return out + [case(f"from_state_dict: {name}", "Loading checks the registers against the "
                       "window and the votes.", [], raises=err, state=d) for name, err, d in bad]


def _scissorhands_option_cases() -> list[dict[str, Any]]:
    """Scissorhands with sinks and with a history window."""
    sink_steps = [on(1, [1.0]), on(2, [0.5, 0.5]), on(3, [0.0, 0.0, 1.0]),
                  on(4, [0.0, 0.0, 0.5, 0.5]), on(5, [0.0, 0.0, 0.25, 0.25, 0.5]),
                  s("votes", expect=[0, 0, 3, 2, 1, 0])]
    burst_steps = [on(1, [1.0]), on(2, [0.25, 0.75]), on(3, [0.0, 1.0, 0.0]),
                   on(4, [0.5, 0.0, 0.5, 0.0]), on(5, [0.375, 0.0, 0.3125, 0.3125, 0.0])]
    h3 = {"budget": 4, "recent_window": 1, "heads": 1, "history_window": 3}
    h64 = {"budget": 4, "recent_window": 1, "heads": 1, "history_window": 64}
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
# Scissorhands.
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# H2O.
# --------------------------------------------------------------------------------------


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
        case("prefill is the decode steps 1..P-1; diagonal and upper triangle unread",
             "Row 1 adds 1.0 to position 0, row 2 adds 0.75 and 0.25.",
             [s("prefill", prompt, dtype="float32"), s("scores", expect=[1.75, 0.25, 0.0]),
              s("prefill", prompt, raises=IIE)],
             budget=4, recent_window=1),
    ] + _constructor_errors("recent_window") + _state_errors(
        "h2o", {"budget": 4, "recent_window": 1, "heads": 1}, "scores", 0.5, -0.5) + _h2o_option_cases() + \
        _h2o_rows_cases()


# --------------------------------------------------------------------------------------
# TOVA.
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# StreamingLLM.
# --------------------------------------------------------------------------------------


def streaming_cases() -> list[dict[str, Any]]:
    """StreamingLLM: the first `sinks` positions stay, otherwise the oldest go."""
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


# --------------------------------------------------------------------------------------
# Rows of different counts, chunks (extend) and row selection, on every policy.
# --------------------------------------------------------------------------------------

RAGGED_NOTE = ("Memory counts 4 bytes for each row's count when there are several rows: "
               "64 + 4 * heads + capacity * heads * bytes per slot.")


def _scissorhands_rows_cases() -> list[dict[str, Any]]:
    """Scissorhands with rows of different counts, chunks and row selection."""
    two = {"budget": 3, "recent_window": 1, "heads": 2}
    pad = {"budget": 8, "recent_window": 1, "heads": 2}
    four = {"budget": 4, "recent_window": 1, "heads": 1}
    four2 = dict(four, heads=2)
    rated = {"budget": 4, "recent_window": 1, "heads": 2, "history_window": 3, "vote_rate": True}
    prompt = [[-1.0, -1.0, -1.0, -1.0],
              [1.0, -1.0, -1.0, -1.0],
              [0.75, 0.25, -1.0, -1.0],
              [0.5, 0.25, 0.25, -1.0]]
    x = -1.0  # a weight no step reads: negative, so that reading it would raise
    padded = [[[x] * 4, [x] * 4, [x] * 4, [x, x, 1.0, x]],
              [[x] * 4, [1.0, x, x, x], [0.25, 0.75, x, x], [0.5, 0.25, 0.25, x]]]
    later = [[[0.5, 0.25, 0.25, x, x, x, x], [0.25, 0.25, 0.25, 0.25, x, x, x]],
             [[x] * 7, [0.125, 0.125, 0.125, 0.125, 0.5, x, x]]]
    good = [[[0.5, 0.5, x, x]], [[0.25, 0.25, 0.5, x]]]
    return [
        case("rows of different counts: a state loads them; each row reads its own count of weights",
             "Rows [0,2,5] (votes [1,0,0]) and [2,5] (votes [2,0]). kept_count, kept, votes and "
             "sink_count need equal counts and raise; counts and kept_row answer. Step 6 gives "
             "(2, 3) weights: row 0 reads 3 (share 1/3: 0.5 votes position 0), row 1 its first 2 "
             "(share 1/2: 0.75 votes position 2) and never reads the -1. Holding [4, 3], step 7 "
             "at budget 3 would evict 2 and 1, and evict() 1 and 0: both raise before any change; "
             "evict(4) evicts 0 from each, the (2, 0) array. step_rows(7): row 0 (share 1/4) "
             "votes 6 -> [2,0,0,1,0] and drops the two 0-vote positions 2, 5 (slots 1, 2) of "
             "slots 0..3; row 1 (share 1/3) votes 6 -> [3,0,1,0] and drops 5 (slot 1). Five "
             "positions outgrow the 4 slots: 8. The rows now hold 3 each and step returns the "
             "(2, 1) array again: row 0 votes 7 -> [2,1,1,0], drops 6; row 1 votes 2, 6 -> "
             "[4,2,0,0], drops 7. " + RAGGED_NOTE,
             [s("counts", expect=[3, 2]), s("kept_row", 0, expect=[0, 2, 5]),
              s("kept_row", 1, expect=[2, 5]), s("kept_row", 2, raises=IIE),
              s("kept_row", -1, raises=IIE), s("kept_row", True, raises=ITE),
              s("kept_row", 1.0, raises=ITE), s("kept_count", raises=IIE), s("kept", raises=IIE),
              s("votes", raises=IIE), s("sink_count", raises=IIE),
              s("votes_of", 2, 1, expect=2), s("votes_of", 0, 1, expect=-1), s("votes_of", 0, 0, expect=1),
              s("memory_bytes", expect=64 + 2 * 4 + 4 * 2 * 9),
              on(6, [[0.5, 0.25, 0.25], [0.75, 0.25, x]]),
              s("state_dict", expect=state("scissorhands", two, [[0, 2, 5, 6], [2, 5, 6]], 6,
                                           votes=[[2, 0, 0, 0], [3, 0, 0]])),
              on(7, [[0.25] * 3, [0.25] * 3], raises=IIE),
              s("step", 7, [[0.25] * 4, [0.25, 0.25, 0.5, x]], raises=IIE),
              s("evict", raises=IIE), s("evict", 4, expect=[[], []]),
              s("step_rows", 7, [[0.25, 0.25, 0.125, 0.375], [0.25, 0.25, 0.5, x]],
                expect=[[2, 1], [2, 5, 5], [1, 2, 1]]),
              s("memory_bytes", expect=64 + 2 * 4 + 8 * 2 * 9),
              s("kept", expect=[[0, 6, 7], [2, 6, 7]]), s("votes", expect=[[2, 1, 0], [3, 1, 0]]),
              s("kept_count", expect=3), s("evict_rows", expect=[[0, 0], [], []]),
              s("step", 8, [[0.0, 0.0, 1.0], [0.5, 0.5, 0.0]], expect=[[6], [7]]),
              s("state_dict", expect=state("scissorhands", two, [[0, 7, 8], [2, 6, 8]], 8,
                                           votes=[[2, 1, 0], [4, 2, 0]]))],
             state=state("scissorhands", two, [[0, 2, 5], [2, 5]], 5, votes=[[1, 0, 0], [2, 0]])),
        case("rows of different counts: an empty row votes nothing and admits as usual",
             "Row 0 holds nothing, row 1 [0, 3] (votes [1, 0]). Step 4: row 0 reads no weight "
             "(its -5 and 7 are never read); row 1 (share 1/2) votes 0. Step 5 with step_rows: "
             "row 0 [4] reads 1.0 (share 1: no vote) and holds 2, the budget; row 1 (share 1/3) "
             "votes 4 -> [2,0,1,0] and drops the 0-vote 3 and 5 (slots 1, 3). Four positions "
             "outgrow the 3 slots: 6. " + RAGGED_NOTE,
             [s("counts", expect=[0, 2]), s("kept_row", 0, expect=[]), s("kept_count", raises=IIE),
              on(4, [[-5.0, 7.0], [0.75, 0.25]]),
              s("state_dict", expect=state("scissorhands", {"budget": 2, "recent_window": 0, "heads": 2},
                                           [[4], [0, 3, 4]], 4, votes=[[0], [2, 0, 0]])),
              s("step_rows", 5, [[1.0, x, x], [0.0, 0.0, 1.0]], expect=[[0, 2], [3, 5], [1, 3]]),
              s("kept", expect=[[4, 5], [0, 4]]), s("votes", expect=[[0, 0], [2, 1]]),
              s("memory_bytes", expect=64 + 2 * 4 + 6 * 2 * 9)],
             state=state("scissorhands", {"budget": 2, "recent_window": 0, "heads": 2},
                         [[], [0, 3]], 3, votes=[[], [1, 0]])),
        case("evict_rows and step_rows with one head return the victims row by row",
             "Votes [5,2,0,1,4,0]: the three fewest of slots 0..4 are 5, 7, 2 -> counts [3], "
             "victims [2,5,7], slots [1,2,3]. Then step 10 (share 1/3) votes 0 -> [6,4,0,0]; "
             "budget 2 drops 8 and 9. Bad positions, budgets and shapes raise as for step.",
             [s("evict_rows", expect=[[3], [2, 5, 7], [1, 2, 3]]), s("kept", expect=[0, 8, 9]),
              s("counts", expect=[3]), s("step_rows", 10, [0.5, 0.25], raises=IIE),
              s("step_rows", 9, [0.5, 0.25, 0.25], raises=IIE),
              s("step_rows", 10, [0.5, 0.25, 0.25], 1, raises=IIE),
              s("step_rows", 10, [True, 0.25, 0.25], raises=ITE), s("evict_rows", True, raises=ITE),
              s("evict_rows", 0, raises=IIE),
              s("step_rows", 10, [0.5, 0.25, 0.25], 2, expect=[[2], [8, 9], [1, 2]]),
              s("kept", expect=[0, 10]), s("votes", expect=[6, 0])],
             state=state("scissorhands", {"budget": 3, "recent_window": 1, "heads": 1},
                         [[0, 2, 5, 7, 8, 9]], 9, votes=[[5, 2, 0, 1, 4, 0]])),
        case("extend on a fresh policy is prefill; then a chunk after the held positions",
             "Fresh, the chunk's tokens are positions 0..3 and token 0 is the position 0 already "
             "held: rows 2 and 3 vote 0, as prefill gives ([2,0,0,0]; the -1 entries are never "
             "read). A second chunk of 2 tokens takes positions 4 and 5 with width 4 + 2: token "
             "4 reads columns 0..3 (share 1/4: no vote), token 5 columns 0..4 (share 1/5: 0.5 "
             "votes 4). Six positions outgrow the 5 slots: 10. evict drops 1 and 2 (0 votes).",
             [s("extend", prompt, dtype="float32"), s("votes", expect=[2, 0, 0, 0]),
              s("state_dict", expect=state("scissorhands", four, [[0, 1, 2, 3]], 3, votes=[[2, 0, 0, 0]])),
              s("memory_bytes", expect=64 + 5 * 9), s("prefill", prompt, raises=IIE),
              s("extend", [[0.25, 0.25, 0.25, 0.25, x, x], [0.125, 0.125, 0.125, 0.125, 0.5, x]]),
              s("votes", expect=[2, 0, 0, 0, 1, 0]), s("kept", expect=[0, 1, 2, 3, 4, 5]),
              s("memory_bytes", expect=64 + 10 * 9), on(5, None, raises=IIE),
              s("evict", expect=[1, 2]), s("kept", expect=[0, 3, 4, 5])],
             **four),
        case("extend with admit: a left-padded prompt keeps its padding out of its row",
             "Row 0 has two padding tokens (positions 0, 1), row 1 none. Row 0: position 0 "
             "leaves, token 1 is skipped, token 2 joins an empty row (no vote), token 3 reads "
             "only column 2 (share 1: no vote). Row 1 is prefill: [1,1,0,0]. Step 4 reads 2 "
             "weights in row 0 (0.75 votes 2) and 4 in row 1 (0.625 votes 3). A chunk of 2 "
             "(width 5 + 2): row 0 (3 held) token 5 reads columns 0..2 (0.5 votes 2), token 6 "
             "columns 0..3 (no vote); row 1 skips token 5, whose weights are never read, and "
             "token 6 reads columns 0..4, not 5 (0.5 votes 4). evict_rows(4): row 0 drops 3 "
             "(slot 1, 0 votes), row 1 drops 2 (0 votes) and 0 (1 vote, the lowest of four). "
             + RAGGED_NOTE,
             [s("extend", padded, admit=[[False, False, True, True], [True, True, True, True]]),
              s("counts", expect=[2, 4]), s("kept_row", 0, expect=[2, 3]),
              s("kept_row", 1, expect=[0, 1, 2, 3]),
              s("state_dict", expect=state("scissorhands", pad, [[2, 3], [0, 1, 2, 3]], 3,
                                           votes=[[0, 0], [1, 1, 0, 0]])),
              on(4, [[0.75, 0.25, x, x], [0.125, 0.125, 0.125, 0.625]]),
              s("extend", later, admit=[[True, True], [False, True]]),
              s("state_dict", expect=state("scissorhands", pad, [[2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 6]], 6,
                                           votes=[[2, 0, 0, 0, 0], [1, 1, 0, 1, 1, 0]])),
              s("evict_rows", 4, expect=[[1, 2], [3, 0, 2], [1, 0, 2]]),
              s("kept", expect=[[2, 4, 5, 6], [1, 3, 4, 6]]), s("votes", expect=[[2, 0, 0, 0], [1, 1, 1, 0]]),
              s("memory_bytes", expect=64 + 2 * 4 + 9 * 2 * 9)],
             **pad),
        case("extend: a first token left out drops position 0, and the policy is no longer fresh",
             "A one-token chunk on a fresh policy: row 0 does not admit it, so it holds nothing; "
             "row 1 keeps position 0. prefill then refuses (not fresh), and the next chunk takes "
             "position 1 with width 1 + 1: row 0 reads nothing, row 1 reads column 0 (share 1: "
             "no vote).",
             [s("extend", [[[5.0]], [[5.0]]], admit=[[False], [True]]), s("counts", expect=[0, 1]),
              s("state_dict", expect=state("scissorhands", four2, [[], [0]], 0, votes=[[], [0]])),
              s("prefill", [[[0.0]], [[0.0]]], raises=IIE), s("extend", [[[0.5]], [[0.5]]], raises=IIE),
              s("extend", [[[x, 7.0]], [[0.5, x]]]),
              s("state_dict", expect=state("scissorhands", four2, [[1], [0, 1]], 1, votes=[[0], [0, 0]]))],
             **four2),
        case("extend: a one-token chunk on a fresh policy leaves it fresh",
             "Token 0 is position 0, held already; nothing is read. prefill is still allowed.",
             [s("extend", [[[9.0]]]), s("kept", expect=[0]), s("prefill", [[0.0, 0.0], [1.0, 0.0]]),
              s("kept", expect=[0, 1])],
             **four),
        case("extend refuses bad chunks and changes nothing; unread weights are not checked",
             "Rows [0,2] and [1,2,3]: the width is 3 + C. Shapes, bool weights, admit of the "
             "wrong kind or shape, and a negative weight a vote reads are refused. Row 1 leaving "
             "out the token never reads its -0.5; row 0 (share 1/2) votes no one.",
             [s("extend", [[[0.5] * 3], [[0.5] * 3]], raises=IIE),
              s("extend", [[[0.5] * 4]], raises=IIE), s("extend", [[0.5] * 4], raises=IIE),
              s("extend", [[[0.5] * 5], [[0.5] * 5]], raises=IIE),
              s("extend", [[[True, 0.5, 0.5, 0.5]], [[0.5] * 4]], raises=ITE),
              s("extend", [[["x"] * 4], [["x"] * 4]], raises=ITE),
              s("extend", good, admit=[[1], [1]], raises=ITE),
              s("extend", good, admit="yes", raises=ITE),
              s("extend", good, admit=[[True, False], [True, True]], raises=IIE),
              s("extend", good, admit=[[True], [True, False]], raises=IIE),
              s("extend", good, admit=[True, True], raises=IIE),
              s("extend", [[[0.5, -0.5, x, x]], [[0.25, 0.25, 0.5, x]]], raises=IIE),
              s("extend", [[[0.5, 0.5, x, x]], [[0.25, 0.25, -0.5, x]]], admit=[[True], [False]]),
              s("state_dict", expect=state("scissorhands", four2, [[0, 2, 4], [1, 2, 3]], 4,
                                           votes=[[0, 0, 0], [0, 0, 0]]))],
             state=state("scissorhands", four2, [[0, 2], [1, 2, 3]], 3, votes=[[0, 0], [0, 0, 0]])),
        case("extend: the chunk's positions must stay within 2**32 - 1",
             "Last position 2**32-2: two tokens would reach 2**32 and raise; one takes 2**32-1 "
             "(share 1/2: no vote), after which no chunk fits. admit is checked before the "
             "positions.",
             [s("extend", [[0.5] * 4, [0.5] * 4], raises=IIE), s("extend", [[0.5, 0.5, x]]),
              s("extend", [[0.5] * 4], admit=[[1]], raises=ITE), s("extend", [[0.5] * 4], raises=IIE),
              on(0, None, raises=IIE), s("kept", expect=[0, U32 - 1, U32])],
             state=state("scissorhands", four, [[0, U32 - 1]], U32 - 1, votes=[[0, 0]])),
        case("select_rows: reorder, repeat, shrink",
             "Votes [[1,0,0],[0,1,0]]. [1,0] swaps the rows; [0,0,1,1] makes four; step 3 "
             "then votes and evicts in each row on its own: row 0 votes 2 and drops 0, row 1 "
             "votes 1 and drops 0, row 2 votes 0 and drops 1, row 3 votes 0, 1 and drops 2. "
             "[3] keeps the last row alone. Memory follows the rows (4 slots each). Bad "
             "indices raise and change nothing.",
             [on(1, [[1.0], [1.0]]), on(2, [[0.75, 0.25], [0.25, 0.75]]),
              s("votes", expect=[[1, 0, 0], [0, 1, 0]]), s("memory_bytes", expect=64 + 2 * 4 + 4 * 2 * 9),
              s("select_rows", [1, 0]), s("votes", expect=[[0, 1, 0], [1, 0, 0]]),
              s("select_rows", [0, 0, 1, 1]), s("heads", expect=4),
              s("votes", expect=[[0, 1, 0], [0, 1, 0], [1, 0, 0], [1, 0, 0]]),
              s("memory_bytes", expect=64 + 4 * 4 + 4 * 4 * 9),
              s("step", 3, [[0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.5, 0.5, 0.0]],
                expect=[[0], [0], [1], [2]]),
              s("select_rows", [3]), s("kept", expect=[0, 1, 3]), s("votes", expect=[2, 1, 0]),
              s("memory_bytes", expect=64 + 4 * 9),
              s("state_dict", expect=state("scissorhands", {"budget": 3, "recent_window": 1, "heads": 1},
                                           [[0, 1, 3]], 3, votes=[[2, 1, 0]])),
              s("select_rows", [], raises=IIE), s("select_rows", [1], raises=IIE),
              s("select_rows", [-1], raises=IIE), s("select_rows", [True], raises=ITE),
              s("select_rows", [0.0], raises=ITE), s("select_rows", [[0]], raises=IIE),
              s("select_rows", 0, raises=IIE), s("select_rows", "0", raises=ITE),
              s("select_rows", None, raises=ITE), s("kept", expect=[0, 1, 3])],
             budget=3, recent_window=1, heads=2),
        case("select_rows copies registers, steps held and counts",
             "Window 3 with a vote rate: rows [0,2,3] and [1,3]. [1,1,0] makes three rows. "
             "step_rows 4: row 0 (share 1/2) votes 3: registers 3<<1 = 6, 2<<1|1 = 5 (2 votes "
             "each), steps held [4,3]; row 1 votes no one: registers 6, 4; row 2 (share 1/3) "
             "votes 0: register 3. None is over budget 4. evict_rows(2): row 0's rates 2/3 and "
             "2/3 (steps capped at 3) tie and the lower, 1, goes; row 1's 2/3 and 1/3: 3 goes; "
             "row 2's 2/3, 0/2, 0/1: 2 and 3 go. 21 bytes a slot, 5 slots a row. "
             + RAGGED_NOTE,
             [s("memory_bytes", expect=64 + 2 * 4 + 5 * 2 * 21), s("select_rows", [1, 1, 0]),
              s("state_dict", expect=state("scissorhands", dict(rated, heads=3), [[1, 3], [1, 3], [0, 2, 3]], 3,
                                           votes=[[2, 1], [2, 1], [1, 0, 0]],
                                           history=[[3, 2], [3, 2], [1, 0, 0]],
                                           steps_held=[[3, 2], [3, 2], [2, 1, 0]])),
              s("counts", expect=[2, 2, 3]), s("memory_bytes", expect=64 + 3 * 4 + 5 * 3 * 21),
              s("step_rows", 4, [[0.25, 0.75, x], [0.5, 0.5, x], [0.5, 0.25, 0.25]],
                expect=[[0, 0, 0], [], []]),
              s("evict_rows", 2, expect=[[1, 1, 2], [1, 3, 2, 3], [0, 1, 1, 2]]),
              s("state_dict", expect=state("scissorhands", dict(rated, heads=3), [[3, 4], [1, 4], [0, 4]], 4,
                                           votes=[[2, 0], [2, 0], [2, 0]], history=[[5, 0], [6, 0], [3, 0]],
                                           steps_held=[[3, 0], [4, 0], [3, 0]]))],
             state=state("scissorhands", rated, [[0, 2, 3], [1, 3]], 3, votes=[[1, 0, 0], [2, 1]],
                         history=[[1, 0, 0], [3, 2]], steps_held=[[2, 1, 0], [3, 2]])),
    ]


def _h2o_rows_cases() -> list[dict[str, Any]]:
    """H2O with rows of different counts and chunks."""
    two = {"budget": 2, "recent_window": 0, "heads": 2}
    x = -1.0
    return [
        case("rows of different counts: evict refuses, evict_rows evicts each row on its own",
             "Rows [0,1,2] (scores [0.5,0.25,0]) and [1] (1.0). evict() would take 1 and 0: it "
             "raises; evict_rows drops the lowest score of row 0 (2). step_rows 3: row 0 adds "
             "[0.5,0.5] -> [1,0.75,0] and drops 3; row 1 reads its one weight (1.25) and holds "
             "2, the budget. " + RAGGED_NOTE,
             [s("counts", expect=[3, 1]), s("scores", raises=IIE), s("sink_count", raises=IIE),
              s("score_of", 1, 1, expect=1.0), s("evict", raises=IIE),
              s("evict_rows", expect=[[1, 0], [2], [2]]),
              s("state_dict", expect=state("h2o", two, [[0, 1], [1]], 2, scores=[[0.5, 0.25], [1.0]])),
              s("step_rows", 3, [[0.5, 0.5], [0.25, x]], expect=[[1, 0], [3], [2]]),
              s("kept", expect=[[0, 1], [1, 3]]), s("scores", expect=[[1.0, 0.75], [1.25, 0.0]]),
              s("memory_bytes", expect=64 + 2 * 4 + 3 * 2 * 13)],
             state=state("h2o", two, [[0, 1, 2], [1]], 2, scores=[[0.5, 0.25, 0.0], [1.0]])),
        case("extend: prefill's scores, then a chunk whose first token is left out",
             "Fresh: [1.75, 0.25, 0] as prefill gives. A chunk of 2 (width 3 + 2) with admit "
             "(C,) = [False, True]: position 3 is skipped and never read; token 4 adds columns "
             "0..2 only. step 5 then adds 0.25 to each and drops the lowest, 4 (0.25).",
             [s("extend", [[x, x, x], [1.0, x, x], [0.75, 0.25, x]], dtype="float32"),
              s("scores", expect=[1.75, 0.25, 0.0]),
              s("extend", [[x] * 5, [0.5, 0.25, 0.25, x, x]], admit=[False, True]),
              s("kept", expect=[0, 1, 2, 4]), s("scores", expect=[2.25, 0.5, 0.25, 0.0]),
              on(4, None, raises=IIE), s("step", 5, [0.25] * 4, expect=[4]),
              s("kept", expect=[0, 1, 2, 5])],
             budget=4, recent_window=1),
    ]


def _streaming_rows_cases() -> list[dict[str, Any]]:
    """StreamingLLM with rows of different counts and chunks (attention never read)."""
    x = -1.0
    return [
        case("extend with admit: each row's sinks are the first positions it holds",
             "Row 0 leaves out position 0, so its sink is 1; row 1 holds 0..4. evict would take "
             "1 and 2: it raises; evict_rows drops 2 from row 0 and 1, 2 from row 1. A chunk of "
             "one (width 3 + 1) is read for its shape only (strings are fine). Five positions "
             "outgrew the 4 slots: 8. " + RAGGED_NOTE,
             [s("extend", [[[x] * 5] * 5, [[x] * 5] * 5], admit=[[False, True, True, True, True], [True] * 5]),
              s("counts", expect=[4, 5]), s("kept_row", 0, expect=[1, 2, 3, 4]),
              s("sink_count", raises=IIE), s("evict", raises=IIE),
              s("evict_rows", expect=[[1, 2], [2, 1, 2], [1, 1, 2]]),
              s("kept", expect=[[1, 3, 4], [0, 3, 4]]), s("sink_count", expect=1),
              s("extend", [[[0.0] * 4, [0.0] * 4]], raises=IIE),
              s("extend", [[["a", "b", "c", "d"]], [["a", "b", "c", "d"]]]),
              s("memory_bytes", expect=64 + 2 * 4 + 8 * 2 * 4),
              s("state_dict", expect=state("streaming-llm", {"budget": 3, "sinks": 1, "heads": 2},
                                           [[1, 3, 4, 5], [0, 3, 4, 5]], 5)),
              s("step", 6, None, expect=[[3, 4], [3, 4]])],
             budget=3, sinks=1, heads=2),
        case("rows of different counts: a state with an empty row loads and steps",
             "Rows [0,5] and []. Step 6 joins both; step_rows 7: row 0 holds 4, keeps sink 0 "
             "and drops 5, 6; row 1 holds 2, the budget. " + RAGGED_NOTE,
             [s("counts", expect=[2, 0]), s("kept", raises=IIE), on(6, "garbage"),
              s("step_rows", 7, None, expect=[[2, 0], [5, 6], [1, 2]]),
              s("kept", expect=[[0, 7], [6, 7]]), s("memory_bytes", expect=64 + 2 * 4 + 6 * 2 * 4)],
             state=state("streaming-llm", {"budget": 2, "sinks": 1, "heads": 2}, [[0, 5], []], 5)),
    ]


def _full_rows_cases() -> list[dict[str, Any]]:
    """Full with rows of different counts, chunks and row selection."""
    return [
        case("extend with admit, then rows of different counts never evict",
             "Row 0 leaves out position 0. evict and step evict nothing from any row, so they "
             "return (2, 0) arrays even with different counts; evict_rows and step_rows return "
             "zero counts. select_rows([1]) keeps row 1 alone. " + RAGGED_NOTE,
             [s("counts", expect=[1, 1]),
              s("extend", [[[0.0] * 3] * 3, [[0.0] * 3] * 3], admit=[[False, True, True], [True] * 3]),
              s("counts", expect=[2, 3]), s("kept", raises=IIE), s("kept_count", raises=IIE),
              s("evict", expect=[[], []]), s("step", 3, "x", expect=[[], []]),
              s("evict_rows", expect=[[0, 0], [], []]), s("step_rows", 4, None, 1, expect=[[0, 0], [], []]),
              s("state_dict", expect=state("full", {"budget": None, "heads": 2},
                                           [[1, 2, 3, 4], [0, 1, 2, 3, 4]], 4)),
              s("memory_bytes", expect=64 + 2 * 4 + 64 * 2 * 4), s("select_rows", [1]),
              s("kept", expect=[0, 1, 2, 3, 4]), s("memory_bytes", expect=64 + 64 * 4)],
             heads=2),
    ]


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
def _observed_params(policy: str, **over: Any) -> dict[str, Any]:
    """A small policy for the observation-window cases: sinks 1 (Full: none), recent
    window 1 where it has one (the rule does not use it)."""
    if policy == "full":
        params: dict[str, Any] = {"budget": 6}
    elif policy == "streaming-llm":
        params = {"budget": 6, "sinks": 1}
    else:
        params = {"budget": 6, "recent_window": 1, "sinks": 1}
    params.update(over)
    return params


def observed_cases(policy: str) -> list[dict[str, Any]]:
    """evict_observed / evict_observed_rows (SnapKV's pooled window scores), the same
    rule for every policy that evicts; Full checks the arguments and evicts nothing."""
    evicts = policy != "full"
    nothing = [[0], [], []]
    spike = [[0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]] * 3
    tiny = 2.0**-53
    order = [[0.0, 1.0, 1.0, 5.0, 0.0, 0.0, 0.0], [0.0, tiny, 0.0, 5.0, 0.0, 0.0, 0.0],
             [0.0, tiny, 0.0, 5.0, 0.0, 0.0, 0.0]]
    bad = -1.0  # JSON holds no NaN: a negative weight is the refused value
    cases = [
        case("evict_observed: a pooled spike keeps its neighbours, equal pooled scores evict the lower",
             "First, holding {0} with a 5-row window: nothing to evict. Then 0..9 held, W = 3 (slots "
             "7, 8, 9, each reading the slots before it), every row weighting slot 4: its score is 3, "
             "every other 0. pool_kernel 3 gives slots 3, 4, 5 the pooled 3. Budget 6 evicts 4 of "
             "the candidates 1..6 (sink 0 and the window protected): 1, 2, 6 (pooled 0), then the "
             "lowest of the tie 3, 4, 5: 3. Full evicts nothing.",
             [s("evict_observed_rows", [[0.0]] * 5, expect=nothing)]
             + [on(i) for i in range(1, 10)]
             + [s("evict_observed_rows", spike, None, 3,
                  expect=[[4], [1, 2, 3, 6], [1, 2, 3, 6]] if evicts else nothing),
                s("kept", expect=[0, 4, 5, 7, 8, 9] if evicts else list(range(10)))],
             **_observed_params(policy)),
        case("evict_observed: window scores add row after row in double (float32 window)",
             "0..6 held, W = 3 (slots 4, 5, 6 read slots 0..3, 0..4, 0..5). Slot 1 scores 1.0 + 2**-53 "
             "+ 2**-53 added in row order: 1.0 at each addition (ties to even), equal to slot 2's 1.0; "
             "slot 3 scores 15. pool_kernel 1: no pooling. Budget 6 evicts one of the candidates 1, 2, "
             "3: the tie 1, 2 goes to the lower, 1 (added in another order slot 1 would be 1 + 2**-52 "
             "and slot 2 would go). The float32 values are exact.",
             [on(i) for i in range(1, 7)]
             + [s("evict_observed", order, None, 1, return_indices=True, dtype="float32",
                  expect=[[1], [1]] if evicts else [[], []])],
             **_observed_params(policy)),
        case("evict_observed: refusals leave the state, unread weights are not checked",
             "0..9 held, budget 6: every refusal is checked before anything changes: budget 0, an "
             "even or bool pool_kernel, a width that is not the 10 held, no window rows. A 9-row "
             "window and the sink leave 0 candidates where 4 must go; a negative weight at slot 3 "
             "of a row that reads it is refused. Full checks only the arguments and the shape. A "
             "negative weight a row does not read (window row 0 is slot 8: its own weight, slot 8) "
             "is never read: slots 0..7 score 0, so the lowest candidates 1..4 go.",
             [on(i) for i in range(1, 10)]
             + [s("evict_observed_rows", [[0.0] * 10] * 2, 0, raises=IIE),
                s("evict_observed_rows", [[0.0] * 10] * 2, None, 2, raises=IIE),
                s("evict_observed_rows", [[0.0] * 10] * 2, None, True, raises=ITE),
                s("evict_observed_rows", [[0.0] * 9] * 2, raises=IIE),
                s("evict_observed_rows", [], raises=IIE),
                s("evict_observed_rows", [[0.0] * 10] * 9, **({"raises": IIE} if evicts else {"expect": nothing})),
                s("evict_observed_rows", [[0.0] * 10, [0.0, 0.0, 0.0, bad] + [0.0] * 6],
                  **({"raises": IIE} if evicts else {"expect": nothing})),
                s("evict_observed_rows", [[0.0] * 8 + [bad, bad], [0.0] * 9 + [bad]], None, 1,
                  expect=[[4], [1, 2, 3, 4], [1, 2, 3, 4]] if evicts else nothing)],
             **_observed_params(policy)),
        case("evict_observed_rows: rows of different counts read their own window rows",
             "A fresh chunk of 8 (row 1 leaves out positions 2 and 5: it holds 0 1 3 4 6 7). W = 2. "
             "Row 0 (8 held, protected 0, 6, 7) weights slot 1 twice: 4 go from 1..5, the zeros 2..5. "
             "Row 1 (6 held, protected slots 0, 4, 5) weights slot 3 (position 4): 2 go from slots "
             "1..3, slots 1, 2 (positions 1, 3). evict_observed refuses rows evicting 4 and 2.",
             [s("extend", [[[0.125] * 8] * 8] * 2, admit=[[True] * 8, [True, True, False, True, True, False,
                                                                        True, True]]),
              s("counts", expect=[8, 6]),
              s("evict_observed", [[[0.0, 1.0] + [0.0] * 6] * 2, [[0.0] * 3 + [1.0] + [0.0] * 4] * 2], None, 1,
                **({"raises": IIE} if evicts else {"expect": [[], []]})),
              s("evict_observed_rows", [[[0.0, 1.0] + [0.0] * 6] * 2, [[0.0] * 3 + [1.0] + [0.0] * 4] * 2], None, 1,
                expect=[[4, 2], [2, 3, 4, 5, 1, 3], [2, 3, 4, 5, 1, 2]] if evicts else [[0, 0], [], []]),
              s("kept_row", 1, expect=[0, 4, 6, 7] if evicts else [0, 1, 3, 4, 6, 7])],
             **_observed_params(policy, budget=4, heads=2)),
    ]
    if SPECS_TAKE_POOL.get(policy):
        cases.append(case(
            "evict_observed refuses pooled budgets",
            "pool=2: the rows of a pool share a budget, which the rule does not take.",
            [on(i) for i in range(1, 8)]
            + [s("evict_observed_rows", [[[0.0] * 8]] * 2, raises=IIE),
               s("evict_observed", [[[0.0] * 8]] * 2, raises=IIE)],
            **_observed_params(policy, budget=4, heads=2, pool=2)))
    return cases


#: Whether each policy takes the pool option (written out: the generator imports no
#: package registry before build()).
SPECS_TAKE_POOL = {"scissorhands": True, "h2o": True, "tova": True}


SCENARIOS = {
    "scissorhands": lambda: scissorhands_cases() + scissorhands_pin_cases(),
    "h2o": lambda: h2o_cases() + h2o_pin_cases(),
    "tova": lambda: tova_cases() + tova_pin_cases(),
    "streaming-llm": lambda: streaming_cases() + streaming_pin_cases(),
    "full": lambda: full_cases() + full_pin_cases(),
}


# --------------------------------------------------------------------------------------
# Checking the hand-written answers against the reference, and writing.
# --------------------------------------------------------------------------------------


def build() -> dict[str, str]:
    """Every vector file's text, keyed by file name, after checking it on the reference."""
    from scissorhands import errors, reference

    files = {}
    for policy, scenarios in SCENARIOS.items():
        cases = scenarios() + observed_cases(policy)
        names = [c["name"] for c in cases]
        if len(set(names)) != len(names):
            raise VectorError(f"{policy}: case names are not unique")
        for c in cases:
            check_case(reference, errors, policy, c)
        doc = {"format": FORMAT, "version": VERSION, "policy": policy,
               "generator": "vectors/generate.py", "cases": cases}
        files[f"{policy}.json"] = dump(doc)
    return files


def dump(doc: dict[str, Any]) -> str:
    """The vector file's text: one line per field and per step, so diffs stay readable."""
    def one(value: Any) -> str:
        return json.dumps(value, allow_nan=False)

    head = [f" {one(k)}: {one(v)}" for k, v in doc.items() if k != "cases"]
    cases = []
    for c in doc["cases"]:
        fields = [f"   {one(k)}: {one(v)}" for k, v in c.items() if k != "steps"]
        steps = ",\n".join(f"    {one(step)}" for step in c["steps"])
        fields.append('   "steps": [' + (f"\n{steps}\n   ]" if steps else "]"))
        cases.append("  {\n" + ",\n".join(fields) + "\n  }")
    body = ",\n".join(head + [' "cases": [\n' + ",\n".join(cases) + "\n ]"])
    text = "{\n" + body + "\n}\n"
    if json.loads(text) != json.loads(json.dumps(doc)):  # the layout must change nothing
        raise VectorError("dump() changed the data")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 if a committed file would change")
    opts = parser.parse_args(argv)
    stale = []
    for name, text in build().items():
        path = HERE / name
        if opts.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print("out of date: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
